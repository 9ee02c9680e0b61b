"""The controller's agent API against hostile input: every bad message is refused with the
right status and changes nothing (real controller process on loopback, real mTLS)."""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tensorlights.rpc.v1 import agent_link_pb2 as pb
from tensorlights.rpc.v1 import operator_pb2 as op_pb
from tensorlights.testbed.processes import free_port

from .controllerproc import ControllerProcess, make_pki

pytestmark = pytest.mark.root

Code = grpc.StatusCode


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[ControllerProcess, grpc.Channel]]:
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"], ["ps1"])
    port = free_port()
    controller = ControllerProcess(
        None, tmp_path, pki, listen=f"127.0.0.1:{port}", metrics=f"127.0.0.1:{free_port()}"
    )
    credentials = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / "ps1.key").read_bytes(),
        (pki / "ps1.pem").read_bytes(),
    )
    channel = grpc.secure_channel(f"127.0.0.1:{port}", credentials)
    try:
        yield controller, channel
    finally:
        channel.close()
        controller.stop()


def _channel(controller: ControllerProcess, name: str) -> grpc.Channel:
    """A channel to the controller with the client certificate `name` of its PKI."""
    pki = controller.pki
    credentials = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / f"{name}.key").read_bytes(),
        (pki / f"{name}.pem").read_bytes(),
    )
    return grpc.secure_channel(controller.listen, credentials)


def call(channel: grpc.Channel, method: str, payload: bytes | Any) -> tuple[Code, bytes]:
    raw = payload if isinstance(payload, bytes) else payload.SerializeToString()
    stub: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
        f"/tensorlights.rpc.v1.{method}"
    )
    try:
        return Code.OK, stub(raw, timeout=10)
    except grpc.RpcError as exc:
        return exc.code(), (exc.details() or "").encode()


def registration(host: str = "ps1", incarnation: int = 100) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        host=host,
        agent_incarnation=incarnation,
        agent_version="test",
        interfaces=[pb.Interface(name="eth0", link_rate_bps=10**9)],
        fallback_policy="rotate",
    )


def report(session: str, seq: int, *jobs: pb.PsJob, mode: str = "local") -> pb.AgentReport:
    return pb.AgentReport(session=session, seq=seq, jobs=list(jobs), mode=mode)


