#!/usr/bin/env python3
"""Pods in their own network namespaces, shaped at the node's NIC: what the green light does
there, in both emulated CNI modes (testbed/pods.py: routed, VXLAN), and what a rotation of
the pods' nftables table costs.

Per mode and repetition: two PS pods serving on the same port, found by discovery from their
connections, the NIC shaped at --rate; the workers (in the peer node) read for --seconds
while the light moves every --turn seconds. Reported: the green pod's share of the bytes and
the link's use (what the peer's end of the NIC received) in steady 0.1 s slots; per move,
how long until the new green pod carried >= 85% of a slot and half the link, and the
retransmission timeout its flow carried into the turn (`ss`, just before the move: a flow
that loses its first packets when it turns green sits that long silent); per TCP congestion
control of the pods (--congctl, set per route; several compare them). Then the rotation cost
of `inet tensorlights_pods` for 2, 16 and 64 pod jobs. Needs root.

    .venv/bin/python scripts/bench_pods.py [--repetitions 3] [--rate 200] [--seconds 30] \
        [--turn 2] [--congctl cubic,bbr]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast, get_args

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
from tensorlights.testbed.pods import Mode, PodNode, connection_rto_ms, pod_node

PORT = 5001
INTERVAL = 0.1
JOBS = ("job-a", "job-b")
SETTLE_SLOTS = 5
"""Slots after a move left out of the steady shares (the move's own and its ramp)."""


@dataclass
class Run:
    shares: list[float]
    uses: list[float]
    took_s: list[float]
    """Per move: seconds until the new green pod led (the run's length if it never did)."""
    rto_ms: list[float]
    """Per move: the new green pod's retransmission timeout just before it."""


def one_run(mode: Mode, rate_mbit: int, seconds: float, turn: float, congctl: str) -> Run:
    with pod_node(mode, pods=2, congctl=congctl) as node:
        env = [{**os.environ, "TENSORLIGHTS_JOB": job, "TENSORLIGHTS_ROLE": "ps"} for job in JOBS]
        servers = [
            traffic.start_server(pod.ns, [PORT], max_seconds=seconds + 30, env=e)
            for pod, e in zip(node.pods, env, strict=True)
        ]
        try:
            return _measure(node, rate_mbit * 1_000_000, seconds, turn)
        finally:
            for server in servers:
                server.kill()
                server.wait()


def _measure(node: PodNode, rate: int, seconds: float, turn: float) -> Run:
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

    def spec(green: int) -> DatapathSpec:
        return DatapathSpec(
            node.nic,
            rate,
            tuple(
                JobShaping(j, 0 if i == green else 1, frozenset(), endpoints[j])
                for i, j in enumerate(JOBS)
            ),
            short_waiting_queues=True,  # as the agent has them with pod shaping on
        )

    moves: list[tuple[float, int]] = []
    rtos: list[float] = []
    with tempfile.TemporaryDirectory() as state:
        tc = open_datapath("htb", Path(state), netns=node.node_ns)
        dataplane = Dataplane(tc, netns=node.node_ns, marking=Marking(DEFAULT_BAND_DSCP), pods=True)
        try:
            dataplane.apply(spec(0))
            sink = _sink(node, targets, seconds)
            began = time.monotonic()
            while (at := turn * (len(moves) + 1)) < seconds - turn / 2:
                green = (len(moves) + 1) % 2
                time.sleep(max(0.0, began + at - 0.05 - time.monotonic()))
                rto = connection_rto_ms(node.pods[green].ns, PORT)
                rtos.append(float("nan") if rto is None else rto)
                time.sleep(max(0.0, began + at - time.monotonic()))  # the experiment's clock
                dataplane.rotate(spec(green))
                moves.append((time.monotonic() - began, green))
            out, _ = sink.communicate(timeout=seconds + 15)
        finally:
            dataplane.cleanup(node.nic)
            dataplane.close()
    result = json.loads(out)
    pods = [result["flows"][t] for t in targets]
    carried = result["link"]  # what the NIC delivered: the workers' reads lag on busy cores
    slot_bytes = rate / 8 * INTERVAL
    starts = [int(at / INTERVAL) + 1 for at, _ in moves]
    total = [a + b for a, b in zip(*pods, strict=True)]
    run = Run([], [], [], rtos)
    for (_, green), first in zip(moves, starts, strict=True):
        mine = pods[green]
        led = (i for i in range(first, len(mine))
               if mine[i] >= 0.85 * total[i] and mine[i] >= 0.5 * slot_bytes)  # fmt: skip
        run.took_s.append((next(led, len(mine)) - first) * INTERVAL)
    for i in range(SETTLE_SLOTS, len(pods[0]) - 1):
        if any(0 <= i - s < SETTLE_SLOTS for s in starts):
            continue
        green = sum(1 for s in starts if s <= i) % 2
        run.shares.append(pods[green][i] / total[i] if total[i] else 0.0)
        run.uses.append(carried[i] / slot_bytes)
    return run


def _sink(node: PodNode, targets: list[str], seconds: float) -> subprocess.Popen[str]:
    command = traffic.sink_command(targets, seconds, INTERVAL, link_dev=node.nic)
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
    parser.add_argument("--rate", type=int, default=200, help="NIC rate, Mbit/s")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--turn", type=float, default=2.0, help="seconds between moves")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--modes", default="routed,vxlan", help="CNI modes, comma-separated")
    parser.add_argument(
        "--congctl", default="cubic", help="the pods' TCP congestion control(s), comma-separated"
    )
    args = parser.parse_args()
    modes = cast(list[Mode], args.modes.split(","))
    if unknown := set(modes) - set(get_args(Mode)):
        parser.error(f"--modes: no such mode {', '.join(sorted(unknown))} (routed, vxlan)")
    print(
        f"Pods behind a node NIC shaped at {args.rate} Mbit/s, the light moving every "
        f"{args.turn:g} s for {args.seconds:g} s, {args.repetitions} runs per mode\n"
    )
    print(
        "| mode | pods' TCP | green share | link use | moves | led within 0.5 s "
        "| slowest moves (s) | RTO carried in, median / max (ms) |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|")
    for congctl in args.congctl.split(","):
        for mode in modes:
            runs = [
                one_run(mode, args.rate, args.seconds, args.turn, congctl)
                for _ in range(args.repetitions)
            ]
            shares = [x for r in runs for x in r.shares]
            uses = [x for r in runs for x in r.uses]
            took = sorted((x for r in runs for x in r.took_s), reverse=True)
            rtos = [x for r in runs for x in r.rto_ms]
            fast = sum(1 for x in took if x <= 0.5)
            slowest = ", ".join(f"{x:.1f}" for x in took[:3])
            print(
                f"| {mode} | {congctl} | {statistics.median(shares):.1%} "
                f"| {statistics.median(uses):.1%} | {len(took)} | {fast} | {slowest} "
                f"| {statistics.median(rtos):.0f} / {max(rtos):.0f} |",
                flush=True,
            )
    print("\n| pod jobs | pods table rotation: median ms | p99 ms |")
    print("|---:|---:|---:|")
    for jobs in (2, 16, 64):
        median, p99 = rotation_cost(jobs, args.rounds)
        print(f"| {jobs} | {median:.3f} | {p99:.3f} |")


if __name__ == "__main__":
    main()
