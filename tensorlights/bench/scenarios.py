"""The benchmark's scenarios and the policies compared (pure data).

Every scenario runs on the same emulated cluster. A PS scenario's bottleneck is one PS host's
egress link (`rate`, 300 Mbit by default), its workers spread round-robin over two worker
hosts, so jobs share them; in the multi-host scenarios (m) the PS tasks run on up to three PS
hosts, each one's egress shaped at `rate`, and a sharded job's workers wait for every shard.
A collective scenario's jobs are all-reduce jobs with one rank on
each of four hosts (the PS host, the two worker hosts and a third), every host's egress
shaped at `rate`: each job's ring crosses every host's link, as on a cluster where several
data-parallel jobs share nodes.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import ClassVar

from tensorlights.errors import ConfigError

MB = 1_000_000
PS_HOST = "ps"
PS_HOSTS = (PS_HOST, "ps2", "ps3")
"""Where the PS tasks of the multi-host scenarios run, each host's egress shaped."""
WORKER_HOSTS = ("w1", "w2")
RANK_HOSTS = (PS_HOST, *WORKER_HOSTS, "w3")
"""Where a collective job's ranks run, rank 0 first: every host shaped."""
CONTROLLER_HOST = "ctl"
"""Where the controller runs (its link is not shaped)."""
COLLECTIVE_WORKLOADS = frozenset({"torch-ddp", "horovod-ddp"})


class Policy(StrEnum):
    """What controls the PS host's egress during a run."""

    FIFO = "fifo"
    """No agent: one FIFO queue at the link rate (tbf)."""
    FAIR = "fair"
    """Per-job HTB classes with equal rate and priority (no light): `tc`, built once."""
    STATIC = "static"
    """The agent, `--policy static`: TL-One, a fixed order."""
    TL_RR_ORIGINAL = "tl-rr-original"
    """The HPBDC'19 prototype: the qdisc deleted and rebuilt with `tc` every 20 s, the top
    priority moving to the next job each time."""
    ROTATE = "rotate"
    """The agent, `--policy rotate`: the light moves every interval."""
    PACK = "pack"
    """The agent, `--policy pack`: measured demand, starvation bound (issue 9)."""
    PACK_ITERATIONS = "pack-iterations"
    """(Asked for by name) `pack`, every job declaring its iterations to the agent
    (TENSORLIGHTS_ITERATIONS in its processes' environment): the guard judges each by its
    deadline (policy/packing.py). What that signal buys, beside `pack`."""
    CONTROLLER_PACK = "controller-pack"
    """The agents of every shaped host following the controller, `--policy pack`: one
    cluster-wide order by measured demand, each job green on all its hosts at once."""
    CONTROLLER_PACK_ITERATIONS = "controller-pack-iterations"
    """(Asked for by name) `controller-pack`, every job declaring its iterations, as in
    `pack-iterations`: what that signal buys under the controller."""
    CONTROLLER_ROTATE = "controller-rotate"
    """The same with the controller's coordinated rotation (`--policy rotate`)."""
    CONTROLLER_KILLED = "controller-pack-killed"
    """(Faults, asked for by name) controller-pack, the controller SIGKILLed FAULT_AT_S into
    the run (--fault-at) and not restarted: the agents hold its plan for the lease, then fall
    back."""
    CONTROLLER_RESTARTED = "controller-pack-restarted"
    """The controller SIGKILLed FAULT_AT_S in and started again FAULT_DOWN_S later
    (--fault-down)."""
    AGENT_RESTARTED = "controller-pack-agent-restarted"
    """The first PS host's agent restarted (SIGTERM, as systemd restarts it) FAULT_AT_S in."""
    ALONE = "alone"
    """(Profiles, not compared) one job alone on a FIFO link: its standalone JCT."""
    ORDERS = "orders"
    """(A reference, asked for by name) every fixed priority order of a scenario of up to
    MAX_ORDER_JOBS jobs, each one run (StaticOrder)."""


FAULTS = (Policy.CONTROLLER_KILLED, Policy.CONTROLLER_RESTARTED, Policy.AGENT_RESTARTED)
FAULT_AT_S = 10.0
FAULT_DOWN_S = 8.0
"""A restarted controller's time down: within the agents' lease (15 s), as a supervisor
restarts a crashed one."""

MAX_ORDER_JOBS = 4
"""Scenarios with more jobs get no static orders (5 jobs: 120 orders)."""


