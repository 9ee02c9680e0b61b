"""What the loop publishes after each pass: an immutable record of it, from which the status
is built when someone asks (the loop runs a pass or more a second; `status` rarely)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorlights import __version__
from tensorlights.agent.config import AgentConfig
from tensorlights.agent.reconcile import PassResult
from tensorlights.agent.status import (
    AgentStatus,
    AppliedRotationView,
    ControllerLinkView,
    IterationView,
    LastPass,
    Light,
    Shaping,
    TelemetryView,
)
from tensorlights.datapath.offload import datapath_path
from tensorlights.discovery.trust import JobVoucher
from tensorlights.model import Mode
from tensorlights.policy.bands import PackView
from tensorlights.policy.packing import JobLoad
from tensorlights.telemetry.straggler import Iteration
from tensorlights.views import snapshot_view


@dataclass(frozen=True)
class PassRecord:
    config: AgentConfig
    result: PassResult | None
    """The last successful pass (None before the first)."""
    last_error: str
    rotations: tuple[AppliedRotationView, ...]
    wall_offset: float
    """Unix time minus monotonic time when the record was made."""


@dataclass(frozen=True)
class LiveParts:
    """What the status reads at the moment it is asked for (other threads keep these)."""

    health: Callable[[], tuple[bool, str]]
    link: Callable[[], ControllerLinkView] | None
    telemetry: Callable[[], tuple[Mapping[str, Sequence[Iteration]], str]] | None
    """(recent iterations per job, the sampler's last error), None with telemetry off."""


def build_status(record: PassRecord, live: LiveParts) -> AgentStatus:
    config, result, offset = record.config, record.result, record.wall_offset

    def wall(monotonic: float | None) -> float | None:
        return None if monotonic is None else monotonic + offset

    healthy, health = live.health()
    shaping = None
    if result is not None:
        plan = result.plan
        shaping = Shaping(
            last_pass=LastPass(
                at=result.at + offset,
                duration_s=result.duration_s,
                kernel_ops=result.kernel_ops,
                full_resync=result.full_resync,
            ),
            bands=dict(plan.bands),
            dscp=(
                {job: config.dscp_bands[band] for job, band in plan.bands.items()}
                if config.dscp_enabled
                else {}
            ),
            order=tuple(plan.order),
            mode=Mode.PLAN if plan.generation else Mode.LOCAL,
            plan_generation=plan.generation,
            discovery={
                **snapshot_view(result.snapshot),
                "vouchers": [_voucher(v) for v in result.vouchers],
            },
            datapath=datapath_path(config.interface, result.offload),
            light=Light(
                green=plan.green,
                green_since=wall(plan.green_since),
                next=plan.order[1] if len(plan.order) > 1 else None,
                next_at=wall(plan.next_change_at),
            ),
        )
    telemetry = None
    if live.telemetry is not None:
        recent, error = live.telemetry()
        telemetry = TelemetryView(
            iterations={
                job: tuple(
                    IterationView(
                        first_done=it.first_done + offset,
                        last_done=it.last_done + offset,
                        last_done_monotonic=it.last_done,
                        spread_s=it.spread,
                        period_s=it.period,
                        push_s=it.push_seconds,
                        connections=it.connections,
                        pushed_bytes=it.pushed_bytes,
                        idle_before_s=it.idle_before_s,
                        count=it.count,
                    )
                    for it in iterations
                )
                for job, iterations in recent.items()
            },
            error=error,
            pack=_pack(result.pack, result.loads) if result and result.pack else None,
        )
    return AgentStatus(
        version=__version__,
        interface=config.interface,
        link_rate_bps=config.link_rate_bps,
        policy=config.policy.value,
        interval_s=config.interval_s,
        standalone=config.standalone,
        host=config.host_name,
        controller=live.link() if live.link is not None else None,
        healthy=healthy,
        health=health,
        last_error=record.last_error,
        recent_rotations=record.rotations,
        shaping=shaping,
        telemetry=telemetry,
    )


def _voucher(voucher: JobVoucher) -> dict[str, Any]:
    return {
        "job": voucher.job,
        "source": voucher.source.value,
        "user": voucher.user,
        "pods": [pod for pod, _ in voucher.pods],
    }


def _pack(view: PackView, loads: Mapping[str, JobLoad]) -> dict[str, Any]:
    """pack's guard and the loads it judged, as status --json shows them."""
    return {
        "max_slowdown": view.max_slowdown,
        "window_s": view.window_s,
        "bound_aimed_for": view.bound_aimed_for,
        "promoted_lag_s": dict(view.promoted_lag_s),
        "lag_s": dict(view.lag_s),
        "lag_allowed_s": dict(view.lag_allowed_s),
        "slack_s": dict(view.slack_s),
        "deadline_period_s": dict(view.deadline_period_s),
        "remaining_s": dict(view.remaining_s),
        "not_iterative": sorted(view.not_iterative),
        "idle": sorted(view.idle),
        "waits_for_siblings": sorted(view.waits_for_siblings),
        "iterations_inferred": dict(view.iterations_inferred),
        "measured_beside": sorted(view.measured_beside),
        "loads": {
            job: {
                "demand": load.demand,
                "link_s": load.link_s,
                "compute_s": load.compute_s,
                "answer_s": load.answer_s,
                "iterations": load.iterations,
                "pushes_read": load.pushes_in_reading,
                "settled": load.settled,
            }
            for job, load in loads.items()
        },
    }
