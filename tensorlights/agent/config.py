"""The agent's configuration: a TOML file, overridden by command-line flags, validated whole.

Every value is checked before anything is programmed; an unknown key is an error (a typo must
not silently fall back to a default). See systemd/agent.toml for a commented example.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from tensorlights.configfile import choice as _choice
from tensorlights.configfile import duration as _duration
from tensorlights.configfile import flag as _flag
from tensorlights.configfile import number as _number
from tensorlights.configfile import parse_address
from tensorlights.configfile import section as _section
from tensorlights.configfile import text as _text
from tensorlights.discovery.rules import DiscoveryRules, OperatorRule
from tensorlights.errors import ConfigError, LinkRateUnknownError
from tensorlights.model import DatapathSpec
from tensorlights.policy.bands import PolicyName
from tensorlights.policy.dscp_plan import DEFAULT_BAND_DSCP, validate_band_dscp
from tensorlights.tls_files import TlsFiles
from tensorlights.units import parse_rate

E = TypeVar("E", bound=StrEnum)

DEFAULT_CONFIG = Path("/etc/tensorlights/agent.toml")
DEFAULT_METRICS_PORT = 9731
DEFAULT_METRICS_ADDRESS = f"127.0.0.1:{DEFAULT_METRICS_PORT}"
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


@dataclass(frozen=True)
class AgentConfig:
    interface: str
    link_rate_bps: int | None = None
    """None: read the link speed from the kernel at start (fails clearly if it has none)."""
    policy: PolicyName = PolicyName.PACK
    interval_s: float = 3.0
    max_slowdown: float = 2.0
    """pack: the starvation bound, a job's slowdown vs running alone."""
    starvation_window_s: float = 120.0
    """pack: the window the slowdown is measured over."""
    standalone: bool = True
    controller: str | None = None
    """The controller's HOST:PORT (with standalone = false)."""
    controller_tls: TlsFiles | None = None
    controller_server_name: str | None = None
    """The name the controller's certificate must carry (default: the address's host)."""
    host_name: str = field(default_factory=socket.gethostname)
    """The name this host registers as; its client certificate's common name."""
    metrics_address: tuple[str, int] = ("127.0.0.1", DEFAULT_METRICS_PORT)
    status_socket: Path = DEFAULT_STATUS_SOCKET
    state_dir: Path = DEFAULT_STATE_DIR
    on_stop: OnStop = OnStop.RESTORE
    scan_interval_s: float = 0.25
    resync_interval_s: float = 30.0
    health_max_age_s: float = 10.0
    unmanaged_share: float = 0.05
    take_over_foreign_qdisc: bool = False
    discovery: DiscoveryRules = field(default_factory=DiscoveryRules)
    dscp_enabled: bool = True
    dscp_bands: tuple[int, ...] = DEFAULT_BAND_DSCP
    """DSCP of bands 0..6 (0 = green)."""
    dscp_on_unsupported: OnUnsupported = OnUnsupported.ERROR
    telemetry_enabled: bool = True
    telemetry_sample_interval_s: float = 0.1
    """Must be under half the workers' compute time to see every push apart."""
    telemetry_min_push_bytes: int = 16 * 1024

    def __post_init__(self) -> None:
        if not self.interface:
            raise ConfigError("no interface: set interface in the config file or --interface")
        if not (math.isfinite(self.max_slowdown) and self.max_slowdown > 1):
            raise ConfigError(f"max_slowdown must be a number above 1, got {self.max_slowdown}")
        for name in (
            "interval_s",
            "starvation_window_s",
            "scan_interval_s",
            "resync_interval_s",
            "health_max_age_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name.removesuffix('_s')} must be a positive duration")
        if not (
            math.isfinite(self.telemetry_sample_interval_s) and self.telemetry_sample_interval_s > 0
        ):
            raise ConfigError("telemetry.sample_interval must be a positive duration")
        if self.policy is PolicyName.PACK and not self.telemetry_enabled:
            raise ConfigError(
                "policy pack orders jobs by what telemetry measures: enable telemetry"
            )
        if self.telemetry_min_push_bytes < 1:
            raise ConfigError("telemetry.min_push_bytes must be at least 1")
        if self.health_max_age_s <= self.scan_interval_s:
            raise ConfigError("health_max_age must be longer than scan_interval")
        # The datapath's own checks (interface name, rates, shares), before anything runs.
        DatapathSpec(self.interface, self.link_rate_bps or 1, (), self.unmanaged_share)
        if not self.standalone:
            if not self.controller:
                raise ConfigError(
                    "standalone = false needs the controller's address: [controller] address "
                    "or --controller HOST:PORT"
                )
            parse_address(self.controller)
            if self.controller_tls is None:
                raise ConfigError(
                    "[controller] needs ca, cert and key: the link to the controller is always "
                    "mutual TLS (scripts/dev_ca.py makes a development CA)"
                )
            self.controller_tls.read("controller")


