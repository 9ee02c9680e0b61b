"""Jobs, their iterations and the event loop (pure: simulated seconds from 0).

A PS job, as the testbed's (testbed/psjob.py): each iteration every PS task pushes its shard
of the model (model_bytes / PS hosts) to every worker at once, over its host's egress link
(one flow of `workers` streams: network.Flow); a worker computes once it has every shard,
then answers (its gradient is small and crosses unshaped links: `overhead_s` stands for the
answer and whatever else a framework adds per iteration, 0 for the synthetic job); the
iteration ends when every worker has answered (the barrier), and the next push starts. Every
worker gets each shard at the same moment (its streams end together), so the barrier is
one event: the last shard's arrival plus the compute.

A collective job, as the testbed's DDP job (testbed/torchjob.py, gloo): one rank per host in
`hosts`, in ring order; each iteration it computes (compute_s + overhead_s), then all-reduces
its gradient (model_bytes) around the ring: 2 (k - 1) steps for k ranks, in each of which
every rank sends a chunk of model_bytes / k to the next rank over its host's egress (one
flow). A rank starts a step once its own previous send and its predecessor's (the chunk it
forwards) are done, as gloo's ring waits on both; the iteration ends with the last step of
every rank.

Policies are evaluated per host, when that host has news: a job came or went (at once), a
push ended there (the agent's telemetry: once per instant, after every event of it), or a
wake-up the driver asked for (`wake`: the light's next move, the agent's scan).

A job alone on every one of its links runs at its standalone speed whatever the policies do
(no other flow to share with, no bands to matter), so the engine skips its iterations in one
event (`fast_forward`), writes the measurements the agent would have taken, and falls back
to push-by-push the moment another job arrives on one of its links, mid-push or mid-compute.
A large cluster is mostly such jobs; only the shared links cost events.

With `settle`, jobs sharing links are skipped too once they have settled: when every job
of a group of links joined by their jobs (a component) has completed SETTLE_AFTER
iterations since anything changed on those links (a job came or went, bands moved), each
runs on at its own measured period (the mean of its last SETTLE_MEASURE iterations, its
traffic as long as measured on each host) until the next change there. An approximation
(exact sharing is not periodic in general): tests/unit/test_sim.py bounds its error; the
at-scale runs use it, the calibration does not.

Telemetry is exact: each (host, job) records every push as the agent measures it
(packing.Measured: bytes, idle before, period), and a policy reads the job's load through
packing.job_load, the agent's own reading, over the same numbers of iterations.
"""

