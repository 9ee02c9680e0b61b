"""Jobs, their iterations and the event loop (pure: simulated seconds from 0).

A PS job, as the testbed's (testbed/psjob.py): each iteration every PS task pushes its shard
of the model (model_bytes / PS hosts) to every worker at once, over its host's egress link;
a worker computes once it has every shard, then answers (its gradient is small and crosses
unshaped links: `overhead_s` stands for the answer and whatever else a framework adds per
iteration, 0 for the synthetic job); the iteration ends when every worker has answered (the
barrier), and the next push starts.

Telemetry is exact: each (host, job) records every push as the agent measures it
(packing.Measured: bytes, idle before, period), and a policy reads the job's load through
packing.job_load, the agent's own reading, over the same numbers of iterations.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
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
    """Sets the links' bands: called at every arrival and departure, and every `tick_s`;
    and may hold a job's push until a time of its choosing (`release`)."""

    tick_s: float | None

    def attach(self, sim: Simulation) -> None: ...

    def evaluate(self, now: float) -> None: ...

    def release(self, job: str, now: float) -> float:
        """When `job`, ready to push now, may start its push (now: at once)."""
        ...


@dataclass
class _Running:
    job: SimJob
    done_iterations: int = 0
    workers_waiting: list[int] = field(default_factory=list)
    """Per worker: shards still to arrive this iteration."""
    answered: int = 0


@dataclass(frozen=True)
class JobResult:
    name: str
    arrival_s: float
    end_s: float

    @property
    def jct_s(self) -> float:
        return self.end_s - self.arrival_s


class Simulation:
    def __init__(
        self,
        links: Mapping[str, float],
        jobs: Sequence[SimJob],
        driver: Driver,
        discipline: Discipline = Discipline.PRIORITY,
        tcp: TcpModel | None = None,
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
        self.now = 0.0
        self.running: dict[str, _Running] = {}
        self.results: dict[str, JobResult] = {}
        self.measured: dict[str, dict[str, HostJob]] = {host: {} for host in links}
        """Host -> job -> what its agent measures: the jobs present there."""
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._scheduled_links: dict[str, int] = {}

    # What a host's agent sees -------------------------------------------------------------

    def host_jobs(self, host: str) -> set[str]:
        return set(self.measured[host])

    def loads(self, host: str) -> dict[str, JobLoad]:
        rate = self.links[host].rate_bps
        loads = {}
        for name, record in self.measured[host].items():
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

    # The loop -------------------------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (when, next(self._seq), action))

    def run(self, until_s: float = 86400.0) -> dict[str, JobResult]:
        self.driver.attach(self)
        for job in self.jobs.values():
            self.at(job.arrival_s, lambda job=job: self._arrive(job))  # type: ignore[misc]
        if self.driver.tick_s is not None:
            self.at(0.0, self._tick)
        while self._events and len(self.results) < len(self.jobs):
            when, _, action = heapq.heappop(self._events)
            if when > until_s:
                break
            self.now = when
            action()
        return dict(self.results)

    def _tick(self) -> None:
        self.driver.evaluate(self.now)
        assert self.driver.tick_s is not None
        self.at(self.now + self.driver.tick_s, self._tick)

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
            self.measured[host][job.name] = HostJob()
        self.driver.evaluate(self.now)
        self._ready(job.name)

    def _ready(self, name: str) -> None:
        when = self.driver.release(name, self.now)
        if when > self.now:
            self.at(when, lambda: self._push(name))
        else:
            self._push(name)

    def _push(self, name: str) -> None:
        state = self.running[name]
        job = state.job
        shard = job.model_bytes // len(job.ps_hosts)
        state.workers_waiting = [len(job.ps_hosts)] * job.workers
        state.answered = 0
        for host in job.ps_hosts:
            record = self.measured[host][name]
            record.push_started = self.now
            record.bytes_this_push = shard * job.workers
            record.flows_left = job.workers
            link = self.links[host]
            for worker in range(job.workers):
                done = self._delivered_callback(name, host, worker)
                link.add(Flow(name, wire_bytes(shard), done), self.now)
            self._schedule_link(link)

    def _delivered_callback(self, name: str, host: str, worker: int) -> Callable[[float], None]:
        return lambda now: self._delivered(name, host, worker, now)

    def _delivered(self, name: str, host: str, worker: int, now: float) -> None:
        state = self.running[name]
        record = self.measured[host][name]
        record.flows_left -= 1
        if record.flows_left == 0:
            self._push_ended(record, now)
        state.workers_waiting[worker] -= 1
        if state.workers_waiting[worker] == 0:
            self.at(now + state.job.compute_s + state.job.overhead_s, lambda: self._answer(name))

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

    def _answer(self, name: str) -> None:
        state = self.running[name]
        state.answered += 1
        if state.answered < state.job.workers:
            return
        state.done_iterations += 1
        if state.done_iterations < state.job.iterations:
            self._ready(name)
            return
        job = state.job
        self.results[name] = JobResult(name, job.arrival_s, self.now)
        del self.running[name]
        for host in job.ps_hosts:
            del self.measured[host][name]
        self.driver.evaluate(self.now)
