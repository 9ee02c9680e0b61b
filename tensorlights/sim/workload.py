"""A cluster's day of training jobs, generated from published distributions of public traces
(nothing is downloaded: the numbers are below, with where they come from).

Drawn from the traces:
  * GPUs per job: 1 (70%), 2 (10%), 4 (15%), 8 (5%), as Gavel (Narayanan et al., OSDI'20)
    samples "the Philly distribution" (Jeon et al., ATC'19): stanford-futuredata/gavel,
    scheduler/utils.py, _generate_scale_factor.
  * A job's run time (alone): the Philly trace's job run times, 83,154 jobs in seconds, as
    the Alibaba PAI authors published them beside their own (Weng et al., NSDI'22, Figure
    4; alibaba/clusterdata, cluster-trace-gpu-v2020/analysis/philly_runtime.csv): the
    quantiles in PHILLY_RUN_TIME_S, sampled log-linearly between them (median 20 min, mean
    4.1 h, 3.5% longer than a day).
  * Arrivals: a Poisson process of `jobs` over the day (the issue's 4,000 on 1,000 hosts).

Assumed here (no public trace gives them; each is a parameter):
  * Hosts of GPUS_PER_HOST GPUs (Philly's and PAI's large servers have 8) and one NIC of
    `nic_bps` egress (25 Gbit/s).
  * The model a job trains: one of MODELS, uniformly (as Gavel draws its job types); their
    sizes are the models' parameter counts in fp32, their compute per iteration an order of
    magnitude for a V100-class GPU.
  * Kind: a 1-GPU job trains alone (no network traffic); a larger one is a PS job with
    probability `ps_share` (one PS task pushing the model to each of its GPUs' workers, as
    PAI's TensorFlow PS/worker jobs), else an all-reduce job (a ring over the hosts its GPUs
    are on: none if they all fit on one).
  * Placement, by a scheduler that sees the jobs' standalone run times (so every policy runs
    the same placement; the network does not feed back into it): a job's GPUs on the host
    with the fewest free GPUs that fits them all (best fit), else over the hosts with the
    most free, fewest hosts first; a job that does not fit waits, first come first served.
    PS tasks are CPU tasks, PS_SLOTS per host: `pack` puts one on the fullest host with a free
    slot (bin packing, as a cluster scheduler keeps hosts free for large jobs; what
    TensorLights is for: PS tasks of several jobs on one host), `spread` on the emptiest.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum

from tensorlights.model import JobKind
from tensorlights.sim.engine import SimJob

PHILLY_RUN_TIME_S = (
    (0.0, 1), (0.01, 17), (0.02, 25), (0.05, 48), (0.1, 61), (0.15, 68), (0.2, 76),
    (0.25, 131), (0.3, 229), (0.35, 428), (0.4, 630), (0.45, 889), (0.5, 1186),
    (0.55, 1500), (0.6, 1871), (0.65, 2242), (0.7, 2590), (0.75, 3342), (0.8, 4699),
    (0.85, 6300), (0.9, 12859), (0.925, 21051), (0.95, 49948), (0.975, 127174),
    (0.99, 287283), (0.995, 484497), (0.999, 1361015), (1.0, 4628239),
)  # fmt: skip
"""(quantile, seconds) of Philly's job run times (see the module doc; the 0 s minimum is
taken as 1 s)."""
GPUS_PER_JOB = ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05))
"""(GPUs, probability): Gavel's sampling of the Philly distribution."""
GPUS_PER_HOST = 8
PS_SLOTS = 4
MB = 1_000_000


@dataclass(frozen=True)
class Model:
    name: str
    params_m: float
    """Millions of parameters (the model's paper)."""
    compute_s: float
    """Compute per iteration on one GPU (assumed, see the module doc)."""

    @property
    def gradient_bytes(self) -> int:
        return int(self.params_m * 4 * MB)


MODELS = (
    Model("ResNet-18", 11.7, 0.05),  # He et al., CVPR'16
    Model("ResNet-50", 25.6, 0.15),  # He et al., CVPR'16
    Model("VGG-16", 138.0, 0.20),  # Simonyan and Zisserman, ICLR'15
    Model("BERT-base", 110.0, 0.25),  # Devlin et al., NAACL'19
    Model("Transformer-big", 213.0, 0.30),  # Vaswani et al., NeurIPS'17
    Model("BERT-large", 340.0, 0.50),  # Devlin et al., NAACL'19
)


class PsPlacement(StrEnum):
    PACK = "pack"
    SPREAD = "spread"


