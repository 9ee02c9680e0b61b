"""The controller's configuration: a TOML file (systemd/controller.toml is a commented
example), overridden by flags, validated whole before anything starts."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorlights.configfile import duration, flag, parse_address, section, text
from tensorlights.errors import ConfigError
from tensorlights.tls_files import TlsFiles

DEFAULT_CONFIG = Path("/etc/tensorlights/controller.toml")
DEFAULT_LISTEN = "0.0.0.0:9740"
DEFAULT_SOCKET = Path("/run/tensorlights-controller/tlctl.sock")
DEFAULT_METRICS = "127.0.0.1:9741"
DEFAULT_STATE_DIR = Path("/var/lib/tensorlights-controller")


@dataclass(frozen=True)
class ControllerConfig:
    tls: TlsFiles
    listen: tuple[str, int] = parse_address(DEFAULT_LISTEN)
    socket: Path | None = DEFAULT_SOCKET
    """The operator API for tlctl (None: TLS only)."""
    socket_group: str | None = None
    """Group that may use the socket (mode 0660); None: root only."""
    metrics_address: tuple[str, int] = parse_address(DEFAULT_METRICS)
    state_dir: Path = DEFAULT_STATE_DIR
    slot_s: float = 3.0
    lease_s: float = 15.0
    policy: str = "pack"
    """rotate: the coordinated cycle of slots; pack: one cluster-wide order by demand."""
    report_interval_s: float = 1.0
    host_timeout_s: float = 30.0
    slurm: bool = False
    slurm_command: tuple[str, ...] = ("squeue", "--json")
    slurm_interval_s: float = 5.0
    jobs_file: Path | None = None
    kubernetes_url: str | None = None
    kubernetes_namespace: str = ""
    kubernetes_token_file: Path | None = None
    kubernetes_ca_file: Path | None = None
    kubernetes_interval_s: float = 5.0

    def __post_init__(self) -> None:
        for name in (
            "slot_s",
            "lease_s",
            "report_interval_s",
            "host_timeout_s",
            "slurm_interval_s",
            "kubernetes_interval_s",
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{name.removesuffix('_s')} must be a positive duration")
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.slot_s < 0.1:
            raise ConfigError("slot must be at least 100ms (agents switch within a few ms)")
        if self.lease_s < 3 * self.report_interval_s:
            raise ConfigError("lease must be at least three report intervals")


POLICIES = ("rotate", "pack")

_KEYS = {
    "policy",
    "listen",
    "socket",
    "socket_group",
    "metrics_address",
    "state_dir",
    "slot",
    "lease",
    "report_interval",
    "host_timeout",
    "tls",
    "sources",
}
_TLS_KEYS = {"ca", "cert", "key"}
_SOURCE_KEYS = {"slurm", "static", "kubernetes"}


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> ControllerConfig:
    values = {**file_values, **{k: v for k, v in overrides.items() if v is not None}}
    unknown = set(values) - _KEYS
    if unknown:
        raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
    tls_table = section(values.get("tls", {}), "tls", _TLS_KEYS)
    missing = _TLS_KEYS - set(tls_table)
    if missing:
        raise ConfigError(
            f"[tls] needs {', '.join(sorted(missing))}: agents and the controller always use "
            "mutual TLS (scripts/dev_ca.py makes a development CA)"
        )
    tls = TlsFiles(*(Path(text(tls_table, key)) for key in ("ca", "cert", "key")))
    tls.read("tls")  # unreadable files: refuse to start
    sources = section(values.get("sources", {}), "sources", _SOURCE_KEYS)
    slurm = section(sources.get("slurm", {}), "sources.slurm", {"enabled", "command", "interval"})
    static = section(sources.get("static", {}), "sources.static", {"file"})
    kube = section(
        sources.get("kubernetes", {}),
        "sources.kubernetes",
        {"url", "namespace", "token_file", "ca_file", "interval"},
    )
    command = slurm.get("command", ["squeue", "--json"])
    if not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command):
        raise ConfigError("sources.slurm.command must be a non-empty list of strings")
    socket_value = text(values, "socket", str(DEFAULT_SOCKET))
    try:
        return ControllerConfig(
            tls=tls,
            listen=parse_address(text(values, "listen", DEFAULT_LISTEN)),
            socket=Path(socket_value) if socket_value else None,
            socket_group=text(values, "socket_group") if "socket_group" in values else None,
            metrics_address=parse_address(text(values, "metrics_address", DEFAULT_METRICS)),
            state_dir=Path(text(values, "state_dir", str(DEFAULT_STATE_DIR))),
            slot_s=duration(values, "slot", 3.0),
            lease_s=duration(values, "lease", 15.0),
            policy=text(values, "policy", "pack"),
            report_interval_s=duration(values, "report_interval", 1.0),
            host_timeout_s=duration(values, "host_timeout", 30.0),
            slurm=flag(slurm, "enabled", False),
            slurm_command=tuple(command),
            slurm_interval_s=duration(slurm, "interval", 5.0),
            jobs_file=Path(text(static, "file")) if "file" in static else None,
            kubernetes_url=text(kube, "url") if "url" in kube else None,
            kubernetes_namespace=text(kube, "namespace", ""),
            kubernetes_token_file=Path(text(kube, "token_file")) if "token_file" in kube else None,
            kubernetes_ca_file=Path(text(kube, "ca_file")) if "ca_file" in kube else None,
            kubernetes_interval_s=duration(kube, "interval", 5.0),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
