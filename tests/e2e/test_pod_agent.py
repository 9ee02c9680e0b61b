"""The real agent on an emulated Kubernetes node (testbed/pods.py: pods in their own network
namespaces behind a VXLAN overlay), with pod shaping on: it finds two PS pods by their
TF_CONFIG alone, from their connections, rotates the green light between them on the node's
NIC, where their ports are hidden inside VXLAN, and measures their iterations."""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path

import pytest

from tensorlights.agent.status import AgentStatus
from tensorlights.telemetry.accuracy import compare
from tensorlights.testbed import netns, traffic
from tensorlights.testbed.pods import NODE_IP, pod_node
from tensorlights.testbed.psjob import (
    RunningJob,
    collect_iterations,
    start_job,
    tf_job_id,
    tf_launcher_env,
)
from tensorlights.testbed.socket_holder import clean_env

from ..functional.tcutil import LINK_BUSY_ROTATING, root_qdisc, sink_result, start_sink_in
from .agentproc import AgentProcess, dominant_slots
from .torchjobs import launch

pytestmark = pytest.mark.root

PORT = 5001
LINK_BYTES_PER_S = 200_000_000 / 8  # the agent's --link-rate


def _tf_config(tag: str) -> str:
    cluster = {"ps": [f"ps-{tag}:{PORT}"], "worker": [f"w-{tag}:{PORT}"]}
    return json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})