@dataclass(frozen=True)
class StaticOrder:
    """One fixed priority order, green first (job indices in the scenario), built once with
    `tc` as the prototype's TL-One tree: the reference every policy is compared with."""

    order: tuple[int, ...]

    PREFIX: ClassVar[str] = "order-"

    @property
    def value(self) -> str:
        return self.PREFIX + "-".join(str(i + 1) for i in self.order)

    @classmethod
    def every(cls, jobs: int) -> list[StaticOrder]:
        if jobs > MAX_ORDER_JOBS:
            return []
        return [cls(order) for order in itertools.permutations(range(jobs))]

    @classmethod
    def parse(cls, value: str) -> StaticOrder | None:
        """The order a trial's policy names (`order-2-1-3`), None for other policies."""
        if not value.startswith(cls.PREFIX):
            return None
        return cls(tuple(int(i) - 1 for i in value[len(cls.PREFIX) :].split("-")))

    def names(self, jobs: Sequence[str]) -> str:
        """`j2 > j1 > j3`: the scenario's job names, green first."""
        return " > ".join(jobs[i] for i in self.order)


COMPARED = (
    Policy.FIFO,
    Policy.FAIR,
    Policy.STATIC,
    Policy.TL_RR_ORIGINAL,
    Policy.ROTATE,
    Policy.PACK,
    Policy.CONTROLLER_PACK,
    Policy.CONTROLLER_ROTATE,
)
LEGACY = frozenset({Policy.FAIR, Policy.TL_RR_ORIGINAL, Policy.ORDERS})
"""Built with `tc` on each shaped host, as the prototype runs: each host its own tree, loop
and port feed, deciding alone. The prototype shaped PS hosts only; on a collective
scenario's rank hosts each tree classifies every rank's ports as discovery finds them (its
gloo pairs'), the rotations in step on every host (prototype_hosts)."""
LEGACY_PHASE_S = 5.0
"""The prototype on several PS hosts: each host's loop starts this long after the previous
host's, as its launcher starts them one host after the other, so their 20 s rotations are
not aligned. On a collective scenario's rank hosts they are (phase 0): a ring is slowed by
its slowest hop, so rotations out of step would put every job behind on some host, and the
prototype, which has no notion of rings, is given its best case there instead."""


def prototype_hosts(
    placements: Sequence[Sequence[str]], shaped: Sequence[str], collective: bool
) -> list[tuple[str, list[int], float]]:
    """Where the prototype's trees run, as the benchmark and the simulator run them: each
    shaped host, the jobs it has a class for (indices into `placements`, each job's PS
    hosts; every job on a rank host: each has a rank there) and its first rotation's delay
    (LEGACY_PHASE_S)."""
    return [
        (
            host,
            [i for i, hosts in enumerate(placements) if collective or host in hosts],
            0.0 if collective else k * LEGACY_PHASE_S,
        )
        for k, host in enumerate(shaped)
    ]


