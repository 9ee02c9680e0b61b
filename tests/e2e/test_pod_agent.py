"""The real agent on an emulated Kubernetes node (testbed/pods.py: pods in their own network
namespaces behind a VXLAN overlay), with pod shaping on: it finds two PS pods by their
TF_CONFIG alone, from their connections, and rotates the green light between them on the
node's NIC, where their ports are hidden inside VXLAN."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from tensorlights.testbed import netns, traffic
from tensorlights.testbed.pods import NODE_IP, pod_node
from tensorlights.testbed.socket_holder import clean_env

from ..functional.tcutil import root_qdisc, sink_result
from .agentproc import AgentProcess, dominant_slots

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
            command = traffic.sink_command(targets, seconds, interval)
            sink = subprocess.Popen(
                netns.in_ns(node.peer_ns, *command), stdout=subprocess.PIPE, text=True
            )
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
        # ...and on the wire one pod at a time carried the NIC, each of them in turn. (How
        # many times the wire shows it move is not asserted: a pod's flow demoted at full
        # rate can sit out a TCP retransmission timeout after it turns green again, while the
        # other pod uses the idle link; see docs/design.md, pods.)
        slots = dominant_slots(result["flows"])[2:-1]
        steady = [s for i, s in enumerate(slots) if 0 < i < len(slots) - 1
                  and slots[i - 1][0] == s[0] == slots[i + 1][0]]  # fmt: skip
        assert len(steady) >= 8, slots
        for _top, share, total in steady:
            assert share >= 0.85 and total >= 0.85 * LINK_BYTES_PER_S * interval, slots
        assert {top for top, _, _ in steady} == set(targets), slots

        assert agent.stop() == 0  # SIGTERM: the NIC restored, our tables gone
        assert root_qdisc(node.node_ns, node.nic)["kind"] == "noqueue"
        tables = netns.run(netns.in_ns(node.node_ns, "nft", "list", "tables")).stdout
        assert "tensorlights" not in tables
