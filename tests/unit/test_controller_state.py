"""Controller pure parts: registry (sessions, replays, merge, expiry), planner, wire checks,
jobs file, Kubernetes pod lists, controller config."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tensorlights.controller.config import build_config
from tensorlights.controller.core import plan_update
from tensorlights.controller.kubernetes import parse_pod_list
from tensorlights.controller.planner import ClusterPolicy, Planner
from tensorlights.controller.registry import (
    PodPlacement,
    Registry,
    SourceJob,
    StaleMessage,
    UnknownSession,
)
from tensorlights.controller.sources import parse_jobs_file
from tensorlights.discovery.rules import launcher_job
from tensorlights.errors import ConfigError
from tensorlights.model import (
    HostReport,
    Mode,
    PlanRenewal,
    PlanSlots,
    Registration,
    ReportedJob,
    Voucher,
    VoucherSource,
)
from tensorlights.rpc import convert
from tensorlights.rpc.convert import InvalidMessage
from tensorlights.rpc.v1 import agent_link_pb2 as pb
from tensorlights.testbed.kube_emulator import kubeflow_pod
from tensorlights.testbed.psjob import tf_launcher_env


def reg(host: str, incarnation: int = 10) -> Registration:
    return Registration(host, incarnation, "t", (("eth0", 10**9),), "rotate")


def rep(session: str, seq: int, *jobs: str) -> HostReport:
    reported = tuple(ReportedJob(j, frozenset({1000 + i}), 1, 1) for i, j in enumerate(jobs))
    return HostReport(session, seq, reported, (), Mode.PLAN, "")


def test_sessions_replays_and_reconnects() -> None:
    registry = Registry(host_timeout_s=30)
    first = registry.register(reg("a"), now=0)
    registry.report(rep(first.session, 1, "j"), now=1)
    with pytest.raises(StaleMessage):
        registry.report(rep(first.session, 1, "other"), now=2)
    with pytest.raises(StaleMessage):
        registry.register(reg("a", incarnation=9), now=2)
    assert registry.membership() == {"j": frozenset({"a"})}
    # The same agent reconnecting keeps its jobs; the old session is gone.
    again = registry.register(reg("a"), now=3)
    assert registry.membership() == {"j": frozenset({"a"})}
    with pytest.raises(UnknownSession):
        registry.report(rep(first.session, 5, "j"), now=4)
    # A restarted agent (higher incarnation): the jobs outlive it, so what the old one
    # reported stands until the new one's first report replaces it.
    restarted = registry.register(reg("a", incarnation=11), now=5)
    assert registry.membership() == {"j": frozenset({"a"})}
    registry.report(rep(restarted.session, 1, "k"), now=6)
    assert registry.membership() == {"k": frozenset({"a"})}
    assert again.session != first.session


def test_disconnected_hosts_expire_after_the_timeout() -> None:
    registry = Registry(host_timeout_s=30)
    record = registry.register(reg("a"), now=0)
    registry.set_connected(record.session, True, now=0)
    registry.report(rep(record.session, 1, "j"), now=0)
    registry.set_connected(record.session, False, now=10)
    assert registry.expire(now=39) == [] and "j" in registry.membership()
    assert registry.expire(now=41) == ["a"] and registry.membership() == {}


def test_sources_merge_into_one_job_view() -> None:
    registry = Registry()
    a = registry.register(reg("a"), now=0)
    registry.register(reg("b"), now=0)
    registry.report(rep(a.session, 1, "slurm/7"), now=0)
    registry.set_source(
        "slurm", [SourceJob("slurm/7", "slurm", "train", nodes=("a", "c"), state="RUNNING")]
    )
    registry.set_source("static", [SourceJob("static/x", "static", ps_hosts=frozenset("bz"))])
    assert registry.membership() == {"slurm/7": frozenset({"a"}), "static/x": frozenset({"b"})}
    views = {view.job: view for view in registry.jobs()}
    assert views["slurm/7"].sources == ("agent", "slurm")
    assert views["slurm/7"].nodes == ("a", "c") and views["slurm/7"].name == "train"
    assert views["static/x"].ps_hosts == ("b",)  # z has no agent: nobody would follow a plan


def test_planner_generations_and_rotation_view() -> None:
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=7)
    changed = planner.update({"x": frozenset("ab"), "y": frozenset("a")}, {"a", "b"})
    assert changed == {"a", "b"} and planner.generation == 1
    assert planner.update({"x": frozenset("ab"), "y": frozenset("a")}, {"a", "b"}) == set()
    plan_b = planner.plan_for("b")
    assert plan_b.slots == (("x",),) and plan_b.generation == 1 and plan_b.epoch == 0.0
    # y leaves: only a's plan changes, at a new generation.
    assert planner.update({"x": frozenset("ab")}, {"a", "b"}) == {"a"}
    assert planner.plan_for("a").generation == 2 and planner.plan_for("b").generation == 1
    planner.update({"x": frozenset("ab"), "y": frozenset("a")}, {"a", "b"})
    view = planner.rotation("a", now=101.0, upcoming=3)  # slot 50 of 2 s: [100, 102)
    assert view.green_since == 100.0 and view.next_at == 102.0
    assert {view.green, view.next} == {"x", "y"}
    assert [at for _, at in view.upcoming] == [102.0, 104.0, 106.0]


def test_pack_planner_gives_every_host_one_cluster_wide_order_by_demand() -> None:
    registry = Registry()
    sessions = {h: registry.register(reg(h), now=0).session for h in ("a", "b")}

    def report(host: str, seq: int, demands: dict[str, float | None]) -> None:
        jobs = tuple(
            ReportedJob(j, frozenset({1000 + i}), 1, 1, demand=d)
            for i, (j, d) in enumerate(sorted(demands.items()))
        )
        registry.report(HostReport(sessions[host], seq, jobs, (), Mode.PLAN, ""), now=1)

    # x spans a and b; y only on a, z only on b. Nothing measured yet: a job on fewer hosts
    # takes fewer links, so y and z go before x, who came first.
    report("a", 1, {"x": None, "y": None})
    report("b", 1, {"x": None, "z": None})
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def update(iterative: set[str] = set()) -> set[str]:  # noqa: B006 (read only)
        return planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, iterative,
        )  # fmt: skip

    assert update() == {"a", "b"}
    assert registry.arrival_order() == ["x", "y", "z"]
    assert planner.plan_for("a").slots == (("y", "x"),)
    assert planner.plan_for("b").slots == (("z", "x"),)
    assert planner.schedule.share("x") == 0.0 and planner.schedule.share("y") == 1.0
    # Once iterating, jobs keep their places (here: as they stand) until measured.
    assert update({"x", "y", "z"}) == set()
    # Measured: x much of two links, y and z little of theirs: y and z stay first.
    version = registry.version
    report("a", 2, {"x": 0.5, "y": 0.1})
    assert registry.demands() == {"x": 1.0, "y": 0.1}  # b's share counted as a's until known
    report("b", 2, {"x": 0.8, "z": 0.2})
    assert registry.version > version and registry.demands()["x"] == pytest.approx(1.3)
    assert update() == set()  # the same order: no new plans
    assert planner.plan_for("a").slots == (("y", "x"),)
    assert planner.plan_for("b").slots == (("z", "x"),)
    # Noise within 10% triggers no replan; within x1.3 it would not reorder anyway.
    version = registry.version
    report("a", 3, {"x": 0.52, "y": 0.105})
    assert registry.version == version and update() == set()
    # x turns out to take little of either link (0.1 summed), y much of its one: x first
    # where they meet; z (0.2) stays ahead of x on b.
    report("a", 4, {"x": 0.05, "y": 0.6})
    report("b", 4, {"x": 0.05, "z": 0.2})
    assert update() == {"a", "b"}
    assert planner.plan_for("a").slots == (("x", "y"),)
    assert planner.plan_for("b").slots == (("x", "z"),)


def test_pack_planner_keeps_an_iterating_job_in_place_until_its_demand_is_trusted() -> None:
    """Agents report a demand only once pack may order by it: a job iterating (a period
    reported) without one holds its place in the order in force instead of going behind
    every measured job and coming back once measured (the light moving twice)."""
    registry = Registry()
    session = registry.register(reg("h"), now=0).session
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def report(seq: int, jobs: dict[str, tuple[float | None, float | None]]) -> None:
        reported = tuple(
            ReportedJob(j, frozenset({1000 + i}), 1, 1, period_s=p, demand=d)
            for i, (j, (p, d)) in enumerate(sorted(jobs.items()))
        )
        registry.report(HostReport(session, seq, reported, (), Mode.PLAN, ""), now=1)

    def order() -> tuple[str, ...]:
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, registry.iterative(),
        )  # fmt: skip
        return planner.plan_for("h").slots[0]

    report(1, {"x": (None, None), "y": (None, None)})
    assert order() == ("x", "y")
    # y measured on top elsewhere: trusted; x iterates here, its demand not trusted yet.
    report(2, {"x": (0.5, None), "y": (0.5, 0.6)})
    assert order() == ("x", "y")
    # x trusted too, clearly smaller: it stays first; y's larger demand keeps it second.
    report(3, {"x": (0.5, 0.2), "y": (0.5, 0.6)})
    assert order() == ("x", "y")
    # x's measurements gone (its agent restarted): a job seen iterating keeps its place.
    report(4, {"x": (None, None), "y": (0.5, 0.6)})
    assert order() == ("x", "y")
    # A job never seen iterating (bulk traffic, not a training job) goes behind.
    report(5, {"x": (None, None), "y": (0.5, 0.6), "z": (None, None)})
    assert order() == ("x", "y", "z")
    report(6, {"x": (None, None), "z": (None, None)})  # y ends; z is still no training job
    assert order() == ("x", "z")


def test_wire_checks_refuse_bad_input() -> None:
    good = pb.AgentReport(session="s", seq=1, mode="plan", jobs=[pb.PsJob(job="j", ports=[80])])
    assert convert.report(good.SerializeToString()).jobs[0].ports == frozenset({80})
    for job in (
        pb.PsJob(job="j", ports=[65536]),
        pb.PsJob(job="j", ports=[1], spread_s=math.inf),
        pb.PsJob(job="x" * 257, ports=[1]),
        pb.PsJob(job="j", ports=[1], demand=math.nan),
        pb.PsJob(job="j", ports=[1], demand=0.0),
        pb.PsJob(job="j", ports=[1], demand=1.5),
    ):
        bad = pb.AgentReport(session="s", seq=1, mode="plan", jobs=[job])
        with pytest.raises(InvalidMessage):
            convert.report(bad.SerializeToString())
    with pytest.raises(InvalidMessage):
        convert.report(pb.AgentReport(seq=1, mode="plan").SerializeToString())  # no session
    with pytest.raises(InvalidMessage):
        convert.registration(b"\x08")  # truncated varint
    for policy in ("fifo", "static", "rotate", "pack"):  # every local policy an agent may have
        request = pb.RegisterRequest(host="h", agent_incarnation=1, fallback_policy=policy)
        assert convert.registration(request.SerializeToString()).fallback_policy == policy
    with pytest.raises(InvalidMessage, match="fallback_policy"):
        convert.registration(
            pb.RegisterRequest(
                host="h", agent_incarnation=1, fallback_policy="best"
            ).SerializeToString()
        )
    with pytest.raises(InvalidMessage):
        convert.plan_slots(pb.HostPlan(generation=1, lease_ms=0, slot_ms=100))


def test_plan_round_trip() -> None:
    plan = PlanSlots(3, 9, 15.0, 0.0, 1.5, (("a", "b"), ("b", "a")))
    assert convert.plan_slots(convert.plan_message(plan)) == plan


def test_jobs_file() -> None:
    jobs = parse_jobs_file('[[job]]\nid = "j1"\nps_hosts = ["h1", "h2"]\nname = "bert"\n')
    assert jobs[0].ps_hosts == frozenset({"h1", "h2"}) and jobs[0].name == "bert"
    for text, message in (
        ('[[job]]\nid = "j1"\n', "ps_hosts"),
        ('[[job]]\nid = "j1"\nps_hosts = ["bad host"]\n', "not a host name"),
        ('[[job]]\nid = "j1"\nps_hosts = ["h"]\nweight = 2\n', "unknown keys"),
        ('[[job]]\nid = "j"\nps_hosts = ["h"]\n[[job]]\nid = "j"\nps_hosts = ["h"]\n', "twice"),
        ("jobs = 1\n", "unknown keys"),
        ("[[job]\n", "jobs file"),
    ):
        with pytest.raises(ConfigError, match=message):
            parse_jobs_file(text)


def test_kubeflow_pods_name_jobs_as_the_agents_do() -> None:
    env = tf_launcher_env("k", 2)
    pods = [
        kubeflow_pod("ml", "bert", "PS", 0, "gpu1", env),
        kubeflow_pod("ml", "bert", "Worker", 0, "gpu2", {}),
        kubeflow_pod("ml", "bert", "Worker", 1, "gpu3", {}),
        kubeflow_pod("ml", "old", "PS", 0, "gpu4", {}, phase="Succeeded"),
        kubeflow_pod("ml", "plain", "PS", 0, "gpu5", {}),
    ]
    jobs = {job.name: job for job in parse_pod_list({"kind": "PodList", "items": pods})}
    found = launcher_job(env)
    assert found is not None
    assert jobs["ml/bert"].job == found[0]
    assert jobs["ml/bert"].ps_hosts == frozenset({"gpu1"})
    assert jobs["ml/bert"].nodes == ("gpu1", "gpu2", "gpu3")
    assert jobs["ml/plain"].job == "k8s/ml/plain" and "ml/old" not in jobs


def test_controller_config(tmp_path: Path) -> None:
    for name in ("ca.pem", "c.pem", "c.key"):
        (tmp_path / name).write_text("x")
    tls = {"ca": str(tmp_path / "ca.pem"), "cert": str(tmp_path / "c.pem")}
    with pytest.raises(ConfigError, match="always use mutual TLS"):
        build_config({"tls": tls}, {})
    tls["key"] = str(tmp_path / "c.key")
    config = build_config({"tls": tls, "sources": {"slurm": {"enabled": True}}}, {"slot": "1s"})
    assert config.slurm and config.slot_s == 1.0 and config.lease_s == 15.0
    assert config.policy == "pack"
    assert build_config({"tls": tls}, {"policy": "rotate"}).policy == "rotate"
    for values, message in (
        ({"tls": tls, "lease": "2s"}, "three report intervals"),
        ({"tls": tls, "slot": "10ms"}, "at least 100ms"),
        ({"tls": tls, "sources": {"nfs": {}}}, "unknown \\[sources\\] keys"),
        ({"tls": {**tls, "key": "/nonexistent"}}, "tls.key /nonexistent"),
        ({"tls": tls, "bogus": 1}, "unknown config keys"),
        ({"tls": tls, "policy": "static"}, "policy must be one of rotate, pack"),
    ):
        with pytest.raises(ConfigError, match=message):
            build_config(values, {})


def test_a_registration_from_the_future_cannot_lock_the_real_agent_out() -> None:
    """Incarnations are agent start times: one far ahead of the controller's clock (2^64-1)
    is refused, so the real agent's next start still orders after every accepted one."""
    from tensorlights.controller.registry import FutureIncarnation

    registry = Registry()
    now = 1_700_000_000.0
    with pytest.raises(FutureIncarnation, match="ahead of the controller's clock"):
        registry.register(reg("a", incarnation=2**64 - 1), now=now)
    assert "a" not in registry.hosts
    registry.register(reg("a", incarnation=int((now + 60) * 1e9)), now=now)  # skew is fine
    real = registry.register(reg("a", incarnation=int((now + 61) * 1e9)), now=now + 1)
    # A report with the largest seq only ends its own session: the agent registers again.
    registry.report(HostReport(real.session, 2**64 - 1, (), (), Mode.LOCAL, ""), now + 2)
    again = registry.register(reg("a", incarnation=int((now + 61) * 1e9)), now=now + 3)
    assert registry.report(HostReport(again.session, 1, (), (), Mode.LOCAL, ""), now + 4)


