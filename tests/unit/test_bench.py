"""The benchmark's pure parts: the lower bound, scenarios, summaries, the baselines' `tc`
commands and the report."""

from __future__ import annotations

import gzip
import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.bench import cli, legacy_tc, report
from tensorlights.bench.bound import (
    link_makespan,
    link_seconds,
    lower_bound_avg_jct,
    wire_bytes,
)
from tensorlights.bench.results import (
    JobRun,
    Trial,
    alone_jct,
    profile_key,
    split_green_share,
    summarize,
)
from tensorlights.bench.scenarios import (
    COMPARED,
    SCENARIOS,
    JobSpec,
    Policy,
    Scenario,
    StaticOrder,
    select,
    select_policies,
)
from tensorlights.errors import ConfigError
from tensorlights.testbed.workloads import start_up_factor

CONTROLLER = (Policy.CONTROLLER_PACK, Policy.CONTROLLER_ROTATE)


def test_wire_bytes_count_headers_per_segment() -> None:
    assert wire_bytes(1448) == pytest.approx(1514)
    assert link_seconds(1448 * 1000, 1514 * 8 * 1000) == pytest.approx(1.0)


def test_bound_two_equal_jobs_sharing_a_link_with_no_compute() -> None:
    # Pure communication (alone = link time 1 s each): the best is one after the other,
    # completions 1 s and 2 s -> average 1.5 s; nothing can do better.
    bound = lower_bound_avg_jct(
        {"a": 1.0, "b": 1.0}, {"ps": {"a": 1.0, "b": 1.0}}, {"a": 0, "b": 0}
    )
    assert bound == pytest.approx(1.5)


def test_bound_jobs_that_fit_together_are_bounded_by_their_standalone_times() -> None:
    # Link time 1 s of a 10 s standalone run each: the link is no constraint.
    bound = lower_bound_avg_jct(
        {"a": 10.0, "b": 10.0}, {"ps": {"a": 1.0, "b": 1.0}}, {"a": 0, "b": 0}
    )
    assert bound == pytest.approx(10.0)


def test_bound_with_arrivals_subtracts_them() -> None:
    # b arrives when a is done with the link: no interference at all.
    bound = lower_bound_avg_jct(
        {"a": 2.0, "b": 2.0}, {"ps": {"a": 2.0, "b": 2.0}}, {"a": 0, "b": 2.0}
    )
    assert bound == pytest.approx(2.0)
    # b arrives at 1 s: whichever finishes second ends at 4 s at the earliest.
    overlap = lower_bound_avg_jct(
        {"a": 2.0, "b": 2.0}, {"ps": {"a": 2.0, "b": 2.0}}, {"a": 0, "b": 1.0}
    )
    assert overlap == pytest.approx((2.0 + (4.0 - 1.0)) / 2)


def test_link_makespan_idles_until_arrivals() -> None:
    assert link_makespan(["a", "b"], {"a": 0, "b": 5}, {"a": 1, "b": 1}) == 6
    assert link_makespan(["a", "b"], {"a": 0, "b": 0.5}, {"a": 1, "b": 1}) == 2


def test_bound_refuses_inconsistent_or_too_many_jobs() -> None:
    with pytest.raises(ConfigError):
        lower_bound_avg_jct({"a": 1.0}, {"ps": {"b": 1.0}}, {"a": 0})
    many = {str(i): 1.0 for i in range(9)}
    with pytest.raises(ConfigError):
        lower_bound_avg_jct(many, {"ps": many}, dict.fromkeys(many, 0.0))


