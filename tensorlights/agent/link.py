"""The agent's side of the controller link: what it registers as, the plans it receives
(moved onto the agent's monotonic clock as they arrive), the vouchers that come back with
each report (users resolved on this host) and what it reports after each pass."""

from __future__ import annotations

import logging
import queue
import statistics
import threading
from collections.abc import Callable, Mapping, Sequence

from tensorlights import __version__
from tensorlights.agent.config import AgentConfig, uid_of
from tensorlights.agent.reconcile import PassResult, shaped_jobs
from tensorlights.agent.status import ControllerLinkView
from tensorlights.discovery.trust import NO_SUCH_USER, JobVoucher
from tensorlights.model import (
    AppliedRotation,
    JobKind,
    LinkStatus,
    Mode,
    PlanRenewal,
    PlanSlots,
    Registration,
    ReportedJob,
    Voucher,
)
from tensorlights.policy.schedule import HostSchedule
from tensorlights.rpc.agent_client import ControllerLink
from tensorlights.telemetry.straggler import Iteration

log = logging.getLogger("tensorlights.agent")


class ControllerBinding:
    def __init__(
        self,
        config: AgentConfig,
        incarnation: int,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        wake: Callable[[], None],
        on_connected: Callable[[bool], None],
    ) -> None:
        assert config.controller is not None and config.controller_tls is not None
        self._address = config.controller
        self._clock = clock
        self._wall = wall_clock
        self._wake = wake
        self._plans: queue.SimpleQueue[HostSchedule] = queue.SimpleQueue()
        self._renewal: tuple[tuple[int, int], float] | None = None
        """The latest plan renewal: the version renewed, its lease's end (monotonic)."""
        self._lock = threading.Lock()
        self._vouchers: tuple[Voucher, ...] | None = None
        self._new_vouchers: tuple[JobVoucher, ...] | None = None
        registration = Registration(
            host=config.host_name,
            incarnation=incarnation,
            agent_version=__version__,
            interfaces=((config.interface, config.link_rate_bps or 0),),
            fallback_policy=config.policy.value,
        )
        self._link = ControllerLink(
            config.controller,
            config.controller_tls,
            config.controller_server_name,
            registration,
            self._plan_received,
            lambda state: on_connected(state.state is LinkStatus.CONNECTED),
            self._vouchers_received,
            self._renewal_received,
        )

    def start(self) -> None:
        self._link.start()

    def stop(self) -> None:
        self._link.stop()

    def _plan_received(self, plan: PlanSlots) -> None:
        """On the link's thread: times moved to our monotonic clock as the plan arrives."""
        self._plans.put(HostSchedule.from_plan(plan, self._clock(), self._wall()))
        self._wake()

    def _renewal_received(self, renewal: PlanRenewal) -> None:
        """On the link's thread, after a report: the lease runs from now."""
        with self._lock:
            self._renewal = (renewal.version, self._clock() + renewal.lease_s)

    def take_renewal(self) -> tuple[tuple[int, int], float] | None:
        """The latest renewal since the last call (plan version, lease end), else None."""
        with self._lock:
            renewal, self._renewal = self._renewal, None
        return renewal

    def _vouchers_received(self, vouchers: tuple[Voucher, ...]) -> None:
        """On the link's thread, after every report: news only when they changed."""
        with self._lock:
            if vouchers == self._vouchers:
                return
            self._vouchers = vouchers
            self._new_vouchers = tuple(map(resolve, vouchers))
        self._wake()

    def take_vouchers(self) -> tuple[JobVoucher, ...] | None:
        """The vouchers if they changed since the last call, else None."""
        with self._lock:
            vouchers, self._new_vouchers = self._new_vouchers, None
        return vouchers

    def take_plans(self) -> list[HostSchedule]:
        """Plans received since the last call, oldest first."""
        plans = []
        while not self._plans.empty():
            plans.append(self._plans.get_nowait())
        return plans

    def passed(self, result: PassResult, recent: Mapping[str, Sequence[Iteration]] | None) -> None:
        mode = Mode.PLAN if result.plan.generation else Mode.LOCAL
        self._link.update(reported_jobs(result, recent or {}), mode, "")

    def failed(self, message: str) -> None:
        self._link.update((), Mode.LOCAL, message)

    def applied(self, rotation: AppliedRotation) -> None:
        self._link.applied(rotation)

    def view(self) -> ControllerLinkView:
        return ControllerLinkView(self._address, self._link.state)


def resolve(voucher: Voucher) -> JobVoucher:
    """The voucher with its user's uid on this host (looked up now: users come and go)."""
    uid = None
    if voucher.user:
        uid = uid_of(voucher.user)
        if uid is None:
            log.warning(
                "the controller says job %s is user %r's, a user this host does not know: "
                "none of its processes can match",
                voucher.job,
                voucher.user,
            )
            uid = NO_SUCH_USER
    return JobVoucher(voucher.job, voucher.source, voucher.user, uid, voucher.pods)


def reported_jobs(
    result: PassResult, recent: Mapping[str, Sequence[Iteration]]
) -> tuple[ReportedJob, ...]:
    """The PS jobs this agent shapes (ports in its network namespace, and its pods' with
    pod shaping on; otherwise a PS seen in another namespace belongs to that namespace's
    host), with their telemetry."""
    snapshot = result.snapshot
    ports = snapshot.job_ports()
    kinds = snapshot.job_kinds()
    jobs = []
    for job in sorted(shaped_jobs(snapshot, result.pods)):
        tasks = [t for t in snapshot.tasks if t.job == job and (t.in_agent_netns or result.pods)]
        iterations = recent.get(job, [])
        spreads = [it.spread for it in iterations]
        periods = [it.period for it in iterations if it.period is not None]
        jobs.append(
            ReportedJob(
                job=job,
                ports=ports.get(job, frozenset()),
                processes=len(tasks),
                connections=sum(len(t.connections) for t in tasks),
                spread_s=statistics.median(spreads) if spreads else None,
                period_s=statistics.median(periods) if periods else None,
                demand=result.demands.get(job),
                kind=kinds.get(job, JobKind.PS),
                lag_s=result.starving.get(job),
                waits_for_siblings=job in result.waits_for_siblings,
                remaining_s=result.pack.remaining_s.get(job) if result.pack else None,
            )
        )
    return tuple(jobs)