def test_kubeflow_pods_keep_their_uids_nodes_and_users() -> None:
    pods = [
        kubeflow_pod("ml", "bert", "PS", 0, "gpu1", run_as_user=1000),
        kubeflow_pod("ml", "bert", "Worker", 0, "gpu1"),
        kubeflow_pod("ml", "bert", "Worker", 1, "gpu2", run_as_user=0),
    ]
    # A container of its own user overrides the pod's; two containers that differ fix none.
    pods[1]["spec"]["containers"].append({"name": "side", "securityContext": {"runAsUser": 7}})
    (job,) = parse_pod_list({"kind": "PodList", "items": pods})
    uids = [pod["metadata"]["uid"] for pod in pods]
    assert {(p.uid, p.node, p.run_as_user) for p in job.pods} == {
        (uids[0], "gpu1", 1000),
        (uids[1], "gpu1", None),
        (uids[2], "gpu2", 0),
    }


def test_vouchers_say_per_host_what_the_sources_vouch_for() -> None:
    registry = Registry()
    registry.set_source(
        "slurm",
        [
            SourceJob("slurm/7", "slurm", nodes=("a", "b"), user="alice"),
            SourceJob("slurm/8", "slurm", nodes=("a",)),  # no user: nothing to check against
        ],
    )
    registry.set_source(
        "static", [SourceJob("j", "static", ps_hosts=frozenset("a"), nodes=("a",), user="bob")]
    )
    pods = (PodPlacement("u1", "a", 1000), PodPlacement("u2", "b", None))
    kube_job = SourceJob("tf/x", "kubernetes", nodes=("a", "b"), pods=pods)
    registry.set_source("kubernetes", [kube_job])
    assert registry.vouchers_for("a") == (
        Voucher("tf/x", VoucherSource.KUBERNETES, pods=(("u1", 1000),)),
        Voucher("slurm/7", VoucherSource.SLURM, user="alice"),
        Voucher("j", VoucherSource.STATIC, user="bob"),
    )
    assert registry.vouchers_for("c") == ()
    registry.set_source("slurm", [])
    assert [v.job for v in registry.vouchers_for("b")] == ["tf/x"]
    # On the wire and back, as the agent reads a report's reply.
    reply = convert.report_reply(5, registry.vouchers_for("a"))
    assert convert.vouchers(pb.ReportReply.FromString(reply.SerializeToString())) == (
        registry.vouchers_for("a")
    )
    assert convert.renewal(reply) is None
    plan = PlanSlots(3, 17, 15.0, 0.0, 1.0, (("j",),))
    renewing = convert.report_reply(6, (), plan)
    assert convert.renewal(pb.ReportReply.FromString(renewing.SerializeToString())) == (
        PlanRenewal(3, 17, 15.0)
    )


