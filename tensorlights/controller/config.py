"""The controller's configuration: a TOML file (systemd/controller.toml is a commented
example), overridden by flags, validated whole before anything starts. Each parameter is
declared once, on its field (configspec)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorlights import configspec as spec
from tensorlights.configfile import integer, parse_address, text, tls_files
from tensorlights.controller.planner import ClusterPolicy
from tensorlights.errors import ConfigError
from tensorlights.tls_files import TlsFiles

DEFAULT_CONFIG = Path("/etc/tensorlights/controller.toml")
DEFAULT_SOCKET = Path("/run/tensorlights-controller/tlctl.sock")


def _socket(value: Any, key: str) -> Path | None:
    path = text(value, key)
    return Path(path) if path else None


def _endpoints(value: Any, key: str) -> tuple[str, ...]:
    """etcd client URLs: a TOML list, or one string with commas (the flag)."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ConfigError(f"{key} must be a list of etcd client URLs")
    urls = tuple(item.strip() for item in items if item.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"{key}: {url!r} is not an http:// or https:// URL")
    return urls


def _advertise(value: Any, key: str) -> str | None:
    address = text(value, key)
    if address:
        parse_address(address)
    return address or None


def _command(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
        raise ConfigError(f"{key} must be a non-empty list of strings")
    return tuple(value)


@dataclass(frozen=True)
class ControllerConfig:
    tls: TlsFiles = spec.param(
        ("tls.ca", "tls.cert", "tls.key"),
        tls_files,
        "The CA that signs agents' certificates, the controller's certificate and its key.",
        key_flags=("--tls-ca", "--tls-cert", "--tls-key"),
    )
    listen: tuple[str, int] = spec.address_param(
        "listen",
        "Agents' (and tlctl --controller's) mutual-TLS port.",
        ("0.0.0.0", 9740),
        "--listen",
    )
    handshake_timeout_s: float = spec.duration_param(
        "handshake_timeout",
        "A client that has not finished its TLS handshake by then is disconnected.",
        5.0,
        low=0.5,
        high=60.0,
    )
    max_connections: int = spec.param(
        "max_connections",
        integer,
        "TCP connections served at once (one per agent, plus tlctl); more are closed at once. "
        "Keep it under the unit's LimitNOFILE.",
        default=16384,
        check=lambda n: 1 <= n <= 1_000_000,
        rule="must be between 1 and 1000000",
    )
    idle_timeout_s: float = spec.duration_param(
        "idle_timeout",
        "A TCP connection with no call for this long is closed (agents report every second).",
        300.0,
        low=10.0,
        high=86400.0,
    )
    socket: Path | None = spec.path_param(
        "socket", 'tlctl\'s Unix socket ("" to disable).', DEFAULT_SOCKET, "--socket", _socket
    )
    """The operator API for tlctl (None: TLS only)."""
    socket_group: str | None = spec.text_param(
        "socket_group", "Group that may use the socket (mode 0660); none: the owner only.", None
    )
    metrics_address: tuple[str, int] = spec.address_param(
        "metrics_address",
        "Where /metrics and /healthz are served.",
        ("127.0.0.1", 9741),
        "--metrics-address",
    )
    state_dir: Path = spec.path_param(
        "state_dir",
        "Where the incarnation number is kept across restarts.",
        Path("/var/lib/tensorlights-controller"),
        "--state-dir",
    )
    slot_s: float = spec.duration_param(
        "slot",
        "Rotation slot length (rotate).",
        3.0,
        "--slot",
        low=0.1,
        high=3600.0,
        rule="must be at least 100ms (agents switch within a few ms) and at most 1h",
    )
    lease_s: float = spec.duration_param(
        "lease", "How long a plan holds unrenewed.", 15.0, "--lease", low=1.0, high=86400.0
    )
    policy: ClusterPolicy = spec.choice_param(
        "policy",
        ClusterPolicy,
        "rotate: a coordinated cycle of green slots; pack: one cluster-wide order by the "
        "demand agents measure.",
        ClusterPolicy.PACK,
        "--policy",
    )
    report_interval_s: float = spec.duration_param(
        "report_interval",
        "How often agents look for news to report (jobs, ports, a demand that moved, a "
        "rotation applied): news waits at most this long.",
        1.0,
        low=0.1,
        high=3600.0,
    )
    heartbeat_interval_s: float = spec.duration_param(
        "heartbeat_interval",
        "A report with no news is sent only this often: it refreshes what tlctl shows, and "
        "its reply renews the plan's lease (between them the plan stream does; a host's "
        "liveness is its stream's). Reports are most of the controller's cost: 60s suits "
        "10,000 hosts.",
        10.0,
        "--heartbeat-interval",
        low=0.1,
        high=3600.0,
    )
    host_timeout_s: float = spec.duration_param(
        "host_timeout",
        "A disconnected host's jobs are forgotten after this.",
        30.0,
        low=1.0,
        high=86400.0,
    )
    slurm: bool = spec.flag_param(
        "sources.slurm.enabled", "Poll Slurm (squeue --json).", False, "--slurm/--no-slurm"
    )
    slurm_command: tuple[str, ...] = spec.param(
        "sources.slurm.command",
        _command,
        "The command that lists Slurm's jobs as JSON.",
        default=("squeue", "--json"),
    )
    slurm_interval_s: float = spec.duration_param(
        "sources.slurm.interval", "How often Slurm is polled.", 5.0, low=0.1, high=3600.0
    )
    jobs_file: Path | None = spec.path_param(
        "sources.static.file",
        "Static jobs file (TOML): jobs no agent can identify by itself.",
        None,
        "--jobs-file",
    )
    kubernetes_url: str | None = spec.text_param(
        "sources.kubernetes.url",
        "Kubernetes API server whose Kubeflow pods to watch.",
        None,
        flag="--kubernetes-url",
        metavar="URL",
    )
    kubernetes_namespace: str = spec.text_param(
        "sources.kubernetes.namespace", 'Namespace to watch ("" = all).', ""
    )
    kubernetes_token_file: Path | None = spec.path_param(
        "sources.kubernetes.token_file", "Service-account token file.", None
    )
    kubernetes_ca_file: Path | None = spec.path_param(
        "sources.kubernetes.ca_file", "CA of the API server.", None
    )
    kubernetes_interval_s: float = spec.duration_param(
        "sources.kubernetes.interval",
        "At the latest, how often the watched pods are read again (a watch event wakes the "
        "controller at once).",
        5.0,
        low=0.1,
        high=3600.0,
    )

    etcd: tuple[str, ...] = spec.param(
        "ha.etcd",
        _endpoints,
        "etcd client URLs: run as one of several replicas, the leader elected in etcd (none: "
        "the only controller, no etcd needed).",
        default=(),
        flag="--etcd",
        metavar="URL,URL",
    )
    advertise: str | None = spec.param(
        "ha.advertise",
        _advertise,
        "With etcd: this replica's HOST:PORT as agents dial it (the other replicas send "
        "agents here while it leads).",
        default=None,
        flag="--advertise",
        metavar="HOST:PORT",
    )
    election_ttl_s: float = spec.duration_param(
        "ha.ttl",
        "With etcd: the leader's lease. A leader cut off from etcd stops leading within it, "
        "and another replica takes over after it.",
        5.0,
        "--ha-ttl",
        low=2.0,
        high=60.0,
    )
    etcd_prefix: str = spec.text_param(
        "ha.prefix", "With etcd: the keys' prefix.", "/tensorlights/controller"
    )

    def __post_init__(self) -> None:
        spec.check_ranges(self)
        self.tls.read("tls")  # unreadable files: refuse to start
        if self.lease_s < 3 * self.report_interval_s:
            raise ConfigError("lease must be at least three report intervals")
        if self.heartbeat_interval_s < self.report_interval_s:
            raise ConfigError("heartbeat_interval must be at least report_interval")
        if self.etcd:
            if self.advertise is None:
                raise ConfigError(
                    "ha.etcd needs ha.advertise: the HOST:PORT agents dial for this replica"
                )
            most = self.lease_s / 2 - self.report_interval_s
            if self.election_ttl_s > most:
                # A new leader plans within half a lease of the old one's last renewal.
                raise ConfigError(
                    "ha.ttl must leave a new leader time to plan before agents' plans expire: "
                    f"at most lease / 2 - report_interval ({most:g}s)"
                )


def build_config(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> ControllerConfig:
    """File values, then the flags that were given (by file key; None = not given)."""

    def rules(fields: dict[str, Any]) -> None:
        if "tls" not in fields:
            fields["tls"] = tls_files({}, "tls")  # says what is missing

    return spec.build(ControllerConfig, file_values, overrides, rules)
