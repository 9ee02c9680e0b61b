"""What one benchmark run measured, and the per-scenario summary over repetitions (pure)."""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from tensorlights.bench.bound import link_seconds, lower_bound_avg_jct
from tensorlights.bench.cpu_use import CPU_BOUND_AT, DISTURBED_AT
from tensorlights.bench.scenarios import JobSpec, Scenario, StaticOrder


@dataclass(frozen=True)
class JobRun:
    name: str
    arrival_s: float
    """When its PS began to listen, seconds after the run started."""
    jct_s: float
    """From its PS listening to the end of its last iteration."""
    spreads_s: tuple[float, ...]
    """Per iteration: last worker to have the whole model minus the first (workers' logs)."""
    shard_spreads_s: tuple[float, ...] = ()
    """A sharded job's, per iteration: the longest any worker waited from its first shard's
    arrival to its last (the worker waits for the slowest PS host)."""


@dataclass(frozen=True)
class Trial:
    scenario: str
    policy: str
    rep: int
    rate_bps: int
    jobs: tuple[JobRun, ...]
    link_bytes: int
    """Bytes the PS host's interface sent while any job ran."""
    busy_s: float
    """From the first job's start to the last job's end."""
    rebuilds: int = 0
    """Qdisc rebuilds by `tc` (the original prototype)."""
    profile: str = ""
    """For standalone runs: the job profile measured."""
    greens: tuple[tuple[float, str], ...] = ()
    """Every move of the green light (seconds after the run started, the job now green),
    for the policies that have one; the first is the light's first job. With several shaped
    hosts: the first host's."""
    host_greens: Mapping[str, tuple[tuple[float, str], ...]] = field(default_factory=dict)
    """With several shaped hosts: `greens` of each."""
    links: int = 1
    """Links whose bytes `link_bytes` counts (the PS hosts')."""
    events: tuple[tuple[float, str], ...] = ()
    """A fault run's (runner.Faulted): what was done and what the agents did about it,
    seconds after the run started."""
    other_cores: float | None = None
    """CPU other work on the machine took during the run, in cores on average (processes
    not the bench's, and steal: cpu_use.CpuUse); None for runs recorded before it was read."""
    own_cores: float | None = None
    """CPU the run took (the machine's busy time less other processes': the bench, agents,
    controller, jobs, the kernel's work for them), likewise. Records before 2026-12-02's
    evening summed the run's processes only: lower by their last 2 s and the kernel's work."""
    cores: int | None = None
    """The machine's cores (os.cpu_count) as the run saw them."""
    daemon_cores: float | None = None
    """Of `own_cores`, what the policy's own processes took (agents, controller; the
    prototype's port feed, not its `tc` commands), from when they were up; None where none
    runs (FIFO, a job alone) and for runs recorded before 2026-12-07."""

    @property
    def avg_jct_s(self) -> float:
        return statistics.mean(job.jct_s for job in self.jobs)

    @property
    def light_moves(self) -> int:
        return max(len(self.greens) - 1, 0)

    @property
    def disturbed(self) -> bool:
        """Other work took enough of the machine's CPU that the run measured it too."""
        return self.other_cores is not None and self.other_cores >= DISTURBED_AT

    @property
    def cpu_bound(self) -> bool:
        """The run's own processes kept nearly every core busy: it compared CPU schedules as
        much as link schedules."""
        return (
            self.own_cores is not None
            and self.cores is not None
            and self.own_cores >= CPU_BOUND_AT * self.cores
        )

    @property
    def utilisation(self) -> float:
        capacity = self.rate_bps * self.busy_s * self.links
        return self.link_bytes * 8 / capacity if capacity > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trial:
        jobs = tuple(
            JobRun(
                j["name"], j["arrival_s"], j["jct_s"], tuple(j["spreads_s"]),
                tuple(j.get("shard_spreads_s", ())),
            )
            for j in data["jobs"]
        )  # fmt: skip

        def moves(raw: Iterable[Sequence[Any]]) -> tuple[tuple[float, str], ...]:
            return tuple((float(at), str(job)) for at, job in raw)

        host_greens = {host: moves(raw) for host, raw in data.get("host_greens", {}).items()}
        return cls(
            **{**data, "jobs": jobs, "greens": moves(data.get("greens", ())),
               "host_greens": host_greens, "events": moves(data.get("events", ()))},
        )  # fmt: skip


def profile_key(job: JobSpec) -> str:
    workload, model, workers, compute, iterations, shards = job.profile
    key = f"{model}B-{workers}w-{compute}s-{iterations}it"
    key += f"-{shards}ps" if shards > 1 else ""
    return key if workload == "synthetic" else f"{workload}-{key}"  # synthetic: the old keys


def alone_jct(trials: Iterable[Trial]) -> dict[str, float]:
    """Median standalone JCT per job profile."""
    by_profile: dict[str, list[float]] = {}
    for trial in trials:
        if trial.profile:
            by_profile.setdefault(trial.profile, []).append(trial.jobs[0].jct_s)
    return {key: statistics.median(values) for key, values in by_profile.items()}


@dataclass(frozen=True)
class PolicySummary:
    policy: str
    reps: int
    avg_jct_s: float
    """Median over repetitions of the average JCT."""
    job_jct_s: dict[str, float]
    """Median over repetitions, per job."""
    slowdown: dict[str, float]
    """Per job: median JCT / standalone JCT."""
    max_slowdown: float
    """Median over repetitions of each run's largest slowdown: where the order differs from
    one run to the next (equal jobs), the per-job medians above hide who waited."""
    spread_median_s: float
    """Median straggler spread over every iteration of every job and repetition."""
    spread_p90_s: float
    utilisation: float
    """Median over repetitions."""
    ratio_to_bound: float
    light_moves: float | None = None
    """Median over repetitions of the green light's moves; None for policies without one
    (or runs recorded before moves were)."""
    shard_spread_median_s: float | None = None
    """Sharded jobs': median over every iteration of how long a worker waited from its first
    shard to its last (None without sharded jobs)..."""
    shard_spread_p90_s: float | None = None
    split_green: float | None = None
    """...and the median over repetitions of the share of the sharded jobs' time during
    which they were green on some but not all of their PS hosts (None without per-host
    lights: FIFO, fair)."""
    events: tuple[tuple[float, str], ...] = ()
    """A fault run's events (Trial.events), of its first repetition."""


