"""The real controller with real agents on an emulated cluster: coordinated rotation across
hosts, lease fallback and reconvergence, mTLS refusals, tlctl (views, EACCES)."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tensorlights.testbed.cluster import Cluster, cluster
from tensorlights.testbed.psjob import RunningJob, start_job, tf_job_id, tf_launcher_env
from tensorlights.testbed.socket_holder import Holder, clean_env, start_holder

from .agentproc import AgentProcess
from .controllerproc import TLCTL, ControllerProcess, agent_config, expired_copy, make_pki

pytestmark = pytest.mark.root

HOSTS = ["ctl", "ps1", "ps2"]
PORT = 9740
SKEW_LIMIT_S = 0.050


def multi_host_env(index: int) -> dict[str, str]:
    """Job X: one PS on ps1 (index 0) and one on ps2 (index 1), one TF cluster spec."""
    spec = {"ps": ["ps1:2222", "ps2:2222"], "worker": ["w0:2222"]}
    return {"TF_CONFIG": json.dumps({"cluster": spec, "task": {"type": "ps", "index": index}})}


@pytest.fixture
def testbed(tmp_path: Path) -> Iterator[tuple[Cluster, Path]]:
    pki = make_pki(tmp_path / "pki", ["10.78.0.1"], ["ps1", "ps2"])
    with cluster(HOSTS) as built:
        yield built, pki


def start_jobs(c: Cluster) -> tuple[list[Holder], dict[str, str]]:
    """X on ps1+ps2, Y on ps1, Z on ps2; their job ids."""
    holders = []
    for host, env in (
        ("ps1", multi_host_env(0)),
        ("ps2", multi_host_env(1)),
        ("ps1", tf_launcher_env("y", 1)),
        ("ps2", tf_launcher_env("z", 1)),
    ):
        h = c.hosts[host]
        holders.append(
            start_holder(env, "--host", h.ipv4, "--connections", "2", prefix=h.exec_args())
        )
    from tensorlights.discovery.rules import launcher_job

    found = launcher_job(multi_host_env(0))
    assert found is not None
    return holders, {"X": found[0], "Y": tf_job_id("y", 1), "Z": tf_job_id("z", 1)}


def start_agents(c: Cluster, pki: Path, tmp_path: Path, pki_of: dict[str, Path] | None = None,
                 ) -> dict[str, AgentProcess]:  # fmt: skip
    agents = {}
    for name in ("ps1", "ps2"):
        workdir = tmp_path / name
        workdir.mkdir(exist_ok=True)
        agent_config(workdir / "agent.toml", f"10.78.0.1:{PORT}", (pki_of or {}).get(name, pki),
                     name, ca=pki / "ca.pem")  # fmt: skip
        agents[name] = AgentProcess(
            c.hosts[name], workdir, "--interval", "1s", "--policy", "rotate", standalone=False
        )
    return agents


def start_controller(c: Cluster, pki: Path, tmp_path: Path) -> ControllerProcess:
    workdir = tmp_path / "ctl"
    workdir.mkdir(exist_ok=True)
    return ControllerProcess(
        c.hosts["ctl"],
        workdir,
        pki,
        "--policy",
        "rotate",
        "--slot",
        "1s",
        "--lease",
        "3s",
        listen=f"10.78.0.1:{PORT}",
    )


def following(document: dict[str, Any], jobs: int) -> bool:
    return document.get("mode") == "plan" and len(document.get("order", [])) == jobs


def applied_switches(agent: AgentProcess, since: float) -> list[tuple[float, str, int]]:
    status = agent.status()
    assert status is not None
    return [
        (entry["applied"], entry["job"], entry["plan"])
        for entry in status["rotations"]["recent"]
        if entry["applied"] >= since and entry["plan"]
    ]


def test_a_multi_host_job_is_green_on_both_hosts_at_once(
    testbed: tuple[Cluster, Path], tmp_path: Path
) -> None:
    c, pki = testbed
    holders, ids = start_jobs(c)
    controller = start_controller(c, pki, tmp_path)
    agents = start_agents(c, pki, tmp_path)
    try:
        for agent in agents.values():
            agent.wait_status(lambda d: following(d, 2), deadline_s=30)
        start = time.time()
        time.sleep(6.5)  # six 1 s slots: the light moves on both hosts at every boundary
        switches = {name: applied_switches(agent, start) for name, agent in agents.items()}
        print(switches)
        assert len(switches["ps1"]) >= 5 and len(switches["ps2"]) >= 5, switches
        skews = []
        # A host whose green job did not change at the first boundary records no switch there
        # (e.g. it applied that job just before `start`): compare from both hosts' first one.
        first = max(switches["ps1"][0][0], switches["ps2"][0][0]) - SKEW_LIMIT_S
        for at, job, _ in switches["ps1"]:
            if at < first:
                continue
            nearest_at, nearest_job, _ = min(switches["ps2"], key=lambda s: abs(s[0] - at))
            skews.append(abs(nearest_at - at))
            # X is green on both at once; when Y is green on ps1, Z is on ps2.
            assert {job, nearest_job} in ({ids["X"]}, {ids["Y"], ids["Z"]}), (job, nearest_job)
        assert len(skews) >= 4 and max(skews) <= SKEW_LIMIT_S, skews

        jobs = {job["job"]: job for job in controller.query("jobs")}
        assert jobs[ids["X"]]["ps_hosts"] == ["ps1", "ps2"]
        assert jobs[ids["X"]]["green_share"] == 0.5
        assert jobs[ids["Y"]]["ps_hosts"] == ["ps1"] and jobs[ids["Y"]]["sources"] == ["agent"]
        hosts = {host["host"]: host for host in controller.query("hosts")}
        assert all(hosts[h]["connected"] and hosts[h]["mode"] == "plan" for h in ("ps1", "ps2"))
        rotations = controller.query("rotations", "ps1")
        (ps1,) = rotations["hosts"]
        assert ps1["green"] in (ids["X"], ids["Y"]) and ps1["next"] in (ids["X"], ids["Y"])
        assert ps1["green"] != ps1["next"] and ps1["next_at"] > rotations["at"]
        assert ps1["recent"], "the agent's applied changes reach the controller"
        table = controller.tlctl("rotations")
        assert table.returncode == 0 and "ps2" in table.stdout and "NEXT" in table.stdout
        watched = controller.tlctl("watch", "--json", "--count", "2", "--interval", "200ms")
        views = [json.loads(line) for line in watched.stdout.splitlines()]
        assert len(views) == 2 and {h["host"] for h in views[0]["hosts"]} == {"ps1", "ps2"}
    finally:
        for agent in agents.values():
            agent.stop()
        controller.stop()
        for holder in holders:
            holder.stop()
    print(f"skew between the two agents' switches: max {max(skews) * 1000:.1f} ms")


def test_boot_without_controller_then_partition_then_reconvergence(
    testbed: tuple[Cluster, Path], tmp_path: Path
) -> None:
    c, pki = testbed
    holders, _ = start_jobs(c)
    agents = start_agents(c, pki, tmp_path)  # the controller is down at boot
    controller: ControllerProcess | None = None
    try:
        for agent in agents.values():
            status = agent.wait_status(
                lambda d: (
                    (d.get("controller") or {}).get("state") == "unreachable"
                    and d.get("mode") == "local"
                    and len(d.get("bands", {})) == 2
                )
            )
            assert status["policy"] == "rotate"  # their own policy shapes meanwhile
        controller = start_controller(c, pki, tmp_path)
        for agent in agents.values():
            agent.wait_status(lambda d: following(d, 2), deadline_s=30)
        first_generation = agents["ps1"].status()["plan_generation"]  # type: ignore[index]
        controller.stop(kill=True)
        lost = time.monotonic()
        # Still the plan within its lease (3 s), then the local policy.
        assert agents["ps1"].status()["mode"] == "plan"  # type: ignore[index]
        agents["ps1"].wait_status(lambda d: d.get("mode") == "local", deadline_s=10)
        assert time.monotonic() - lost >= 2.0
        assert agents["ps1"].status()["controller"]["state"] == "unreachable"  # type: ignore[index]
        # A new controller rebuilds its state from the agents' re-registration.
        controller = start_controller(c, pki, tmp_path)
        for agent in agents.values():
            agent.wait_status(lambda d: following(d, 2), deadline_s=30)
        controller.wait(
            lambda: (
                {h["host"] for h in controller.query("hosts") if h["connected"]} == {"ps1", "ps2"}
            ),
            what="both hosts back",
        )
        assert len(controller.query("jobs")) == 3
        assert agents["ps1"].status()["plan_generation"] >= 1  # type: ignore[index]
        assert first_generation >= 1
    finally:
        for agent in agents.values():
            agent.stop()
        if controller is not None:
            controller.stop()
        for holder in holders:
            holder.stop()


def test_wrong_ca_and_expired_certificates_are_refused_and_change_nothing(
    testbed: tuple[Cluster, Path], tmp_path: Path
) -> None:
    c, pki = testbed
    other = make_pki(tmp_path / "other-ca", [], ["ps1"])
    expired = expired_copy(pki, tmp_path / "expired", "ps2")
    controller = start_controller(c, pki, tmp_path)
    agents = start_agents(c, pki, tmp_path, pki_of={"ps1": other, "ps2": expired})
    try:
        for agent in agents.values():
            status = agent.wait_status(
                lambda d: (d.get("controller") or {}).get("state") == "unauthenticated"
            )
            assert "UNAUTHENTICATED" in status["controller"]["detail"]
            assert "refused our client certificate" in status["controller"]["detail"]
            assert status["mode"] == "local"
        assert controller.query("hosts") == []
        # tlctl over TLS (from the controller's host) with another CA's certificate.
        result = subprocess.run(
            c.hosts["ctl"].exec_args(
                *TLCTL, "--controller", f"10.78.0.1:{PORT}", "--ca", str(pki / "ca.pem"),
                "--cert", str(other / "ps1.pem"), "--key", str(other / "ps1.key"), "hosts",
            ),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert result.returncode == 1 and "UNAUTHENTICATED" in result.stderr, result.stderr
        good = subprocess.run(
            c.hosts["ctl"].exec_args(
                *TLCTL, "--controller", f"10.78.0.1:{PORT}", "--ca", str(pki / "ca.pem"),
                "--cert", str(pki / "operator.pem"), "--key", str(pki / "operator.key"),
                "hosts", "--json",
            ),
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert good.returncode == 0 and json.loads(good.stdout) == [], good.stderr
    finally:
        for agent in agents.values():
            agent.stop()
        controller.stop()


def test_tlctl_as_an_unprivileged_user_gets_eacces(
    testbed: tuple[Cluster, Path], tmp_path: Path
) -> None:
    c, pki = testbed
    public = Path(tempfile.mkdtemp(prefix="tl-sock-"))  # traversable: only the socket may refuse
    public.chmod(0o755)
    controller = ControllerProcess(
        c.hosts["ctl"], tmp_path, pki, listen=f"10.78.0.1:{PORT}", socket=public / "ctl.sock"
    )
    try:
        assert (controller.socket.stat().st_mode & 0o777) == 0o600
        result = controller.tlctl("hosts", uid=65534)
        assert result.returncode == 1
        assert "EACCES" in result.stderr and "permission denied" in result.stderr
        assert controller.tlctl("hosts").returncode == 0
    finally:
        controller.stop()
        public.rmdir()


@contextmanager
def pack_cluster(tmp_path: Path) -> Iterator[tuple[Cluster, ControllerProcess, AgentProcess]]:
    """A controller under policy pack and ps1's agent following it, with worker host w1."""
    pki = make_pki(tmp_path / "pki", ["10.78.0.1"], ["ps1"])
    with cluster(["ctl", "ps1", "w1"]) as c:
        (tmp_path / "ctl").mkdir()
        controller = ControllerProcess(
            c.hosts["ctl"], tmp_path / "ctl", pki, "--policy", "pack", "--slot", "1s",
            listen=f"10.78.0.1:{PORT}",
        )  # fmt: skip
        try:
            workdir = tmp_path / "ps1"
            workdir.mkdir()
            agent_config(workdir / "agent.toml", f"10.78.0.1:{PORT}", pki, "ps1")
            agent = AgentProcess(c.hosts["ps1"], workdir, "--policy", "pack", standalone=False)
            try:
                agent.wait_status(lambda d: d.get("mode") in ("plan", "local"), deadline_s=30)
                yield c, controller, agent
            finally:
                agent.stop()
        finally:
            controller.stop()


