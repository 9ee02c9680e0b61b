"""Jobs, their iterations and the event loop (pure: simulated seconds from 0).

A PS job, as the testbed's (testbed/psjob.py): each iteration every PS task pushes its shard
of the model (model_bytes / PS hosts) to every worker at once, over its host's egress link
(one flow of `workers` streams: network.Flow); a worker computes once it has every shard,
then answers (its gradient is small and crosses unshaped links: `overhead_s` stands for the
answer and whatever else a framework adds per iteration, 0 for the synthetic job); the
iteration ends when every worker has answered (the barrier), and the next push starts. Every
worker gets each shard at the same moment (its streams end together), so the barrier is
one event: the last shard's arrival plus the compute.

Policies are evaluated per host, when that host has news: a job came or went (at once), a
push ended there (the agent's telemetry: once per instant, after every event of it), or a
wake-up the driver asked for (`wake`: the light's next move, the agent's scan).

A job alone on every one of its links runs at its standalone speed whatever the policies do
(no other flow to share with, no bands to matter), so the engine skips its iterations in one
event (`fast_forward`), writes the measurements the agent would have taken, and falls back
to push-by-push the moment another job arrives on one of its links, mid-push or mid-compute.
A large cluster is mostly such jobs; only the shared links cost events.

Telemetry is exact: each (host, job) records every push as the agent measures it
(packing.Measured: bytes, idle before, period), and a policy reads the job's load through
packing.job_load, the agent's own reading, over the same numbers of iterations.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tensorlights.policy.packing import JobLoad, Measured, job_load, wire_bytes
from tensorlights.sim.network import Discipline, Flow, Link
from tensorlights.telemetry.sampler import COMPUTE_ITERATIONS, LOAD_ITERATIONS


@dataclass(frozen=True)
class TcpModel:
    """How a push that joins a busy link ramps up (network.Link.ramp_s / ramp_weight);
    calibrate.py fits them to the benchmark's FIFO runs."""

    ramp_s: float = 0.0
    ramp_weight: float = 1.0


@dataclass(frozen=True)
class SimJob:
    name: str
    model_bytes: int
    workers: int
    compute_s: float
    iterations: int
    arrival_s: float
    ps_hosts: tuple[str, ...]
    overhead_s: float = 0.0
    """Per iteration, beyond the push and the compute (see the module doc)."""

    def link_s(self, rate_bps: float) -> float:
        """One iteration's pushes on one of its PS hosts' links, alone."""
        shard = self.model_bytes / len(self.ps_hosts)
        return wire_bytes(shard) * self.workers * 8 / rate_bps

    def alone_s(self, rate_bps: float) -> float:
        """Its completion time with its links to itself."""
        return self.iterations * (self.link_s(rate_bps) + self.compute_s + self.overhead_s)


@dataclass
class HostJob:
    """What one host's agent measures of one job."""

    recent: deque[Measured] = field(default_factory=lambda: deque(maxlen=COMPUTE_ITERATIONS))
    count: int = 0
    push_started: float | None = None
    last_push_end: float | None = None
    bytes_this_push: int = 0
    flows_left: int = 0
    _load: tuple[int, JobLoad | None] = (-1, None)

    def load(self, rate_bps: float) -> JobLoad | None:
        if self._load[0] != self.count:
            recent = list(self.recent)
            self._load = (
                self.count,
                job_load(recent, LOAD_ITERATIONS, self.count, False, rate_bps),
            )
        return self._load[1]


class Driver(Protocol):
    """Sets the links' bands: `evaluate` is called for the hosts with news (see the module
    doc); it may ask for a host's evaluation later (`Simulation.wake`) and hold a job's push
    until a time of its choosing (`release`)."""

    def attach(self, sim: Simulation) -> None: ...

    def evaluate(self, now: float, hosts: Collection[str]) -> None: ...

    def release(self, job: str, now: float) -> float:
        """When `job`, ready to push now, may start its push (now: at once)."""
        ...