def test_bad_messages_are_refused_and_change_nothing(
    api: tuple[ControllerProcess, grpc.Channel],
) -> None:
    controller, channel = api
    assert call(channel, "AgentLink/Register", b"\xff\xff\xff\xff")[0] is Code.INVALID_ARGUMENT
    assert call(channel, "AgentLink/Register", registration("bad host!"))[0] is (
        Code.INVALID_ARGUMENT
    )
    assert call(channel, "AgentLink/Register", registration(incarnation=0))[0] is (
        Code.INVALID_ARGUMENT
    )
    code, details = call(channel, "AgentLink/Register", registration("ps2"))
    assert code is Code.PERMISSION_DENIED and b"ps1" in details  # the cert names another host
    assert controller.query("hosts") == []

    code, reply = call(channel, "AgentLink/Register", registration())
    assert code is Code.OK
    session = pb.RegisterReply.FromString(reply).session
    before = (controller.query("hosts"), controller.query("jobs"))

    bad_reports = [
        report(session, 1, pb.PsJob(job="j", ports=[70000])),
        report(session, 1, pb.PsJob(job="j", ports=[0])),
        report(session, 1, pb.PsJob(job="j", ports=[5000], spread_s=math.nan)),
        report(session, 1, pb.PsJob(job="j", ports=[5000], period_s=-1.0)),
        report(session, 1, pb.PsJob(job="j", ports=list(range(1, 65536)) * 16)),  # 10^6 entries
        report(session, 1, *[pb.PsJob(job=f"j{i}", ports=[1]) for i in range(5000)]),
        report(session, 1, pb.PsJob(job="j", ports=[1]), pb.PsJob(job="j", ports=[2])),
        report(session, 1, pb.PsJob(job="", ports=[1])),
        report(session, 1, pb.PsJob(job="j\n", ports=[1])),
        report(session, 1, pb.PsJob(job="j", ports=[1]), mode="sideways"),
    ]
    for bad in bad_reports:
        code, details = call(channel, "AgentLink/Report", bad)
        assert code is Code.INVALID_ARGUMENT, (code, details[:200])
    assert call(channel, "AgentLink/Report", b"\x0a\xff")[0] is Code.INVALID_ARGUMENT
    assert (controller.query("hosts"), controller.query("jobs")) == before

    good = report(session, 1, pb.PsJob(job="j1", ports=[5000, 5001], processes=1))
    assert call(channel, "AgentLink/Report", good)[0] is Code.OK
    assert [job["job"] for job in controller.query("jobs")] == ["j1"]

    # Replays: an old seq, a registration from an older agent start, an unknown session.
    stale = report(session, 1, pb.PsJob(job="other", ports=[6000]))
    assert call(channel, "AgentLink/Report", stale)[0] is Code.FAILED_PRECONDITION
    assert call(channel, "AgentLink/Register", registration(incarnation=99))[0] is (
        Code.FAILED_PRECONDITION
    )
    # An agent start from the far future would lock every later real start out.
    assert call(channel, "AgentLink/Register", registration(incarnation=2**64 - 1))[0] is (
        Code.FAILED_PRECONDITION
    )
    unknown = report("no-such-session", 5, pb.PsJob(job="x", ports=[7000]))
    assert call(channel, "AgentLink/Report", unknown)[0] is Code.NOT_FOUND
    assert [job["job"] for job in controller.query("jobs")] == ["j1"]
    assert (
        call(channel, "AgentLink/Report", report(session, 2, pb.PsJob(job="j1", ports=[1])))[0]
        is Code.OK
    )  # the session survived every refusal

    # Larger than gRPC's receive limit: gRPC itself refuses it.
    huge = report(session, 3, pb.PsJob(job="j1", ports=[1]))
    huge.health = "x" * (17 * 1024 * 1024)
    assert call(channel, "AgentLink/Report", huge)[0] is Code.RESOURCE_EXHAUSTED
    operator = _channel(controller, "operator")
    try:
        request = op_pb.GetRotationsRequest(upcoming=1000)
        assert call(operator, "Operator/GetRotations", request)[0] is Code.INVALID_ARGUMENT
    finally:
        operator.close()

    # The plan stream delivers this host's plan.
    watch: grpc.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
        "/tensorlights.rpc.v1.AgentLink/WatchPlan"
    )
    stream = watch(pb.WatchPlanRequest(session=session).SerializeToString(), timeout=10)
    plan = pb.HostPlan.FromString(next(iter(stream)))
    stream.cancel()
    assert [list(slot.order) for slot in plan.slots] == [["j1"]]
    assert plan.generation >= 1 and plan.lease_ms == 15000 and plan.slot_ms == 3000


def test_kubernetes_jobs_reach_tlctl(tmp_path: Path) -> None:
    from tensorlights.testbed.kube_emulator import KubeEmulator, kubeflow_pod

    pki = make_pki(tmp_path / "pki", ["127.0.0.1"], [])
    with KubeEmulator() as kube:
        kube.pods = [
            kubeflow_pod("ml", "bert", "PS", 0, "gpu1"),
            kubeflow_pod("ml", "bert", "Worker", 0, "gpu2"),
        ]
        # Polled once a minute at most: what arrives sooner came by the watch.
        (tmp_path / "kube.toml").write_text('[sources.kubernetes]\ninterval = "60s"\n')
        controller = ControllerProcess(
            None, tmp_path, pki, "--kubernetes-url", kube.url,
            "--config", str(tmp_path / "kube.toml"),
            listen=f"127.0.0.1:{free_port()}", metrics=f"127.0.0.1:{free_port()}",
        )  # fmt: skip
        try:
            controller.wait(lambda: bool(controller.query("jobs")), what="the Kubeflow job")
            (job,) = controller.query("jobs")
            assert job["job"] == "k8s/ml/bert" and job["sources"] == ["kubernetes"]
            assert job["nodes"] == ["gpu1", "gpu2"]
            assert job["ps_hosts"] == []  # no agent on gpu1 yet: nothing to coordinate

            # A job starts and another ends: tlctl shows both changes long before a poll.
            kube.pods = [kubeflow_pod("ml", "gpt", "PS", 0, "gpu3")]
            controller.wait(
                lambda: [j["job"] for j in controller.query("jobs")] == ["k8s/ml/gpt"],
                deadline_s=30,  # half the poll interval
                what="the watch to bring the new pods",
            )
        finally:
            controller.stop()


