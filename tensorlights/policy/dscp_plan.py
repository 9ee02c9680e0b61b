"""DSCP marks that follow the bands (pure): the nftables table we want, and how to get there.

Our table `inet tensorlights` (nothing else is ever touched):
  map ps_ports      TCP source port -> jump job_<htid>     (the job's PS ports)
  chain job_<htid>  ip dscp set D; ip6 dscp set D          (D = DSCP of the job's band)
  chain postrouting hook postrouting, prio mangle: oifname DEV tcp sport vmap @ps_ports
A rotation rewrites only the chains of the jobs whose band moved, in one transaction; ports
and the map stay. Non-PS packets match nothing and keep their DSCP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorlights.errors import ConfigError
from tensorlights.model import NUM_BANDS, DatapathSpec

TABLE = "tensorlights"
FAMILY = "inet"
PORT_MAP = "ps_ports"
HOOK_CHAIN = "postrouting"

DEFAULT_BAND_DSCP: tuple[int, ...] = (34, 26, 18, 10, 10, 10, 10)
"""Band 0 (green) AF41, band 1 AF31, band 2 AF21, bands 3-6 AF11: ordered like the bands, all
above best effort (0), which unmanaged traffic keeps."""


def validate_band_dscp(values: Sequence[int]) -> tuple[int, ...]:
    if len(values) != NUM_BANDS - 1:
        raise ConfigError(f"dscp.bands needs {NUM_BANDS - 1} values (bands 0-{NUM_BANDS - 2})")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= 63 for v in values):
        raise ConfigError("dscp.bands values must be DSCP code points 0-63")
    return tuple(values)


@dataclass(frozen=True)
class DscpLayout:
    interface: str
    chain_dscp: Mapping[str, int]
    """job chain -> DSCP."""
    port_chain: Mapping[int, str]
    """TCP source port -> job chain."""


def chain_name(htid: int) -> str:
    return f"job_{htid:x}"


def desired_dscp(
    spec: DatapathSpec, job_table: Mapping[str, int], band_dscp: Sequence[int]
) -> DscpLayout:
    """The marks for `spec`; a job's chain is named after its u32 table (stable handle)."""
    chain_dscp: dict[str, int] = {}
    port_chain: dict[int, str] = {}
    for job in spec.jobs:
        chain = chain_name(job_table[job.job])
        chain_dscp[chain] = band_dscp[job.band]
        for port in job.ports:
            port_chain[port] = chain
    return DscpLayout(spec.interface, chain_dscp, port_chain)


def chain_body(where: str, dscp: int) -> list[str]:
    """The rules that mark a job's packets (`where`: "FAMILY TABLE CHAIN")."""
    return [f"add rule {where} ip dscp set {dscp}", f"add rule {where} ip6 dscp set {dscp}"]


def nft_interface_problem(interface: str) -> str | None:
    """Why our rule cannot match exactly this interface by name, or None. nftables strings
    cannot hold a double quote, and a trailing * is its wildcard (it would match others)."""
    if '"' in interface or interface.endswith("*"):
        return (
            f"interface name {interface!r} cannot be matched exactly in an nftables rule "
            '(no " and no trailing *): rename it, or set dscp.enabled = false'
        )
    return None


def render_replace(layout: DscpLayout) -> str:
    """One transaction that makes our table exactly `layout` (created or replaced whole)."""
    name = f"{FAMILY} {TABLE}"
    lines = [f"add table {name}", f"delete table {name}", f"add table {name}"]
    for chain, dscp in sorted(layout.chain_dscp.items()):
        lines.append(f"add chain {name} {chain}")
        lines += chain_body(f"{FAMILY} {TABLE} {chain}", dscp)
    lines.append(f"add map {name} {PORT_MAP} {{ type inet_service : verdict; }}")
    if layout.port_chain:
        elements = ", ".join(
            f"{port} : jump {chain}" for port, chain in sorted(layout.port_chain.items())
        )
        lines.append(f"add element {name} {PORT_MAP} {{ {elements} }}")
    lines.append(
        f"add chain {name} {HOOK_CHAIN} "
        "{ type filter hook postrouting priority mangle; policy accept; }"
    )
    lines.append(
        f'add rule {name} {HOOK_CHAIN} oifname "{_nft_interface(layout.interface)}" '
        f"meta l4proto tcp tcp sport vmap @{PORT_MAP}"
    )
    return "\n".join(lines) + "\n"