_FILE_KEYS = {
    "interface",
    "link_rate",
    "policy",
    "interval",
    "max_slowdown",
    "starvation_window",
    "standalone",
    "controller",
    "metrics_address",
    "status_socket",
    "state_dir",
    "on_stop",
    "scan_interval",
    "resync_interval",
    "health_max_age",
    "unmanaged_share",
    "take_over_foreign_qdisc",
    "discovery",
    "dscp",
    "telemetry",
}
_CONTROLLER_KEYS = {"address", "ca", "cert", "key", "server_name", "host"}
_TELEMETRY_KEYS = {"enabled", "sample_interval", "min_push_bytes"}
_DSCP_KEYS = {"enabled", "bands", "on_unsupported"}
_DISCOVERY_KEYS = {"torch_ps_roles", "torch_ps_ranks", "slurm_ps_procids", "rule"}
_RULE_KEYS = {"name", "role", "job", "exe", "cmdline_regex", "env"}


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> AgentConfig:
    """File values, then the flags that were given (None = not given), validated."""
    values = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    unknown = set(values) - _FILE_KEYS
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
    controller = _section(file_values.get("controller", {}), "controller", _CONTROLLER_KEYS)
    if overrides.get("controller") is not None:  # --controller HOST:PORT
        controller = {**controller, "address": overrides["controller"]}
    try:
        return AgentConfig(
            interface=_text(values, "interface", ""),
            link_rate_bps=parse_rate(_text(values, "link_rate")) if "link_rate" in values else None,
            policy=_choice(PolicyName, values.get("policy", "pack"), "policy"),
            interval_s=_duration(values, "interval", 3.0),
            max_slowdown=_number(values, "max_slowdown", 2.0),
            starvation_window_s=_duration(values, "starvation_window", 120.0),
            standalone=_flag(values, "standalone", "address" not in controller),
            **_controller(controller),
            metrics_address=parse_address(
                _text(values, "metrics_address", DEFAULT_METRICS_ADDRESS)
            ),
            status_socket=Path(_text(values, "status_socket", str(DEFAULT_STATUS_SOCKET))),
            state_dir=Path(_text(values, "state_dir", str(DEFAULT_STATE_DIR))),
            on_stop=_choice(OnStop, values.get("on_stop", "restore"), "on_stop"),
            scan_interval_s=_duration(values, "scan_interval", 0.25),
            resync_interval_s=_duration(values, "resync_interval", 30.0),
            health_max_age_s=_duration(values, "health_max_age", 10.0),
            unmanaged_share=_number(values, "unmanaged_share", 0.05),
            take_over_foreign_qdisc=_flag(values, "take_over_foreign_qdisc", False),
            discovery=_discovery(values.get("discovery", {})),
            **_dscp(values.get("dscp", {})),
            **_telemetry(values.get("telemetry", {})),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def discovery_rules(file_values: Mapping[str, Any]) -> DiscoveryRules:
    """Only the [discovery] section of a config file (what `discover` needs)."""
    return _discovery(file_values.get("discovery", {}))


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


def _discovery(table: Any) -> DiscoveryRules:
    table = _section(table, "discovery", _DISCOVERY_KEYS)
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


def _controller(table: dict[str, Any]) -> dict[str, Any]:
    tls_keys = {"ca", "cert", "key"} & set(table)
    if tls_keys and tls_keys != {"ca", "cert", "key"}:
        raise ConfigError("[controller] needs all of ca, cert and key, or none")
    values: dict[str, Any] = {
        "controller": _text(table, "address") if "address" in table else None,
        "controller_tls": (
            TlsFiles(*(Path(_text(table, key)) for key in ("ca", "cert", "key")))
            if tls_keys
            else None
        ),
        "controller_server_name": _text(table, "server_name") if "server_name" in table else None,
    }
    if "host" in table:
        values["host_name"] = _text(table, "host")
    return values


def _dscp(table: Any) -> dict[str, Any]:
    table = _section(table, "dscp", _DSCP_KEYS)
    bands = table.get("bands", list(DEFAULT_BAND_DSCP))
    if not isinstance(bands, list):
        raise ConfigError("dscp.bands must be a list of DSCP code points")
    return {
        "dscp_enabled": _flag(table, "enabled", True),
        "dscp_bands": validate_band_dscp(bands),
        "dscp_on_unsupported": _choice(
            OnUnsupported, table.get("on_unsupported", "error"), "dscp.on_unsupported"
        ),
    }


def _telemetry(table: Any) -> dict[str, Any]:
    table = _section(table, "telemetry", _TELEMETRY_KEYS)
    min_push = table.get("min_push_bytes", 16 * 1024)
    if isinstance(min_push, bool) or not isinstance(min_push, int):
        raise ConfigError("telemetry.min_push_bytes must be an integer")
    return {
        "telemetry_enabled": _flag(table, "enabled", True),
        "telemetry_sample_interval_s": _duration(table, "sample_interval", 0.1),
        "telemetry_min_push_bytes": min_push,
    }