@dataclass(frozen=True)
class ClusterSpec:
    hosts: int = 1000
    jobs: int = 4000
    day_s: float = 86400.0
    nic_bps: float = 25e9
    ps_share: float = 0.5
    ps_placement: PsPlacement = PsPlacement.PACK
    seed: int = 1

    def __post_init__(self) -> None:
        if self.hosts < 2 or self.jobs < 1 or not self.day_s > 0 or not self.nic_bps > 0:
            raise ValueError("a cluster needs 2 hosts or more, jobs, a day and a NIC rate")
        if not 0.0 <= self.ps_share <= 1.0:
            raise ValueError(f"ps_share must be within 0..1, got {self.ps_share}")

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(f"h{i:04d}" for i in range(self.hosts))


@dataclass(frozen=True)
class ClusterJob:
    """One job of the day, placed."""

    name: str
    model: Model
    gpus: int
    kind: JobKind | None
    """PS, collective, or None: its traffic never leaves its host (1 GPU, or a ring on one
    host)."""
    submitted_s: float
    started_s: float
    alone_s: float
    """Its run time alone (drawn from the trace, whole iterations)."""
    hosts: tuple[str, ...]
    """The hosts whose egress carries its traffic (its PS host; its ring's hosts)."""
    sim_job: SimJob | None
    """What the simulator runs (None: no network traffic, its JCT is its run time)."""
    gpu_hosts: tuple[tuple[str, int], ...] = ()
    """Where its GPUs are: (host, GPUs)."""


@dataclass
class _Host:
    free_gpus: int = GPUS_PER_HOST
    ps_tasks: int = 0


@dataclass
class Workload:
    spec: ClusterSpec
    jobs: list[ClusterJob] = field(default_factory=list)

    @property
    def links(self) -> dict[str, float]:
        return {host: self.spec.nic_bps for host in self.spec.host_names}

    @property
    def networked(self) -> list[ClusterJob]:
        return [job for job in self.jobs if job.sim_job is not None]

    def sharing(self) -> set[str]:
        """Networked jobs that share a link with another one at some time (runs alone)."""
        runs: dict[str, list[tuple[float, float, str]]] = {}
        for job in self.networked:
            for host in job.hosts:
                runs.setdefault(host, []).append(
                    (job.started_s, job.started_s + job.alone_s, job.name)
                )
        shared: set[str] = set()
        for spans in runs.values():
            spans.sort()
            active: list[tuple[float, str]] = []
            for start, end, name in spans:
                active = [(until, other) for until, other in active if until > start]
                if active:
                    shared.add(name)
                    shared.update(other for _, other in active)
                active.append((end, name))
        return shared

    def gpu_utilisation(self) -> float:
        """Mean share of the cluster's GPUs busy over the day (standalone run times)."""
        day = self.spec.day_s
        busy = sum(
            job.gpus * max(0.0, min(day, job.started_s + job.alone_s) - job.started_s)
            for job in self.jobs
            if job.started_s < day
        )
        return busy / (self.spec.hosts * GPUS_PER_HOST * day)


def run_time(u: float) -> float:
    """The Philly run time at quantile `u` (log-linear between the table's quantiles)."""
    quantiles = [q for q, _ in PHILLY_RUN_TIME_S]
    i = min(max(bisect.bisect_right(quantiles, u), 1), len(quantiles) - 1)
    (q0, t0), (q1, t1) = PHILLY_RUN_TIME_S[i - 1], PHILLY_RUN_TIME_S[i]
    share = (u - q0) / (q1 - q0) if q1 > q0 else 0.0
    return math.exp(math.log(t0) + share * (math.log(t1) - math.log(t0)))


def generate(spec: ClusterSpec) -> Workload:
    rng = random.Random(spec.seed)
    scheduler = _Scheduler(spec, rng)
    for index, arrival in enumerate(sorted(rng.uniform(0.0, spec.day_s) for _ in range(spec.jobs))):
        gpus = _choose(rng, GPUS_PER_JOB)
        model = rng.choice(MODELS)
        kind = None if gpus == 1 else (
            JobKind.PS if rng.random() < spec.ps_share else JobKind.COLLECTIVE
        )  # fmt: skip
        scheduler.submit(_Request(index, arrival, model, gpus, kind, run_time(rng.random())))
    scheduler.finish()
    workload = Workload(spec, sorted(scheduler.placed, key=lambda job: job.started_s))
    return workload


@dataclass(frozen=True)
class _Request:
    index: int
    submitted_s: float
    model: Model
    gpus: int
    kind: JobKind | None
    alone_s: float