@pytest.mark.parametrize(
    ("voucher", "message"),
    [
        (pb.Voucher(job="", source="slurm"), "job id"),
        (pb.Voucher(job="j", source="pbs"), "unknown source"),
        (pb.Voucher(job="j", source="slurm", user="a\x1b[2J"), "unprintable"),
        (pb.Voucher(job="j", source="kubernetes", pods=[pb.Pod(uid="x")] * 1025), "pods of job j"),
    ],
)
def test_vouchers_from_the_wire_are_checked(voucher: pb.Voucher, message: str) -> None:
    with pytest.raises(InvalidMessage, match=message):
        convert.vouchers(pb.ReportReply(seq=1, vouchers=[voucher]))


def test_a_restarted_controller_places_jobs_it_never_placed_fewest_hosts_first() -> None:
    """All jobs iterate already (the agents kept following the old plan), only the
    single-host ones are trusted: the sharded x, first in the new registry's arrival
    order, does not go back ahead of them."""
    registry = Registry()
    sessions = {h: registry.register(reg(h), now=0).session for h in ("a", "b")}
    for host, single in (("a", "y"), ("b", "z")):
        jobs = (
            ReportedJob("x", frozenset({1000}), 1, 1, period_s=0.3),
            ReportedJob(single, frozenset({1001}), 1, 1, period_s=0.3, demand=0.7),
        )
        registry.report(HostReport(sessions[host], 1, jobs, (), Mode.PLAN, ""), now=1)
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=2, policy=ClusterPolicy.PACK)
    planner.update(
        registry.membership(), set(registry.hosts), registry.demands(),
        registry.arrival_order(), None, registry.iterative(),
    )  # fmt: skip
    assert registry.arrival_order()[0] == "x"
    assert planner.plan_for("a").slots == (("y", "x"),)
    assert planner.plan_for("b").slots == (("z", "x"),)