@dataclass(frozen=True)
class ScenarioSummary:
    scenario: Scenario
    lower_bound_s: float
    alone_s: dict[str, float]
    link_s: dict[str, float]
    policies: list[PolicySummary] = field(default_factory=list)
    orders: list[PolicySummary] = field(default_factory=list)
    """Every fixed priority order that ran (policy `order-2-1-3`: StaticOrder)."""

    @property
    def best_order(self) -> PolicySummary | None:
        """The static order with the lowest average JCT measured, if any ran."""
        return min(self.orders, key=lambda p: p.avg_jct_s, default=None)


def _percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def summarize(
    scenario: Scenario,
    rate_bps: int,
    trials: Iterable[Trial],
    alone_by_profile: Mapping[str, float],
    policy_order: Sequence[str],
) -> ScenarioSummary:
    """The policies of `policy_order` that ran, in that order; every static order that ran
    (StaticOrder) apart, in `orders`."""
    alone = {job.name: alone_by_profile[profile_key(job)] for job in scenario.jobs}
    by_host: dict[str, dict[str, float]] = {}
    for job in scenario.jobs:
        for host, payload in job.pushed_bytes_on().items():
            by_host.setdefault(host, {})[job.name] = link_seconds(payload, rate_bps)
    link = {job.name: link_seconds(job.pushed_bytes, rate_bps) for job in scenario.jobs}
    arrival = {job.name: job.start_s for job in scenario.jobs}
    bound = lower_bound_avg_jct(alone, by_host, arrival)
    summary = ScenarioSummary(scenario, bound, alone, link)
    mine = [t for t in trials if t.scenario == scenario.key and not t.profile]
    for policy in policy_order:
        runs = [t for t in mine if t.policy == policy]
        if runs:
            summary.policies.append(_policy_summary(policy, runs, scenario, alone, bound))
    orders = sorted({t.policy for t in mine if StaticOrder.parse(t.policy) is not None})
    for policy in orders:
        runs = [t for t in mine if t.policy == policy]
        summary.orders.append(_policy_summary(policy, runs, scenario, alone, bound))
    return summary


def _policy_summary(
    policy: str,
    runs: Sequence[Trial],
    scenario: Scenario,
    alone: Mapping[str, float],
    bound: float,
) -> PolicySummary:
    averages = [t.avg_jct_s for t in runs]
    per_job = {
        job.name: statistics.median(j.jct_s for t in runs for j in t.jobs if j.name == job.name)
        for job in scenario.jobs
    }
    slowdown = {name: per_job[name] / alone[name] for name in per_job}
    spreads = [s for t in runs for j in t.jobs for s in j.spreads_s]
    shard_spreads = [s for t in runs for j in t.jobs for s in j.shard_spreads_s]
    splits = [split_green_share(t, scenario) for t in runs]
    avg = statistics.median(averages)
    return PolicySummary(
        policy=policy,
        reps=len(runs),
        avg_jct_s=avg,
        job_jct_s=per_job,
        slowdown=slowdown,
        max_slowdown=statistics.median(max(j.jct_s / alone[j.name] for j in t.jobs) for t in runs),
        spread_median_s=statistics.median(spreads) if spreads else float("nan"),
        spread_p90_s=_percentile(spreads, 0.9),
        utilisation=statistics.median(t.utilisation for t in runs),
        ratio_to_bound=avg / bound,
        light_moves=(
            statistics.median(t.light_moves for t in runs) if all(t.greens for t in runs) else None
        ),
        shard_spread_median_s=statistics.median(shard_spreads) if shard_spreads else None,
        shard_spread_p90_s=_percentile(shard_spreads, 0.9) if shard_spreads else None,
        split_green=(
            statistics.median(v for v in splits if v is not None)
            if splits and all(v is not None for v in splits)
            else None
        ),
        events=min(runs, key=lambda t: t.rep).events,
    )


def _green_at(moves: Sequence[tuple[float, str]], at: float) -> str | None:
    """Who was green at `at` on a host whose light moved as `moves` (sorted) says."""
    green = None
    for moved_at, job in moves:
        if moved_at > at:
            break
        green = job
    return green


def split_green_share(trial: Trial, scenario: Scenario) -> float | None:
    """The share of its sharded jobs' lifetimes during which each was green on some but not
    all of its PS hosts; None where a host of one has no light (or no job is sharded)."""
    sharded = {job.name: job.ps_hosts for job in scenario.jobs if job.shards > 1}
    split = total = 0.0
    for run in trial.jobs:
        hosts = sharded.get(run.name)
        if hosts is None:
            continue
        if not all(trial.host_greens.get(host) for host in hosts):
            return None
        moves = {host: sorted(trial.host_greens[host]) for host in hosts}
        start, end = run.arrival_s, run.arrival_s + run.jct_s
        edges = sorted({start, end, *(t for m in moves.values() for t, _ in m if start < t < end)})
        for left, right in itertools.pairwise(edges):
            green_on = sum(_green_at(moves[host], left) == run.name for host in hosts)
            if 0 < green_on < len(hosts):
                split += right - left
        total += end - start
    return split / total if total > 0 else None