class _Scheduler:
    """Places jobs as they come, first come first served, on standalone run times."""

    def __init__(self, spec: ClusterSpec, rng: random.Random) -> None:
        self.spec = spec
        self.hosts = {name: _Host() for name in spec.host_names}
        order = list(spec.host_names)
        rng.shuffle(order)  # ties broken by a fixed random order, not by name
        self.rank = {name: i for i, name in enumerate(order)}
        self.releases: list[tuple[float, int, str, int, int]] = []
        """(when, seq, host, GPUs, PS tasks) freed when a job's standalone run ends."""
        self.waiting: list[_Request] = []
        self.placed: list[ClusterJob] = []
        self._seq = 0

    def submit(self, request: _Request) -> None:
        while self.waiting and self.releases and self.releases[0][0] <= request.submitted_s:
            self._run_until(self.releases[0][0])
        self._run_until(request.submitted_s)
        self.waiting.append(request)
        self._start(request.submitted_s)

    def finish(self) -> None:
        """Start what still waits, as GPUs free."""
        while self.waiting and self.releases:
            self._run_until(self.releases[0][0])

    def _run_until(self, now: float) -> None:
        while self.releases and self.releases[0][0] <= now:
            _, _, host, gpus, ps_tasks = heapq.heappop(self.releases)
            self.hosts[host].free_gpus += gpus
            self.hosts[host].ps_tasks -= ps_tasks
        self._start(now)

    def _start(self, now: float) -> None:
        while self.waiting and self._place(self.waiting[0], now):
            self.waiting.pop(0)

    def _place(self, request: _Request, now: float) -> bool:
        gpu_hosts = _place_gpus(self.hosts, self.rank, request.gpus)
        if gpu_hosts is None:
            return False
        ps_host = None
        if request.kind is JobKind.PS:
            ps_host = _place_ps(self.hosts, self.rank, self.spec.ps_placement)
            if ps_host is None:
                return False
        job = _placed(self.spec, request, now, ps_host, gpu_hosts)
        if ps_host is not None:
            self._hold(ps_host, 0, 1, now + job.alone_s)
        for host, count in gpu_hosts.items():
            self._hold(host, count, 0, now + job.alone_s)
        self.placed.append(job)
        return True

    def _hold(self, host: str, gpus: int, ps_tasks: int, until: float) -> None:
        self.hosts[host].free_gpus -= gpus
        self.hosts[host].ps_tasks += ps_tasks
        self._seq += 1
        heapq.heappush(self.releases, (until, self._seq, host, gpus, ps_tasks))


def _choose(rng: random.Random, table: Sequence[tuple[int, float]]) -> int:
    u, total = rng.random(), 0.0
    for value, probability in table:
        total += probability
        if u < total:
            return value
    return table[-1][0]


def _place_gpus(hosts: dict[str, _Host], rank: dict[str, int], gpus: int) -> dict[str, int] | None:
    """Best fit on one host, else the fewest hosts with the most free GPUs."""
    fits = [name for name, host in hosts.items() if host.free_gpus >= gpus]
    if fits:
        best = min(fits, key=lambda name: (hosts[name].free_gpus, rank[name]))
        return {best: gpus}
    placed: dict[str, int] = {}
    left = gpus
    for name in sorted(hosts, key=lambda name: (-hosts[name].free_gpus, rank[name])):
        if left == 0 or hosts[name].free_gpus == 0:
            break
        take = min(left, hosts[name].free_gpus)
        placed[name] = take
        left -= take
    return placed if left == 0 else None


def _place_ps(hosts: dict[str, _Host], rank: dict[str, int], how: PsPlacement) -> str | None:
    room = [name for name, host in hosts.items() if host.ps_tasks < PS_SLOTS]
    if not room:
        return None
    if how is PsPlacement.PACK:
        return min(room, key=lambda name: (-hosts[name].ps_tasks, rank[name]))
    return min(room, key=lambda name: (hosts[name].ps_tasks, rank[name]))


def _placed(
    spec: ClusterSpec, request: _Request, start: float, ps_host: str | None,
    gpu_hosts: dict[str, int],
) -> ClusterJob:  # fmt: skip
    name = f"job{request.index:05d}"
    model, kind = request.model, request.kind
    if kind is JobKind.COLLECTIVE and len(gpu_hosts) < 2:
        kind = None  # a ring inside one host: NVLink/PCIe, not the NIC
    if kind is None:
        return ClusterJob(
            name, model, request.gpus, None, request.submitted_s, start, request.alone_s, (),
            None, tuple(gpu_hosts.items()),
        )  # fmt: skip
    hosts = (ps_host,) if ps_host is not None else tuple(gpu_hosts)
    draft = SimJob(name, model.gradient_bytes, request.gpus, model.compute_s, 1, start, hosts,
                   kind=kind)  # fmt: skip
    iterations = max(2, round(request.alone_s / draft.alone_s(spec.nic_bps)))
    sim_job = replace(draft, iterations=iterations)
    return ClusterJob(
        name, model, request.gpus, kind, request.submitted_s, start,
        sim_job.alone_s(spec.nic_bps), hosts, sim_job, tuple(gpu_hosts.items()),
    )  # fmt: skip
