"""Classifying pods' PS traffic that this host forwards (pure): the nftables table we want.

A PS in a pod's own network namespace sends from the pod's address; its packets cross the
pod's veth into the host, are routed (and, with an overlay CNI, encapsulated in VXLAN: the
inner ports are then hidden from filters on the host NIC) and leave by the host NIC. The skb
mark does not survive the crossing from the pod's namespace, but everything set after it does:
so in the host's forward hook, before any encapsulation or NAT, each pod endpoint's packets
get the band's HTB class as their skb priority (HTB puts a packet whose priority names one of
its leaf classes straight into it, before any filter) and, where marking is on, the band's
DSCP (a VXLAN device with `tos inherit` copies it to the outer header, so the fabric sees it
too). Our table `inet tensorlights_pods` (nothing else is touched):

  map pods_v4       ip saddr . tcp sport -> jump job_<htid>
  map pods_v6       ip6 saddr . tcp sport -> jump job_<htid>
  chain job_<htid>  meta priority set MAJOR:BAND_MINOR [; ip dscp set D; ip6 dscp set D]
  chain forward     hook forward, prio mangle: the two vmaps

A rotation rewrites only the moved jobs' chains, in one transaction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorlights.model import DatapathSpec
from tensorlights.policy.dscp_plan import chain_body, chain_dscp, chain_name
from tensorlights.policy.tc_plan import band_minor

TABLE = "tensorlights_pods"
FAMILY = "inet"
HOOK_CHAIN = "forward"
MAPS = {4: "pods_v4", 6: "pods_v6"}
"""IP version -> the map of its endpoints."""


@dataclass(frozen=True)
class ChainAction:
    classid: int
    """The HTB class (major << 16 | minor) the job's packets are put in."""
    dscp: int | None
    """The DSCP they are marked with; None where marking is off."""


@dataclass(frozen=True)
class PodLayout:
    chain_action: Mapping[str, ChainAction]
    endpoint_chain: Mapping[tuple[str, int], str]
    """(pod address, TCP source port) -> job chain."""

    @property
    def empty(self) -> bool:
        return not self.endpoint_chain


def desired_pods(
    spec: DatapathSpec,
    job_table: Mapping[str, int],
    major: int,
    band_dscp: Sequence[int] | None,
) -> PodLayout:
    """The classification of `spec`'s pod endpoints; chains named as the DSCP table's."""
    actions: dict[str, ChainAction] = {}
    endpoints: dict[tuple[str, int], str] = {}
    for job in spec.jobs:
        if not job.pod_endpoints:
            continue
        chain = chain_name(job_table[job.job])
        dscp = None if band_dscp is None else band_dscp[job.band]
        actions[chain] = ChainAction((major << 16) | band_minor(job.band), dscp)
        for endpoint in job.pod_endpoints:
            endpoints[endpoint] = chain
    return PodLayout(actions, endpoints)


def _classid_text(classid: int) -> str:
    return f"{classid >> 16:x}:{classid & 0xFFFF:x}"


def _body(chain: str, action: ChainAction) -> list[str]:
    lines = [f"add rule {FAMILY} {TABLE} {chain} meta priority set {_classid_text(action.classid)}"]
    if action.dscp is not None:
        lines += chain_body(f"{FAMILY} {TABLE} {chain}", action.dscp)
    return lines


def _version(address: str) -> int:
    return 6 if ":" in address else 4


def render_replace(layout: PodLayout) -> str:
    """One transaction that makes our table exactly `layout` (created or replaced whole)."""
    name = f"{FAMILY} {TABLE}"
    lines = [f"add table {name}", f"delete table {name}", f"add table {name}"]
    for chain, action in sorted(layout.chain_action.items()):
        lines.append(f"add chain {name} {chain}")
        lines += _body(chain, action)
    for version, map_name in sorted(MAPS.items()):
        kind = "ipv4_addr" if version == 4 else "ipv6_addr"
        lines.append(f"add map {name} {map_name} {{ type {kind} . inet_service : verdict; }}")
        elements = ", ".join(
            f"{address} . {port} : jump {chain}"
            for (address, port), chain in sorted(layout.endpoint_chain.items())
            if _version(address) == version
        )
        if elements:
            lines.append(f"add element {name} {map_name} {{ {elements} }}")
    lines.append(
        f"add chain {name} {HOOK_CHAIN} "
        "{ type filter hook forward priority mangle; policy accept; }"
    )
    for version, map_name in sorted(MAPS.items()):
        family = "ip" if version == 4 else "ip6"
        lines.append(
            f"add rule {name} {HOOK_CHAIN} meta l4proto tcp {family} saddr . tcp sport "
            f"vmap @{map_name}"
        )
    return "\n".join(lines) + "\n"