jobs_strategy = st.lists(
    st.tuples(
        st.floats(0.1, 20), st.floats(0.01, 1.0), st.sampled_from([0.0, 0.0, 1.0, 3.0])
    ),  # alone, link share of alone, arrival
    min_size=1,
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(jobs_strategy)
def test_bound_is_below_every_serial_schedule_and_above_both_simple_bounds(
    jobs: list[tuple[float, float, float]],
) -> None:
    names = [f"j{i}" for i in range(len(jobs))]
    alone = {n: a for n, (a, _, _) in zip(names, jobs, strict=True)}
    link = {n: a * share for n, (a, share, _) in zip(names, jobs, strict=True)}
    arrival = {n: t for n, (_, _, t) in zip(names, jobs, strict=True)}
    bound = lower_bound_avg_jct(alone, {"ps": link}, arrival)
    # Never below what each job needs alone ...
    assert bound >= sum(alone.values()) / len(names) - 1e-9
    # ... and never above a feasible schedule: jobs run one after the other, each at its
    # standalone speed, in the best order (the link then is never shared).
    best_serial = float("inf")
    for order in itertools.permutations(names):
        t, total = 0.0, 0.0
        for n in order:
            t = max(t, arrival[n]) + alone[n]
            total += t - arrival[n]
        best_serial = min(best_serial, total / len(names))
    assert bound <= best_serial + 1e-9


def test_scenarios_cover_the_issue_and_scale() -> None:
    assert sorted(SCENARIOS) == [
        *("a", "b", "c", "c1", "c2", "d", "e", "f", "g", "m1", "m2", "m3", "m4", "m5"),
        *("r1", "r2", "r3", "r4", "r5"),
    ]
    # m3's jobs and placement again as real PyTorch PS jobs, three of them sharded.
    assert [replace(j, workload="synthetic") for j in SCENARIOS["m5"].jobs] == list(
        SCENARIOS["m3"].jobs
    )
    assert {j.workload for j in SCENARIOS["m5"].jobs} == {"torch-gloo"}
    assert [j.shards for j in SCENARIOS["m5"].jobs] == [2, 2, 2, 1]
    # The real frameworks' scenarios: RPC, overloaded gloo, mixed sizes, TensorFlow.
    assert {j.workload for j in SCENARIOS["r1"].jobs} == {"torch-rpc"}
    assert {j.workload for j in SCENARIOS["r2"].jobs} == {"torch-gloo"}
    assert len({j.model_bytes for j in SCENARIOS["r3"].jobs}) == 3
    assert {j.workload for j in SCENARIOS["r4"].jobs} == {"tf-ps"}
    assert {j.workload for s in "abcdefg" for j in SCENARIOS[s].jobs} == {"synthetic"}
    # A sweep's trials: one model, lengths differing, the longest first; g's again in gloo.
    for key in ("g", "r5"):
        trials = SCENARIOS[key].jobs
        assert len({(j.model_bytes, j.compute_s) for j in trials}) == 1
        assert [j.iterations for j in trials] == sorted({j.iterations for j in trials})[::-1]
        assert [j.start_s for j in trials] == sorted(j.start_s for j in trials)
    assert {j.workload for j in SCENARIOS["r5"].jobs} == {"torch-gloo"}
    assert len(SCENARIOS["a"].jobs) == 2
    assert all(j.workers >= 4 for j in SCENARIOS["c"].jobs)
    assert len({j.model_bytes for j in SCENARIOS["d"].jobs}) == 3
    assert [j.start_s for j in SCENARIOS["e"].jobs] == [0, 5, 10]
    half = SCENARIOS["e"].scaled(0.5)
    assert [j.start_s for j in half.jobs] == [0, 2.5, 5]
    assert all(j.iterations == 13 for j in half.jobs)
    with pytest.raises(ConfigError):
        SCENARIOS["a"].scaled(0)


def test_a_scenarios_framework_start_up_grows_with_the_processes_each_core_starts() -> None:
    # r2's 9 PyTorch processes on 2 cores start within the workload's own lead; m5's 15 take
    # 1.9 times as long; on 16 cores they start within it again.
    assert start_up_factor(8, cores=2) == 1.0
    assert start_up_factor(15, cores=2) == pytest.approx(1.875)
    assert start_up_factor(15, cores=16) == 1.0
    assert start_up_factor(0, cores=2) == 1.0


def test_selection_refuses_unknown_names() -> None:
    assert [s.key for s in select("a, c")] == ["a", "c"]
    assert len(select("all")) == len(SCENARIOS) == 19
    assert select_policies("all") == list(COMPARED)
    with pytest.raises(ConfigError, match="unknown scenario"):
        select("z")
    with pytest.raises(ConfigError, match="unknown policy"):
        select_policies("fifo,bogus")


def test_run_help_lists_every_policy_it_accepts() -> None:
    shown = CliRunner().invoke(cli.main, ["run", "--help"], terminal_width=200)
    assert shown.exit_code == 0
    listed, more = shown.output.split("Of: ", 1)[1].split(";", 1)
    assert listed.split(", ") == [policy.value for policy in COMPARED], shown.output
    assert "`orders`: every fixed priority order" in " ".join(more.split())


def test_original_prios_rotate_and_fold_into_seven_levels() -> None:
    assert legacy_tc.original_prios(3, 0) == [0, 1, 2]
    assert legacy_tc.original_prios(3, 1) == [2, 0, 1]
    assert max(legacy_tc.original_prios(10, 0)) == 6


def test_original_commands_rebuild_the_whole_tree() -> None:
    cmds = legacy_tc.htb_commands("eth0", 300_000_000, [[5001], [5002, 5003]], [0, 1])
    assert cmds[0] == ["qdisc", "del", "dev", "eth0", "root"]
    assert cmds[1][:6] == ["qdisc", "add", "dev", "eth0", "root", "handle"]
    classes = [c for c in cmds if c[0] == "class"]
    assert len(classes) == 4  # root, default, two jobs
    job2 = next(c for c in classes if "1:11" in c)
    assert job2[job2.index("prio") + 1] == "1" and job2[job2.index("rate") + 1] == "1000000bit"
    filters = [c for c in cmds if c[0] == "filter"]
    assert [f[f.index("sport") + 1] for f in filters] == ["5001", "5002", "5003"]
    assert filters[2][-1] == "1:11"


def test_fair_tree_has_equal_rates_and_priorities() -> None:
    cmds = legacy_tc.htb_commands("eth0", 300_000_000, [[1], [2], [3]], [0, 0, 0], fair=True)
    jobs = [
        c for c in cmds if c[0] == "class" and c[c.index("classid") + 1] in {"1:10", "1:11", "1:12"}
    ]
    assert {c[c.index("rate") + 1] for c in jobs} == {"95000000bit"}
    assert {c[c.index("prio") + 1] for c in jobs} == {"0"}
    assert all("quantum" in c for c in jobs)


def _trial(policy: str, rep: int, jcts: dict[str, float], scenario: str = "t") -> Trial:
    runs = tuple(JobRun(name, 0.0, jct, (0.01, 0.02, 0.2)) for name, jct in jcts.items())
    return Trial(scenario, policy, rep, 100_000_000, runs, 10_000_000, max(jcts.values()))


def test_summary_takes_medians_and_ratios() -> None:
    spec = JobSpec("x", 1_000_000, 2, 0.1, 10)
    scenario = Scenario("t", "test", "two equal jobs", (spec, JobSpec("y", 1_000_000, 2, 0.1, 10)))
    alone_trials = [
        Trial(f"alone:{profile_key(spec)}", "alone", r, 100_000_000, (JobRun("x", 0, t, ()),),
              1, t, profile=profile_key(spec))
        for r, t in enumerate([2.0, 2.2, 9.0])
    ]  # fmt: skip
    alone = alone_jct(alone_trials)
    assert alone == {profile_key(spec): 2.2}
    trials = [
        _trial("fifo", 0, {"x": 3.0, "y": 3.0}),
        _trial("fifo", 1, {"x": 4.0, "y": 4.0}),
        _trial("fifo", 2, {"x": 30.0, "y": 30.0}),  # an outlier: the median ignores it
        _trial("static", 0, {"x": 2.2, "y": 4.0}),
    ]
    summary = summarize(scenario, 100_000_000, trials, alone, ["fifo", "static", "fair"])
    assert [p.policy for p in summary.policies] == ["fifo", "static"]
    fifo, static = summary.policies
    assert fifo.reps == 3 and fifo.avg_jct_s == 4.0
    assert fifo.ratio_to_bound == pytest.approx(4.0 / summary.lower_bound_s)
    assert static.slowdown == {"x": 1.0, "y": pytest.approx(4.0 / 2.2)}
    assert static.spread_median_s == 0.02 and static.spread_p90_s == 0.2
    assert 0 < static.utilisation <= 1
    text = report.markdown([summary], {"rate": "100mbit", "reps": 3, "interval": "3s",
                                       "original_interval_s": 20.0}, {})  # fmt: skip
    assert "Lower bound on average JCT" in text and "| TL-One (static) | 3.10 |" in text
    assert report.summary_table([summary])[2].startswith("| FIFO (no agent) | ")


def test_trial_round_trips_through_json() -> None:
    trial = _trial("rotate", 1, {"x": 3.0})
    assert Trial.from_dict(trial.to_dict()) == trial
    moved = replace(trial, greens=((0.5, "x"), (3.5, "y"), (6.5, "x")))
    assert Trial.from_dict(json.loads(json.dumps(moved.to_dict()))) == moved
    assert moved.light_moves == 2 and trial.light_moves == 0


def test_light_moves_are_reported_only_where_every_run_recorded_them() -> None:
    spec = JobSpec("x", 1_000_000, 2, 0.1, 10)
    scenario = Scenario("t", "test", "one job", (spec,))
    alone = {profile_key(spec): 2.0}
    first = replace(_trial("pack", 0, {"x": 3.0}), greens=((0.1, "x"),))
    moved = replace(_trial("pack", 1, {"x": 3.0}), greens=((0.1, "x"), (1.0, "x"), (2.0, "x")))
    pack = summarize(scenario, 100_000_000, [first, moved], alone, ["pack"]).policies[0]
    assert pack.light_moves == 1  # median of 0 and 2
    old = summarize(scenario, 100_000_000, [first, _trial("pack", 1, {"x": 3})], alone, ["pack"])
    assert old.policies[0].light_moves is None
    row = report.scenario_section(old, None)[-2]
    assert row.endswith("| — | 2 |"), row


def test_every_static_order_of_up_to_four_jobs() -> None:
    assert [o.value for o in StaticOrder.every(2)] == ["order-1-2", "order-2-1"]
    assert len(StaticOrder.every(4)) == 24 and StaticOrder.every(5) == []
    order = StaticOrder((2, 0, 1))
    assert StaticOrder.parse(order.value) == order and StaticOrder.parse("pack") is None
    assert order.names(["small", "medium", "large"]) == "large > small > medium"
    # Job 2 on top, then job 0, then job 1 (HTB prio 0 first).
    assert legacy_tc.order_prios(order.order) == [1, 2, 0]
    assert legacy_tc.order_prios(tuple(range(9)))[-2:] == [6, 6]  # 7 levels, as the prototype


def test_orders_expand_per_scenario_in_the_plan() -> None:
    two, five = SCENARIOS["a"], SCENARIOS["f"]
    steps = cli._plan([two, five], [Policy.STATIC, Policy.ORDERS], 1)
    runs = [
        (scenario, policy.value) for scenario, policy, _, _, _ in steps if "alone" not in scenario
    ]
    assert runs == [("a", "static"), ("a", "order-1-2"), ("a", "order-2-1"), ("f", "static")]
    assert select_policies("pack,orders") == [Policy.PACK, Policy.ORDERS]
    assert Policy.ORDERS not in select_policies("all")
    declaring = select_policies("pack-iterations,controller-pack-iterations")
    assert declaring == [Policy.PACK_ITERATIONS, Policy.CONTROLLER_PACK_ITERATIONS]
    assert not set(declaring) & set(select_policies("all"))


def test_collective_scenarios_put_a_rank_on_every_shaped_host() -> None:
    # The issue's all-reduce scenarios: 2 and 3 DDP jobs, every host runs a rank of each.
    for key, jobs in (("c1", 2), ("c2", 3)):
        scenario = SCENARIOS[key]
        assert scenario.collective and len(scenario.jobs) == jobs
        assert all(j.workload == "torch-ddp" and j.workers + 1 == 4 for j in scenario.jobs)
    # Each host's link carries its share of every ring all-reduce: 2 (n - 1) / n of 8 MB.
    job = SCENARIOS["c2"].jobs[0]
    assert job.pushed_bytes == 2 * 3 * job.model_bytes // 4 * job.iterations
    ddp = JobSpec("x", 8_000_000, 3, 0.1, 10, workload="torch-ddp")
    with pytest.raises(ConfigError, match="do not mix"):
        Scenario("t", "t", "t", (ddp, JobSpec("y", 8_000_000, 3, 0.1, 10)))
    with pytest.raises(ConfigError, match="one rank per host"):
        Scenario("t", "t", "t", (replace(ddp, workers=2),))
    # The prototype's tc trees run on every rank host (tests/e2e/test_benchmark.py), every
    # static order too; the controller's policies as on PS hosts.
    steps = cli._plan(
        [SCENARIOS["c1"]], [Policy.FIFO, Policy.TL_RR_ORIGINAL, *CONTROLLER, Policy.ORDERS], 1
    )
    runs = [policy.value for scenario, policy, _, _, _ in steps if scenario == "c1"]
    assert runs == [
        "fifo", "tl-rr-original", "controller-pack", "controller-rotate", "order-1-2", "order-2-1"
    ]  # fmt: skip


def test_policies_are_reported_against_the_best_static_order() -> None:
    x, y = JobSpec("x", 1_000_000, 2, 0.1, 10), JobSpec("y", 1_000_000, 2, 0.1, 10)
    scenario = Scenario("t", "test", "two equal jobs", (x, y))
    alone = {profile_key(x): 2.0}
    trials = [
        _trial("order-1-2", 0, {"x": 2.0, "y": 4.0}),
        _trial("order-2-1", 0, {"x": 4.5, "y": 2.5}),
        _trial("pack", 0, {"x": 2.2, "y": 4.2}),
    ]
    summary = summarize(scenario, 100_000_000, trials, alone, ["pack", "orders"])
    assert [p.policy for p in summary.policies] == ["pack"]
    assert [p.policy for p in summary.orders] == ["order-1-2", "order-2-1"]
    assert summary.best_order is summary.orders[0]
    table = report.best_order_table([summary])
    assert table[2] == "| TensorLights pack | 1.07x |"
    assert table[3] == f"| {report.BEST_ORDER} | 1.00x (x > y) |"
    assert report.summary_table([summary])[-1].startswith(f"| {report.BEST_ORDER} | ")
    section = "\n".join(report.scenario_section(summary, None))
    assert "| x > y (best) | 3.00 |" in section and "| y > x | 3.50 |" in section
    assert "Average JCT against the best order: TensorLights pack 1.07x." in section
    assert report.best_order_table([summarize(scenario, 100_000_000, trials[2:], alone, [])]) == []


def test_the_largest_slowdown_is_taken_in_each_run() -> None:
    # Two equal jobs whose order flips between runs: per-job medians are equal (3.0), but
    # in every run one of them waited (4.0 against 2.0 alone).
    x, y = JobSpec("x", 1_000_000, 2, 0.1, 10), JobSpec("y", 1_000_000, 2, 0.1, 10)
    scenario = Scenario("t", "test", "two equal jobs", (x, y))
    trials = [
        _trial("pack", 0, {"x": 2.0, "y": 4.0}),
        _trial("pack", 1, {"x": 4.0, "y": 2.0}),
    ]
    pack = summarize(scenario, 100_000_000, trials, {profile_key(x): 2.0}, ["pack"]).policies[0]
    assert pack.slowdown == {"x": 1.5, "y": 1.5}
    assert pack.max_slowdown == 2.0


def test_bound_over_several_links_is_held_by_the_busiest() -> None:
    # a is sharded over links x and y (1 s on each), b sits on y alone (2 s): y carries 3 s
    # of pushes, x only 1 s; with no compute the best is a first (1 s), then b (3 s).
    links = {"x": {"a": 1.0}, "y": {"a": 1.0, "b": 2.0}}
    bound = lower_bound_avg_jct({"a": 1.0, "b": 2.0}, links, {"a": 0, "b": 0})
    assert bound == pytest.approx((1.0 + 3.0) / 2)
    # Spread over separate links, the jobs do not constrain each other.
    apart = {"x": {"a": 1.0}, "y": {"b": 2.0}}
    assert lower_bound_avg_jct({"a": 1.0, "b": 2.0}, apart, {"a": 0, "b": 0}) == pytest.approx(1.5)


def test_multi_host_scenarios_shard_over_ps_hosts_and_shape_each() -> None:
    m3 = SCENARIOS["m3"]
    assert m3.shaped_hosts == ("ps", "ps2", "ps3")
    assert SCENARIOS["m2"].shaped_hosts == ("ps", "ps2") and SCENARIOS["a"].shaped_hosts == ("ps",)
    j1 = m3.jobs[0]
    # An 8 MB model over two PS hosts: each host pushes 4 MB to each worker per iteration.
    per_host = 4_000_000 * 2 * j1.iterations
    assert j1.pushed_bytes_on() == {"ps": per_host, "ps2": per_host}
    assert profile_key(j1).endswith("-2ps") and not profile_key(m3.jobs[3]).endswith("ps")
    with pytest.raises(ConfigError, match="PS hosts"):
        Scenario("x", "t", "d", (JobSpec("j", 1, 1, 0.1, 1, ps_hosts=("ps", "nowhere")),))
    with pytest.raises(ConfigError, match="only synthetic, gloo PS and TF"):
        Scenario("x", "t", "d", (JobSpec("j", 1, 1, 0.1, 1, 0, "torch-rpc", ("ps", "ps2")),))


def test_split_green_share_counts_time_a_sharded_job_is_green_on_one_host_only() -> None:
    scenario = SCENARIOS["m2"]  # "sharded" on ps + ps2, "on-ps", "on-ps2"
    runs = tuple(JobRun(name, 0.0, 10.0, ()) for name in ("sharded", "on-ps", "on-ps2"))
    # ps: sharded green 0-10; ps2: on-ps2 green 0-4, then sharded: split for 4 of 10 s.
    lights = {"ps": ((0.0, "sharded"),), "ps2": ((0.0, "on-ps2"), (4.0, "sharded"))}
    trial = Trial("m2", "pack", 0, 1, runs, 0, 10.0, host_greens=lights)
    assert split_green_share(trial, scenario) == pytest.approx(0.4)
    agreeing = {"ps": ((0.0, "sharded"),), "ps2": ((0.0, "sharded"),)}
    assert split_green_share(replace(trial, host_greens=agreeing), scenario) == 0.0
    # Without a light on one of its hosts (FIFO, fair) there is nothing to count.
    assert split_green_share(replace(trial, host_greens={"ps": lights["ps"]}), scenario) is None
    assert Trial.from_dict(json.loads(json.dumps(trial.to_dict()))) == trial


def test_traces_count_each_hosts_reported_iterations_against_the_workers_log(
    tmp_path: Path,
) -> None:
    """`bench traces`: an iteration listed by many status reads counts once (a ring's
    merged all-reduces as many as it stands for); each host's count stands beside the job's
    logged iterations; gzipped traces read the same."""
    folder = tmp_path
    trial = _trial("controller-pack", 1, {"j1": 20.0}, scenario="c2")  # 3 iterations logged
    (folder / "trials.jsonl").write_text(json.dumps(trial.to_dict()) + "\n")
    (folder / "status").mkdir()

    def read(*ends: float) -> str:
        listed = [{"last_done_monotonic": end, "period_s": 1.0 if end > 1 else None,
                   "count": 2 if end == 4.5 else 1} for end in ends]  # fmt: skip
        return json.dumps({"at_s": 0, "status": {"telemetry": {"torch/c2-j1-x-1-42": listed}}})

    reads = [read(1.0), read(1.0, 2.0), read(2.0, 3.5), read(3.5, 4.0, 4.5)]
    (folder / "status" / "c2-controller-pack-1-w1.jsonl").write_text("\n".join(reads) + "\n")
    with gzip.open(folder / "status" / "c2-controller-pack-1-w2.jsonl.gz", "wt") as kept:
        kept.write("\n".join(reads[:2]) + "\n")
    shown = CliRunner().invoke(cli.main, ["traces", str(folder), "--json"])
    assert shown.exit_code == 0, shown.output
    rows = [json.loads(line) for line in shown.output.splitlines()]
    assert [(r["host"], r["job"], r["reported"], r["logged"]) for r in rows] == [
        ("w1", "j1", 6, 3),
        ("w2", "j1", 2, 3),
    ]
    assert rows[0]["policy"] == "controller-pack" and rows[0]["median_period_s"] == 1.0
    missing = CliRunner().invoke(cli.main, ["traces", str(folder / "status")])
    assert missing.exit_code == 2 and "--status-traces" in missing.output


def test_runs_with_other_work_beside_them_and_cpu_bound_runs_are_marked_in_the_report() -> None:
    quiet = replace(_trial("pack", 0, {"j1": 10.0}), other_cores=0.01, own_cores=0.6, cores=2)
    busy = replace(_trial("pack", 1, {"j1": 20.0}), other_cores=0.93, own_cores=1.9, cores=2)
    old = Trial.from_dict(
        {k: v for k, v in quiet.to_dict().items() if k not in ("other_cores", "own_cores", "cores")}
    )
    assert Trial.from_dict(busy.to_dict()) == busy and old.other_cores is None
    assert busy.disturbed and not quiet.disturbed and not old.disturbed
    assert busy.cpu_bound and not quiet.cpu_bound and not old.cpu_bound
    section = report.cpu_section([quiet, busy, old])
    assert "| t | 1.25 | 1.90 | 2 | 1 of 2 |" in section  # the median of 0.6 and 1.9
    assert any("at most 0.93 cores" in line and "2 of 3 runs read" in line for line in section)
    assert "| t pack 1 | 0.93 | 20.00 |" in section
    assert not any("t pack 0 |" in line for line in section)
    assert report.cpu_section([old]) == []
    assert "No run was disturbed." in report.cpu_section([quiet])
    assert not any("daemons' cores" in line for line in section)  # none recorded


def test_the_policys_own_processes_cpu_is_reported_per_scenario_and_policy() -> None:
    runs = [
        replace(_trial("pack", rep, {"j1": 10.0}), other_cores=0.0, own_cores=0.6, cores=2,
                daemon_cores=cores)
        for rep, cores in enumerate((0.012, 0.020, 0.016))
    ]  # fmt: skip
    fifo = replace(_trial("fifo", 0, {"j1": 12.0}), other_cores=0.0, own_cores=0.5, cores=2)
    assert Trial.from_dict(runs[0].to_dict()) == runs[0]
    section = report.cpu_section([*runs, fifo])
    assert "| t | pack | 0.016 | 0.020 |" in section
    assert not any("| t | fifo |" in line for line in section)  # no daemon ran


def test_a_run_recorded_again_supersedes_its_earlier_record(tmp_path: Path) -> None:
    """`run --rerun-disturbed` appends a run's new record: the latest is the one read."""
    first = replace(_trial("pack", 0, {"j1": 20.0}), other_cores=0.9)
    other = _trial("fifo", 0, {"j1": 30.0})
    again = replace(first, other_cores=0.0, jobs=_trial("pack", 0, {"j1": 10.0}).jobs)
    records = [first, other, again]
    (tmp_path / "trials.jsonl").write_text("".join(json.dumps(t.to_dict()) + "\n" for t in records))
    assert cli._read_trials(tmp_path) == [again, other]
