"""The agent's status as a typed, immutable value: built from a pass record by the agent,
served as JSON on the status socket (`tensorlights-agent status --json` prints that JSON), and
read back into the same type by the CLI, the benchmark and the demo.

Times are Unix seconds (the agent converts from its monotonic clock once per pass).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tensorlights.errors import TransientError
from tensorlights.model import LinkState, LinkStatus, Mode

MAX_STATUS_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class ControllerLinkView:
    address: str
    link: LinkState


@dataclass(frozen=True)
class AppliedRotationView:
    """A green-light change this agent applied."""

    job: str
    since: float | None
    """When the job's slot began (the plan's or the policy's time)."""
    applied: float
    plan: int
    """The plan generation it followed (0: the local policy)."""


@dataclass(frozen=True)
class Light:
    """Who is green now and who is next (from the last pass)."""

    green: str | None
    green_since: float | None
    next: str | None
    next_at: float | None
    """None when the light does not move by time (static, pack)."""


@dataclass(frozen=True)
class LastPass:
    at: float
    duration_s: float
    kernel_ops: int
    full_resync: bool


@dataclass(frozen=True)
class Shaping:
    """What the last successful pass programmed."""

    last_pass: LastPass
    bands: Mapping[str, int]
    dscp: Mapping[str, int]
    order: tuple[str, ...]
    mode: Mode
    plan_generation: int
    discovery: Mapping[str, Any]
    """The discovery snapshot as `discover --json` shows it (views.snapshot_view)."""
    light: Light
    datapath: str = ""
    """The path the HTB tree runs on, and the NIC's hw-tc-offload (datapath/offload.py)."""


@dataclass(frozen=True)
class IterationView:
    first_done: float
    last_done: float
    last_done_monotonic: float
    spread_s: float
    period_s: float | None
    """None: the job's first measured iteration."""
    push_s: float
    connections: int
    pushed_bytes: int = 0
    """What the job's connections on this host sent in the iteration (a ring's rank: the
    bytes its steps sent; 0 in a status read from an agent older than this field)."""
    idle_before_s: float | None = None
    """From the previous iteration's end to this one's first push (the compute; None: not
    measured)."""
    count: int = 1
    """The job's iterations this one stands for: several where a ring's all-reduces were
    measured merged (then `period_s` is their mean, `pushed_bytes` their sum)."""


@dataclass(frozen=True)
class TelemetryView:
    iterations: Mapping[str, tuple[IterationView, ...]]
    error: str | None
    pack: Mapping[str, Any] | None = None
    """pack's guard and the loads it judged (policy pack only)."""


@dataclass(frozen=True)
class AgentStatus:
    version: str
    interface: str
    link_rate_bps: int | None
    policy: str
    interval_s: float
    standalone: bool
    host: str
    controller: ControllerLinkView | None
    healthy: bool
    health: str
    last_error: str
    recent_rotations: tuple[AppliedRotationView, ...] = ()
    shaping: Shaping | None = None
    """None before the first successful pass."""
    telemetry: TelemetryView | None = None
    """None with telemetry off."""

    @property
    def mode(self) -> Mode | None:
        return self.shaping.mode if self.shaping is not None else None

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "version": self.version,
            "interface": self.interface,
            "link_rate_bps": self.link_rate_bps,
            "policy": self.policy,
            "interval_s": self.interval_s,
            "standalone": self.standalone,
            "host": self.host,
            "controller": None
            if self.controller is None
            else {"address": self.controller.address, **asdict(self.controller.link)},
            "healthy": self.healthy,
            "health": self.health,
            "last_error": self.last_error,
            "rotations": {"recent": [asdict(r) for r in self.recent_rotations]},
        }
        if self.shaping is not None:
            shaping = self.shaping
            document.update(
                last_pass=asdict(shaping.last_pass),
                bands=dict(shaping.bands),
                dscp=dict(shaping.dscp),
                order=list(shaping.order),
                mode=shaping.mode.value,
                plan_generation=shaping.plan_generation,
                discovery=shaping.discovery,
                datapath=shaping.datapath,
            )
            document["rotations"].update(asdict(shaping.light))
        if self.telemetry is not None:
            document["telemetry"] = {
                job: [asdict(it) for it in iterations]
                for job, iterations in self.telemetry.iterations.items()
            }
            document["telemetry_error"] = self.telemetry.error
            if self.telemetry.pack is not None:
                document["pack"] = self.telemetry.pack
        return document

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> AgentStatus:
        rotations = document.get("rotations", {})
        link = document.get("controller")
        shaping = None
        if "last_pass" in document:
            shaping = Shaping(
                last_pass=LastPass(**document["last_pass"]),
                bands=document["bands"],
                dscp=document["dscp"],
                order=tuple(document["order"]),
                mode=Mode(document["mode"]),
                plan_generation=document["plan_generation"],
                discovery=document["discovery"],
                light=Light(
                    rotations.get("green"),
                    rotations.get("green_since"),
                    rotations.get("next"),
                    rotations.get("next_at"),
                ),
                datapath=document.get("datapath", ""),
            )
        telemetry = None
        if "telemetry" in document:
            telemetry = TelemetryView(
                iterations={
                    job: tuple(IterationView(**it) for it in items)
                    for job, items in document["telemetry"].items()
                },
                error=document.get("telemetry_error"),
                pack=document.get("pack"),
            )
        return cls(
            version=document["version"],
            interface=document["interface"],
            link_rate_bps=document["link_rate_bps"],
            policy=document["policy"],
            interval_s=document["interval_s"],
            standalone=document["standalone"],
            host=document["host"],
            controller=None if link is None else _link_view(link),
            healthy=document["healthy"],
            health=document["health"],
            last_error=document["last_error"],
            recent_rotations=tuple(AppliedRotationView(**r) for r in rotations.get("recent", [])),
            shaping=shaping,
            telemetry=telemetry,
        )


def _link_view(document: Mapping[str, Any]) -> ControllerLinkView:
    fields = {k: v for k, v in document.items() if k != "address"}
    fields["state"] = LinkStatus(fields["state"])
    return ControllerLinkView(document["address"], LinkState(**fields))


def read_status_document(path: Path, timeout_s: float = 5.0) -> dict[str, Any]:
    """The running agent's status as it sent it (JSON): `status --json`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        try:
            sock.connect(str(path))
        except FileNotFoundError:
            raise TransientError(
                f"no agent status socket at {path}: is the agent running?"
            ) from None
        except ConnectionRefusedError:
            raise TransientError(f"{path} exists but no agent listens on it") from None
        chunks = []
        total = 0
        while chunk := sock.recv(1 << 16):
            chunks.append(chunk)
            total += len(chunk)
            if total > MAX_STATUS_BYTES:
                raise TransientError("the agent's status is larger than 16 MiB")
    document: dict[str, Any] = json.loads(b"".join(chunks))
    return document


def read_status(path: Path, timeout_s: float = 5.0) -> AgentStatus | None:
    """The running agent's status; None while it is starting (before its first pass)."""
    return status_of(read_status_document(path, timeout_s))


def status_of(document: Mapping[str, Any]) -> AgentStatus | None:
    """A status document read; None while the agent is starting (before its first pass)."""
    if document.get("state") == "starting":
        return None
    return AgentStatus.from_json(document)