def render_rotation(written: PodLayout, desired: PodLayout) -> str | None:
    """Only chain contents changed: those chains, rewritten; None when anything else changed
    (then `render_replace`); "" when nothing did."""
    if (
        written.endpoint_chain != desired.endpoint_chain
        or written.chain_action.keys() != desired.chain_action.keys()
    ):
        return None
    lines: list[str] = []
    for chain, action in sorted(desired.chain_action.items()):
        if written.chain_action[chain] != action:
            lines.append(f"flush chain {FAMILY} {TABLE} {chain}")
            lines += _body(chain, action)
    return "\n".join(lines) + "\n" if lines else ""


def parse_table(listing: Any) -> PodLayout | None:
    """Our table as libnftables lists it in JSON; None when it is not exactly of our shape
    (missing pieces, hand edits), which the caller repairs by replacing it."""
    items = listing.get("nftables", []) if isinstance(listing, dict) else []
    chains: set[str] = set()
    rules: dict[str, list[Any]] = {}
    endpoints: dict[tuple[str, int], str] = {}
    maps: set[str] = set()
    for item in items:
        if "chain" in item:
            chains.add(item["chain"]["name"])
        elif "rule" in item:
            rules.setdefault(item["rule"]["chain"], []).append(item["rule"]["expr"])
        elif "map" in item and item["map"].get("name") in MAPS.values():
            maps.add(item["map"]["name"])
            for key, verdict in item["map"].get("elem", []):
                parts = key.get("concat") if isinstance(key, dict) else None
                if not (isinstance(parts, list) and len(parts) == 2 and "jump" in verdict):
                    return None
                address, port = parts
                if not isinstance(address, str) or not isinstance(port, int):
                    return None
                endpoints[(address, port)] = verdict["jump"]["target"]
    if maps != set(MAPS.values()) or HOOK_CHAIN not in chains:
        return None
    if _hook_maps(rules.get(HOOK_CHAIN, [])) != set(MAPS.values()):
        return None
    actions: dict[str, ChainAction] = {}
    for chain in chains - {HOOK_CHAIN}:
        action = _chain_action(rules.get(chain, []))
        if action is None:
            return None
        actions[chain] = action
    if not set(endpoints.values()) <= actions.keys():
        return None
    return PodLayout(actions, endpoints)


def _hook_maps(hook_rules: list[Any]) -> set[str]:
    found = set()
    for expr_list in hook_rules:
        for expr in expr_list:
            if "vmap" in expr:
                found.add(str(expr["vmap"].get("data", "")).lstrip("@"))
    return found if len(hook_rules) == len(MAPS) else set()


def _chain_action(chain_rules: list[Any]) -> ChainAction | None:
    """What a job chain does, if it is exactly our rules."""
    if not chain_rules:
        return None
    first, rest = chain_rules[0], chain_rules[1:]
    if len(first) != 1 or "mangle" not in first[0]:
        return None
    mangle = first[0]["mangle"]
    if mangle.get("key", {}).get("meta", {}).get("key") != "priority":
        return None
    classid = _parse_classid(mangle.get("value"))
    if classid is None:
        return None
    if not rest:
        return ChainAction(classid, None)
    dscp = chain_dscp(rest)
    return None if dscp is None else ChainAction(classid, dscp)


def _parse_classid(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if not isinstance(value, str) or ":" not in value:
        return None
    major, _, minor = value.partition(":")
    try:
        return (int(major or "0", 16) << 16) | int(minor or "0", 16)
    except ValueError:
        return None