def test_the_agent_rotates_the_light_between_pods_behind_vxlan(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    with pod_node("vxlan", pods=2) as node:
        servers = [
            traffic.start_server(
                pod.ns, [PORT], max_seconds=60, env=clean_env({"TF_CONFIG": _tf_config(tag)})
            )
            for pod, tag in zip(node.pods, "ab", strict=True)
        ]
        try:
            where = netns.Host(node.node_ns, node.nic, NODE_IP, "")
            agent = AgentProcess(
                where, tmp_path, "--policy", "rotate", "--interval", "2s", "--pod-shaping"
            )
            agents.append(agent)
            agent.wait_status(lambda d: "last_pass" in d)
            interval, seconds = 0.5, 12.0
            targets = [f"{pod.ipv4}:{PORT}" for pod in node.pods]
            sink = start_sink_in(node.peer_ns, targets, seconds, interval, link_dev=node.nic)
            # The pods' jobs are known from their first connections on.
            document = agent.wait_status(lambda d: len(d.get("bands", {})) == 2, deadline_s=5)
            pods = document["discovery"]["job_pod_endpoints"]
            assert sorted(pods.values()) == [[f"{pod.ipv4}:{PORT}"] for pod in node.pods]
            result = sink_result(sink, timeout=seconds + 15)
        finally:
            for server in servers:
                server.kill()
                server.wait()
        assert result["resets"] == 0 and not result["errors"]
        # The light moved on its 2 s cadence between the two pods' jobs...
        document = agent.wait_status(lambda d: len(d["rotations"]["recent"]) >= 5)
        greens = [r["job"] for r in document["rotations"]["recent"]]
        assert all(a != b for a, b in itertools.pairwise(greens)), greens
        # ...and on the wire one pod at a time carried the NIC, each of them in turn, every
        # time the light moved: each green turn (bar the cut first and last) lasted its 2 s
        # (4 slots, give or take the slot the move fell in). Before the waiting bands had
        # short queues, a pod's flow sat out seconds of RTO backoff after some moves (the
        # other pod kept the link), in 2 of 10 runs; with short queues drained in 0.5 s of
        # 256 kbit, a flow whose first green packets were lost sat out its RTO, inflated by
        # the waiting band's round trip (1.3 s, once in ~100 moves; in CI once in ~20 runs);
        # drained in 0.1 s, it carries 0.3 s. See docs/design.md, pods.
        slots = dominant_slots(result["flows"])[2:-1]
        carried = result["link"][2:-1]  # what the NIC delivered: the link's use
        held = [i for i in range(1, len(slots) - 1)
                if slots[i - 1][0] == slots[i][0] == slots[i + 1][0]]  # fmt: skip
        steady = [slots[i] for i in held]
        # Every slot in full on a failure (a list is cut short in pytest's report).
        link = LINK_BYTES_PER_S * interval
        shown = "\n".join(
            f"{top} {share:.0%} of the slot, {used / link:.3f} of the link"
            for (top, share, _), used in zip(slots, carried, strict=True)
        )
        assert len(steady) >= 8, shown
        failure = f"{shown}\nagent log:\n{agent.log_text()[-3000:]}"
        # The green pod's flow sitting out an RTO (200 ms at the least) costs it 0.4 of a
        # slot's share. The link's use is read on the wire: the sink's reads lag a slot by
        # 25-30% on two busy cores while the NIC stays busy, and catch up in the next
        # (testbed/traffic.py); read so, a steady slot once fell to 0.83 in CI
        # (docs/testing.md).
        for i in held:
            assert slots[i][1] >= 0.85 and carried[i] >= LINK_BUSY_ROTATING * link, failure
        assert {top for top, _, _ in steady} == set(targets), shown
        turns = [len(list(run)) for _, run in itertools.groupby(top for top, _, _ in slots)]
        assert len(turns) >= 5 and all(3 <= n <= 5 for n in turns[1:-1]), (turns, slots)

        # With pod shaping the waiting bands have short queues (policy/tc_plan.py).
        qdiscs = netns.run(netns.in_ns(node.node_ns, "tc", "qdisc", "show", "dev", node.nic))
        assert qdiscs.stdout.count("pfifo") == 7 and "limit 16p" in qdiscs.stdout, qdiscs.stdout

        assert agent.stop() == 0  # SIGTERM: the NIC restored, our tables gone
        assert root_qdisc(node.node_ns, node.nic)["kind"] == "noqueue"
        tables = netns.run(netns.in_ns(node.node_ns, "nft", "list", "tables")).stdout
        assert "tensorlights" not in tables


ITERATIONS = 20
WARM_UP = 2  # iterations the agent does not report: it met the job mid-push, then anchors


def test_telemetry_measures_pods_against_the_workers_own_log(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    """Straggler telemetry of two synthetic PS jobs in pods behind VXLAN, sampled in the
    pods' own network namespaces: every iteration the workers logged is reported (bar the
    warm-up) with its period within 10% or 10 ms, so `pack` has a demand for pod jobs too.
    The spread is less exact than on the host's own path (there: all within 10 ms bar one):
    with the CI's load, up to 4 of 18 were off by 10-28 ms (docs/design.md, pods): at least
    2 in 3 within 10% or 10 ms is asserted."""
    with pod_node("vxlan", pods=2) as node:
        where = netns.Host(node.node_ns, node.nic, NODE_IP, "")
        agent = AgentProcess(where, tmp_path, "--policy", "rotate", "--interval", "1s",
                             "--pod-shaping")  # fmt: skip
        agents.append(agent)
        agent.wait_status(lambda d: "telemetry" in d)
        jobs: dict[str, RunningJob] = {}
        try:
            for pod, tag in zip(node.pods, "ab", strict=True):
                jobs[tf_job_id(tag, 3)] = start_job(
                    netns.in_ns(pod.ns), [netns.in_ns(node.peer_ns)], pod.ipv4,
                    clean_env(tf_launcher_env(tag, 3)),
                    workers=3, model_bytes=3_000_000, iterations=ITERATIONS, compute_s=0.25,
                )  # fmt: skip

            def status() -> AgentStatus | None:
                document = agent.status()
                return (
                    AgentStatus.from_json(document) if document and "version" in document else None
                )

            truths, measured = collect_iterations(status, jobs)
        finally:
            for running in jobs.values():
                running.kill()
    for job, received in truths.items():
        agreement = compare(received, measured[job])
        assert agreement.iterations == ITERATIONS
        assert agreement.matched >= ITERATIONS - WARM_UP, (job, agreement)
        assert agreement.period_ok >= agreement.period_checked - 1, (job, agreement)
        assert agreement.spread_ok >= 2 * agreement.matched / 3, (job, agreement)


def test_a_real_pytorch_ps_in_a_pod_is_found_shaped_and_measured(
    agents: list[AgentProcess], tmp_path: Path
) -> None:
    """A real PyTorch PS job (gloo, ephemeral data ports; testbed/torchjob.py) with its PS in
    a pod behind VXLAN and its workers on the peer node: the agent finds it by TF_CONFIG
    alone, classifies its pod endpoints, and its telemetry sees the iterations."""
    pytest.importorskip("torch", reason="the torch extra is not installed")
    from tensorlights.testbed.torchjob import model_bytes

    workers, hidden, iterations, master_port = 2, 512, 12, 29500
    with pod_node("vxlan", pods=1) as node:
        (pod,) = node.pods
        where = netns.Host(node.node_ns, node.nic, NODE_IP, "")
        agent = AgentProcess(where, tmp_path, "--policy", "pack", "--pod-shaping")
        agents.append(agent)
        agent.wait_status(lambda d: bool(d.get("healthy")))
        job = tf_job_id("torch", workers)
        run = launch(
            (pod.ns, "eth0"), (node.peer_ns, "vxlan0"), f"{pod.ipv4}:{master_port}",
            workers, hidden, iterations,
        )  # fmt: skip
        try:
            # gloo's data ports are ephemeral: the pod endpoints come from the connections.
            document = agent.wait_status(
                lambda d: any(
                    not e.endswith(f":{master_port}")
                    for e in d["discovery"]["job_pod_endpoints"].get(job, [])
                ),
                deadline_s=60,
            )
            assert job in document["bands"]
            assert all(
                e.startswith(f"{pod.ipv4}:")
                for e in document["discovery"]["job_pod_endpoints"][job]
            )
            received, summary = run.results()
            final = max(times[-1] for times in received)
            seen: list[object] = []
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the last iteration is in (or never)
                seen = (agent.status() or {}).get("telemetry", {}).get(job, [])
                if any(isinstance(it, dict) and it["last_done_monotonic"] > final for it in seen):
                    break
                time.sleep(0.2)
        finally:
            run.kill()
    assert all(len(times) == iterations for times in received)
    assert summary["model_bytes"] == model_bytes(hidden)
    seen_at = [item["last_done_monotonic"] for item in seen if isinstance(item, dict)]
    # Measured: 11 of 12 in 3 of 3 runs, the first lost (discovery finds gloo's data
    # connections as they start pushing, ~10 s after the job's store connection); with every
    # PS's new connections found within a poll and a first iteration met in its first push
    # reported, 12 in 2 of 4 runs and 11 in 2 (not traced). Before new connections were
    # sampled at once and the first whole iteration was reported, 7-10 of 12
    # (docs/testing.md). Asserted: at most 2 lost, and none once the first was seen (ends
    # 60-80 ms after the workers' logs on this path; iterations 0.5 s apart).
    ends = [max(times) for times in zip(*received, strict=True)]
    missed = [
        end
        for end in ends
        if seen_at and end > seen_at[0] - 0.2 and all(abs(end - at) > 0.2 for at in seen_at)
    ]
    assert len(seen) >= iterations - 2 and not missed, (
        f"saw {len(seen)} of {iterations}, missed {missed} after the first; worker 1 received "
        f"at {received[0]}; the agent saw iterations end at {seen_at}"
    )