def _nft_interface(interface: str) -> str:
    if problem := nft_interface_problem(interface):
        raise ConfigError(problem)
    return interface


def render_rotation(written: DscpLayout, desired: DscpLayout) -> str | None:
    """The fast path: only chain contents changed (same interface, chains and ports). None
    when anything else changed (then `render_replace`); "" when nothing changed."""
    if (
        written.interface != desired.interface
        or written.port_chain != desired.port_chain
        or written.chain_dscp.keys() != desired.chain_dscp.keys()
    ):
        return None
    lines: list[str] = []
    for chain, dscp in sorted(desired.chain_dscp.items()):
        if written.chain_dscp[chain] != dscp:
            lines.append(f"flush chain {FAMILY} {TABLE} {chain}")
            lines += chain_body(f"{FAMILY} {TABLE} {chain}", dscp)
    return "\n".join(lines) + "\n" if lines else ""


def parse_table(listing: Any) -> DscpLayout | None:
    """Our table as `nft -j list table inet tensorlights` shows it; None when it is not
    exactly of our shape (missing pieces, hand edits), which the caller repairs."""
    items = listing.get("nftables", []) if isinstance(listing, dict) else []
    chain_rules: dict[str, list[Any]] = {}
    chains: set[str] = set()
    port_chain: dict[int, str] = {}
    have_map = False
    for item in items:
        if "chain" in item:
            chains.add(item["chain"]["name"])
        elif "rule" in item:
            chain_rules.setdefault(item["rule"]["chain"], []).append(item["rule"]["expr"])
        elif "map" in item and item["map"].get("name") == PORT_MAP:
            have_map = True
            for port, verdict in item["map"].get("elem", []):
                if not isinstance(port, int) or "jump" not in verdict:
                    return None
                port_chain[port] = verdict["jump"]["target"]
    if not have_map or HOOK_CHAIN not in chains:
        return None
    interface = _hook_interface(chain_rules.get(HOOK_CHAIN, []))
    if interface is None:
        return None
    marks: dict[str, int] = {}
    for chain in chains - {HOOK_CHAIN}:
        dscp = chain_dscp(chain_rules.get(chain, []))
        if dscp is None:
            return None
        marks[chain] = dscp
    if not set(port_chain.values()) <= marks.keys():
        return None
    return DscpLayout(interface, marks, port_chain)


def _hook_interface(rules: list[Any]) -> str | None:
    if len(rules) != 1:
        return None
    interface = None
    has_vmap = False
    for expr in rules[0]:
        match = expr.get("match", {})
        if match.get("left", {}).get("meta", {}).get("key") == "oifname":
            interface = match.get("right")
        if "vmap" in expr and expr["vmap"].get("data") == f"@{PORT_MAP}":
            has_vmap = True
    return interface if has_vmap and isinstance(interface, str) else None


def chain_dscp(rules: list[Any]) -> int | None:
    """The DSCP a job chain sets, if it is exactly our two rules (IPv4 and IPv6)."""
    values: dict[str, int] = {}
    for expr_list in rules:
        for expr in expr_list:
            mangle = expr.get("mangle")
            if mangle is None:
                continue
            payload = mangle.get("key", {}).get("payload", {})
            value = mangle.get("value")
            if payload.get("field") == "dscp" and isinstance(value, int):
                values[payload.get("protocol", "")] = value
    if len(rules) != 2 or set(values) != {"ip", "ip6"} or len(set(values.values())) != 1:
        return None
    return values["ip"]