def test_certificates_act_only_in_their_role(
    api: tuple[ControllerProcess, grpc.Channel], tmp_path: Path
) -> None:
    """An operator's certificate cannot register as (or report for) a host, an agent's cannot
    read the cluster, and a certificate of the same CA with no role can do neither."""
    from tensorlights.devca import issue, load_or_make_ca

    controller, agent = api
    issue(
        controller.pki, "norole", "ps1", load_or_make_ca(controller.pki, 3650),
        server_names=[], client=True, expired=False, days=1,
    )  # fmt: skip
    operator, norole = _channel(controller, "operator"), _channel(controller, "norole")
    try:
        denied = Code.PERMISSION_DENIED
        assert call(operator, "AgentLink/Register", registration("operator"))[0] is denied
        assert call(norole, "AgentLink/Register", registration("ps1"))[0] is denied
        code, details = call(agent, "Operator/ListJobs", op_pb.ListJobsRequest())
        assert code is denied and b"operator role" in details
        assert call(norole, "Operator/ListHosts", op_pb.ListHostsRequest())[0] is denied
        assert call(operator, "Operator/ListHosts", op_pb.ListHostsRequest())[0] is Code.OK
        assert call(agent, "AgentLink/Register", registration("ps1"))[0] is Code.OK
        assert [h["host"] for h in controller.query("hosts")] == ["ps1"]
    finally:
        operator.close()
        norole.close()


def test_stalled_tls_clients_cannot_lock_anyone_out(tmp_path: Path) -> None:
    """300 clients connect and never finish the TLS handshake, against a controller limited
    to 256 descriptors (the issue's reproduction): over the cap they are closed at once, the
    rest when the handshake times out; tlctl's local socket answers all the while, and a real
    client gets through afterwards."""
    pki = make_pki(tmp_path / "pki", ["127.0.0.1"], ["ps1"])
    port = free_port()
    (tmp_path / "limits.toml").write_text('handshake_timeout = "1s"\nmax_connections = 64\n')
    controller = ControllerProcess(
        None, tmp_path, pki, "--config", str(tmp_path / "limits.toml"),
        listen=f"127.0.0.1:{port}", metrics=f"127.0.0.1:{free_port()}", max_open_files=256,
    )  # fmt: skip
    stalled: list[socket.socket] = []
    try:
        for _ in range(300):
            stalled.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        # Within tlctl's own 3 s deadline: the local socket is not starved.
        local = controller.tlctl("--timeout", "3s", "hosts", "--json")
        assert local.returncode == 0, local.stderr

        def all_closed() -> bool:
            closed = 0
            for sock in stalled:
                sock.setblocking(False)
                try:
                    closed += sock.recv(1) == b""
                except BlockingIOError:
                    pass
                except OSError:
                    closed += 1
            return closed == len(stalled)

        controller.wait(all_closed, deadline_s=10, what="every stalled client disconnected")
        operator = _channel(controller, "operator")
        try:
            assert call(operator, "Operator/ListHosts", op_pb.ListHostsRequest())[0] is Code.OK
        finally:
            operator.close()
    finally:
        for sock in stalled:
            sock.close()
        controller.stop()