def test_a_restarted_controller_learning_hosts_one_report_at_a_time_keeps_them_ahead() -> None:
    """The agents' reports reach a restarted controller one by one and it plans after each.
    Once a's report placed the sharded x behind y, x iterates in a place this planner gave
    it and holds it unmeasured; z, measured on b, reported a moment later, is not appended
    behind x (seen in m2: x green on b for 8 s until it was measured there)."""
    registry = Registry()
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=2, policy=ClusterPolicy.PACK)

    def replan() -> None:
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, registry.iterative(),
        )  # fmt: skip

    for now, (host, single) in enumerate((("a", "y"), ("b", "z"))):
        session = registry.register(reg(host), now=now).session
        replan()
        jobs = (
            ReportedJob("x", frozenset({1000}), 1, 1, period_s=0.3),
            ReportedJob(single, frozenset({1001}), 1, 1, period_s=0.3, demand=0.7),
        )
        registry.report(HostReport(session, 1, jobs, (), Mode.PLAN, ""), now=now + 0.5)
        replan()
        assert planner.plan_for(host).slots == ((single, "x"),)
    assert planner.plan_for("a").slots == (("y", "x"),)


def test_the_controller_gives_the_light_to_jobs_no_job_ahead_holds_back() -> None:
    """m3's shape: j1, j2, j3 sharded over two of three hosts each, j4 alone on ps. Put
    first by arrival, j1 (behind the smaller j4 on ps) took ps2's light from j2; j2 and j4
    share no host, and go first everywhere they run, from the start and once measured."""
    registry = Registry()
    where = {"ps": ("j1", "j3", "j4"), "ps2": ("j1", "j2"), "ps3": ("j2", "j3")}
    sessions = {h: registry.register(reg(h), now=0).session for h in where}
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def report(seq: int, demand: dict[str, float] | None = None) -> dict[str, tuple[str, ...]]:
        for host, jobs in where.items():
            reported = tuple(
                ReportedJob(j, frozenset({1000 + i}), 1, 1, period_s=0.3,
                            demand=None if demand is None else demand[j])
                for i, j in enumerate(jobs)
            )  # fmt: skip
            registry.report(HostReport(sessions[host], seq, reported, (), Mode.PLAN, ""), now=1)
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            ["j1", "j2", "j3", "j4"], None, registry.iterative(),
        )  # fmt: skip
        return {host: planner.plan_for(host).slots[0] for host in where}

    expected = {"ps": ("j4", "j1", "j3"), "ps2": ("j2", "j1"), "ps3": ("j2", "j3")}
    assert report(1) == expected
    # Measured: j4 half the others' links (summed over their two hosts); j1-j3 equal.
    generation = planner.generation
    assert report(2, {"j1": 0.7, "j2": 0.68, "j3": 0.72, "j4": 0.7}) == expected
    assert planner.generation == generation, "no light moved once measured"


