"""The job registry: what every source says, merged (pure; time comes in as an argument).

Sources:
  agent       each host's agent reports the PS jobs it discovered there (the PS hosts of a
              job are the hosts that report it: the authority on where PS processes run)
  slurm       running jobs and their nodes (`slurm/<id>`, the id discovery gives their tasks)
  static      a jobs file: job -> PS hosts, for jobs no agent can identify by itself
  kubernetes  Kubeflow pods: job -> PS nodes and all nodes

Each report's reply tells the host's agent what the sources vouch for there (`vouchers_for`):
a Slurm job's or a jobs-file job's user on its nodes, a Kubeflow job's pods on their node.

A host's session starts with its registration. A registration older than the current one
(lower agent incarnation) and a report whose seq does not grow are replays and are refused
without a change. A host whose agent disconnected keeps its jobs for `host_timeout` (a
restarting agent does not reshuffle the cluster) and is forgotten after it.
"""

from __future__ import annotations

import secrets
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tensorlights.model import (
    AppliedRotation,
    HostReport,
    JobKind,
    Mode,
    Registration,
    ReportedJob,
    Voucher,
    VoucherSource,
    jobs_moved,
)
from tensorlights.policy.packing import MEASURE_GRACE_S

SOURCES = ("agent", "slurm", "static", "kubernetes")
HISTORY = 20


class StaleMessage(Exception):
    """A replayed or out-of-order registration or report (FAILED_PRECONDITION)."""


class FutureIncarnation(StaleMessage):
    """A registration whose agent start lies ahead of the controller's clock: taken, it would
    lock out every later start of the real agent (FAILED_PRECONDITION)."""


MAX_INCARNATION_AHEAD_S = 300.0
"""How far an agent's start time (its incarnation) may be ahead of the controller's clock: the
slots already need NTP-synchronised clocks, so five minutes is generous skew."""


class UnknownSession(Exception):
    """A session this controller does not know (it restarted): register again (NOT_FOUND)."""


@dataclass(frozen=True)
class PodPlacement:
    """One pod of a Kubernetes job: its metadata.uid, its node, and the uid its containers
    run as where the pod says (securityContext.runAsUser)."""

    uid: str
    node: str
    run_as_user: int | None = None


@dataclass(frozen=True)
class SourceJob:
    """A job as a resource manager or the jobs file declares it."""

    job: str
    source: str
    name: str = ""
    ps_hosts: frozenset[str] = frozenset()
    nodes: tuple[str, ...] = ()
    state: str = ""
    user: str = ""
    end_time: float | None = None
    """When the resource manager will end it (its time limit), Unix seconds."""
    pods: tuple[PodPlacement, ...] = ()


@dataclass
class HostRecord:
    registration: Registration
    session: str
    registered_at: float
    seq: int = 0
    connected: bool = False
    disconnected_at: float | None = None
    last_report_at: float | None = None
    jobs: dict[str, ReportedJob] = field(default_factory=dict)
    mode: Mode = Mode.LOCAL
    health: str = ""
    recent: deque[AppliedRotation] = field(default_factory=lambda: deque(maxlen=HISTORY))

    @property
    def host(self) -> str:
        return self.registration.host


@dataclass(frozen=True)
class JobView:
    job: str
    name: str
    sources: tuple[str, ...]
    ps_hosts: tuple[str, ...]
    nodes: tuple[str, ...]
    state: str
    user: str
    spread_s: float | None
    period_s: float | None
    kind: str = ""
    """As its agents report it (collective if any says so); empty where no agent reports it."""
    demand: float | None = None
    """The link time it takes, summed over its hosts (`Registry.demands`); None unmeasured."""
    remaining_s: float | None = None
    """Its remaining standalone time where it declared its iterations (`Registry.remaining`)."""


