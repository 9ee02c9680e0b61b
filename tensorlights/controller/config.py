"""The controller's configuration: a TOML file (systemd/controller.toml is a commented
example), overridden by flags, validated whole before anything starts. Each parameter is
declared once, on its field (configspec)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorlights.configfile import address, enum_reader, path, text, tls_files
from tensorlights.configfile import flag as read_flag
from tensorlights.configspec import (
    allowed_keys,
    check_keys,
    check_ranges,
    duration_param,
    merge,
    param,
    read_fields,
    show_address,
)
from tensorlights.controller.planner import ClusterPolicy
from tensorlights.errors import ConfigError
from tensorlights.tls_files import TlsFiles

DEFAULT_CONFIG = Path("/etc/tensorlights/controller.toml")
DEFAULT_SOCKET = Path("/run/tensorlights-controller/tlctl.sock")


def _socket(value: Any, key: str) -> Path | None:
    path = text(value, key)
    return Path(path) if path else None


def _command(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ConfigError(f"{key} must be a non-empty list of strings")
    return tuple(value)


@dataclass(frozen=True)
class ControllerConfig:
    tls: TlsFiles = param(
        ("tls.ca", "tls.cert", "tls.key"),
        tls_files,
        "The CA that signs agents' certificates, the controller's certificate and its key.",
        key_flags=("--tls-ca", "--tls-cert", "--tls-key"),
    )
    listen: tuple[str, int] = param(
        "listen",
        address,
        "Agents' (and tlctl --controller's) mutual-TLS port.",
        default=("0.0.0.0", 9740),
        flag="--listen",
        metavar="HOST:PORT",
        show=show_address,
    )
    socket: Path | None = param(
        "socket",
        _socket,
        'tlctl\'s Unix socket ("" to disable).',
        default=DEFAULT_SOCKET,
        flag="--socket",
        metavar="PATH",
    )
    """The operator API for tlctl (None: TLS only)."""
    socket_group: str | None = param(
        "socket_group",
        text,
        "Group that may use the socket (mode 0660); none: the owner only (0600).",
        default=None,
    )
    metrics_address: tuple[str, int] = param(
        "metrics_address",
        address,
        "Where /metrics and /healthz are served.",
        default=("127.0.0.1", 9741),
        flag="--metrics-address",
        metavar="HOST:PORT",
        show=show_address,
    )
    state_dir: Path = param(
        "state_dir",
        path,
        "Where the incarnation number is kept across restarts.",
        default=Path("/var/lib/tensorlights-controller"),
        flag="--state-dir",
        metavar="DIR",
    )
    slot_s: float = duration_param("slot", "Rotation slot length (rotate).", 3.0, "--slot")
    lease_s: float = duration_param("lease", "How long a plan holds unrenewed.", 15.0, "--lease")
    policy: ClusterPolicy = param(
        "policy",
        enum_reader(ClusterPolicy),
        "rotate: a coordinated cycle of green slots; pack: one cluster-wide order by the "
        "demand agents measure.",
        default=ClusterPolicy.PACK,
        flag="--policy",
        choices=tuple(ClusterPolicy),
    )
    report_interval_s: float = duration_param("report_interval", "How often agents report.", 1.0)
    host_timeout_s: float = duration_param(
        "host_timeout", "A disconnected host's jobs are forgotten after this.", 30.0
    )
    slurm: bool = param(
        "sources.slurm.enabled",
        read_flag,
        "Poll Slurm (squeue --json).",
        default=False,
        flag="--slurm/--no-slurm",
    )
    slurm_command: tuple[str, ...] = param(
        "sources.slurm.command",
        _command,
        "The command that lists Slurm's jobs as JSON.",
        default=("squeue", "--json"),
    )
    slurm_interval_s: float = duration_param(
        "sources.slurm.interval", "How often Slurm is polled.", 5.0
    )
    jobs_file: Path | None = param(
        "sources.static.file",
        path,
        "Static jobs file (TOML): jobs no agent can identify by itself.",
        default=None,
        flag="--jobs-file",
        metavar="PATH",
    )
    kubernetes_url: str | None = param(
        "sources.kubernetes.url",
        text,
        "Kubernetes API server to poll for Kubeflow pods.",
        default=None,
        flag="--kubernetes-url",
        metavar="URL",
    )
    kubernetes_namespace: str = param(
        "sources.kubernetes.namespace", text, 'Namespace to watch ("" = all).', default=""
    )
    kubernetes_token_file: Path | None = param(
        "sources.kubernetes.token_file", path, "Service-account token file.", default=None
    )
    kubernetes_ca_file: Path | None = param(
        "sources.kubernetes.ca_file", path, "CA of the API server.", default=None
    )
    kubernetes_interval_s: float = duration_param(
        "sources.kubernetes.interval", "How often Kubernetes is polled.", 5.0
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        self.tls.read("tls")  # unreadable files: refuse to start
        if self.slot_s < 0.1:
            raise ConfigError("slot must be at least 100ms (agents switch within a few ms)")
        if self.lease_s < 3 * self.report_interval_s:
            raise ConfigError("lease must be at least three report intervals")


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> ControllerConfig:
    """File values, then the flags that were given (by file key; None = not given)."""
    values = merge(file_values, overrides)
    check_keys(values, allowed_keys(ControllerConfig))
    fields = read_fields(ControllerConfig, values)
    if "tls" not in fields:
        fields["tls"] = tls_files({}, "tls")  # says what is missing
    try:
        return ControllerConfig(**fields)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