@dataclass
class _Skip:
    """A job running alone on all its links, its iterations skipped in one event."""

    start: float
    iterations: int
    period_s: float
    push_s: dict[str, float]
    """Per PS host: its push alone."""
    token: int
    recorded: int = 0
    """Iterations whose measurements are written (each once its pushes have all ended)."""


@dataclass
class _Running:
    job: SimJob
    done_iterations: int = 0
    hosts_left: int = 0
    """PS hosts whose push of this iteration is still on the wire."""
    skip: _Skip | None = None
    tokens: int = 0


@dataclass(frozen=True)
class JobResult:
    name: str
    arrival_s: float
    end_s: float

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s


@dataclass
class Counters:
    """What a run cost (the at-scale report's speed figures)."""

    events: int = 0
    evaluations: int = 0
    """Host evaluations handed to the driver."""
    skipped_iterations: int = 0
    """Iterations run as a job alone on its links, in one event each run of them."""
    pushed_iterations: int = 0
    """Iterations run push by push."""


class Simulation:
    def __init__(
        self,
        links: Mapping[str, float],
        jobs: Sequence[SimJob],
        driver: Driver,
        discipline: Discipline = Discipline.PRIORITY,
        tcp: TcpModel | None = None,
        fast_forward: bool = True,
    ) -> None:
        for job in jobs:
            missing = set(job.ps_hosts) - set(links)
            if missing:
                raise ValueError(f"job {job.name}: no link for PS host(s) {sorted(missing)}")
        tcp = tcp or TcpModel()
        self.links = {
            host: Link(host, rate, discipline, ramp_s=tcp.ramp_s, ramp_weight=tcp.ramp_weight)
            for host, rate in links.items()
        }
        self.jobs = {job.name: job for job in jobs}
        if len(self.jobs) != len(jobs):
            raise ValueError("job names must be unique")
        self.driver = driver
        self.fast_forward = fast_forward
        self.now = 0.0
        self.running: dict[str, _Running] = {}
        self.results: dict[str, JobResult] = {}
        self.measured: dict[str, dict[str, HostJob]] = {host: {} for host in links}
        """Host -> job -> what its agent measures: the jobs present there."""
        self.counters = Counters()
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._news: set[str] = set()
        self._wakes: dict[str, float] = {}

    # What a host's agent sees -------------------------------------------------------------

    def host_jobs(self, host: str) -> set[str]:
        return set(self.measured[host])

    def loads(self, host: str) -> dict[str, JobLoad]:
        rate = self.links[host].rate_bps
        loads = {}
        for name, record in self.measured[host].items():
            self._catch_up(name)
            load = record.load(rate)
            if load is not None:
                busy = record.flows_left > 0
                loads[name] = load if load.busy == busy else replace(load, busy=busy)
        return loads

    def started(self, host: str) -> frozenset[str]:
        return frozenset(j for j, r in self.measured[host].items() if r.push_started is not None)

    def set_bands(self, host: str, bands: Mapping[str, int]) -> None:
        link = self.links[host]
        if link.set_bands(bands, self.now):
            self._schedule_link(link)

    def wake(self, host: str, when: float) -> None:
        """Evaluate `host` at `when` (or sooner: only its earliest wake-up stands)."""
        pending = self._wakes.get(host)
        if pending is not None and self.now <= pending <= when:
            return
        self._wakes[host] = when
        self.at(when, lambda: self._woken(host, when))

    # The loop -------------------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def run(self, until_s: float = math.inf) -> dict[str, JobResult]:
        self.driver.attach(self)
        for job in self.jobs.values():
            self.at(job.arrival_s, lambda job=job: self._arrive(job))  # type: ignore[misc]
        while self._events and len(self.results) < len(self.jobs):
            when, _, action = heapq.heappop(self._events)
            if when > until_s:
                break
            self.now = when
            self.counters.events += 1
            action()
        return dict(self.results)

    def _evaluate(self, hosts: Collection[str]) -> None:
        self.counters.evaluations += len(hosts)
        self.driver.evaluate(self.now, hosts)

    def _woken(self, host: str, when: float) -> None:
        if self._wakes.get(host) == when:
            del self._wakes[host]
            self._evaluate((host,))

    def _host_news(self, host: str) -> None:
        """Evaluate `host` once every event of this instant has run."""
        if not self._news:
            self.at(self.now, self._evaluate_news)
        self._news.add(host)

    def _evaluate_news(self) -> None:
        hosts, self._news = self._news, set()
        self._evaluate(sorted(hosts))

    def _schedule_link(self, link: Link) -> None:
        when = link.next_change()
        if when is not None:
            version = link.version
            self.at(when, lambda: self._link_event(link, version))

    def _link_event(self, link: Link, version: int) -> None:
        if link.version != version:
            return  # the link changed since: a newer event stands
        for flow in link.finish(self.now):
            flow.done(self.now)
        self._schedule_link(link)

    # Jobs -----------------------------------------------------------------------------------

    def _arrive(self, job: SimJob) -> None:
        self.running[job.name] = _Running(job)
        for host in job.ps_hosts:
            for other in self.measured[host]:
                self._unskip(other)
            self.measured[host][job.name] = HostJob()
        self._evaluate(job.ps_hosts)
        self._ready(job.name)

    def _ready(self, name: str) -> None:
        when = self.driver.release(name, self.now)
        if when > self.now:
            self.at(when, lambda: self._push(name))
        elif self.fast_forward and self._alone(self.running[name].job):
            self._skip(name)
        else:
            self._push(name)

    def _alone(self, job: SimJob) -> bool:
        return all(
            len(self.measured[host]) == 1 and not self.links[host].flows for host in job.ps_hosts
        )

    def _push(self, name: str) -> None:
        state = self.running[name]
        job = state.job
        self.counters.pushed_iterations += 1
        state.hosts_left = len(job.ps_hosts)
        for host in job.ps_hosts:
            self._push_on(name, host, self.now, 1.0)

    def _push_on(self, name: str, host: str, started: float, left: float) -> None:
        """Put `left` (a fraction) of this iteration's push from `host` on its link."""
        job = self.running[name].job
        shard = job.model_bytes // len(job.ps_hosts)
        record = self.measured[host][name]
        record.push_started = started
        record.bytes_this_push = self._push_bytes(job)
        record.flows_left = 1
        link = self.links[host]
        done = self._delivered_callback(name, host)
        flow = Flow(name, wire_bytes(shard) * job.workers * left, done, job.workers)
        link.add(flow, self.now)
        self._schedule_link(link)

    def _delivered_callback(self, name: str, host: str) -> Callable[[float], None]:
        return lambda now: self._delivered(name, host, now)

    def _delivered(self, name: str, host: str, now: float) -> None:
        state = self.running[name]
        record = self.measured[host][name]
        record.flows_left = 0
        self._push_ended(record, now)
        self._host_news(host)
        state.hosts_left -= 1
        if state.hosts_left == 0:
            self.at(now + state.job.compute_s + state.job.overhead_s, lambda: self._barrier(name))

    @staticmethod
    def _push_ended(record: HostJob, now: float) -> None:
        assert record.push_started is not None
        if record.last_push_end is None:
            idle, period = None, now - record.push_started
        else:
            idle = record.push_started - record.last_push_end
            period = now - record.last_push_end
        record.recent.append(Measured(record.bytes_this_push, idle, period))
        record.count += 1
        record.last_push_end = now

    def _barrier(self, name: str) -> None:
        """Every worker has answered: the iteration is done."""
        state = self.running[name]
        state.done_iterations += 1
        if state.done_iterations < state.job.iterations:
            self._ready(name)
        else:
            self._finish(name)

    def _finish(self, name: str) -> None:
        job = self.running.pop(name).job
        self.results[name] = JobResult(name, job.arrival_s, self.now)
        for host in job.ps_hosts:
            del self.measured[host][name]
        self._evaluate(job.ps_hosts)

    # Fast-forward ---------------------------------------------------------------------------

    def _skip(self, name: str) -> None:
        state = self.running[name]
        job = state.job
        shard_bits = wire_bytes(job.model_bytes // len(job.ps_hosts)) * job.workers * 8
        push_s = {host: shard_bits / self.links[host].rate_bps for host in job.ps_hosts}
        period = max(push_s.values()) + job.compute_s + job.overhead_s
        state.tokens += 1
        iterations = job.iterations - state.done_iterations
        state.skip = _Skip(self.now, iterations, period, push_s, state.tokens)
        token = state.tokens
        self.at(self.now + iterations * period, lambda: self._skipped(name, token))

    def _skipped(self, name: str, token: int) -> None:
        state = self.running.get(name)
        skip = state.skip if state is not None else None
        if state is None or skip is None or skip.token != token:
            return
        self._record_skipped(name, skip, skip.iterations)
        state.skip = None
        state.done_iterations += skip.iterations
        self._finish(name)

    def _catch_up(self, name: str) -> None:
        """Write the measurements of a skipping job's iterations whose pushes have ended by
        now (what its agents have measured so far)."""
        skip = self.running[name].skip
        if skip is not None:
            pushed = (self.now - skip.start - max(skip.push_s.values())) / skip.period_s
            self._record_skipped(name, skip, min(int(pushed) + 1, skip.iterations))

    def _unskip(self, name: str) -> None:
        """Another job arrived on one of `name`'s links: back to push by push, from where
        its skipped iterations have got to."""
        state = self.running[name]
        skip = state.skip
        if skip is None:
            return
        state.skip = None
        done = min(int((self.now - skip.start) / skip.period_s), skip.iterations)
        self._record_skipped(name, skip, done)
        state.done_iterations += done
        if done == skip.iterations:  # its last barrier is this very instant
            self.at(self.now, lambda: self._finish(name))
            return
        started = skip.start + done * skip.period_s
        into = self.now - started
        state.hosts_left = 0
        self.counters.pushed_iterations += 1
        for host, push_s in skip.push_s.items():
            if into < push_s:
                state.hosts_left += 1
                self.links[host].busy_s += into
                self._push_on(name, host, started, 1.0 - into / push_s)
            elif skip.recorded == done:  # ended, and not measured yet
                record = self.measured[host][name]
                record.push_started = started
                record.bytes_this_push = self._push_bytes(state.job)
                self._push_ended(record, started + push_s)
                self.links[host].busy_s += push_s
        if state.hosts_left == 0:
            end = started + max(skip.push_s.values()) + state.job.compute_s + state.job.overhead_s
            self.at(end, lambda: self._barrier(name))

    @staticmethod
    def _push_bytes(job: SimJob) -> int:
        return job.model_bytes // len(job.ps_hosts) * job.workers

    def _record_skipped(self, name: str, skip: _Skip, upto: int) -> None:
        """The measurements the agents took of skipped iterations `skip.recorded` to `upto`
        (of a long run only the last COMPUTE_ITERATIONS, the agent's window)."""
        if upto <= skip.recorded:
            return
        self.counters.skipped_iterations += upto - skip.recorded
        pushed = self._push_bytes(self.running[name].job)
        first = max(skip.recorded, upto - COMPUTE_ITERATIONS)
        for host, push_s in skip.push_s.items():
            self.links[host].busy_s += push_s * (upto - skip.recorded)
            record = self.measured[host][name]
            if first > skip.recorded:
                record.count += first - skip.recorded
                record.last_push_end = skip.start + (first - 1) * skip.period_s + push_s
            for k in range(first, upto):
                record.push_started = skip.start + k * skip.period_s
                record.bytes_this_push = pushed
                self._push_ended(record, record.push_started + push_s)
        skip.recorded = upto
