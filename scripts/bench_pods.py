#!/usr/bin/env python3
"""Pods in their own network namespaces, shaped at the node's NIC: what the green light does
there, in both emulated CNI modes (testbed/pods.py: routed, VXLAN), and what a rotation of
the pods' nftables table costs.

Per mode and repetition: two PS pods serving on the same port, found by discovery from their
connections, the NIC shaped at --rate; the workers (in the peer node) read for --seconds, the
light moves halfway. Reported: the green pod's share of the bytes and the link's use in
steady 0.5 s slots, and how many slots after the move the new green pod took >= 85%, per
TCP congestion control of the pods (--congctl, set per route; several compare them). Then
the rotation cost of `inet tensorlights_pods` for 2, 16 and 64 pod jobs. Needs root.

    .venv/bin/python scripts/bench_pods.py [--repetitions 3] [--rate 100] [--seconds 8] \
        [--congctl cubic,bbr]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tensorlights.datapath import open_datapath
from tensorlights.datapath.dataplane import Dataplane, Marking
from tensorlights.datapath.dscp import PodClassifier
from tensorlights.datapath.nft import Nft
from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.trust import TRUST_ANY
from tensorlights.model import DatapathSpec, JobShaping
from tensorlights.policy.dscp_plan import DEFAULT_BAND_DSCP, chain_name
from tensorlights.policy.pod_plan import ChainAction, PodLayout
from tensorlights.testbed import netns, traffic
from tensorlights.testbed.pods import Mode, PodNode, pod_node

PORT = 5001
INTERVAL = 0.5
JOBS = ("job-a", "job-b")


def one_run(mode: Mode, rate_mbit: int, seconds: float, congctl: str) -> tuple[float, float, int]:
    """(green share, link use, slots until the new green pod took the link)."""
    with pod_node(mode, pods=2, congctl=congctl) as node:
        env = [{**os.environ, "TENSORLIGHTS_JOB": job, "TENSORLIGHTS_ROLE": "ps"} for job in JOBS]
        servers = [
            traffic.start_server(pod.ns, [PORT], max_seconds=seconds + 30, env=e)
            for pod, e in zip(node.pods, env, strict=True)
        ]
        try:
            return _measure(node, rate_mbit * 1_000_000, seconds)
        finally:
            for server in servers:
                server.kill()
                server.wait()


def _measure(node: PodNode, rate: int, seconds: float) -> tuple[float, float, int]:
    targets = [f"{pod.ipv4}:{PORT}" for pod in node.pods]
    warmup = _sink(node, targets, 2.0)
    with Scanner(DiscoveryRules(trust=TRUST_ANY)) as scanner:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            endpoints = scanner.scan().job_pod_endpoints()
            if all(endpoints.get(job) for job in JOBS):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"discovery did not find both pods: {endpoints}")
    warmup.communicate(timeout=15)

    def spec(green: str) -> DatapathSpec:
        return DatapathSpec(
            node.nic,
            rate,
            tuple(JobShaping(j, 0 if j == green else 1, frozenset(), endpoints[j]) for j in JOBS),
            short_waiting_queues=True,  # as the agent has them with pod shaping on
        )

    with tempfile.TemporaryDirectory() as state:
        tc = open_datapath("htb", Path(state), netns=node.node_ns)
        dataplane = Dataplane(tc, netns=node.node_ns, marking=Marking(DEFAULT_BAND_DSCP), pods=True)
        try:
            dataplane.apply(spec("job-a"))
            sink = _sink(node, targets, seconds)
            time.sleep(seconds / 2)  # the experiment's clock: the light moves halfway
            dataplane.rotate(spec("job-b"))
            out, _ = sink.communicate(timeout=seconds + 15)
        finally:
            dataplane.cleanup(node.nic)
            dataplane.close()
    flows = json.loads(out)["flows"]
    a, b = (flows[t] for t in targets)
    move = int(seconds / 2 / INTERVAL)
    link = rate / 8 * INTERVAL
    shares, uses = [], []
    for slot in [*range(1, move - 1), *range(move + 3, len(a))]:
        green = a[slot] if slot < move else b[slot]
        total = a[slot] + b[slot]
        shares.append(green / total if total else 0.0)
        uses.append(total / link)
    took = next((i for i in range(move, len(b)) if b[i] >= 0.85 * (a[i] + b[i])), len(b)) - move
    return statistics.median(shares), statistics.median(uses), took


def _sink(node: PodNode, targets: list[str], seconds: float) -> subprocess.Popen[str]:
    command = traffic.sink_command(targets, seconds, INTERVAL)
    return subprocess.Popen(netns.in_ns(node.peer_ns, *command), stdout=subprocess.PIPE, text=True)


def rotation_cost(jobs: int, rounds: int) -> tuple[float, float]:
    """Median and p99 ms of rotating the pods' table (the green light moves: 2 chains)."""
    with netns.host_pair() as pair:
        table = PodClassifier(Nft(pair.a.ns))
        try:

            def layout(green: int) -> PodLayout:
                actions = {
                    chain_name(j + 1): ChainAction(0x7A10010 if j == green else 0x7A10011, 26)
                    for j in range(jobs)
                }
                endpoints = {
                    (f"10.244.{j // 250}.{j % 250 + 2}", PORT): chain_name(j + 1)
                    for j in range(jobs)
                }
                return PodLayout(actions, endpoints)

            table.apply(layout(0))
            times = []
            for i in range(1, rounds + 1):
                start = time.perf_counter()
                table.rotate(layout(i % jobs))
                times.append((time.perf_counter() - start) * 1000)
            times.sort()
            return statistics.median(times), times[int(0.99 * (len(times) - 1))]
        finally:
            table.cleanup()
            table.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--rate", type=int, default=100, help="NIC rate, Mbit/s")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--congctl", default="cubic", help="the pods' TCP congestion control(s), comma-separated"
    )
    args = parser.parse_args()
    print(
        f"Pods behind a node NIC shaped at {args.rate} Mbit/s, {args.repetitions} runs per mode\n"
    )
    print(
        "| mode | pods' TCP | green share (median of runs) | link use "
        "| slots until the new green pod leads |"
    )
    print("|---|---|---:|---:|---|")
    for congctl in args.congctl.split(","):
        for mode in ("routed", "vxlan"):
            runs = [
                one_run(mode, args.rate, args.seconds, congctl) for _ in range(args.repetitions)
            ]
            share = statistics.median(r[0] for r in runs)
            use = statistics.median(r[1] for r in runs)
            took = ", ".join(str(r[2]) for r in runs)
            print(f"| {mode} | {congctl} | {share:.1%} | {use:.1%} | {took} |")
    print("\n| pod jobs | pods table rotation: median ms | p99 ms |")
    print("|---:|---:|---:|")
    for jobs in (2, 16, 64):
        median, p99 = rotation_cost(jobs, args.rounds)
        print(f"| {jobs} | {median:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    main()