def test_a_young_job_keeps_its_place_while_another_host_reports_first() -> None:
    """Reports come one host at a time. a says x and y iterate before b says z does: z,
    first on b, stays there (it went behind x on b's report, then held that place once
    iterating: found by the simulator's m2); past the grace, a job never seen iterating
    goes behind as bulk traffic."""
    registry = Registry()
    sessions = {h: registry.register(reg(h), now=0).session for h in ("a", "b")}
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def report(host: str, seq: int, single: str, period: float | None, now: float) -> None:
        jobs = (
            ReportedJob("x", frozenset({1000}), 1, 1, period_s=period),
            ReportedJob(single, frozenset({1001}), 1, 1, period_s=period),
        )
        registry.report(HostReport(sessions[host], seq, jobs, (), Mode.PLAN, ""), now=now)

    def replan(now: float) -> None:
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, registry.iterative(), registry.young(now),
        )  # fmt: skip

    report("a", 1, "y", None, now=0.0)
    report("b", 1, "z", None, now=0.0)
    replan(0.0)
    assert planner.plan_for("b").slots == (("z", "x"),)
    report("a", 2, "y", 0.3, now=1.0)
    replan(1.0)
    assert registry.young(1.0) == {"x", "y", "z"}
    assert planner.plan_for("b").slots == (("z", "x"),)
    report("b", 2, "z", 0.3, now=1.1)
    replan(1.1)
    assert planner.plan_for("a").slots == (("y", "x"),)
    assert planner.plan_for("b").slots == (("z", "x"),)
    # Without the grace (a planner given no young jobs) z went behind x at a's report.
    ungraced = Registry()
    sessions = {h: ungraced.register(reg(h), now=0).session for h in ("a", "b")}
    registry, planner = (
        ungraced,
        Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK),
    )
    report("a", 1, "y", None, now=0.0)
    report("b", 1, "z", None, now=0.0)
    planner.update(registry.membership(), set(registry.hosts), {}, registry.arrival_order())
    report("a", 2, "y", 0.3, now=1.0)
    planner.update(
        registry.membership(), set(registry.hosts), {}, registry.arrival_order(), None,
        registry.iterative(),
    )  # fmt: skip
    assert planner.plan_for("b").slots == (("x", "z"),)


