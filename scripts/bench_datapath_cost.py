#!/usr/bin/env python3
"""What the datapath costs the traffic it shapes, at the highest rate this machine reaches.

A veth pair with --queues transmit/receive queues (a multi-queue NIC's shape) and offloads
on (TSO/GSO/GRO, as on a GPU host's NIC); iperf3 servers in the sending namespace push bulk
TCP to clients in the other (`-R`): the sender is the PS. Traffic always goes to the same
two ports (5201, 5202), split evenly over --flows parallel flows, so every cell carries the
same traffic and only what sits on the egress differs:

  mq         what a multi-queue NIC gets by default: mq, a pfifo_fast per queue
  root-KIND  one qdisc KIND at the root (root-pfifo: the least any single root costs)
  noqueue    veth's own default: no qdisc at all
  ours-J     TensorLights' dataplane over that mq (as the agent takes over a NIC's default
             root), link rate 100 Gbit: J jobs, the two on the traffic ports in bands 0 and
             1 (with J = 1, port 5202's traffic is unmanaged), the others idle with 4 ports
             each; DSCP marks on, as the agent's defaults have them
  ours-J-nomarks  the same without the DSCP marks (dscp.enabled = false)

Cells are interleaved per repetition (the order rotates) and medians reported: throughput
(Gbit/s, what the receivers got after a 1 s warm-up) and the sender's CPU per Gbit/s (user +
system of the sending process, as iperf3 reports it). On this 2-core VM the two cores are
the bottleneck, so the tax shows as lost throughput. Needs root and iperf3 (`scripts/setup.sh
bench` installs it).

    .venv/bin/python scripts/bench_datapath_cost.py [--queues 4,8] [--flows 1,8,32] \
        [--configs mq,root-pfifo,ours-2] [--repetitions 3] [--seconds 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tensorlights.datapath import open_datapath
from tensorlights.datapath.dataplane import Dataplane, Marking
from tensorlights.model import NUM_BANDS, DatapathSpec, JobShaping
from tensorlights.policy.dscp_plan import DEFAULT_BAND_DSCP
from tensorlights.testbed import netns

TRAFFIC_PORTS = (5201, 5202)
IDLE_PORTS_PER_JOB = 4
LINK_RATE = 400_000_000_000
DEFAULT_CONFIGS = "mq,root-pfifo,ours-1,ours-2-nomarks,ours-2,ours-16"


@dataclass(frozen=True)
class Cell:
    gbit: float
    sender_cpu_per_gbit: float  # % of one core per Gbit/s


def spec(jobs: int) -> DatapathSpec:
    """`jobs` jobs; the traffic ports' jobs come last (the worst place in a linear lookup)."""
    idle = [
        JobShaping(
            f"idle-{i:02}",
            2 + i % (NUM_BANDS - 3),  # bands 2..6; 7 is unmanaged traffic
            frozenset(6001 + i * IDLE_PORTS_PER_JOB + k for k in range(IDLE_PORTS_PER_JOB)),
        )
        for i in range(max(0, jobs - 2))
    ]
    loaded = [
        JobShaping(f"loaded-{i}", i, frozenset({port})) for i, port in enumerate(TRAFFIC_PORTS)
    ]
    return DatapathSpec("veth-a", LINK_RATE, tuple(idle + loaded[: min(jobs, 2)]))


def configure(pair: netns.HostPair, state: Path, config: str) -> Dataplane | None:
    ns = pair.a.ns
    if config == "noqueue":
        netns.run(["tc", "-n", ns, "qdisc", "del", "dev", "veth-a", "root"], check=False)
        return None
    if config.startswith("root-"):  # any one qdisc at the root, for comparison
        netns.run(["tc", "-n", ns, "qdisc", "replace", "dev", "veth-a", "root", config[5:]])
        return None
    netns.run(["tc", "-n", ns, "qdisc", "replace", "dev", "veth-a", "root", "mq"])
    if config == "mq":
        return None
    _, jobs, *rest = config.split("-")
    marking = None if rest == ["nomarks"] else Marking(DEFAULT_BAND_DSCP)
    tc = open_datapath("htb", state, netns=ns, take_over_foreign=True)
    dataplane = Dataplane(tc, netns=ns, marking=marking)
    dataplane.apply(spec(int(jobs)))
    return dataplane