@dataclass(frozen=True)
class JobSpec:
    """One PS job: synthetic (tensorlights.testbed.psjob) or a real framework's
    (testbed/workloads.py names them)."""

    name: str
    model_bytes: int
    workers: int
    compute_s: float
    iterations: int
    start_s: float = 0.0
    """Arrival, seconds after the run starts."""
    workload: str = "synthetic"
    """synthetic, torch-gloo, torch-rpc, torch-ddp, horovod-ddp or tf-ps (Workload)."""
    ps_hosts: tuple[str, ...] = (PS_HOST,)
    """The hosts of its PS tasks (PS_HOSTS): with several, the model is sharded evenly over
    them, and each worker waits for every shard (synthetic, PyTorch gloo and TensorFlow
    jobs)."""

    @property
    def shards(self) -> int:
        return len(self.ps_hosts)

    @property
    def profile(self) -> tuple[str, int, int, float, int, int]:
        """What determines its standalone run (arrival and which hosts do not)."""
        return (
            self.workload, self.model_bytes, self.workers, self.compute_s, self.iterations,
            self.shards,
        )  # fmt: skip

    @property
    def collective(self) -> bool:
        """An all-reduce job: `workers` + 1 ranks, one per host (RANK_HOSTS)."""
        return self.workload in COLLECTIVE_WORKLOADS

    @property
    def pushed_bytes(self) -> int:
        """Payload its busiest host's egress carries over the run: the PS's, the model to
        every worker every iteration; a collective job's, every rank's share of a ring
        all-reduce, 2 (n - 1) / n of the model for n ranks, every iteration."""
        if self.collective:
            ranks = self.workers + 1
            return 2 * (ranks - 1) * self.model_bytes // ranks * self.iterations
        return self.model_bytes // self.shards * self.workers * self.iterations

    def pushed_bytes_on(self) -> dict[str, int]:
        """`pushed_bytes` on each host whose egress carries them: every PS host's shard; a
        collective job's every rank host."""
        hosts = RANK_HOSTS if self.collective else self.ps_hosts
        return {host: self.pushed_bytes for host in hosts}


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    description: str
    jobs: tuple[JobSpec, ...]

    @property
    def collective(self) -> bool:
        return any(job.collective for job in self.jobs)

    @property
    def shaped_hosts(self) -> tuple[str, ...]:
        """Every host whose egress the policies control: each PS host in use (PS_HOSTS
        order), or every rank host."""
        if self.collective:
            return RANK_HOSTS
        return tuple(host for host in PS_HOSTS if any(host in job.ps_hosts for job in self.jobs))

    def __post_init__(self) -> None:
        if self.collective and not all(job.collective for job in self.jobs):
            raise ConfigError(f"scenario {self.key}: collective and PS jobs do not mix")
        if self.collective and any(job.workers + 1 != len(RANK_HOSTS) for job in self.jobs):
            raise ConfigError(f"scenario {self.key}: a collective job has one rank per host")
        for job in self.jobs:
            if set(job.ps_hosts) - set(PS_HOSTS) or len(set(job.ps_hosts)) != job.shards:
                raise ConfigError(f"scenario {self.key}: {job.name}'s PS hosts are of {PS_HOSTS}")
            if job.shards > 1 and job.workload not in ("synthetic", "torch-gloo", "tf-ps"):
                raise ConfigError(
                    f"scenario {self.key}: only synthetic, gloo PS and TF jobs are sharded"
                )

    def scaled(self, factor: float) -> Scenario:
        """The same scenario with `factor` times the iterations (and arrival offsets)."""
        if not factor > 0:
            raise ConfigError(f"scale must be positive, got {factor}")
        return replace(
            self,
            jobs=tuple(
                replace(
                    job,
                    iterations=max(2, math.ceil(job.iterations * factor)),
                    start_s=job.start_s * factor,
                )
                for job in self.jobs
            ),
        )


SHARDED = (PS_HOST, "ps2")
M_ITERATIONS = 80
"""A multi-host job alone: about 26 s; sharing hosts: 35-50 s, two rotations of the
prototype's 20 s loop or more (with 25 iterations it never rotated before the jobs ended)."""


M3_JOBS = (
    JobSpec("j1", 8 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=SHARDED),
    JobSpec("j2", 8 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=("ps2", "ps3")),
    JobSpec("j3", 8 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=("ps3", PS_HOST)),
    JobSpec("j4", 4 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=(PS_HOST,)),
)
"""m3's jobs (synthetic) and where their PS tasks run; m5 runs them as PyTorch jobs."""


def _jobs(
    count: int,
    model_mb: float,
    workers: int,
    compute_s: float,
    iterations: int,
    workload: str = "synthetic",
) -> tuple[JobSpec, ...]:
    return tuple(
        JobSpec(f"j{i + 1}", int(model_mb * MB), workers, compute_s, iterations, 0.0, workload)
        for i in range(count)
    )


SWEEP_ITERATIONS = (50, 25, 10)
"""g's and r5's trials, in arrival order (longest first)."""


def _sweep(workload: str, compute_s: float) -> tuple[JobSpec, ...]:
    return tuple(
        JobSpec(f"j{i + 1}", 4 * MB, 2, compute_s, iterations, 0.5 * i, workload)
        for i, iterations in enumerate(SWEEP_ITERATIONS)
    )


