"""A cluster's day simulated under each policy (issue 22, items 4 and 5).

The workload (workload.py) is placed once; every policy runs the same placement, and jobs
alone on their links, or settled with the jobs sharing them, run in one event
(engine.Simulation's fast_forward and settle). Reported per policy, over the jobs with
network traffic that would finish within the day alone: average and p95 JCT, the share
slowed more than 2x; and what the run cost (wall time, events, the controller's replans,
timed from the real Planner's calls).
"""

from __future__ import annotations

import json
import random
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from functools import cache

from tensorlights.policy.bands import PolicyName
from tensorlights.sim.baselines import CassiniShifts, CruxIntensity
from tensorlights.sim.drivers import Coordinated, HostPolicies, NoBands, PrototypeRR, agent_policy
from tensorlights.sim.engine import Driver, Simulation
from tensorlights.sim.network import Discipline
from tensorlights.sim.workload import ClusterSpec, Workload, generate

POLICIES = ("fifo", "static", "tl-rr-original", "pack", "controller-pack", "cassini", "crux")
"""FIFO, per-host TL-One and TL-RR (the prototype: a 20 s rotation, hosts' phases not
aligned), our agents alone (uncoordinated pack), our agents following the controller
(coordinated pack), and the two other proposals."""
PROTOTYPE_PERIOD_S = 20.0
SLOWED = 2.0
"""The slowdown the report counts jobs past."""
RUN_LIMIT_DAYS = 4.0
"""A run stops here even if some counted job has not finished (reported as unfinished)."""


@dataclass(frozen=True)
class ScaleResult:
    policy: str
    reach: float
    """The share of hosts running an agent (the others stay FIFO)."""
    counted: int
    """Jobs with network traffic that would finish within the day alone."""
    unfinished: int
    avg_jct_s: float
    p95_jct_s: float
    slowed_share: float
    """Counted jobs slowed more than SLOWED times (unfinished ones among them)."""
    mean_slowdown: float
    wall_s: float
    cpu_s: float
    """The run's CPU time (the day's runs go two at a time beside other work: their wall
    time says little; the speed runs of the first hour run alone)."""
    simulated_s: float
    events: int
    evaluations: int
    settles: int
    skipped_iterations: int
    pushed_iterations: int
    replans: int = 0
    replan_mean_ms: float = 0.0
    replan_p99_ms: float = 0.0
    slowdowns: tuple[float, ...] = ()
    """Per counted job, its JCT over its run alone (unfinished: so far)."""


def driver(policy: str, workload: Workload, reach: float = 1.0) -> tuple[Driver, Discipline]:
    """The driver standing for `policy` on `workload`'s cluster; with `reach` < 1, our
    agents run on that share of hosts only (drawn with the workload's seed)."""
    hosts = workload.spec.host_names
    rng = random.Random(workload.spec.seed)
    # The hosts with an agent from a stream of their own: drawn from Random(seed), as the
    # placement's tie-breaking shuffle is, the sample took the very hosts the shuffle moved
    # to the end of its order, never the PS hosts placement fills first (none of 15 at any
    # reach: every reach ran as FIFO).
    sampler = random.Random(f"{workload.spec.seed}/reach")
    agents = None if reach >= 1.0 else frozenset(sampler.sample(hosts, round(reach * len(hosts))))
    if policy == "fifo":
        return NoBands(), Discipline.PRIORITY
    if policy in (PolicyName.STATIC, PolicyName.PACK):
        return HostPolicies(agent_policy(policy), reach=agents), Discipline.PRIORITY
    if policy == "tl-rr-original":
        phases = {host: rng.uniform(0.0, PROTOTYPE_PERIOD_S) for host in hosts}
        return PrototypeRR(None, PROTOTYPE_PERIOD_S, phases), Discipline.PRIORITY
    if policy == "controller-pack":
        local = agent_policy(PolicyName.PACK)
        return Coordinated("pack", local, reach=agents), Discipline.PRIORITY
    if policy == "cassini":
        return CassiniShifts(), Discipline.PRIORITY
    if policy == "crux":
        return CruxIntensity(), Discipline.PRIORITY
    raise ValueError(f"policy {policy} is not run at scale (of: {', '.join(POLICIES)})")