def start_known_jobs(
    c: Cluster,
    controller: ControllerProcess,
    jobs: list[tuple[str, int, int, dict[str, str]]],
    started: dict[str, RunningJob],
) -> None:
    """Start each (tag, model bytes, iterations, extra env) on ps1 with 2 workers on w1, one
    after another once the controller knows the one before (so arrival orders them)."""
    for tag, model, iterations, extra in jobs:
        started[tag] = start_job(
            c.hosts["ps1"].exec_args(), [c.hosts["w1"].exec_args()], "10.78.0.2",
            clean_env(tf_launcher_env(tag, 2) | extra), 2, model, iterations, 0.2,
        )  # fmt: skip

        def known(job: str = tf_job_id(tag, 2)) -> bool:
            return job in {view["job"] for view in controller.query("jobs")}

        controller.wait(known, deadline_s=20, what=f"the controller to know {tag}")


def following_order(agent: AgentProcess, order: list[str], shown: str) -> dict[str, Any]:
    """The agent's status once it follows a plan ordering its jobs `order`, each of them in
    its pack view's `shown` (loads, remaining_s)."""
    return agent.wait_status(
        lambda d: (
            d.get("mode") == "plan"
            and d.get("order") == order
            and set(order) <= set(d.get("pack", {}).get(shown, {}))
        ),
        deadline_s=40,
    )


