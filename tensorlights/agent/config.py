"""The agent's configuration: a TOML file, overridden by command-line flags, validated whole.

Every value is checked before anything is programmed; an unknown key is an error (a typo must
not silently fall back to a default). See systemd/agent.toml for a commented example.
"""

from __future__ import annotations

import math
import pwd
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from tensorlights import configspec as spec
from tensorlights.configfile import (
    integer,
    parse_address,
    section,
    split_addresses,
    tls_files,
)
from tensorlights.configfile import number as read_number
from tensorlights.configfile import text as read_text
from tensorlights.datapath.dataplane import Marking
from tensorlights.discovery.rules import DiscoveryRules, OperatorRule
from tensorlights.discovery.trust import Trust, TrustMode
from tensorlights.errors import ConfigError, LinkRateUnknownError
from tensorlights.model import DatapathSpec
from tensorlights.policy.bands import PolicyName
from tensorlights.policy.dscp_plan import (
    DEFAULT_BAND_DSCP,
    nft_interface_problem,
    validate_band_dscp,
)
from tensorlights.policy.packing import HORIZON_WINDOWS
from tensorlights.tls_files import TlsFiles
from tensorlights.units import parse_rate

E = TypeVar("E", bound=StrEnum)

DEFAULT_CONFIG = Path("/etc/tensorlights/agent.toml")
DEFAULT_METRICS_PORT = 9731
MIN_LINK_RATE = 1_000
MAX_LINK_RATE = 10**13
"""10 tbit: above any NIC, far below where the kernel's 64-bit byte rates overflow."""
DEFAULT_STATUS_SOCKET = Path("/run/tensorlights/agent.sock")
DEFAULT_STATE_DIR = Path("/var/lib/tensorlights")


class OnUnsupported(StrEnum):
    ERROR = "error"
    """Refuse to start (exit 1) when DSCP marking cannot work here (default)."""
    WARN = "warn"
    """Run without marking, with a loud warning and tensorlights_dscp_marking_enabled 0."""


class OnStop(StrEnum):
    RESTORE = "restore"
    """Remove our qdisc and put back the one that was there (default)."""
    LEAVE = "leave"
    """Leave the shaping in place for the next start to adopt (upgrades, restarts)."""


def _rate(value: Any, key: str) -> int:
    return parse_rate(read_text(value, key))


def uid_of(user: str) -> int | None:
    """The uid of the user so named on this host (None: no such user)."""
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        return None


def _uids(value: Any, key: str) -> frozenset[int]:
    """User names (looked up now) or numeric uids."""
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list of user names or uids")
    uids = set()
    for user in value:
        if isinstance(user, int) and not isinstance(user, bool) and user >= 0:
            uids.add(user)
        elif isinstance(user, str) and user:
            uid = uid_of(user)
            if uid is None:
                raise ConfigError(f"{key}: there is no user {user!r} on this host")
            uids.add(uid)
        else:
            raise ConfigError(f"{key}: {user!r} is neither a user name nor a uid")
    return frozenset(uids)


