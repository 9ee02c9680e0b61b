"""Pods in their own network namespaces, shaped at the node's NIC (issue 21, item 5), on the
real kernel: a routed CNI and a VXLAN overlay, each emulated with namespaces, veths and a
vxlan device (testbed/pods.py). Two PS pods serve on the same port from their own addresses;
discovery finds their sockets, the dataplane classifies them in the node's forward hook, and
the green pod carries the shaped NIC, then the other after a rotation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorlights.datapath import open_datapath
from tensorlights.datapath.dataplane import Dataplane, Marking
from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.trust import TRUST_ANY
from tensorlights.model import DatapathSpec, DiscoverySnapshot, JobShaping
from tensorlights.policy.dscp_plan import DEFAULT_BAND_DSCP
from tensorlights.testbed import traffic
from tensorlights.testbed.netns import in_ns, run
from tensorlights.testbed.pods import Mode, PodNode, connection_rto_ms, pod_node

from .holders import scan_until
from .tcutil import assert_green_slots, sink_result, start_sink_in

pytestmark = pytest.mark.root

RATE = 100_000_000
PORT = 5001
JOBS = ("job-a", "job-b")


@pytest.fixture(params=["routed", "vxlan"])
def node(request: pytest.FixtureRequest) -> Iterator[PodNode]:
    mode: Mode = request.param
    with pod_node(mode, pods=2) as made:
        yield made


def _spec(endpoints: dict[str, frozenset[tuple[str, int]]], green: str) -> DatapathSpec:
    jobs = tuple(
        JobShaping(job, 0 if job == green else 1, frozenset(), endpoints[job]) for job in JOBS
    )
    return DatapathSpec("nic", RATE, jobs, short_waiting_queues=True)  # as with pod shaping


def test_the_green_pod_carries_the_node_nic_in_both_cni_modes(
    node: PodNode, tmp_path: Path
) -> None:
    identities = [
        {**os.environ, "TENSORLIGHTS_JOB": job, "TENSORLIGHTS_ROLE": "ps"} for job in JOBS
    ]
    servers = [
        traffic.start_server(pod.ns, [PORT], max_seconds=60, env=env)
        for pod, env in zip(node.pods, identities, strict=True)
    ]
    tc = open_datapath("htb", tmp_path, netns=node.node_ns)
    dataplane = Dataplane(tc, netns=node.node_ns, marking=Marking(DEFAULT_BAND_DSCP), pods=True)
    sniffer = None
    targets = [f"{pod.ipv4}:{PORT}" for pod in node.pods]
    try:
        # Discovery, from outside the pods' namespaces as the agent sees them, while workers
        # are connected.
        workers = start_sink_in(node.peer_ns, targets, seconds=2.0, interval=0.5)
        with Scanner(DiscoveryRules(trust=TRUST_ANY)) as scanner:

            def both(snapshot: DiscoverySnapshot) -> bool:
                found = snapshot.job_pod_endpoints()
                return all(found.get(job) for job in JOBS)

            snapshot = scan_until(scanner, both, deadline_s=5)
        sink_result(workers, timeout=15)
        endpoints = snapshot.job_pod_endpoints()
        assert {job: {a for a, _ in found} for job, found in endpoints.items()} == {
            job: {pod.ipv4} for pod, job in zip(node.pods, JOBS, strict=True)
        }
        assert all(port == PORT for found in endpoints.values() for _, port in found)
        assert not any(task.in_agent_netns for task in snapshot.tasks if task.job in JOBS)

        # Shaping: the workers connect again, to pods already classified (as the host-local
        # path's test does it), and the green light moves halfway. Nothing else runs meanwhile:
        # on two cores a packet capture beside it starves the workers' reads.
        dataplane.apply(_spec(endpoints, "job-a"))
        interval, seconds, rotate_at, probe_at = 0.5, 8.0, 4.0, 7.0
        sink = start_sink_in(node.peer_ns, targets, seconds, interval, link_dev=node.nic)
        time.sleep(rotate_at)  # a wall-clock experiment: the sink records what happens when
        dataplane.rotate(_spec(endpoints, "job-b"))
        time.sleep(probe_at - rotate_at)
        state = _tcp_and_tc_state(node)  # while the workers still read
        waiting_rto_ms = connection_rto_ms(node.pods[0].ns, PORT)
        result = sink_result(sink, timeout=seconds + 10)

        # The marks, on the wire, with job-b green now.
        sniffer = _sniff(node, seconds=1.5)
        sink_result(start_sink_in(node.peer_ns, targets, 2.0, interval), timeout=15)
        wire = _sniffed(sniffer)
    finally:
        for server in servers:
            server.kill()
            server.wait()
        if sniffer is not None and sniffer.poll() is None:
            sniffer.kill()
            sniffer.wait()
        dataplane.cleanup("nic")
        dataplane.close()

    a, b = (result["flows"][target] for target in targets)
    carried = result["link"]  # what the NIC delivered to the peer: the link's use
    link_bytes = RATE / 8 * interval
    # Steady slots: connection start-up (the first slot), the slot of the rotation, and those
    # of the probe of TCP and tc state left out: its four processes (ss, tc, each through
    # `ip netns exec`) on two cores stalled the workers' reads, and the slot they ran in
    # carried 75% of the link (vxlan, in one CI run of the suite).
    before = range(1, int(rotate_at / interval) - 1)
    after = range(int(rotate_at / interval) + 1, int(probe_at / interval) - 1)
    # Said in full when it fails: the bytes per slot, and the pods' TCP state and the node's
    # classes (drops, backlog) as they were when the workers stopped.
    assert_green_slots(a, b, carried, result["stolen"], link_bytes, before, after, node.mode, state)
    assert result["resets"] == 0 and not result["errors"]
    # The waiting pod's flow keeps a short round trip, so a short RTO: were its first packets
    # lost when it turns green, it would sit that long silent (with 16 packets at 256 kbit,
    # 0.76 s of queue, waiting flows carried 1.1-2.2 s; drained in 0.1 s, 0.2-0.32 s).
    assert waiting_rto_ms is not None and waiting_rto_ms < 600, (node.mode, waiting_rto_ms, state)
    # The fabric sees the bands too: the pods' packets leave the NIC with their band's DSCP
    # (with VXLAN, in the outer header, which the device copies from the inner one); the
    # green pod's the most.
    counts: dict[int, int] = {}
    for _, sport, dscp, packets in wire["counts"]:
        if sport == PORT:
            counts[dscp] = counts.get(dscp, 0) + packets
    marked = counts.get(DEFAULT_BAND_DSCP[0], 0) + counts.get(DEFAULT_BAND_DSCP[1], 0)
    assert counts and marked >= 0.99 * sum(counts.values()), (node.mode, counts)
    assert counts.get(DEFAULT_BAND_DSCP[0], 0) > counts.get(DEFAULT_BAND_DSCP[1], 0)


def _tcp_and_tc_state(node: PodNode) -> str:
    """`ss -tin` of each pod's PS port and `tc -s class show` of the NIC, as text."""
    out = [run(in_ns(pod.ns, "ss", "-tin", f"sport = :{PORT}")).stdout for pod in node.pods]
    out.append(run(in_ns(node.node_ns, "tc", "-s", "class", "show", "dev", node.nic)).stdout)
    return "\n".join(out)


def _sniff(node: PodNode, seconds: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        in_ns(node.peer_ns, sys.executable, "-m", "tensorlights.testbed.sniff",
              "--iface", node.nic, "--seconds", str(seconds)),
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _sniffed(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """{"slot": seconds, "counts": [[slot, sport, dscp, packets], ...]}"""
    out, _ = proc.communicate(timeout=30)
    parsed: dict[str, Any] = json.loads(out)
    return parsed
