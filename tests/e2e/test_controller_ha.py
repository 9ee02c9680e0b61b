"""Three controller replicas on a real 3-member etcd cluster (all on loopback), an agent's
real controller link (rpc/agent_client.ControllerLink, mutual TLS) given every replica's
address: leader election, fail-over, partition from etcd, quorum loss and a full restart,
each timed."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tensorlights.model import LinkStatus, Mode, PlanSlots, Registration, ReportedJob
from tensorlights.rpc.agent_client import ControllerLink
from tensorlights.testbed.etcd import EtcdCluster
from tensorlights.testbed.processes import free_port
from tensorlights.testbed.tcpproxy import CuttableProxy
from tensorlights.tls_files import TlsFiles

from .controllerproc import TLCTL, ControllerProcess, make_pki

TTL_S = 3
LEASE_S = 15.0
HOST = "h1"


def leading(replica: ControllerProcess) -> bool | None:
    """What the replica's metrics say (None: no answer)."""
    try:
        with urllib.request.urlopen(f"http://{replica.metrics}/metrics", timeout=1) as reply:
            text = reply.read().decode()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("tensorlights_controller_leader "):
            return float(line.split()[1]) == 1.0
    return None


@dataclass
class Agent:
    """The agent's link, recording every plan it is sent (when, which incarnation)."""

    link: ControllerLink
    plans: list[tuple[float, PlanSlots]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def newest(self) -> tuple[float, PlanSlots] | None:
        with self.lock:
            return self.plans[-1] if self.plans else None

    def incarnations(self) -> list[int]:
        with self.lock:
            return [plan.incarnation for _, plan in self.plans]


@dataclass
class Cluster:
    etcd: EtcdCluster
    pki: Path
    workdir: Path
    ports: list[int]
    proxies: list[list[CuttableProxy]]
    """Per replica, its own relays to the etcd members (to cut one replica off)."""
    replicas: list[ControllerProcess | None] = field(default_factory=list)

    def start(self, index: int) -> ControllerProcess:
        workdir = self.workdir / f"r{index}"
        workdir.mkdir(exist_ok=True)
        endpoints = ",".join(proxy.url for proxy in self.proxies[index])
        replica = ControllerProcess(
            None, workdir, self.pki,
            "--etcd", endpoints, "--advertise", f"127.0.0.1:{self.ports[index]}",
            "--ha-ttl", f"{TTL_S}s", "--lease", f"{LEASE_S}s",
            listen=f"127.0.0.1:{self.ports[index]}", metrics=f"127.0.0.1:{free_port()}",
            ready=lambda r: leading(r) is not None,
        )  # fmt: skip
        self.replicas[index] = replica
        return replica

    def leader(self) -> int | None:
        found = [i for i, r in enumerate(self.replicas) if r is not None and leading(r)]
        assert len(found) <= 1, f"two replicas lead at once: {found}"
        return found[0] if found else None

    def wait_leader(self, deadline_s: float, other_than: int | None = None) -> tuple[int, float]:
        """The leading replica and when it was first seen leading."""
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            index = self.leader()
            if index is not None and index != other_than:
                return index, time.monotonic()
            time.sleep(0.05)
        raise AssertionError(f"no leader within {deadline_s}s")


@pytest.fixture
def ha(tmp_path: Path) -> Iterator[Cluster]:
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"], [HOST])
    (tmp_path / "etcd").mkdir()
    with EtcdCluster(tmp_path / "etcd", members=3) as etcd:
        targets = [("127.0.0.1", port) for port in etcd.client_ports]
        proxies = [[CuttableProxy(target) for target in targets] for _ in range(3)]
        built = Cluster(etcd, pki, tmp_path, [free_port() for _ in range(3)], proxies)
        built.replicas = [None, None, None]
        try:
            for index in range(3):
                built.start(index)
            yield built
        finally:
            for replica in built.replicas:
                if replica is not None:
                    replica.stop(kill=True)
            for row in proxies:
                for proxy in row:
                    proxy.close()


@pytest.fixture
def agent(ha: Cluster) -> Iterator[Agent]:
    addresses = ",".join(f"127.0.0.1:{port}" for port in ha.ports)
    tls = TlsFiles(ha.pki / "ca.pem", ha.pki / f"{HOST}.pem", ha.pki / f"{HOST}.key")
    registration = Registration(HOST, time.time_ns(), "test", (("eth0", 10**9),), "pack")
    recorder: list[Agent] = []

    def on_plan(plan: PlanSlots) -> None:
        with recorder[0].lock:
            recorder[0].plans.append((time.monotonic(), plan))

    link = ControllerLink(addresses, tls, "127.0.0.1", registration, on_plan)
    recorder.append(Agent(link))
    job = ReportedJob("job-a", frozenset({5000}), 1, 1)
    link.update((job,), Mode.LOCAL, "")
    link.start()
    try:
        yield recorder[0]
    finally:
        link.stop()


def wait(done: Callable[[], bool], deadline_s: float, what: str) -> float:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if done():
            return time.monotonic()
        time.sleep(0.05)
    raise AssertionError(f"timed out: {what}")


def test_fail_over_partition_quorum_loss_and_full_restart(ha: Cluster, agent: Agent) -> None:
    first, _ = ha.wait_leader(20)
    wait(lambda: agent.newest() is not None, 20, "a first plan")
    assert agent.link.state.state is LinkStatus.CONNECTED
    assert agent.link.address == f"127.0.0.1:{ha.ports[first]}"  # sent there if need be

    # tlctl against a follower answers with the leader's view (it follows the redirect).
    follower = next(i for i in range(3) if i != first)
    result = ha.replicas[follower].tlctl("hosts", "--json")  # type: ignore[union-attr]
    assert result.returncode != 0 and "the leader is at" in result.stderr
    over_tls = _tlctl_tls(ha, follower, "hosts", "--json")
    assert HOST in over_tls

    # 1. SIGKILL the leader: a new leader serves plans within half a lease, the agent never
    # goes a lease without a plan (it would fall back to its local policy).
    before = agent.incarnations()[-1]
    killed_at = time.monotonic()
    old = ha.replicas[first]
    assert old is not None
    old.stop(kill=True)
    ha.replicas[first] = None
    served = wait(lambda: agent.incarnations()[-1] > before, LEASE_S, "a plan from the new leader")
    fail_over_s = served - killed_at
    assert fail_over_s <= LEASE_S / 2, fail_over_s
    second, _ = ha.wait_leader(1)
    print(f"\nfail-over after SIGKILL: new plans at the agent {fail_over_s:.2f}s later")

    # 2. Cut the leader off from etcd (its own relays): it stops leading before its lease
    # in etcd runs out, i.e. before another replica can be elected.
    ha.start(first)  # back as a follower
    cut_at = time.monotonic()
    for proxy in ha.proxies[second]:
        proxy.cut()
    leader_replica = ha.replicas[second]
    assert leader_replica is not None
    stepped_down = wait(lambda: leading(leader_replica) is False, 2 * TTL_S, "a step-down")
    third, elected = ha.wait_leader(3 * TTL_S, other_than=second)
    assert stepped_down < elected, (stepped_down - cut_at, elected - cut_at)
    assert stepped_down - cut_at <= TTL_S
    served = wait(
        lambda: agent.newest() is not None
        and agent.incarnations()[-1] > before
        and agent.link.address == f"127.0.0.1:{ha.ports[third]}",
        LEASE_S, "plans from the third leader",
    )  # fmt: skip
    print(
        f"partition: stepped down {stepped_down - cut_at:.2f}s after the cut, another "
        f"elected {elected - cut_at:.2f}s after it, plans at the agent {served - cut_at:.2f}s"
    )
    for proxy in ha.proxies[second]:
        proxy.heal()

    # 3. etcd loses its quorum: the leader stops leading within the TTL; nobody plans, so
    # the agent's last plan ages (its lease then runs out: the agent's local policy).
    last = agent.incarnations()[-1]
    lost_at = time.monotonic()
    ha.etcd.stop_member(0)
    ha.etcd.stop_member(1)
    nobody = wait(lambda: ha.leader() is None, 2 * TTL_S, "no leader without a quorum")
    count = len(agent.incarnations())
    time.sleep(TTL_S)
    assert len(agent.incarnations()) == count, "plans while no replica can lead"
    print(f"quorum lost: no leader {nobody - lost_at:.2f}s later")

    # 4. Restart everything: etcd members and replicas. Incarnations still increase.
    for index in range(3):
        replica = ha.replicas[index]
        if replica is not None:
            replica.stop()
            ha.replicas[index] = None
    ha.etcd.stop_member(2)
    for member in range(3):
        ha.etcd.start_member(member, wait=False)
    ha.etcd.wait_healthy([0, 1, 2])
    restarted = time.monotonic()
    for index in range(3):
        ha.start(index)
    served = wait(
        lambda: agent.incarnations()[-1] > last, 3 * LEASE_S, "plans after a full restart"
    )
    print(f"full restart: plans {served - restarted:.2f}s after the replicas started")
    incarnations = agent.incarnations()
    assert incarnations == sorted(incarnations), "the agent saw an older leader's plan"


def _tlctl_tls(ha: Cluster, index: int, *args: str) -> str:
    import subprocess

    result = subprocess.run(
        [
            *TLCTL, "--controller", f"127.0.0.1:{ha.ports[index]}",
            "--ca", str(ha.pki / "ca.pem"), "--cert", str(ha.pki / "operator.pem"),
            "--key", str(ha.pki / "operator.key"), *args,
        ],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_agents_report_news_at_once_and_otherwise_only_a_heartbeat(tmp_path: Path) -> None:
    """One controller (no etcd): a link with nothing new sends a report per heartbeat, not
    per report interval; a new job, a moved demand or an applied rotation goes at once."""
    from tensorlights.model import AppliedRotation

    pki = make_pki(tmp_path / "pki", ["127.0.0.1"], [HOST])
    port = free_port()
    controller = ControllerProcess(
        None, tmp_path, pki, "--heartbeat-interval", "3s",
        listen=f"127.0.0.1:{port}", metrics=f"127.0.0.1:{free_port()}",
    )  # fmt: skip

    def reports() -> float:
        with urllib.request.urlopen(f"http://{controller.metrics}/metrics", timeout=2) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("tensorlights_controller_reports_total "):
                    return float(line.split()[1])
        raise AssertionError("no reports counter")

    tls = TlsFiles(pki / "ca.pem", pki / f"{HOST}.pem", pki / f"{HOST}.key")
    registration = Registration(HOST, time.time_ns(), "test", (("eth0", 10**9),), "pack")
    link = ControllerLink(f"127.0.0.1:{port}", tls, "127.0.0.1", registration, lambda p: None)
    job = ReportedJob("job-a", frozenset({5000}), 1, 1, demand=0.5)
    link.update((job,), Mode.LOCAL, "")
    link.start()
    try:
        wait(lambda: reports() == 1, 10, "the first report")
        quiet_from = time.monotonic()
        wait(lambda: link.state.reports_skipped >= 2, 5, "report intervals with no news")
        assert reports() == 1
        link.update((replace(job, demand=0.52),), Mode.LOCAL, "")  # noise: not news
        time.sleep(1.2)
        assert reports() == 1
        link.update((replace(job, demand=0.7),), Mode.LOCAL, "")  # news: at once
        wait(lambda: reports() == 2, 1.5, "a report of the moved demand")
        link.applied(AppliedRotation("job-a", time.time(), 1))
        wait(lambda: reports() == 3, 1.5, "a report of the applied rotation")
        beat = wait(lambda: reports() == 4, 5, "a heartbeat")
        assert beat - quiet_from >= 3 - 0.5
    finally:
        link.stop()
        controller.stop()


def test_report_replies_renew_plans_and_the_stream_resends_only_to_silent_agents(
    tmp_path: Path,
) -> None:
    """One controller, lease 6 s, heartbeat 4 s: a reporting agent's plan is renewed by its
    reports' replies and its stream sends nothing more; a client that watches its plan but
    never reports (as an agent whose heartbeats are further apart) gets the plan again every
    0.8 of a lease."""
    import grpc

    from tensorlights.model import PlanRenewal
    from tensorlights.rpc import convert
    from tensorlights.rpc.tls import channel_credentials, channel_options
    from tensorlights.rpc.v1 import agent_link_pb2 as pb
    from tensorlights.rpc.v1 import agent_link_pb2_grpc as pb_grpc

    silent_host = "h2"
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"], [HOST, silent_host])
    port = free_port()
    controller = ControllerProcess(
        None, tmp_path, pki, "--lease", "6s", "--heartbeat-interval", "4s",
        listen=f"127.0.0.1:{port}", metrics=f"127.0.0.1:{free_port()}",
    )  # fmt: skip
    plans: list[float] = []
    renewals: list[PlanRenewal] = []
    renew_times: list[float] = []
    tls = TlsFiles(pki / "ca.pem", pki / f"{HOST}.pem", pki / f"{HOST}.key")
    registration = Registration(HOST, time.time_ns(), "test", (("eth0", 10**9),), "pack")

    def on_renewal(renewal: PlanRenewal) -> None:
        renewals.append(renewal)
        renew_times.append(time.monotonic())

    link = ControllerLink(
        f"127.0.0.1:{port}", tls, "127.0.0.1", registration,
        on_plan=lambda plan: plans.append(time.monotonic()), on_renewal=on_renewal,
    )  # fmt: skip
    link.update((ReportedJob("job-a", frozenset({5000}), 1, 1),), Mode.LOCAL, "")
    silent_tls = TlsFiles(pki / "ca.pem", pki / f"{silent_host}.pem", pki / f"{silent_host}.key")
    channel = grpc.secure_channel(
        f"127.0.0.1:{port}", channel_credentials(silent_tls), channel_options("127.0.0.1")
    )
    silent_plans: list[float] = []
    link.start()
    try:
        # The second renewal: by then the plan is the one the first replan gave this host.
        wait(lambda: len(renewals) >= 2, 15, "reports' replies renewing the plan")
        settled = len(plans)
        stub = pb_grpc.AgentLinkStub(channel)  # type: ignore[no-untyped-call]
        silent = Registration(silent_host, time.time_ns(), "test", (("eth0", 10**9),), "pack")
        reply = stub.Register(convert.registration_message(silent), timeout=5)
        stream = stub.WatchPlan(pb.WatchPlanRequest(session=reply.session))

        def watch() -> None:
            with contextlib.suppress(grpc.RpcError):  # cancelled at the end
                for _ in stream:
                    silent_plans.append(time.monotonic())

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait(lambda: len(silent_plans) >= 4, 20, "the silent client's plan, resent")
        # At once (and again as the replan gives the host its own generation), then each 0.8
        # of a lease (4.8 s) after the one before.
        gaps = [b - a for a, b in itertools.pairwise(silent_plans[1:])]
        assert all(4.3 <= gap <= 5.4 for gap in gaps), gaps
        # Meanwhile the reporting agent: renewed by replies (every 4 s), no plan resent.
        assert len(plans) == settled, (plans, silent_plans, renew_times)
        assert len(renewals) >= 3 and link.state.renewals == len(renewals)
        assert all(r.lease_s == 6.0 and r.generation == link.state.last_plan_generation
                   for r in renewals[-2:])  # fmt: skip
        stream.cancel()
        watcher.join(5)
        with urllib.request.urlopen(f"http://{controller.metrics}/metrics", timeout=2) as page:
            samples = dict(
                line.rsplit(" ", 1) for line in page.read().decode().splitlines()
                if line and not line.startswith("#")
            )  # fmt: skip
        resent = float(samples['tensorlights_controller_plans_sent_total{why="lease"}'])
        # The silent client's resends (those a lease apart), none of the agent's.
        assert resent == sum(b - a >= 4.3 for a, b in itertools.pairwise(silent_plans))
        assert float(samples["tensorlights_controller_report_seconds_count"]) >= len(renewals)
    finally:
        channel.close()
        link.stop()
        controller.stop()