def _dscp_bands(value: Any, key: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be a list of DSCP code points")
    return validate_band_dscp(value)


@dataclass(frozen=True)
class AgentConfig:
    interface: str = spec.text_param(
        "interface",
        "Network interface whose egress is shaped, e.g. eth0.",
        None,
        flag="--interface",
        metavar="DEV",
        default_text="none: required, here or in the config file",
    )
    link_rate_bps: int | None = spec.param(
        "link_rate",
        _rate,
        "Link capacity, e.g. 200mbit, 10gbit.",
        default=None,
        check=lambda bits: MIN_LINK_RATE <= bits <= MAX_LINK_RATE,
        rule="must be between 1kbit and 10tbit",
        flag="--link-rate",
        metavar="RATE",
        default_text="the link's speed from the kernel",
    )
    """None: read the link speed from the kernel at start (fails clearly if it has none)."""
    policy: PolicyName = spec.choice_param(
        "policy",
        PolicyName,
        "fifo: observe only; static: fixed order (TL-One); rotate: the green light moves every "
        "interval (TL-RR); pack: order by measured demand with a starvation bound "
        "(max_slowdown, starvation_window).",
        PolicyName.PACK,
        "--policy",
    )
    interval_s: float = spec.duration_param(
        "interval", "Rotation slot (rotate).", 3.0, "--interval", low=0.1, high=3600.0
    )
    max_slowdown: float = spec.param(
        "max_slowdown",
        read_number,
        "pack: no job slowed more than this vs running alone, over its life so far (at "
        f"least starvation_window, looking back at most {HORIZON_WINDOWS} of them); a job "
        "whose processes declare its iterations (TENSORLIGHTS_ITERATIONS) over its whole run.",
        default=2.0,
        check=lambda v: math.isfinite(v) and v > 1,
        rule="must be a number above 1",
    )
    starvation_window_s: float = spec.duration_param(
        "starvation_window",
        "pack: the shortest span the slowdown is judged over (a job younger than it is "
        f"held to its allowance); the guard looks back at most {HORIZON_WINDOWS} of them.",
        120.0,
        low=1.0,
        high=86400.0,
    )
    standalone: bool = spec.flag_param(
        "standalone",
        "Decide on this host alone; --no-standalone follows the controller ([controller]).",
        True,
        "--standalone/--no-standalone",
        default_text="true, or false where a controller address is given",
    )
    controller: str | None = spec.text_param(
        "controller.address",
        "The controller's HOST:PORT (several replicas: HOST:PORT,HOST:PORT,...); giving it "
        "turns standalone off.",
        None,
        flag="--controller",
        metavar="HOST:PORT",
    )
    controller_tls: TlsFiles | None = spec.param(
        ("controller.ca", "controller.cert", "controller.key"),
        tls_files,
        "The CA, this host's client certificate and its key (mutual TLS); `{host}` in a path "
        "is the host name (one Secret holding every node's files, on Kubernetes).",
        default=None,
    )
    controller_server_name: str | None = spec.text_param(
        "controller.server_name",
        "The name the controller's certificate must carry.",
        None,
        default_text="the host part of the address",
    )
    host_name: str = spec.param(
        "controller.host",
        read_text,
        "The name this host registers as; its client certificate's common name.",
        default_factory=socket.gethostname,
        default_text="this machine's host name",
        flag="--host",
        metavar="NAME",
    )
    metrics_address: tuple[str, int] = spec.address_param(
        "metrics_address",
        "Where /metrics and /healthz are served.",
        ("127.0.0.1", DEFAULT_METRICS_PORT),
        "--metrics-address",
    )
    status_socket: Path = spec.path_param(
        "status_socket",
        "The local socket `tensorlights-agent status` reads.",
        DEFAULT_STATUS_SOCKET,
        "--status-socket",
    )
    state_dir: Path = spec.path_param(
        "state_dir",
        "Where the root qdisc we replaced is recorded for cleanup.",
        DEFAULT_STATE_DIR,
        "--state-dir",
    )
    on_stop: OnStop = spec.choice_param(
        "on_stop",
        OnStop,
        "On SIGTERM: restore the previous qdisc, or leave ours for the next start to adopt.",
        OnStop.RESTORE,
        "--on-stop",
    )
    scan_interval_s: float = spec.duration_param(
        "scan_interval",
        "Full discovery scan and reconcile cadence (re-reads every PS's sockets).",
        1.0,
        low=0.01,
        high=60.0,
    )
    poll_interval_s: float = spec.duration_param(
        "poll_interval",
        "Cheap checks between scans: descriptors of PS processes (a young one's new port, "
        "any one's new connection), and without process events new PIDs; a change makes "
        "the scan at once.",
        0.1,
        low=0.01,
        high=60.0,
    )
    process_events: bool = spec.flag_param(
        "process_events",
        "Learn new and exited processes from the kernel's process connector instead of "
        "listing /proc (needs the host's PID namespace; else the agent polls and says why).",
        True,
        "--process-events/--no-process-events",
    )
    resync_interval_s: float = spec.duration_param(
        "resync_interval",
        "Full read-back of the kernel state (repairs manual changes).",
        30.0,
        low=1.0,
        high=3600.0,
    )
    health_max_age_s: float = spec.duration_param(
        "health_max_age",
        "/healthz is 503 when the last good pass is older.",
        10.0,
        low=1.0,
        high=3600.0,
    )
    unmanaged_share: float = spec.param(
        "unmanaged_share",
        read_number,
        "Link share guaranteed to traffic of no job.",
        default=0.05,
    )
    take_over_foreign_qdisc: bool = spec.flag_param(
        "take_over_foreign_qdisc",
        "Replace another root qdisc (restored on cleanup).",
        False,
        "--take-over-foreign-qdisc/--no-take-over-foreign-qdisc",
    )
    pod_shaping: bool = spec.flag_param(
        "pod_shaping",
        "Also shape PS tasks in other network namespaces as pods whose traffic this host "
        "forwards (Kubernetes CNIs, routed or VXLAN): needs nftables. Off where other "
        "namespaces are other machines (an emulated cluster).",
        False,
        "--pod-shaping/--no-pod-shaping",
    )
    discovery: DiscoveryRules = spec.param(
        "discovery",
        lambda table, key: _discovery(table),
        "How PS processes are recognised ([discovery] and [[discovery.rule]]).",
        default_factory=DiscoveryRules,
        table=True,
    )
    trust: TrustMode = spec.choice_param(
        "trust",
        TrustMode,
        "Whose job claims get a band: resource-manager (what Slurm, or the controller's "
        "Kubernetes and jobs-file sources, vouch for; trusted_users) or any (every launcher "
        "variable; single-tenant hosts only).",
        TrustMode.RESOURCE_MANAGER,
        "--trust",
    )
    trusted_users: frozenset[int] = spec.param(
        "trusted_users",
        _uids,
        "Users (names or uids) whose processes' job claims are believed.",
        default=frozenset(),
        show=lambda uids: str(sorted(uids)),
    )
    dscp_enabled: bool = spec.flag_param(
        "dscp.enabled", "Mark PS packets with their band's DSCP (nftables).", True
    )
    dscp_bands: tuple[int, ...] = spec.param(
        "dscp.bands", _dscp_bands, "DSCP of bands 0 (green) .. 6.", default=DEFAULT_BAND_DSCP
    )
    """DSCP of bands 0..6 (0 = green)."""
    dscp_on_unsupported: OnUnsupported = spec.choice_param(
        "dscp.on_unsupported",
        OnUnsupported,
        "No nftables here: error refuses to start; warn runs unmarked.",
        OnUnsupported.ERROR,
    )
    telemetry_enabled: bool = spec.flag_param(
        "telemetry.enabled", "Straggler telemetry from the PS connections.", True
    )
    telemetry_sample_interval_s: float = spec.duration_param(
        "telemetry.sample_interval",
        "The slowest tcp_info sampling. Jobs whose workers answer on the push connections (all "
        "real frameworks measured) are sampled faster by themselves, a third of their compute "
        "gaps down to 5 ms; a job that does not is sampled at this: under half its compute.",
        0.1,
        low=0.005,
        high=10.0,
    )
    """The interval for jobs whose gaps are long or unknown (telemetry/sampler.py)."""
    telemetry_min_push_bytes: int = spec.param(
        "telemetry.min_push_bytes",
        integer,
        "Smaller writes are not parameter pushes.",
        default=16 * 1024,
        check=lambda v: v >= 1,
        rule="must be at least 1",
    )

    @property
    def rules(self) -> DiscoveryRules:
        """The discovery rules with the trust setting: what the scanner works by."""
        return discovery_rules_with_trust(self.discovery, self.trust, self.trusted_users)

    def __post_init__(self) -> None:
        if not self.interface:
            raise ConfigError("no interface: set interface in the config file or --interface")
        spec.check_ranges(self)
        if self.policy is PolicyName.PACK and not self.telemetry_enabled:
            raise ConfigError(
                "policy pack orders jobs by what telemetry measures: enable telemetry"
            )
        if self.health_max_age_s <= self.scan_interval_s:
            raise ConfigError("health_max_age must be longer than scan_interval")
        # The datapath's own checks (interface name, rates, shares), before anything runs.
        DatapathSpec(self.interface, self.link_rate_bps or 1, (), self.unmanaged_share)
        if self.dscp_enabled and (problem := nft_interface_problem(self.interface)):
            raise ConfigError(problem)
        if not self.standalone:
            if not self.controller:
                raise ConfigError(
                    "standalone = false needs the controller's address: [controller] address "
                    "or --controller HOST:PORT"
                )
            for address in split_addresses(self.controller):
                parse_address(address)
            if self.controller_tls is None:
                raise ConfigError(
                    "[controller] needs ca, cert and key: the link to the controller is always "
                    "mutual TLS (scripts/dev_ca.py makes a development CA)"
                )
            self.controller_tls.read("controller")


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> AgentConfig:
    """File values, then the flags that were given (by file key; None = not given), read by
    each parameter's declaration and validated whole. Absent keys keep their defaults."""

    def rules(fields: dict[str, Any]) -> None:
        # Giving the controller's address means following it, unless standalone says otherwise.
        fields.setdefault("standalone", "controller" not in fields)
        fields.setdefault("interface", "")
        tls = fields.get("controller_tls")
        if tls is not None:
            fields["controller_tls"] = tls.for_host(fields.get("host_name") or socket.gethostname())

    return spec.build(AgentConfig, file_values, overrides, rules)


def marking(config: AgentConfig) -> Marking | None:
    """DSCP marking as configured (None: off)."""
    if not config.dscp_enabled:
        return None
    return Marking(config.dscp_bands, required=config.dscp_on_unsupported is OnUnsupported.ERROR)


def load_config_function(
    file_reader: Callable[[], Mapping[str, Any]], overrides: Mapping[str, Any]
) -> Callable[[], AgentConfig]:
    """A loader that re-reads the file each call (SIGHUP) with the command line on top."""

    def load() -> AgentConfig:
        return build_config(file_reader(), overrides)

    return load


def discovery_rules(
    file_values: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
) -> DiscoveryRules:
    """What `discover` needs of a config file (with flags on top): the [discovery] section
    and the trust setting."""
    fields = {item.name: spec.default_of(item) for item, _ in spec.params(AgentConfig)}
    fields.update(spec.read_fields(AgentConfig, spec.merge(file_values, overrides or {})))
    return discovery_rules_with_trust(fields["discovery"], fields["trust"], fields["trusted_users"])


def discovery_rules_with_trust(
    rules: DiscoveryRules, mode: TrustMode, trusted_uids: frozenset[int]
) -> DiscoveryRules:
    return replace(rules, trust=Trust(mode, trusted_uids))


def with_link_rate(config: AgentConfig, sysfs: Path = Path("/sys/class/net")) -> AgentConfig:
    """The config with its link rate known: configured, else the link's speed from sysfs."""
    if config.link_rate_bps is not None:
        return config
    try:
        mbit = int((sysfs / config.interface / "speed").read_text().strip())
    except (OSError, ValueError):
        mbit = -1
    if mbit <= 0:
        raise LinkRateUnknownError(
            f"{config.interface} reports no link speed (virtual or down): set link_rate in the "
            "config or --link-rate, e.g. --link-rate 10gbit"
        )
    return replace(config, link_rate_bps=mbit * 1_000_000)


def _int_set(values: Mapping[str, Any], key: str) -> frozenset[int] | None:
    if key not in values:
        return None
    items = values[key]
    if not isinstance(items, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in items
    ):
        raise ConfigError(f"discovery.{key} must be a list of non-negative integers")
    return frozenset(items)


_DISCOVERY_KEYS = {
    "torch_ps_roles",
    "torch_ps_ranks",
    "slurm_ps_procids",
    "slurm_spank_dir",
    "rule",
}
_RULE_KEYS = {"name", "role", "job", "exe", "cmdline_regex", "env"}


def _discovery(table: Any) -> DiscoveryRules:
    table = section(table, "discovery", _DISCOVERY_KEYS)
    rules = DiscoveryRules()
    roles = table.get("torch_ps_roles")
    if roles is not None:
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ConfigError("discovery.torch_ps_roles must be a list of strings")
        rules = replace(rules, torch_ps_roles=frozenset(r.lower() for r in roles))
    ranks = _int_set(table, "torch_ps_ranks")
    if ranks is not None:
        rules = replace(rules, torch_ps_ranks=ranks)
    procids = _int_set(table, "slurm_ps_procids")
    if procids is not None:
        rules = replace(rules, slurm_ps_procids=procids)
    spank_dir = table.get("slurm_spank_dir")
    if spank_dir is not None:
        if not isinstance(spank_dir, str) or not spank_dir.startswith("/"):
            raise ConfigError(
                "discovery.slurm_spank_dir must be an absolute path (the Slurm plugin's dir=)"
            )
        rules = replace(rules, slurm_spank_dir=spank_dir)
    operator_rules = []
    for raw in table.get("rule", []):
        if not isinstance(raw, dict) or set(raw) - _RULE_KEYS:
            raise ConfigError(f"[[discovery.rule]] keys must be among {sorted(_RULE_KEYS)}")
        env = raw.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ConfigError("discovery.rule.env must map names to strings")
        operator_rules.append(
            OperatorRule(
                name=str(raw.get("name", "")),
                role=str(raw.get("role", "")),
                job=str(raw.get("job", "")),
                exe=raw.get("exe"),
                cmdline_regex=raw.get("cmdline_regex"),
                env=env,
            )
        )
    return replace(rules, operator_rules=tuple(operator_rules))