class Registry:
    def __init__(self, host_timeout_s: float = 30.0) -> None:
        self.host_timeout_s = host_timeout_s
        self.hosts: dict[str, HostRecord] = {}
        self._sessions: dict[str, str] = {}
        self._sources: dict[str, dict[str, SourceJob]] = {}
        self.version = 0
        """Grows whenever membership (job -> PS hosts), or a job's demand, may have changed."""
        self._arrival: dict[str, int] = {}
        self._arrivals = 0
        self._iterated: set[str] = set()
        self._first_reported: dict[str, float] = {}
        self._vouchers: dict[str, tuple[Voucher, ...]] | None = None
        """Host -> what the sources vouch for there; rebuilt after a source changes."""
        self._by_job: dict[str, dict[str, ReportedJob]] = {}
        """Job -> host -> the job as that host's agent reports it (every host's jobs, by job:
        each replan reads the views below, and a 10,000-host registry walked host by host
        took 24 ms of every replan; now only the jobs reported differently since the last
        one are looked at again)."""
        self._stale: set[str] = set()
        """Jobs whose per-job views below are out of date."""
        self._reported_on: dict[str, frozenset[str]] = {}
        self._demand: dict[str, float] = {}
        self._lag: dict[str, float] = {}
        self._remaining: dict[str, float] = {}
        self._periodic: set[str] = set()
        """Per job: the hosts reporting it, its demand (see demands), its lag where every
        host says it starves (see starving), its remaining work (see remaining), whether any
        host reports a period."""

    # Agents ------------------------------------------------------------------------------

    def register(self, registration: Registration, now: float) -> HostRecord:
        ahead_s = registration.incarnation / 1e9 - now
        if ahead_s > MAX_INCARNATION_AHEAD_S:
            raise FutureIncarnation(
                f"host {registration.host}: incarnation {registration.incarnation} is an agent "
                f"start {ahead_s:.0f}s ahead of the controller's clock (at most "
                f"{MAX_INCARNATION_AHEAD_S:.0f}s): check NTP on both"
            )
        current = self.hosts.get(registration.host)
        if current is not None and registration.incarnation < current.registration.incarnation:
            raise StaleMessage(
                f"host {registration.host}: registration from an older agent start "
                f"({registration.incarnation} < {current.registration.incarnation})"
            )
        if current is not None:
            self._sessions.pop(current.session, None)
        record = HostRecord(registration, secrets.token_hex(16), now)
        if current is not None:
            # The same agent reconnecting keeps what it reported. A restarted one too, until
            # its first report: the jobs outlive their agent, and a job on this host alone
            # that dropped out of the cluster-wide order meanwhile rejoined it at the end
            # (m2: a single-host job put behind a sharded one for the rest of its run).
            record.jobs = current.jobs
            if current.registration.incarnation == registration.incarnation:
                record.recent = current.recent
        self.hosts[registration.host] = record
        self._sessions[record.session] = registration.host
        self.version += 1
        return record

    def session(self, session: str) -> HostRecord:
        host = self._sessions.get(session)
        if host is None:
            raise UnknownSession("unknown session: register again")
        return self.hosts[host]

    def report(self, report: HostReport, now: float) -> HostRecord:
        record = self.session(report.session)
        if report.seq <= record.seq:
            raise StaleMessage(
                f"host {record.host}: report {report.seq} is not newer than {record.seq}"
            )
        jobs = {job.job: job for job in report.jobs}
        for job in jobs.keys() - self._first_reported.keys():
            self._first_reported[job] = now
        if jobs_moved(tuple(record.jobs.values()), report.jobs):  # news for the plan
            self.version += 1
        record.seq = report.seq
        self._set_jobs(record.host, record.jobs, jobs)
        record.jobs = jobs
        record.mode = report.mode
        record.health = report.health
        record.last_report_at = now
        record.recent.extend(report.rotations)
        return record

    def set_connected(self, session: str, connected: bool, now: float) -> None:
        host = self._sessions.get(session)
        if host is None:
            return
        record = self.hosts[host]
        if record.connected != connected:
            record.connected = connected
            record.disconnected_at = None if connected else now
            self.version += 1

    def expire(self, now: float) -> list[str]:
        """Forget hosts disconnected for longer than host_timeout; their names."""
        gone = [
            host
            for host, record in self.hosts.items()
            if not record.connected
            and (record.disconnected_at or record.registered_at) + self.host_timeout_s < now
        ]
        for host in gone:
            record = self.hosts.pop(host)
            self._sessions.pop(record.session, None)
            self._set_jobs(host, record.jobs, {})
        if gone:
            self.version += 1
        return gone

    def drop_hosts(self) -> None:
        """Forget every host and session (this replica stopped leading: its agents register
        with the leader, and with it again, anew, should it lead again). Sources stay."""
        self.hosts.clear()
        self._sessions.clear()
        self._by_job.clear()
        self._stale.clear()
        self._reported_on.clear()
        self._demand.clear()
        self._lag.clear()
        self._remaining.clear()
        self._periodic.clear()
        self._arrival.clear()
        self._iterated.clear()
        self._first_reported.clear()
        self.version += 1

    def _set_jobs(
        self, host: str, old: Mapping[str, ReportedJob], new: Mapping[str, ReportedJob]
    ) -> None:
        """`host` reports `new` where it reported `old`: update the jobs' index."""
        for job in old.keys() - new.keys():
            on = self._by_job[job]
            del on[host]
            if not on:
                del self._by_job[job]
            self._stale.add(job)
        for job, state in new.items():
            if old.get(job) != state:
                self._by_job.setdefault(job, {})[host] = state
                self._stale.add(job)

    def _refresh(self) -> None:
        """Bring the per-job views up to date with what the stale jobs' hosts report."""
        for job in self._stale:
            on = self._by_job.get(job)
            promoted = self._lag.pop(job, None) is not None
            for view in (self._reported_on, self._demand, self._remaining):
                view.pop(job, None)
            self._periodic.discard(job)
            if on is None:
                continue
            reports = on.values()
            self._reported_on[job] = frozenset(on)
            demands = [state.demand for state in reports if state.demand is not None]
            if demands:
                self._demand[job] = statistics.fmean(demands) * len(on)
            lags = [state.lag_s for state in reports]
            # A promoted job keeps its turn while it starves: green, it gains fast, and its
            # hosts then find it waits in time for its siblings; demoted on that word, it
            # would wait, gain less, and be promoted again.
            if all(lag is not None for lag in lags) and (
                promoted or not all(state.waits_for_siblings for state in reports)
            ):
                self._lag[job] = min(lag for lag in lags if lag is not None)
            remaining = [state.remaining_s for state in reports if state.remaining_s is not None]
            if remaining:
                self._remaining[job] = max(remaining)
            if any(state.period_s is not None for state in reports):
                self._periodic.add(job)
        self._stale.clear()

    # Sources ------------------------------------------------------------------------------

    def set_source(self, source: str, jobs: Iterable[SourceJob]) -> None:
        new = {job.job: job for job in jobs}
        if new != self._sources.get(source):
            self._sources[source] = new
            self._vouchers = None
            self.version += 1

    def source_jobs(self, source: str) -> Mapping[str, SourceJob]:
        return self._sources.get(source, {})

    def vouchers_for(self, host: str) -> tuple[Voucher, ...]:
        """What the resource-manager sources vouch for on `host`: Slurm and jobs-file jobs
        placed there with their user, Kubernetes jobs with their pods there."""
        if self._vouchers is None:
            by_host: dict[str, list[Voucher]] = {}
            for source, jobs in sorted(self._sources.items()):
                for job in jobs.values():
                    for node, voucher in _vouchers(source, job):
                        by_host.setdefault(node, []).append(voucher)
            self._vouchers = {node: tuple(found) for node, found in by_host.items()}
        return self._vouchers.get(host, ())

    # Views --------------------------------------------------------------------------------

    def membership(self) -> dict[str, frozenset[str]]:
        """Job -> the known hosts where its PS runs: the ones whose agents report it, and the
        ones the jobs file or Kubernetes declare it on (hosts without a known agent are left
        out: nobody would execute a plan there)."""
        self._refresh()
        ps_hosts = dict(self._reported_on)
        for jobs in self._sources.values():
            for source_job in jobs.values():
                declared = {h for h in source_job.ps_hosts if h in self.hosts}
                if declared:
                    ps_hosts[source_job.job] = ps_hosts.get(source_job.job, frozenset()) | declared
        for job in sorted(set(ps_hosts) - set(self._arrival)):
            self._arrivals += 1
            self._arrival[job] = self._arrivals
        for job in set(self._arrival) - set(ps_hosts):
            del self._arrival[job]
        for job in self._first_reported.keys() - ps_hosts.keys():
            del self._first_reported[job]
        return ps_hosts

    def arrival_order(self) -> list[str]:
        """Jobs in the order membership first saw them (as of the last `membership()`)."""
        return sorted(self._arrival, key=self._arrival.__getitem__)

    def end_times(self) -> dict[str, float]:
        """Per job with a known time limit: when it ends at the latest (Unix seconds)."""
        ends: dict[str, float] = {}
        for jobs in self._sources.values():
            for job, source_job in jobs.items():
                if source_job.end_time is not None:
                    ends[job] = min(ends.get(job, source_job.end_time), source_job.end_time)
        return ends

    def demands(self) -> dict[str, float]:
        """Per job, its demand summed over the hosts it has PS tasks or ranks on: the links'
        time it takes from the cluster, which the cluster-wide order ranks, smallest first.
        A job sharded over two PS hosts takes both links: ranked by its busiest host alone,
        it went first on both and held back the two single-host jobs beside it (m2: every
        policy worse than FIFO). A host that reports no demand for it yet counts as the
        average of those that do (a sum over the reporting hosts alone would make a job
        look small while it is being measured)."""
        self._refresh()
        return dict(self._demand)

    def iterative(self) -> set[str]:
        """Jobs some host measured iterations of (a period reported), now or since they
        appeared (as of the last `membership()`): their demand may not be trusted yet, but
        they are training jobs, not bulk traffic. Remembered, because a restarted agent
        reports its jobs unmeasured at first: a job on its host alone then read as bulk
        traffic and went behind every other one."""
        self._refresh()
        self._iterated |= self._periodic
        self._iterated &= self._arrival.keys()
        return set(self._iterated)

    def starving(self) -> dict[str, float]:
        """Jobs every host reporting them says starve (their guards would promote them),
        with the smallest lag reported (seconds): the cluster-wide order puts them first,
        in their turns (Planner._turns: those put first before keep their order, then the
        most behind first). A job's progress is one for all its hosts, and promoting it
        moves it up on all of them, so all must see it behind: one host's misreading (a
        waiting ring's steps grouped into iterations) would otherwise move the cluster. Not
        a job every host says waits in time for its siblings there (the same model launched
        together, alone with it: StarvationGuard.waits_in_time), as a host ordering its jobs
        alone keeps it waiting: promoted midway, the second of two equal sharded jobs that
        outlive the window ended late, and both with it (the simulator's m1 at --scale 3:
        112.68 s against TL-One's 103.39). One host's word is not enough: there it may have
        only siblings, and elsewhere wait behind other jobs too (m3's j3). A job promoted
        keeps its turn until a host no longer reports it starving, whatever they say of its
        siblings since."""
        self._refresh()
        return dict(self._lag)

    def remaining(self) -> dict[str, float]:
        """Jobs that declared their iterations, with their remaining standalone time
        (seconds): the most any host reporting them says (the job ends with its slowest
        host). The cluster-wide order puts the least first among jobs of equal demand, as an
        agent's own pack does (packing.pack_order)."""
        self._refresh()
        return dict(self._remaining)

    def young(self, now: float) -> set[str]:
        """Jobs an agent first reported less than MEASURE_GRACE_S ago (as of the last
        `membership()`): still being measured, as an agent's pack holds its young jobs. Not
        iterating yet is no sign of bulk traffic before that: a job placed ahead on one
        host's report went behind a sharded job when another host reported first that the
        sharded job iterates, and held that place once its own host reported it iterating
        (the simulator's m2, reports arriving one host at a time)."""
        return {job for job, first in self._first_reported.items() if now - first < MEASURE_GRACE_S}

    def jobs(self) -> list[JobView]:
        membership = self.membership()
        names = set(membership)
        for jobs in self._sources.values():
            names.update(jobs)
        views = []
        for job in sorted(names):
            declared = [jobs[job] for jobs in self._sources.values() if job in jobs]
            reports = [r.jobs[job] for r in self.hosts.values() if job in r.jobs]
            sources = sorted(
                ({"agent"} if reports else set()) | {d.source for d in declared},
                key=SOURCES.index,
            )
            spreads = [r.spread_s for r in reports if r.spread_s is not None]
            periods = [r.period_s for r in reports if r.period_s is not None]
            views.append(
                JobView(
                    job=job,
                    name=next((d.name for d in declared if d.name), ""),
                    sources=tuple(sources),
                    ps_hosts=tuple(sorted(membership.get(job, ()))),
                    nodes=tuple(sorted({n for d in declared for n in d.nodes})),
                    state=next(
                        (d.state for d in declared if d.state), "RUNNING" if reports else "declared"
                    ),
                    user=next((d.user for d in declared if d.user), ""),
                    spread_s=max(spreads) if spreads else None,
                    period_s=max(periods) if periods else None,
                    kind=_kind(reports),
                    demand=self._demand.get(job),
                    remaining_s=self._remaining.get(job),
                )
            )
        return views


def _kind(reports: list[ReportedJob]) -> str:
    """A rank on any host makes the job collective (its PS hosts, if any, report ps)."""
    if not reports:
        return ""
    collective = any(report.kind is JobKind.COLLECTIVE for report in reports)
    return (JobKind.COLLECTIVE if collective else JobKind.PS).value


def _vouchers(source: str, job: SourceJob) -> Iterable[tuple[str, Voucher]]:
    """(node, voucher) for each node where `source` vouches for `job`."""
    if source == VoucherSource.KUBERNETES:
        pods: dict[str, list[tuple[str, int | None]]] = {}
        for pod in job.pods:
            pods.setdefault(pod.node, []).append((pod.uid, pod.run_as_user))
        for node, placed in sorted(pods.items()):
            placed.sort(key=lambda pod: pod[0])
            yield node, Voucher(job.job, VoucherSource.KUBERNETES, pods=tuple(placed))
    elif source in (VoucherSource.SLURM, VoucherSource.STATIC) and job.user:
        for node in job.nodes:
            yield node, Voucher(job.job, VoucherSource(source), user=job.user)