SCENARIOS: dict[str, Scenario] = {
    s.key: s
    for s in (
        Scenario(
            "a",
            "comm-heavy, 2 jobs",
            "2 jobs x 2 workers, 6 MB model, 100 ms compute: each job's push takes 3x its "
            "compute, so the link is busy almost all the time with either job alone.",
            _jobs(2, 6, 2, 0.1, 25),
        ),
        Scenario(
            "b",
            "overload, 3 jobs",
            "3 jobs x 2 workers, 4 MB model, 250 ms compute: the three pushes together (0.67 s "
            "at 300 Mbit) exceed what the link can carry while any one job computes.",
            _jobs(3, 4, 2, 0.25, 25),
        ),
        Scenario(
            "c",
            "straggler-prone, 3 jobs x 4 workers",
            "3 jobs x 4 workers sharing the two worker hosts, 2 MB model, 250 ms compute: "
            "interleaved pushes finish at different times on different workers.",
            _jobs(3, 2, 4, 0.25, 25),
        ),
        Scenario(
            "d",
            "mixed model sizes",
            "3 jobs x 2 workers with 1, 3 and 6 MB models, 200 ms compute: small jobs stuck "
            "behind big pushes under FIFO.",
            (
                JobSpec("small", 1 * MB, 2, 0.2, 25),
                JobSpec("medium", 3 * MB, 2, 0.2, 25),
                JobSpec("large", 6 * MB, 2, 0.2, 25),
            ),
        ),
        Scenario(
            "e",
            "staggered arrivals",
            "3 jobs x 2 workers, 4 MB model, 250 ms compute, arriving 0, 5 and 10 s apart.",
            tuple(replace(job, start_s=5.0 * i) for i, job in enumerate(_jobs(3, 4, 2, 0.25, 25))),
        ),
        Scenario(
            "f",
            "starvation-prone, 5 jobs",
            "5 jobs x 2 workers, 4 MB model, 250 ms compute: two jobs fill the link, so under a "
            "fixed order the last ones wait for the first ones to finish.",
            _jobs(5, 4, 2, 0.25, 25),
        ),
        Scenario(
            "g",
            "a sweep's trials, longest first",
            "3 jobs x 2 workers, 4 MB model, 250 ms compute, of 50, 25 and 10 iterations, "
            "arriving 0.5 s apart in that order: the same model, so equal demands, and "
            "only a declared length tells the short trial from the long one.",
            _sweep("synthetic", 0.25),
        ),
        # Real frameworks (testbed/workloads.py): launched with their launchers' variables,
        # found by discovery alone; --compute stands for the accelerator's step.
        Scenario(
            "r1",
            "PyTorch RPC, comm-heavy, 2 jobs",
            "2 torch.distributed.rpc (TensorPipe) PS jobs x 2 workers, 8 MB model, 100 ms "
            "compute: each push takes 4x the compute.",
            _jobs(2, 8, 2, 0.1, 25, "torch-rpc"),
        ),
        Scenario(
            "r2",
            "PyTorch gloo, overload, 3 jobs",
            "3 gloo send/recv PS jobs x 2 workers, 4 MB model, 150 ms compute.",
            _jobs(3, 4, 2, 0.15, 25, "torch-gloo"),
        ),
        Scenario(
            "r3",
            "PyTorch, mixed frameworks and model sizes",
            "A 1 MB and a 6 MB gloo job and a 3 MB RPC job, 2 workers each, 200 ms compute.",
            (
                JobSpec("small", 1 * MB, 2, 0.2, 25, workload="torch-gloo"),
                JobSpec("medium", 3 * MB, 2, 0.2, 25, workload="torch-rpc"),
                JobSpec("large", 6 * MB, 2, 0.2, 25, workload="torch-gloo"),
            ),
        ),
        Scenario(
            "r4",
            "TensorFlow ParameterServerStrategy, 2 jobs",
            "2 TensorFlow PS jobs (TF_CONFIG: chief and PS on the PS host) x 2 workers, 6 MB "
            "of variables, 150 ms compute, one step per worker per iteration.",
            _jobs(2, 6, 2, 0.15, 25, "tf-ps"),
        ),
        # Several PS hosts (each shaped): jobs sharded over PS tasks on two of them, mixed with
        # jobs whose PS sits on one. A worker waits for its slowest shard. The jobs outlast
        # the prototype's 20 s rotation a few times over (M_ITERATIONS).
        Scenario(
            "r5",
            "PyTorch gloo, a sweep's trials, longest first",
            "g's sweep as gloo send/recv PS jobs x 2 workers, 4 MB model, 150 ms compute, "
            "of 50, 25 and 10 iterations, arriving 0.5 s apart in that order.",
            _sweep("torch-gloo", 0.15),
        ),
        Scenario(
            "m1",
            "2 sharded jobs on 2 PS hosts",
            "2 jobs x 2 workers, each with an 8 MB model sharded over PS tasks on ps and ps2 "
            "(4 MB each), 100 ms compute: each shard's push takes 2x the compute.",
            tuple(replace(job, ps_hosts=SHARDED) for job in _jobs(2, 8, 2, 0.1, M_ITERATIONS)),
        ),
        Scenario(
            "m2",
            "1 sharded job and 2 single-host jobs on 2 PS hosts",
            "An 8 MB job sharded over ps and ps2, and a 4 MB job on each of them alone, 2 "
            "workers each, 100 ms compute: every host carries two jobs.",
            (
                JobSpec("sharded", 8 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=SHARDED),
                JobSpec("on-ps", 4 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=(PS_HOST,)),
                JobSpec("on-ps2", 4 * MB, 2, 0.1, M_ITERATIONS, ps_hosts=("ps2",)),
            ),
        ),
        Scenario(
            "m3",
            "4 jobs over 3 PS hosts, overlapping",
            "Three 8 MB jobs sharded over two PS hosts each (ps+ps2, ps2+ps3, ps3+ps) and a "
            "4 MB job on ps alone, 2 workers each, 100 ms compute: no host carries the same "
            "jobs as another.",
            M3_JOBS,
        ),
        Scenario(
            "m4",
            "TensorFlow, 2 sharded jobs on 2 PS hosts",
            "2 TensorFlow ParameterServerStrategy jobs x 2 workers, TF_CONFIG with a PS task on "
            "ps and one on ps2 (the chief on ps), 8 MB of variables placed round-robin over "
            "them, 150 ms compute.",
            tuple(
                replace(job, ps_hosts=SHARDED)
                for job in _jobs(2, 8, 2, 0.15, M_ITERATIONS, "tf-ps")
            ),
        ),
        Scenario(
            "m5",
            "PyTorch, m3's 4 jobs over 3 PS hosts",
            "m3's jobs and placement as real PyTorch gloo PS jobs with torchrun's variables: "
            "three 8 MB models each sharded over PS ranks on two hosts (launched with --role "
            "ps), a 4 MB one on ps alone, 2 workers each, 100 ms compute.",
            tuple(replace(job, workload="torch-gloo") for job in M3_JOBS),
        ),
        # Collective jobs: PyTorch DDP (gloo ring all-reduce), a rank on every shaped host.
        Scenario(
            "c1",
            "PyTorch DDP, 2 jobs on 4 hosts",
            "2 DistributedDataParallel jobs x 4 ranks (one on each host), 8 MB of gradients, "
            "100 ms compute: each iteration's all-reduce sends 12 MB from every host.",
            _jobs(2, 8, 3, 0.1, 25, "torch-ddp"),
        ),
        Scenario(
            "c2",
            "PyTorch DDP, overload, 3 jobs on 4 hosts",
            "3 DistributedDataParallel jobs x 4 ranks, 8 MB of gradients, 100 ms compute: the "
            "three all-reduces of an iteration need ~1 s of every host's link, 10x the compute.",
            _jobs(3, 8, 3, 0.1, 25, "torch-ddp"),
        ),
    )
}