def test_pack_orders_jobs_cluster_wide_by_the_demand_agents_measure(tmp_path: Path) -> None:
    """Controller policy pack: a small and a big synthetic job (real pushes) on ps1; ps1's
    agent measures their demand and reports it; the controller ranks the small one first
    and ps1 follows that order."""
    jobs: dict[str, RunningJob] = {}
    with pack_cluster(tmp_path) as (c, controller, agent):
        try:
            big, small = tf_job_id("big", 2), tf_job_id("small", 2)
            # "big" is known to the controller first: arrival order alone puts it on top,
            # so only the measured demands can put "small" first.
            start_known_jobs(
                c, controller, [("big", 6_000_000, 60, {}), ("small", 1_000_000, 60, {})], jobs
            )
            document = following_order(agent, [small, big], "loads")
            assert document["plan_generation"] > 0
            demands = document["pack"]["loads"]
            assert demands[small]["demand"] < demands[big]["demand"]
            hosts = {h["host"]: h for h in controller.query("hosts")}
            assert hosts["ps1"]["mode"] == "plan"
            rotations = controller.query("rotations", "ps1")
            assert rotations["hosts"][0]["green"] == small
        finally:
            for job in jobs.values():
                job.kill()


def test_pack_orders_equal_jobs_cluster_wide_by_the_work_they_declare_left(
    tmp_path: Path,
) -> None:
    """Controller policy pack: two trials of one model on ps1, the long one first, each
    declaring its iterations (TENSORLIGHTS_ITERATIONS). Their demands are equal: only the
    remaining work ps1's agent reports tells them apart, and the controller ranks the short
    trial first, as a host's own pack would."""
    jobs: dict[str, RunningJob] = {}
    with pack_cluster(tmp_path) as (c, controller, agent):
        try:
            long, short = tf_job_id("long", 2), tf_job_id("short", 2)
            start_known_jobs(
                c, controller,
                [("long", 2_000_000, 400, {"TENSORLIGHTS_ITERATIONS": "400"}),
                 ("short", 2_000_000, 60, {"TENSORLIGHTS_ITERATIONS": "60"})],
                jobs,
            )  # fmt: skip
            document = following_order(agent, [short, long], "remaining_s")
            left = document["pack"]["remaining_s"]
            assert left[short] < left[long]
            loads = document["pack"]["loads"]
            assert 1 / 1.3 < loads[short]["link_s"] / loads[long]["link_s"] < 1.3  # one model
            assert controller.query("rotations", "ps1")["hosts"][0]["green"] == short
            # What ordered them, shown to the operator: the work left and, once the agent
            # trusts both (a few iterations more), the demands.
            views = {view["job"]: view for view in controller.query("jobs")}
            assert views[short]["remaining_s"] < views[long]["remaining_s"]

            def demands() -> list[float | None]:
                views = {view["job"]: view for view in controller.query("jobs")}
                return [views[job]["demand"] for job in (short, long)]

            controller.wait(lambda: None not in demands(), what="both jobs' demands")
            assert all(demand is not None and demand > 0 for demand in demands())
        finally:
            for job in jobs.values():
                job.kill()