def test_a_job_never_seen_iterating_goes_behind_once_past_the_grace() -> None:
    registry = Registry()
    session = registry.register(reg("h"), now=0).session
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)
    jobs = (
        ReportedJob("bulk", frozenset({1000}), 1, 1),
        ReportedJob("train", frozenset({1001}), 1, 1, period_s=0.3),
    )
    registry.report(HostReport(session, 1, (jobs[0],), (), Mode.PLAN, ""), now=0.0)

    def order(now: float) -> tuple[str, ...]:
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, registry.iterative(), registry.young(now),
        )  # fmt: skip
        return planner.plan_for("h").slots[0]

    assert order(0.0) == ("bulk",)
    registry.report(HostReport(session, 2, jobs, (), Mode.PLAN, ""), now=1.0)
    assert order(1.0) == ("bulk", "train")  # young: it holds its place
    assert registry.young(10.5) == {"train"}
    assert order(10.5) == ("train", "bulk")


def test_the_controller_puts_jobs_its_agents_report_starving_first_the_most_behind_first() -> None:
    """An agent following a plan keeps watching its starvation guard and reports the jobs it
    would promote (lag_s); the cluster-wide order puts them first, as an agent's own pack
    does, and back in their place once no host reports them."""
    registry = Registry()
    sessions = {h: registry.register(reg(h), now=0).session for h in ("a", "b")}
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def report(host: str, seq: int, jobs: dict[str, tuple[float, float | None]]) -> None:
        reported = tuple(
            ReportedJob(j, frozenset({1000 + i}), 1, 1, period_s=0.3, demand=d, lag_s=lag)
            for i, (j, (d, lag)) in enumerate(sorted(jobs.items()))
        )
        registry.report(HostReport(sessions[host], seq, reported, (), Mode.PLAN, ""), now=seq)

    def orders() -> tuple[tuple[str, ...], tuple[str, ...]]:
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, registry.iterative(), (), registry.starving(),
        )  # fmt: skip
        return planner.plan_for("a").slots[0], planner.plan_for("b").slots[0]

    report("a", 1, {"x": (0.2, None), "y": (0.3, None), "z": (0.6, None)})
    report("b", 1, {"v": (0.1, None), "w": (0.7, None)})
    assert orders() == (("x", "y", "z"), ("v", "w"))
    # z starves on a, w on b: each first where it runs.
    report("a", 2, {"x": (0.2, None), "y": (0.3, None), "z": (0.6, 40.0)})
    report("b", 2, {"v": (0.1, None), "w": (0.7, 45.0)})
    assert registry.starving() == {"z": 40.0, "w": 45.0}
    assert orders() == (("z", "x", "y"), ("w", "v"))
    # Caught up: back to the order by demand.
    report("a", 3, {"x": (0.2, None), "y": (0.3, None), "z": (0.6, None)})
    report("b", 3, {"v": (0.1, None), "w": (0.7, None)})
    assert orders() == (("x", "y", "z"), ("v", "w"))


