"""The controller's state machine on one asyncio loop: registry + planner + plan delivery.

Every change that may move membership marks the plan dirty; one task recomputes it (at most
every `REPLAN_GAP_S`, so a burst of reports costs one computation) and wakes the WatchPlan
streams of the hosts whose plan changed. Sources are polled in threads (squeue and HTTP
block) and keep their last good answer when a poll fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from tensorlights.controller.metrics import ControllerMetrics
from tensorlights.controller.planner import HostRotationView, Planner
from tensorlights.controller.registry import (
    HostRecord,
    JobView,
    Registry,
    SourceJob,
)
from tensorlights.errors import TensorLightsError
from tensorlights.model import HostReport, PlanSlots, Registration, Voucher

log = logging.getLogger("tensorlights.controller")

REPLAN_GAP_S = 0.05
RESEND_SHARE = 0.8
"""A plan stream resends its plan, unchanged, after this share of a lease without a renewal
(each reply to an agent's report renews it): a fifth of the lease is left for it to arrive.
With the defaults (heartbeat 10 s, lease 15 s) the heartbeats' replies renew every plan and
the streams stay quiet; with heartbeats further apart (a large cluster's setting) the
streams renew the plans: a plan sent on an open stream costs the controller about a tenth of
what a report does (2026-11-26: ~0.1 ms against 0.5-1 ms of a core on the 2-core VM)."""


class NotLeader(TensorLightsError):
    """This replica follows: agents belong with the leader (FAILED_PRECONDITION, the
    leader's address in the `tl-leader` trailing metadata)."""

    def __init__(self, leader: str | None) -> None:
        where = f"the leader is at {leader}" if leader else "no leader is elected right now"
        super().__init__(f"this controller replica does not lead: {where}")
        self.leader = leader


class Source(Protocol):
    name: str

    def jobs(self) -> list[SourceJob]: ...


@runtime_checkable
class WatchedSource(Source, Protocol):
    """A source that learns of changes itself (a Kubernetes watch): it calls `wake()` from
    its own thread, and the controller reads `jobs()` at once instead of at the next poll."""

    def subscribe(self, wake: Callable[[], None]) -> None: ...

    def close(self) -> None:
        """Ends the watch (the controller is stopping)."""


@dataclass(frozen=True)
class HostRotations:
    view: HostRotationView
    recent: tuple[tuple[str, float, int], ...]
    """(green, applied at, plan generation) as the agent reported, newest last."""


def plan_update(registry: Registry, planner: Planner, now: float) -> set[str]:
    """The planner's update from what the registry knows at `now` (every replan: the
    controller's, the simulator's, the benchmark's); the hosts whose plan changed."""
    return planner.update(
        registry.membership(),
        set(registry.hosts),
        registry.demands(),
        registry.arrival_order(),
        registry.end_times(),
        registry.iterative(),
        registry.young(now),
        registry.starving(),
        registry.remaining(),
    )


class Controller:
    def __init__(
        self,
        registry: Registry,
        planner: Planner,
        metrics: ControllerMetrics,
        report_interval_s: float,
        clock: Callable[[], float] = time.time,
        heartbeat_interval_s: float | None = None,
    ) -> None:
        self.registry = registry
        self.planner = planner
        self.metrics = metrics
        self.report_interval_s = report_interval_s
        self.heartbeat_interval_s = heartbeat_interval_s or report_interval_s
        """Agents send a report with no news only this often."""
        self._clock = clock
        self._dirty = asyncio.Event()
        self._plan_changed: dict[str, asyncio.Event] = {}
        self._renewed: dict[str, tuple[tuple[int, int], float]] = {}
        """Per host: the plan version its stream sent last, and when its lease was last
        renewed (monotonic seconds), by the stream or by a report's reply."""
        self._planned_version = -1
        self.changed = asyncio.Condition()
        """Notified after every replan (the operator Watch stream waits on it)."""
        self.leading = True
        """False while another replica leads (with etcd): no plans, agents sent there."""
        self.leader: str | None = None
        """The leader's address, as agents dial it (with etcd)."""

    # Leadership (with etcd; one replica alone always leads) -------------------------------

    def lead(self, planner: Planner, address: str) -> None:
        """This replica leads from now, planning with `planner` (its term's incarnation)."""
        self.registry.drop_hosts()
        self.planner = planner
        self.leading, self.leader = True, address
        self._planned_version = -1
        self.metrics.leader.set(1)
        self.metrics.terms.inc()
        self._dirty.set()

    def follow(self, leader: str | None) -> None:
        """Another replica leads (or none, for now): stop planning and end every plan stream
        (their agents register again and are sent to the leader)."""
        self.leader = leader
        if not self.leading:
            return
        self.leading = False
        self.metrics.leader.set(0)
        self.registry.drop_hosts()
        for event in self._plan_changed.values():
            event.set()

    def now(self) -> float:
        return self._clock()

    # Agents -------------------------------------------------------------------------------

    def register(self, registration: Registration) -> HostRecord:
        if not self.leading:
            raise NotLeader(self.leader)
        record = self.registry.register(registration, self._clock())
        self.metrics.registrations.inc()
        log.info(
            "host %s registered (agent %s, incarnation %d)",
            record.host,
            registration.agent_version,
            registration.incarnation,
        )
        self._plan_changed.setdefault(record.host, asyncio.Event()).set()  # old stream: re-check
        self._mark()
        return record

    def report(self, report: HostReport) -> HostRecord:
        record = self.registry.report(report, self._clock())
        self.metrics.reports.inc()
        self._mark()
        return record

    def stream_opened(self, record: HostRecord) -> asyncio.Event:
        self.registry.set_connected(record.session, True, self._clock())
        self._mark()
        event = self._plan_changed.setdefault(record.host, asyncio.Event())
        event.clear()
        return event

    def stream_closed(self, record: HostRecord) -> None:
        if self.registry.hosts.get(record.host) is record:
            self.registry.set_connected(record.session, False, self._clock())
            self._renewed.pop(record.host, None)
            self._mark()

    def plan_sent(self, host: str, plan: PlanSlots) -> None:
        """The host's stream sent `plan` (its lease runs from now)."""
        self._renewed[host] = (plan.version, time.monotonic())

    def renewing(self, host: str) -> PlanSlots | None:
        """The host's plan if a report's reply may renew its lease: the version its stream
        sent last (a newer one is on its way: the stream carries it, and its lease)."""
        renewed = self._renewed.get(host)
        if not self.leading or renewed is None:
            return None
        plan = self.planner.plan_for(host)
        if plan.version != renewed[0]:
            return None
        self._renewed[host] = (plan.version, time.monotonic())
        return plan

    def resend_at(self, host: str) -> float:
        """When the host's stream sends its plan again, unchanged, to renew its lease:
        RESEND_SHARE of a lease after the last renewal (by the stream, or by a report's
        reply)."""
        renewed = self._renewed.get(host)
        return (renewed[1] if renewed else -math.inf) + RESEND_SHARE * self.planner.lease_s

    def vouchers_for(self, host: str) -> tuple[Voucher, ...]:
        return self.registry.vouchers_for(host)

    def plan_for(self, host: str) -> PlanSlots:
        return self.planner.plan_for(host)

    def current(self, record: HostRecord) -> bool:
        """Whether `record` is still the host's session (a re-registration replaces it)."""
        return self.registry.hosts.get(record.host) is record

    # Planning -----------------------------------------------------------------------------

    def _mark(self) -> None:
        if self.registry.version != self._planned_version:
            self._dirty.set()

    def replan(self) -> set[str]:
        """On the event loop: the hosts whose plan changed. (Tried in a worker thread, so
        that reports would be answered during a 10,000-host replan: with the interpreter
        shared between the two, 1,000 agents' report latency went from p50 80 / p99 537 ms
        to 257 / 1,544 ms, scripts/bench_controller.py agents --agents 1000 --churn 10.)"""
        for host in self.registry.expire(self._clock()):
            log.info("host %s forgotten: disconnected for over the host timeout", host)
        self._planned_version = self.registry.version
        started = time.perf_counter()
        changed = plan_update(self.registry, self.planner, self._clock())
        if changed:
            self.metrics.plan_seconds.observe(time.perf_counter() - started)
            self.metrics.generation.set(self.planner.generation)
            for host in changed:
                self._plan_changed.setdefault(host, asyncio.Event()).set()
        records = self.registry.hosts.values()
        self.metrics.hosts.set(sum(r.connected for r in records))
        self.metrics.jobs.set(len(self.planner.schedule.green_slots))
        self.metrics.slots.set(len(self.planner.schedule.slots))
        return changed

    async def replan_loop(self) -> None:
        while True:
            # Also when nothing happens: disconnected hosts expire.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.report_interval_s)
            self._dirty.clear()
            if self.leading:
                self.replan()
            async with self.changed:
                self.changed.notify_all()
            await asyncio.sleep(REPLAN_GAP_S)

    async def source_loop(self, source: Source, interval_s: float) -> None:
        failing = False
        woken = asyncio.Event()
        if isinstance(source, WatchedSource):
            loop = asyncio.get_running_loop()

            def wake() -> None:  # from the source's thread
                loop.call_soon_threadsafe(woken.set)

            source.subscribe(wake)
        while True:
            try:
                jobs = await asyncio.to_thread(source.jobs)
            except TensorLightsError as exc:
                self.metrics.source_errors.labels(source.name).inc()
                if not failing:
                    log.warning("source %s failed (keeping its last jobs): %s", source.name, exc)
                failing = True
            else:
                if failing:
                    log.info("source %s recovered", source.name)
                failing = False
                self.registry.set_source(source.name, jobs)
                self.metrics.source_success.labels(source.name).set(self._clock())
                self._mark()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), interval_s)
            woken.clear()

    # Operator views -----------------------------------------------------------------------

    def jobs(self) -> list[tuple[JobView, float]]:
        """Each job with its share of the cycle as green."""
        return [(job, self.planner.schedule.share(job.job)) for job in self.registry.jobs()]

    def hosts(self) -> Sequence[HostRecord]:
        return sorted(self.registry.hosts.values(), key=lambda r: r.host)

    def rotations(self, host: str = "", upcoming: int = 3) -> list[HostRotations]:
        now = self._clock()
        hosts = [h for h in sorted(self.registry.hosts) if not host or h == host]
        return [
            HostRotations(
                view=self.planner.rotation(name, now, upcoming),
                recent=tuple(
                    (r.green, r.applied_at, r.generation) for r in self.registry.hosts[name].recent
                ),
            )
            for name in hosts
        ]