from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections import deque
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from tensorlights.model import JobKind
from tensorlights.policy.packing import MEASURED_AFTER, JobLoad, Measured, job_load, wire_bytes
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
    """A PS job's workers (a collective job's ranks are its hosts)."""
    compute_s: float
    iterations: int
    arrival_s: float
    hosts: tuple[str, ...]
    """The hosts whose egress carries its traffic: a PS job's PS hosts (its shards), a
    collective job's rank hosts in ring order."""
    overhead_s: float = 0.0
    """Per iteration, beyond the traffic and the compute (see the module doc)."""
    kind: JobKind = JobKind.PS
    wire_factor: float = 1.0
    """Link time per payload byte, over TCP/IP's alone (wire_bytes): what a framework's
    own framing and pacing add to its traffic (1 for the synthetic job)."""
    declares: bool = False
    """Its processes declare its iterations (TENSORLIGHTS_ITERATIONS): the agents know them."""

    def __post_init__(self) -> None:
        if self.kind is JobKind.COLLECTIVE and len(set(self.hosts)) != len(self.hosts):
            raise ValueError(f"job {self.name}: a collective job has one rank per host")
        if self.kind is JobKind.COLLECTIVE and len(self.hosts) < 2:
            raise ValueError(f"job {self.name}: a ring needs two hosts or more")

    @property
    def steps(self) -> int:
        """Sends per host per iteration: a PS's one push; a ring's 2 (k - 1) steps."""
        if self.kind is JobKind.COLLECTIVE:
            return 2 * (len(self.hosts) - 1)
        return 1

    @property
    def flow_bytes(self) -> float:
        """Wire bytes of one send from one host: a PS shard to all its workers, or a chunk."""
        if self.kind is JobKind.COLLECTIVE:
            return wire_bytes(self.model_bytes / len(self.hosts)) * self.wire_factor
        return wire_bytes(self.model_bytes // len(self.hosts)) * self.workers * self.wire_factor

    @property
    def streams(self) -> int:
        """TCP connections one send stands for (a PS's one per worker; a rank's one)."""
        return 1 if self.kind is JobKind.COLLECTIVE else self.workers

    @property
    def pushed_bytes(self) -> int:
        """Payload one host sends per iteration (what its agent measures)."""
        if self.kind is JobKind.COLLECTIVE:
            return self.steps * self.model_bytes // len(self.hosts)
        return self.model_bytes // len(self.hosts) * self.workers

    def link_s(self, rate_bps: float) -> float:
        """One iteration's traffic on one of its hosts' links, alone."""
        return self.steps * self.flow_bytes * 8 / rate_bps

    def alone_s(self, rate_bps: float) -> float:
        """Its completion time with its links to itself."""
        return self.iterations * (self.link_s(rate_bps) + self.compute_s + self.overhead_s)

    @property
    def compute_first(self) -> bool:
        """A ring computes its gradient, then reduces it; a PS pushes, then workers compute."""
        return self.kind is JobKind.COLLECTIVE


@dataclass
class HostJob:
    """What one host's agent measures of one job."""

    recent: deque[Measured] = field(default_factory=lambda: deque(maxlen=COMPUTE_ITERATIONS))
    count: int = 0
    push_started: float | None = None
    first_push_started: float | None = None
    last_push_end: float | None = None
    bytes_this_push: int = 0
    flows_left: int = 0
    _load: tuple[tuple[int, bool], JobLoad | None] = ((-1, False), None)

    def load(self, rate_bps: float, holds: bool) -> JobLoad | None:
        """What the agent reads of it now (`holds`: its bytes hold while it waits, a PS's)."""
        busy = self.flows_left > 0
        if self._load[0] != (self.count, busy):
            load = job_load(list(self.recent), LOAD_ITERATIONS, self.count, busy, rate_bps)
            if load is not None and not holds:
                load = replace(load, bytes_hold_waiting=False)
            self._load = ((self.count, busy), load)
        return self._load[1]

    def push_began(self, at: float) -> None:
        """A push began at `at` (the first one's time is kept: Simulation.started)."""
        self.push_started = at
        if self.first_push_started is None:
            self.first_push_started = at


class Driver(Protocol):
    """Sets the links' bands: `evaluate` is called for the hosts with news (see the module
    doc); it may ask for a host's evaluation later (`Simulation.wake`) and hold a job's push
    until a time of its choosing (`release`)."""

    def attach(self, sim: Simulation) -> None: ...

    def evaluate(self, now: float, hosts: Collection[str]) -> None: ...

    def release(self, job: str, now: float) -> float:
        """When `job`, ready to push now, may start its push (now: at once)."""
        ...


SETTLE_AFTER = 8
"""Iterations every job of a component completes after a change before it is settled."""
SETTLE_MEASURE = 4
"""Iterations a settled job's period and traffic are averaged over (the last ones)."""
SETTLE_WAIT_S = 60.0
"""Or, after this long since the change, what each job has done: a job starved behind
others (TL-One's last job, for days) would keep its component from ever settling; it is
taken to progress as it did since the change (one iteration per that time if none)."""


@dataclass
class _Skip:
    """A job whose iterations run in one event: alone on all its links (at its standalone
    speed), or settled with the jobs sharing them (at its measured period)."""

    start: float
    """When the first skipped iteration began (a PS's push, a ring's compute)."""
    iterations: int
    period_s: float
    traffic_at: float
    """Where in an iteration its traffic begins (a ring computes first)."""
    traffic_s: dict[str, float]
    """Per host: its traffic's duration in an iteration (its first send to its last)."""
    busy_s: dict[str, float]
    """Per host: its link's busy time in an iteration."""
    settled: bool = False
    recorded: int = 0
    """Iterations whose measurements are written (each once its traffic has ended)."""
    measured_first: frozenset[str] = frozenset()
    """Hosts where the first skipped iteration's traffic was measured already (a settled
    job caught after its push ended)."""


@dataclass
class _Running:
    job: SimJob
    done_iterations: int = 0
    hosts_left: int = 0
    """A PS job's hosts whose push of this iteration is still on the wire."""
    started: list[int] = field(default_factory=list)
    sent: list[int] = field(default_factory=list)
    """A ring's steps started, and sent, per rank this iteration."""
    skip: _Skip | None = None
    tokens: int = 0
    """Grows whenever its pending events go stale (a skip begins or ends)."""
    steady: int = 0
    """Iterations completed since its component last changed."""
    changed_at: float = 0.0
    """When its component last changed."""
    ends: deque[float] = field(default_factory=lambda: deque(maxlen=SETTLE_MEASURE + 1))
    """When its last iterations since then ended."""
    last_end: float = 0.0
    """When its last iteration ended (its arrival before the first)."""


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
    """Iterations run in one event per run of them (alone on its links, or settled)."""
    settles: int = 0
    """Components settled (settle=True)."""
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
        settle: bool = False,
    ) -> None:
        for job in jobs:
            missing = set(job.hosts) - set(links)
            if missing:
                raise ValueError(f"job {job.name}: no link for host(s) {sorted(missing)}")
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
        self.settle = settle
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
        self._wanted: set[str] = set()

    # What a host's agent sees -------------------------------------------------------------

    def host_jobs(self, host: str) -> set[str]:
        return set(self.measured[host])

    def loads(self, host: str) -> dict[str, JobLoad]:
        rate = self.links[host].rate_bps
        loads = {}
        for name, record in self.measured[host].items():
            self._catch_up(name)
            load = record.load(rate, self.jobs[name].kind is JobKind.PS)
            if load is not None:
                loads[name] = load
        return loads

    def declared(self, host: str) -> dict[str, int]:
        """The iterations the jobs present on `host` declare (those that do)."""
        return {j: self.jobs[j].iterations for j in self.measured[host] if self.jobs[j].declares}

    def observed(
        self, host: str
    ) -> tuple[dict[str, JobLoad], dict[str, float], frozenset[str], dict[str, int]]:
        """What `host`'s agent hands pack besides its jobs: their loads, those started, the
        collective ones and the iterations declared (BandPolicy.evaluate's arguments)."""
        return self.loads(host), self.started(host), self.collective(host), self.declared(host)

    def collective(self, host: str) -> frozenset[str]:
        return frozenset(j for j in self.measured[host] if self.jobs[j].kind is JobKind.COLLECTIVE)

    def started(self, host: str) -> dict[str, float]:
        """The jobs that have begun to push on `host`, each with when its first push began."""
        return {
            j: r.first_push_started
            for j, r in self.measured[host].items()
            if r.first_push_started is not None
        }

    def set_bands(self, host: str, bands: Mapping[str, int]) -> None:
        link = self.links[host]
        if bands == link.bands:
            return
        self._links_changed((host,), settled_only=True)
        link.set_bands(bands, self.now)
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

    def run(
        self, until_s: float = math.inf, wanted: Collection[str] | None = None
    ) -> dict[str, JobResult]:
        """Until every job (every `wanted` one) has finished, or `until_s`."""
        self.driver.attach(self)
        for job in self.jobs.values():
            self.at(job.arrival_s, lambda job=job: self._arrive(job))  # type: ignore[misc]
        self._wanted = set(self.jobs if wanted is None else wanted) - self.results.keys()
        while self._events and self._wanted:
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

    def _job_at(self, name: str, when: float, action: Callable[[], None]) -> None:
        """`action` for job `name` at `when`, unless a skip began or ended meanwhile."""
        token = self.running[name].tokens
        self.at(when, lambda: self._fire(name, token, action))

    def _fire(self, name: str, token: int, action: Callable[[], None]) -> None:
        state = self.running.get(name)
        if state is not None and state.tokens == token:
            action()

    def _arrive(self, job: SimJob) -> None:
        self.running[job.name] = _Running(job, changed_at=self.now, last_end=self.now)
        self._links_changed(job.hosts, settled_only=False)
        for host in job.hosts:
            self.measured[host][job.name] = HostJob()
        self._evaluate(job.hosts)
        self._ready(job.name)

    def _component(self, hosts: Collection[str]) -> set[str]:
        """The running jobs joined to `hosts` through the links they share."""
        jobs: set[str] = set()
        seen = set(hosts)
        frontier = list(hosts)
        while frontier:
            for name in self.measured[frontier.pop()]:
                if name not in jobs and name in self.running:
                    jobs.add(name)
                    for host in self.jobs[name].hosts:
                        if host not in seen:
                            seen.add(host)
                            frontier.append(host)
        return jobs

    def _links_changed(self, hosts: Collection[str], settled_only: bool) -> None:
        """Something on `hosts` changes now (a job comes or goes, bands move): the jobs
        sharing those links run send by send again (`settled_only`: the settled ones; a job
        alone on its links runs as fast whatever the bands) and settle anew."""
        if not self.settle and settled_only:
            return
        # In name order: the order they go back to send by send is the order their flows
        # join the links (a set's order differs per process, with the hash seed).
        for name in sorted(self._component(hosts) if self.settle else self._on(hosts)):
            state = self.running[name]
            if state.skip is not None and (state.skip.settled or not settled_only):
                self._unskip(name)
            state.steady = 0
            state.changed_at = self.now
            state.ends.clear()

    def _on(self, hosts: Collection[str]) -> set[str]:
        return {name for host in hosts for name in self.measured[host] if name in self.running}

    def _ready(self, name: str) -> None:
        """Its next iteration begins now."""
        job = self.running[name].job
        if job.compute_first:
            if self.fast_forward and self._alone(job):
                self._skip(name)
            else:
                self._job_at(
                    name, self.now + job.compute_s + job.overhead_s, lambda: self._release(name)
                )
            return
        when = self.driver.release(name, self.now)
        if when > self.now:
            self._job_at(name, when, lambda: self._communicate(name))
        elif self.fast_forward and self._alone(job):
            self._skip(name)
        else:
            self._communicate(name)

    def _release(self, name: str) -> None:
        when = self.driver.release(name, self.now)
        if when > self.now:
            self._job_at(name, when, lambda: self._communicate(name))
        else:
            self._communicate(name)

    def _alone(self, job: SimJob) -> bool:
        return all(
            len(self.measured[host]) == 1 and not self.links[host].flows for host in job.hosts
        )

    def _communicate(self, name: str) -> None:
        """Its traffic of this iteration begins now, on every one of its hosts."""
        state = self.running[name]
        job = state.job
        self.counters.pushed_iterations += 1
        for host in job.hosts:
            self._traffic_began(name, host, self.now)
        if job.kind is JobKind.COLLECTIVE:
            state.started = [0] * len(job.hosts)
            state.sent = [0] * len(job.hosts)
            for rank in range(len(job.hosts)):
                self._try_step(name, rank)
        else:
            state.hosts_left = len(job.hosts)
            for host in job.hosts:
                self._send(name, host, 1.0)

    def _traffic_began(self, name: str, host: str, started: float) -> None:
        record = self.measured[host][name]
        record.push_began(started)
        record.bytes_this_push = self.running[name].job.pushed_bytes
        record.flows_left = 1

    def _send(self, name: str, host: str, left: float, rank: int | None = None) -> None:
        """Put `left` (a fraction) of one send of `name` on `host`'s link: a PS's push, or a
        ring step of `rank`."""
        job = self.running[name].job
        if rank is None:
            done = self._delivered_callback(name, host)
        else:
            done = self._stepped_callback(name, rank)
        link = self.links[host]
        link.add(Flow(name, job.flow_bytes * left, done, job.streams), self.now)
        self._schedule_link(link)

    def _delivered_callback(self, name: str, host: str) -> Callable[[float], None]:
        return lambda now: self._delivered(name, host, now)

    def _stepped_callback(self, name: str, rank: int) -> Callable[[float], None]:
        return lambda now: self._stepped(name, rank, now)

    def _delivered(self, name: str, host: str, now: float) -> None:
        """A PS host's push ended: its workers compute once every shard is in."""
        state = self.running[name]
        self._traffic_ended(name, host, now)
        state.hosts_left -= 1
        if state.hosts_left == 0:
            job = state.job
            self._job_at(name, now + job.compute_s + job.overhead_s, lambda: self._barrier(name))

    def _try_step(self, name: str, rank: int, left: float = 1.0) -> None:
        """Start `rank`'s next ring step if its own previous send and its predecessor's (the
        chunk it forwards) are done."""
        state = self.running[name]
        step = state.started[rank]
        if step >= state.job.steps or state.sent[rank] != step:
            return
        if step > 0 and state.sent[rank - 1] < step:
            return
        state.started[rank] += 1
        self._send(name, state.job.hosts[rank], left, rank)

    def _stepped(self, name: str, rank: int, now: float) -> None:
        state = self.running[name]
        job = state.job
        state.sent[rank] += 1
        if state.sent[rank] == job.steps:
            self._traffic_ended(name, job.hosts[rank], now)
        if all(sent == job.steps for sent in state.sent):
            self._barrier(name)
            return
        self._try_step(name, rank)
        self._try_step(name, (rank + 1) % len(job.hosts))

    def _traffic_ended(self, name: str, host: str, now: float) -> None:
        record = self.measured[host][name]
        record.flows_left = 0
        self._push_ended(record, now)
        self._host_news(host)

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
        """Every worker has answered (a ring: every rank has sent its last step): the
        iteration is done."""
        state = self.running[name]
        state.done_iterations += 1
        if state.done_iterations >= state.job.iterations:
            self._finish(name)
            return
        state.steady += 1
        state.ends.append(self.now)
        state.last_end = self.now
        if self.settle and self._try_settle(name):
            return
        self._ready(name)

    def _finish(self, name: str) -> None:
        state = self.running.pop(name)
        job = state.job
        self.results[name] = JobResult(name, job.arrival_s, self.now)
        self._wanted.discard(name)
        for host in job.hosts:
            del self.measured[host][name]
            self.links[host].remove_job(name, self.now)
        self._links_changed(job.hosts, settled_only=True)
        self._evaluate(job.hosts)

    # Fast-forward ---------------------------------------------------------------------------

    def _skip(self, name: str) -> None:
        """`name` is alone on its links, at the start of an iteration: run the rest in one
        event at its standalone speed."""
        state = self.running[name]
        job = state.job
        busy = {host: job.link_s(self.links[host].rate_bps) for host in job.hosts}
        if job.kind is JobKind.COLLECTIVE:
            # Every step waits for the slowest link's send of it.
            slowest = max(busy.values())
            traffic = {host: slowest for host in job.hosts}
            traffic_at = job.compute_s + job.overhead_s
        else:
            traffic, traffic_at = dict(busy), 0.0
        period = max(traffic.values()) + job.compute_s + job.overhead_s
        iterations = job.iterations - state.done_iterations
        skip = _Skip(self.now, iterations, period, traffic_at, traffic, busy)
        self._begin_skip(name, skip)
        # Its agents would look at it after every push; a driver's counts of what it saw
        # green (packing.OnTop) begin at its first load (the second iteration measured) and
        # trust its demand MEASURED_AFTER iterations later: evaluated then, as push by push.
        ends = skip.start + skip.traffic_at + max(skip.traffic_s.values())
        for index in (1, 1 + MEASURED_AFTER):
            if index < iterations:
                self._job_at(name, ends + index * period, lambda: self._evaluate(job.hosts))

    def _begin_skip(self, name: str, skip: _Skip) -> None:
        state = self.running[name]
        state.tokens += 1
        state.skip = skip
        end = max(self.now, skip.start + skip.iterations * skip.period_s)
        self._job_at(name, end, lambda: self._skipped(name))

    def _try_settle(self, name: str) -> bool:
        """Settle `name`'s component if every job of it has run steady (see the module doc);
        whether it did."""
        if self.running[name].steady < min(SETTLE_AFTER, 2):
            return False
        jobs = self._component(self.jobs[name].hosts)
        if len(jobs) < 2:
            return False
        for other in jobs:
            state = self.running[other]
            waited = self.now - state.changed_at >= SETTLE_WAIT_S
            if state.skip is not None or (state.steady < SETTLE_AFTER and not waited):
                return False
        self.counters.settles += 1
        for other in sorted(jobs):
            self._settle(other)
        return True

    def _settle(self, name: str) -> None:
        state = self.running[name]
        job = state.job
        for host in job.hosts:
            link = self.links[host]
            if link.remove_job(name, self.now):
                self._schedule_link(link)
        start = state.last_end
        if len(state.ends) >= 2:
            period = (start - state.ends[0]) / (len(state.ends) - 1)
        else:  # starved since the change (SETTLE_WAIT_S)
            period = (self.now - state.changed_at) / (state.steady + 1)
        traffic = {}
        for host in job.hosts:
            recent = list(self.measured[host][name].recent)[-SETTLE_MEASURE:]
            lengths = [m.period_s - m.idle_before_s for m in recent if m.idle_before_s is not None]
            traffic[host] = min(period, statistics.fmean(lengths)) if lengths else period
        traffic_at = 0.0 if job.kind is JobKind.PS else period - max(traffic.values())
        busy = {host: job.link_s(self.links[host].rate_bps) for host in job.hosts}
        measured_first = frozenset(
            host
            for host in job.hosts
            if (last := self.measured[host][name].last_push_end) is not None and last > start
        )
        iterations = job.iterations - state.done_iterations
        skip = _Skip(start, iterations, period, traffic_at, traffic, busy, True, 0, measured_first)
        self._begin_skip(name, skip)

    def _skipped(self, name: str) -> None:
        state = self.running[name]
        skip = state.skip
        assert skip is not None
        self._record_skipped(name, skip, skip.iterations)
        state.skip = None
        state.done_iterations += skip.iterations
        self._finish(name)

    def _catch_up(self, name: str) -> None:
        """Write the measurements of a skipping job's iterations whose traffic has ended by
        now (what its agents have measured so far)."""
        skip = self.running[name].skip
        if skip is not None:
            ended = self.now - skip.start - skip.traffic_at - max(skip.traffic_s.values())
            # (At a look set for a push's end, `ended` can come out a hair short of it.)
            pushed = math.floor(ended / skip.period_s + 1e-9) + 1
            self._record_skipped(name, skip, max(0, min(pushed, skip.iterations)))

    def _unskip(self, name: str) -> None:
        """Something changed on `name`'s links: back to send by send, from where its skipped
        iterations have got to."""
        state = self.running[name]
        skip = state.skip
        if skip is None:
            return
        state.skip = None
        state.tokens += 1
        job = state.job
        done = min(max(0, math.floor((self.now - skip.start) / skip.period_s)), skip.iterations)
        if skip.settled:
            done = min(done, skip.iterations - 1)  # its last iteration ends at its event
        self._record_skipped(name, skip, done)
        state.done_iterations += done
        if done == skip.iterations:  # its last iteration ends this very instant
            self._job_at(name, self.now, lambda: self._finish(name))
            return
        began = skip.start + done * skip.period_s
        state.last_end = began
        into = self.now - began - skip.traffic_at
        if into < 0 or (into == 0 and job.compute_first):
            # A ring, computing (or done this very instant: its release is an event of its
            # own, after what is happening now, as when it runs send by send: the order in
            # which pushes join a link decides which of them ramps).
            self._job_at(name, began + skip.traffic_at, lambda: self._release(name))
            return
        self.counters.pushed_iterations += 1
        traffic_began = began + skip.traffic_at
        measured = done == 0 and skip.measured_first
        if job.kind is JobKind.COLLECTIVE:
            # Every rank in the same step (its sends are paced by the slowest link).
            share = min(into / max(skip.traffic_s.values()), 1.0) * job.steps
            step = min(int(share), job.steps - 1)
            state.started = [step] * len(job.hosts)
            state.sent = [step] * len(job.hosts)
            for rank, host in enumerate(job.hosts):
                self.links[host].busy_s += skip.busy_s[host] * share / job.steps
                self._traffic_began(name, host, traffic_began)
                self._try_step(name, rank, 1.0 - (share - step))
            return
        state.hosts_left = 0
        for host, traffic_s in skip.traffic_s.items():
            if into < traffic_s:
                state.hosts_left += 1
                self.links[host].busy_s += skip.busy_s[host] * into / traffic_s
                self._traffic_began(name, host, traffic_began)
                self._send(name, host, 1.0 - into / traffic_s)
            elif skip.recorded == done and not (measured and host in skip.measured_first):
                # Ended, and not measured yet.
                self._traffic_began(name, host, traffic_began)
                self._push_ended(self.measured[host][name], traffic_began + traffic_s)
                self.measured[host][name].flows_left = 0
                self.links[host].busy_s += skip.busy_s[host]
        if state.hosts_left == 0:
            self._job_at(name, max(self.now, began + skip.period_s), lambda: self._barrier(name))

    def _record_skipped(self, name: str, skip: _Skip, upto: int) -> None:
        """The measurements the agents took of skipped iterations `skip.recorded` to `upto`
        (of a long run only the last COMPUTE_ITERATIONS, the agent's window)."""
        if upto <= skip.recorded:
            return
        self.counters.skipped_iterations += upto - skip.recorded
        pushed = self.running[name].job.pushed_bytes
        for host, traffic_s in skip.traffic_s.items():
            self.links[host].busy_s += skip.busy_s[host] * (upto - skip.recorded)
            record = self.measured[host][name]
            begin = skip.recorded + (1 if skip.recorded == 0 and host in skip.measured_first else 0)
            first = max(begin, upto - COMPUTE_ITERATIONS)
            if first > begin:
                record.count += first - begin
                last = skip.start + (first - 1) * skip.period_s + skip.traffic_at
                record.last_push_end = last + traffic_s
            for k in range(first, upto):
                began = skip.start + k * skip.period_s + skip.traffic_at
                record.push_began(began)
                record.bytes_this_push = pushed
                self._push_ended(record, began + traffic_s)
        skip.recorded = upto