def stop(servers: list[subprocess.Popen[str]]) -> None:
    for server in servers:
        server.kill()
        server.wait()


def start_servers(pair: netns.HostPair) -> list[subprocess.Popen[str]]:
    servers = []
    for port in TRAFFIC_PORTS:
        proc = subprocess.Popen(
            pair.a.exec_args("iperf3", "-s", "-p", str(port), "--forceflush"),
            stdout=subprocess.PIPE,
            text=True,
        )
        servers.append(proc)
        assert proc.stdout is not None
        while "listening" not in (line := proc.stdout.readline()):
            if not line:
                raise RuntimeError(f"iperf3 server on port {port} did not start")
    return servers


def measure(pair: netns.HostPair, flows: int, seconds: float) -> Cell | None:
    """One run of `flows` flows; None if an iperf3 client hung (iperf3 3.12's server now
    and then never starts a test: its control connection stalls after the cookie)."""
    ports = TRAFFIC_PORTS[: min(flows, len(TRAFFIC_PORTS))]
    client = ["iperf3", "-c", pair.a.ipv4, "-R", "-J", "-O", "1", "-t", str(seconds)]
    clients = [
        subprocess.Popen(
            pair.b.exec_args(*client, "-p", str(port), "-P", str(flows // len(ports))),
            stdout=subprocess.PIPE,
            text=True,
        )
        for port in ports
    ]
    bits = 0.0
    sender_cpu = 0.0
    for client in clients:
        try:
            out, _ = client.communicate(timeout=seconds + 10)
        except subprocess.TimeoutExpired:
            for other in clients:
                other.kill()
                other.wait()
            return None
        end = json.loads(out)["end"]
        bits += end["sum_received"]["bits_per_second"]
        sender_cpu += end["cpu_utilization_percent"]["remote_total"]
    gbit = bits / 1e9
    return Cell(gbit, sender_cpu / gbit)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--queues", default="4,8")
    parser.add_argument("--flows", default="1,8,32")
    parser.add_argument("--configs", default=DEFAULT_CONFIGS)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    if shutil.which("iperf3") is None:
        print("iperf3 is needed: scripts/setup.sh bench installs it", file=sys.stderr)
        return 2
    configs = args.configs.split(",")
    flow_counts = [int(n) for n in args.flows.split(",")]
    cells: dict[tuple[int, int, str], list[Cell]] = defaultdict(list)
    hung = 0
    for queues in (int(q) for q in args.queues.split(",")):
        with netns.host_pair(offloads_off=False, queues=queues) as pair, \
                tempfile.TemporaryDirectory() as state:  # fmt: skip
            servers = start_servers(pair)
            try:
                for rep in range(args.repetitions):
                    order = configs[rep % len(configs) :] + configs[: rep % len(configs)]
                    for config in order:
                        dataplane = configure(pair, Path(state), config)
                        try:
                            for flows in flow_counts:
                                while (cell := measure(pair, flows, args.seconds)) is None:
                                    hung += 1
                                    stop(servers)
                                    servers = start_servers(pair)
                                cells[(queues, flows, config)].append(cell)
                        finally:
                            if dataplane is not None:
                                dataplane.cleanup("veth-a")
                                dataplane.close()
                    print(f"{queues} queues: repetition {rep + 1} done", file=sys.stderr)
            finally:
                stop(servers)
    baseline = "mq" if "mq" in configs else configs[0]
    print(
        f"veth, offloads on, iperf3 -R; medians of {args.repetitions} interleaved runs of "
        f"{args.seconds:g} s. Gbit/s (sender CPU, % of a core per Gbit/s); tax vs {baseline}."
    )
    print(f"iperf3 runs that hung and were repeated (servers restarted): {hung}\n")
    print("| queues | flows | " + " | ".join(configs) + " |")
    print("|---:|---:|" + "---:|" * len(configs))
    for queues, flows in sorted({(q, f) for q, f, _ in cells}):
        base = statistics.median(c.gbit for c in cells[(queues, flows, baseline)])
        row = []
        for config in configs:
            runs = cells[(queues, flows, config)]
            gbit = statistics.median(c.gbit for c in runs)
            cpu = statistics.median(c.sender_cpu_per_gbit for c in runs)
            tax = "" if config == baseline else f", {1 - gbit / base:+.1%}"
            row.append(f"{gbit:.1f} ({cpu:.2f}{tax})")
        print(f"| {queues} | {flows} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