def select(keys: str) -> list[Scenario]:
    """'a,c' -> those scenarios; 'all' -> every one."""
    if keys == "all":
        return list(SCENARIOS.values())
    chosen = [key.strip() for key in keys.split(",") if key.strip()]
    unknown = [key for key in chosen if key not in SCENARIOS]
    if unknown or not chosen:
        raise ConfigError(f"unknown scenario {unknown or keys!r}; choose from {sorted(SCENARIOS)}")
    return [SCENARIOS[key] for key in chosen]


DECLARING = (Policy.PACK_ITERATIONS, Policy.CONTROLLER_PACK_ITERATIONS)
"""The policies whose jobs declare their iterations (TENSORLIGHTS_ITERATIONS): asked for by
name, not in `all`."""


def select_policies(names: str) -> list[Policy]:
    """'fifo,rotate' -> those policies; 'all' -> every compared one."""
    if names == "all":
        return list(COMPARED)
    chosen = [name.strip() for name in names.split(",") if name.strip()]
    valid = {p.value for p in (*COMPARED, *FAULTS, Policy.ORDERS, *DECLARING)}
    unknown = [name for name in chosen if name not in valid]
    if unknown or not chosen:
        raise ConfigError(f"unknown policy {unknown or names!r}; choose from {sorted(valid)}")
    return [Policy(name) for name in chosen]