def run(
    workload: Workload,
    policy: str,
    reach: float = 1.0,
    until_s: float | None = None,
    settle: bool = True,
) -> ScaleResult:
    """Simulate `workload` under `policy` until every counted job has finished (or
    `until_s`: the speed benchmark's hour); without `settle`, every shared link send by
    send (exact, and slow: scripts/sim_settle_error.py compares the two)."""
    jobs = workload.networked
    counted = [job for job in jobs if job.started_s + job.alone_s <= workload.spec.day_s]
    sim_jobs = [job.sim_job for job in jobs if job.sim_job is not None]
    the_driver, discipline = driver(policy, workload, reach)
    sim = Simulation(workload.links, sim_jobs, the_driver, discipline, settle=settle)
    limit = until_s if until_s is not None else RUN_LIMIT_DAYS * workload.spec.day_s
    began, began_cpu = time.perf_counter(), time.process_time()
    results = sim.run(until_s=limit, wanted=[job.name for job in counted])
    wall, cpu = time.perf_counter() - began, time.process_time() - began_cpu
    if until_s is not None:  # the speed run: jobs that ended within it
        counted = [job for job in counted if job.name in results]
    jcts, slowdowns = [], []
    unfinished = 0
    for job in counted:
        result = results.get(job.name)
        if result is None:
            unfinished += 1
            slowdowns.append((sim.now - job.started_s) / job.alone_s)
            continue
        jcts.append(result.jct_s)
        slowdowns.append(result.jct_s / job.alone_s)
    replans = the_driver.replan_s if isinstance(the_driver, Coordinated) else []
    return ScaleResult(
        policy=policy,
        reach=reach,
        counted=len(counted),
        unfinished=unfinished,
        avg_jct_s=statistics.fmean(jcts) if jcts else 0.0,
        p95_jct_s=_quantile(jcts, 0.95),
        slowed_share=sum(s > SLOWED for s in slowdowns) / len(slowdowns) if slowdowns else 0.0,
        mean_slowdown=statistics.fmean(slowdowns) if slowdowns else 0.0,
        wall_s=wall,
        cpu_s=cpu,
        simulated_s=sim.now,
        events=sim.counters.events,
        evaluations=sim.counters.evaluations,
        settles=sim.counters.settles,
        skipped_iterations=sim.counters.skipped_iterations,
        pushed_iterations=sim.counters.pushed_iterations,
        replans=len(replans),
        replan_mean_ms=statistics.fmean(replans) * 1e3 if replans else 0.0,
        replan_p99_ms=_quantile(replans, 0.99) * 1e3,
        slowdowns=tuple(slowdowns),
    )


@dataclass(frozen=True)
class Task:
    """One run of a cluster's day (see run)."""

    policy: str
    reach: float = 1.0
    until_s: float | None = None


def run_all(
    spec: ClusterSpec,
    tasks: Sequence[Task],
    workers: int,
    done: Callable[[Task, ScaleResult], None],
    finished: Mapping[Task, ScaleResult] | None = None,
) -> list[ScaleResult]:
    """Every task on `spec`'s workload, `workers` at a time in processes of their own (each
    generates the same workload from the spec), `done` called as each ends; the results in
    the tasks' order. Tasks in `finished` are not run again (a run resumed)."""
    finished = finished or {}
    results = {index: finished[task] for index, task in enumerate(tasks) if task in finished}
    left = [(index, task) for index, task in enumerate(tasks) if task not in finished]
    for position, result in _each(spec, [task for _, task in left], workers):
        index, task = left[position]
        results[index] = result
        done(task, result)
    return [results[index] for index in range(len(tasks))]


def journal_line(spec: ClusterSpec, task: Task, result: ScaleResult) -> str:
    """One finished run, as a line of a run's journal (see read_journal)."""
    return json.dumps({"spec": _plain(spec), "task": asdict(task), "result": asdict(result)})


def read_journal(text: str, spec: ClusterSpec) -> dict[Task, ScaleResult]:
    """The runs a journal holds for `spec`'s workload (lines of other workloads ignored)."""
    finished = {}
    for line in text.splitlines():
        entry = json.loads(line)
        if entry["spec"] == _plain(spec):
            result = entry["result"]
            result["slowdowns"] = tuple(result["slowdowns"])
            finished[Task(**entry["task"])] = ScaleResult(**result)
    return finished


def _plain(spec: ClusterSpec) -> dict[str, object]:
    plain: dict[str, object] = json.loads(json.dumps(asdict(spec), default=str))
    return plain


def _each(
    spec: ClusterSpec, tasks: Sequence[Task], workers: int
) -> Iterator[tuple[int, ScaleResult]]:
    if workers <= 1:
        for index, task in enumerate(tasks):
            yield index, _run_task(spec, task)
        return
    with ProcessPoolExecutor(workers) as pool:
        futures = {pool.submit(_run_task, spec, task): index for index, task in enumerate(tasks)}
        for future in as_completed(futures):
            yield futures[future], future.result()


def _run_task(spec: ClusterSpec, task: Task) -> ScaleResult:
    return run(workload_of(spec), task.policy, task.reach, task.until_s)


@cache
def workload_of(spec: ClusterSpec) -> Workload:
    """`spec`'s workload, generated once per process (generate is deterministic)."""
    return generate(spec)


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
