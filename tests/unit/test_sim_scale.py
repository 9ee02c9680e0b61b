"""The simulator at scale: the generated workload (published distributions, placement), the
settled fast-forward's error against the exact run, and the at-scale runs and report."""

from __future__ import annotations

import statistics
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from tensorlights.model import JobKind
from tensorlights.sim.cli import main
from tensorlights.sim.drivers import Coordinated, HostPolicies, NoBands, agent_policy
from tensorlights.sim.engine import Driver, SimJob, Simulation, TcpModel
from tensorlights.sim.scale import POLICIES, driver, run
from tensorlights.sim.workload import (
    GPUS_PER_HOST,
    PHILLY_RUN_TIME_S,
    PS_SLOTS,
    ClusterSpec,
    PsPlacement,
    generate,
    run_time,
)
from tests.unit.hashseed import outputs_under_hash_seeds

MB = 1_000_000
RATE = 300e6


def test_run_times_follow_the_published_quantiles() -> None:
    for quantile, seconds in PHILLY_RUN_TIME_S[1:]:
        assert run_time(quantile) == pytest.approx(seconds, rel=1e-9)
    drawn = sorted(run_time(i / 10_000) for i in range(10_000))
    assert statistics.median(drawn) == pytest.approx(1186, rel=0.01)


def test_the_workload_draws_sizes_as_published_and_never_overfills_a_host() -> None:
    workload = generate(ClusterSpec(hosts=200, jobs=2000, seed=3))
    sizes = Counter(job.gpus for job in workload.jobs)
    assert sizes[1] / 2000 == pytest.approx(0.70, abs=0.04)
    assert sizes[4] / 2000 == pytest.approx(0.15, abs=0.03)
    # At any time, no host holds more GPUs or PS tasks than it has (runs alone).
    events = []
    for job in workload.jobs:
        held = [(host, count, 0) for host, count in job.gpu_hosts]
        if job.kind is JobKind.PS:
            held.append((job.hosts[0], 0, 1))
        for host, gpus, ps in held:
            events.append((job.started_s, 1, host, gpus, ps))
            events.append((job.started_s + job.alone_s, -1, host, gpus, ps))
    events.sort(key=lambda event: (event[0], event[1]))
    gpus_held: Counter[str] = Counter()
    ps_held: Counter[str] = Counter()
    for _, sign, host, gpus, ps in events:
        gpus_held[host] += sign * gpus
        ps_held[host] += sign * ps
        assert gpus_held[host] <= GPUS_PER_HOST and ps_held[host] <= PS_SLOTS
    assert all(sum(n for _, n in job.gpu_hosts) == job.gpus for job in workload.jobs)
    for job in workload.networked:
        if job.kind is JobKind.COLLECTIVE:
            assert len(job.hosts) >= 2  # a ring inside one host has no network traffic
    for job in workload.networked:
        assert job.sim_job is not None
        assert job.sim_job.alone_s(workload.spec.nic_bps) == pytest.approx(job.alone_s)


def test_packed_ps_tasks_share_hosts_and_spread_ones_rarely_do() -> None:
    packed = generate(ClusterSpec(hosts=200, jobs=800, seed=5))
    spread = generate(ClusterSpec(hosts=200, jobs=800, seed=5, ps_placement=PsPlacement.SPREAD))
    assert len(packed.networked) == len(spread.networked) > 50
    assert len(packed.sharing()) > 0.8 * len(packed.networked)
    assert len(spread.sharing()) < 0.2 * len(spread.networked)


def _driver(policy: str) -> Driver:
    if policy == "fifo":
        return NoBands()
    if policy == "controller-pack":
        return Coordinated("pack", agent_policy("pack"))
    return HostPolicies(agent_policy(policy))