def test_starving_jobs_keep_their_turns_when_their_lags_cross() -> None:
    """Two jobs starving on one host keep the order they were first put in (the most behind
    first), as an agent's guard keeps its promoted jobs' turns: re-sorted by lag, two that
    fit together traded the light as their lags crossed. One promoted later goes behind."""
    registry = Registry()
    session = registry.register(reg("h"), now=0).session
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def order(seq: int, lags: dict[str, float | None]) -> tuple[str, ...]:
        reported = tuple(
            ReportedJob(j, frozenset({1000 + i}), 1, 1, period_s=0.3, demand=0.3, lag_s=lag)
            for i, (j, lag) in enumerate(sorted(lags.items()))
        )
        registry.report(HostReport(session, seq, reported, (), Mode.PLAN, ""), now=seq)
        planner.update(
            registry.membership(), set(registry.hosts), registry.demands(),
            registry.arrival_order(), None, registry.iterative(), (), registry.starving(),
        )  # fmt: skip
        return planner.plan_for("h").slots[0]

    assert order(1, {"p": None, "q": None, "r": None, "s": None}) == ("p", "q", "r", "s")
    assert order(2, {"p": None, "q": None, "r": 2.0, "s": 3.0}) == ("s", "r", "p", "q")
    assert order(3, {"p": None, "q": None, "r": 4.0, "s": 3.5}) == ("s", "r", "p", "q")
    assert order(4, {"p": None, "q": 9.0, "r": 4.5, "s": 3.0}) == ("s", "r", "q", "p")
    # Released, s keeps its place among the equal; promoted again, more behind than q, it
    # comes after those held all the same.
    assert order(5, {"p": None, "q": 9.5, "r": 5.0, "s": None}) == ("r", "q", "s", "p")
    assert order(6, {"p": None, "q": 9.0, "r": 5.0, "s": 9.9}) == ("r", "q", "s", "p")


def test_the_controller_keeps_a_job_waiting_for_its_siblings_where_all_its_hosts_say_so() -> None:
    """A job past its lag's limit whose only company on a host is its siblings, which it
    ends in time behind, is reported starving and waiting for them (waits_for_siblings):
    kept waiting where every host reporting it says so; promoted where one host says it
    starves without that excuse (there it waits behind other jobs too), and then kept
    promoted while every host reports it starving."""
    registry = Registry()
    sessions = {h: registry.register(reg(h), now=0).session for h in ("a", "b")}
    seqs = dict.fromkeys(sessions, 0)

    def report(host: str, jobs: dict[str, tuple[float | None, bool]]) -> None:
        seqs[host] += 1
        reported = tuple(
            ReportedJob(j, frozenset({1000 + i}), 1, 1, 0.1, 0.3, 0.5, lag_s=lag,
                        waits_for_siblings=waits)
            for i, (j, (lag, waits)) in enumerate(sorted(jobs.items()))
        )  # fmt: skip
        registry.report(HostReport(sessions[host], seqs[host], reported, (), Mode.PLAN, ""), 1.0)

    report("a", {"x": (None, False), "y": (30.0, True)})
    report("b", {"x": (None, False), "y": (25.0, True)})
    assert registry.starving() == {}
    # On b, a third job of other bytes: y may wait behind it too.
    report("b", {"x": (None, False), "y": (25.0, False), "z": (None, False)})
    assert registry.starving() == {"y": 25.0}
    # Promoted, it keeps its turn while it starves, though its hosts now find it waits in
    # time (green, it gains fast): demoted on that word, the light would swing back.
    report("b", {"x": (None, False), "y": (20.0, True), "z": (None, False)})
    assert registry.starving() == {"y": 20.0}
    # Every host has to see it behind (lag_s) for a promotion: once one does not, it is
    # over, and the excuse counts again.
    report("a", {"x": (None, False), "y": (None, False)})
    assert registry.starving() == {}
    report("a", {"x": (None, False), "y": (30.0, True)})
    assert registry.starving() == {}


def test_the_controller_orders_equal_jobs_by_the_remaining_work_their_agents_report() -> None:
    """Trials of one model that declared their iterations, launched longest first: equal
    demands, so the work left their agents report orders them, the least first (as an
    agent's own pack does). A job on two hosts counts the most either says; a job none
    reports it for keeps its place in the order in force."""
    registry = Registry()
    sessions = {h: registry.register(reg(h), now=0).session for h in ("a", "b")}
    seqs = dict.fromkeys(sessions, 0)
    planner = Planner(slot_s=2.0, lease_s=10.0, incarnation=1, policy=ClusterPolicy.PACK)

    def report(host: str, jobs: dict[str, float | None]) -> None:
        seqs[host] += 1
        reported = tuple(
            ReportedJob(j, frozenset({1000 + i}), 1, 1, period_s=0.3, demand=0.5, remaining_s=r)
            for i, (j, r) in enumerate(sorted(jobs.items()))
        )
        registry.report(HostReport(sessions[host], seqs[host], reported, (), Mode.PLAN, ""), 1.0)

    def order() -> tuple[str, ...]:
        plan_update(registry, planner, now=20.0)
        return planner.plan_for("a").slots[0]

    # Each job sharded over both hosts (its demand is summed over them: all equal).
    for host in ("a", "b"):
        report(host, {"long": None, "mid": None, "short": None})
    assert order() == ("long", "mid", "short")  # arrival (by name here): nothing declared
    report("a", {"long": 20.0, "mid": 10.0, "short": 4.0})
    report("b", {"long": 20.0, "mid": 10.0, "short": 4.0})
    assert registry.remaining() == {"long": 20.0, "mid": 10.0, "short": 4.0}
    assert order() == ("short", "mid", "long")
    # More of mid is left on b: the most counts; within x1.3 of long, the order in force
    # holds between them.
    report("b", {"long": 20.0, "mid": 25.0, "short": 4.0})
    assert registry.remaining()["mid"] == 25.0
    assert order() == ("short", "mid", "long")
    # tlctl jobs shows what ordered them: the demand summed over both hosts, the work left.
    views = {view.job: view for view in registry.jobs()}
    assert (views["mid"].demand, views["mid"].remaining_s) == (1.0, 25.0)
    report("b", {"long": 20.0, "mid": 30.0, "short": 4.0})
    assert order() == ("short", "long", "mid")
    # short no longer declares on either host (agents that predate it): its group is not
    # all declared, so the order in force holds.
    for host in ("a", "b"):
        report(host, {"long": 20.0, "mid": 10.0, "short": None})
    assert "short" not in registry.remaining()
    assert order() == ("short", "long", "mid")
    assert next(v for v in registry.jobs() if v.job == "short").remaining_s is None


def test_a_starving_jobs_lag_crosses_the_wire() -> None:
    report = HostReport(
        "s", 1, (ReportedJob("j", frozenset({80}), 1, 1, period_s=0.3, lag_s=42.5),), (),
        Mode.PLAN, "",
    )  # fmt: skip
    back = convert.report(convert.report_message(report).SerializeToString())
    assert back.jobs[0].lag_s == 42.5 and not back.jobs[0].waits_for_siblings
    waiting = HostReport(
        "s", 1, (ReportedJob("j", frozenset({80}), 1, 1, lag_s=42.5, waits_for_siblings=True),),
        (), Mode.PLAN, "",
    )  # fmt: skip
    assert convert.report(convert.report_message(waiting).SerializeToString()) == waiting
    quiet = convert.report(
        convert.report_message(
            HostReport("s", 1, (ReportedJob("j", frozenset({80}), 1, 1),), (), Mode.PLAN, "")
        ).SerializeToString()
    )
    assert quiet.jobs[0].lag_s is None
    bad = convert.report_message(report)
    bad.jobs[0].lag_s = -1.0
    with pytest.raises(InvalidMessage, match="lag_s"):
        convert.report(bad.SerializeToString())


def test_a_declared_jobs_remaining_work_crosses_the_wire() -> None:
    declared = HostReport(
        "s", 1, (ReportedJob("j", frozenset({80}), 1, 1, period_s=0.3, remaining_s=12.5),), (),
        Mode.PLAN, "",
    )  # fmt: skip
    assert convert.report(convert.report_message(declared).SerializeToString()) == declared
    quiet = HostReport("s", 1, (ReportedJob("j", frozenset({80}), 1, 1),), (), Mode.PLAN, "")
    message = convert.report_message(quiet)
    assert not message.jobs[0].HasField("remaining_s")  # as from an agent that predates it
    assert convert.report(message.SerializeToString()).jobs[0].remaining_s is None
    bad = convert.report_message(declared)
    bad.jobs[0].remaining_s = float("nan")
    with pytest.raises(InvalidMessage, match="remaining_s"):
        convert.report(bad.SerializeToString())