@pytest.mark.parametrize("policy", ["fifo", "static", "pack", "controller-pack"])
def test_settled_components_run_within_a_few_percent_of_the_exact_run(policy: str) -> None:
    """Long jobs sharing links, coming and going: the settled fast-forward's average JCT
    within 3% of the run send by send (the at-scale runs rest on it)."""
    jobs = [
        SimJob("a", 4 * MB, 3, 0.2, 600, 0.0, ("x",)),
        SimJob("b", 2 * MB, 2, 0.1, 900, 5.0, ("x",)),
        SimJob("c", 6 * MB, 0, 0.3, 300, 40.0, ("x", "y", "z"), kind=JobKind.COLLECTIVE),
        SimJob("d", 3 * MB, 2, 0.15, 500, 90.0, ("y",)),
        SimJob("e", 8 * MB, 0, 0.4, 200, 150.0, ("z", "y"), kind=JobKind.COLLECTIVE),
    ]
    links = {"x": RATE, "y": RATE, "z": RATE}
    exact = Simulation(links, jobs, _driver(policy), tcp=TcpModel(0.5, 0.05)).run()
    sim = Simulation(links, jobs, _driver(policy), tcp=TcpModel(0.5, 0.05), settle=True)
    settled = sim.run()
    assert sim.counters.settles > 0
    average = statistics.fmean(r.jct_s for r in settled.values())
    assert average == pytest.approx(statistics.fmean(r.jct_s for r in exact.values()), rel=0.03)


def test_every_policy_runs_a_small_cluster_on_the_same_placement() -> None:
    workload = generate(ClusterSpec(hosts=40, jobs=120, day_s=7200.0, seed=2))
    results = {policy: run(workload, policy) for policy in POLICIES}
    counted = {r.counted for r in results.values()}
    assert len(counted) == 1 and counted.pop() > 0
    for result in results.values():
        assert result.unfinished == 0
        assert all(slowdown >= 1 - 1e-9 for slowdown in result.slowdowns)
        assert 0 <= result.slowed_share <= 1
    assert results["controller-pack"].replans > 0
    half = run(workload, "controller-pack", reach=0.5)
    assert half.reach == 0.5 and half.counted == results["fifo"].counted


def test_the_hosts_with_an_agent_are_drawn_apart_from_the_placement() -> None:
    """Drawn from the workload's own random stream, the reached hosts were exactly those the
    placement fills last: no PS host had an agent at any reach."""
    workload = generate(ClusterSpec(hosts=200, jobs=800, seed=5))
    ps_hosts = {host for job in workload.networked for host in job.hosts}
    for reach in (0.25, 0.5, 0.75):
        the_driver, _ = driver("controller-pack", workload, reach)
        assert isinstance(the_driver, Coordinated) and the_driver.reach is not None
        reached = len(ps_hosts & the_driver.reach) / len(ps_hosts)
        assert reach - 0.3 < reached < reach + 0.3, (reach, reached)


def test_the_scale_command_writes_its_report(tmp_path: Path) -> None:
    args = [
        "scale", "--hosts", "30", "--jobs", "80", "--policies", "fifo,controller-pack",
        "--reach", "0.5", "--out", str(tmp_path), "--no-plots",
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    report = (tmp_path / "report.md").read_text()
    assert "## Every policy" in report and "| 50% |" in report
    assert "Speed: 30 hosts x 1 simulated hour" in report
    assert (tmp_path / "results.json").exists()
    # Each run is journaled as it ends (3 day runs, 2 speed runs); --resume takes them.
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 5
    again = CliRunner().invoke(main, [*args, "--resume"])
    assert again.exit_code == 0, again.output
    assert "5 run(s) taken from" in again.output
    assert (tmp_path / "report.md").read_text() == report
    bad = CliRunner().invoke(main, ["scale", "--policies", "nope"])
    assert bad.exit_code == 2 and "unknown" in bad.output


def test_a_cluster_day_is_the_same_whatever_the_hash_seed() -> None:
    """Jobs going back to send by send after a change were taken in set order, which differs
    per process: the same day under FIFO ended 5,804-5,824 s on average in three runs."""
    code = (
        "from tensorlights.sim.scale import run; "
        "from tensorlights.sim.workload import ClusterSpec, generate; "
        "w = generate(ClusterSpec(hosts=60, jobs=240, day_s=4 * 3600.0, seed=1)); "
        "print(run(w, 'fifo').avg_jct_s)"
    )
    outputs = outputs_under_hash_seeds(code)
    assert len(outputs) == 1, outputs
