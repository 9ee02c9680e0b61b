#!/usr/bin/env python3
"""Rotation latency: TensorLights' datapath vs the original prototype's way, under load.

For 1, 8, 16 and 64 jobs (2 ports each, or --ports-per-job: a collective job's rank holds one
connection per peer rank and more, so 64 jobs x 64 ports is the size to hold; three of the jobs
carry backlogged TCP flows through a veth shaped at 200 Mbit) it measures:
  * ours, "green moves": the green light passes to the next job (2 job tables retargeted);
  * ours, "all move": every job changes band (N tables retargeted) -- the worst case;
  * original: delete the root qdisc, re-add qdisc, classes and u32 filters with one `tc`
    command each, as the HPBDC'19 prototype did every 20 s.
Drops are what the sender's TCP had to retransmit during each phase (TcpRetransSegs) plus
the qdisc's own drop counter. Needs root. Prints a Markdown table.

    .venv/bin/python scripts/bench_rotation.py [--rounds 200] [--jobs 1,8,16,64]
        [--ports-per-job 2]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorlights.bench import legacy_tc
from tensorlights.datapath import open_datapath
from tensorlights.datapath.htb import HtbDatapath
from tensorlights.model import NUM_BANDS, DatapathSpec, JobShaping
from tensorlights.testbed import netns, traffic

RATE = 200_000_000
LOADED_PORTS = [5001, 5002, 5003]


PORTS_PER_JOB = [2]
"""Set from --ports-per-job."""


def job_ports(index: int) -> frozenset[int]:
    """5001 + index (the loaded jobs' server ports), then ports no other job has."""
    extra = PORTS_PER_JOB[0] - 1
    return frozenset({5001 + index, *range(20001 + index * extra, 20001 + (index + 1) * extra)})


def spec(jobs: int, band_of: list[int]) -> DatapathSpec:
    return DatapathSpec(
        "veth-a",
        RATE,
        tuple(JobShaping(f"job-{i}", band_of[i], job_ports(i)) for i in range(jobs)),
    )


def retransmits(ns: str) -> int:
    out = netns.run(netns.in_ns(ns, "cat", "/proc/net/snmp")).stdout.splitlines()
    tcp = [line.split() for line in out if line.startswith("Tcp:")]
    return int(tcp[1][tcp[0].index("RetransSegs")])


def qdisc_drops(ns: str) -> int:
    out = netns.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", "veth-a"]).stdout
    return sum(
        int(part.split()[1].rstrip(","))
        for part in out.split("(")[1:]
        if part.startswith("dropped")
    )


def root_backlog_packets(ns: str) -> int:
    out = netns.run(["tc", "-n", ns, "-s", "qdisc", "show", "dev", "veth-a", "root"]).stdout
    for line in out.splitlines():
        if "backlog" in line:
            return int(line.split()[2].rstrip("p"))
    return 0


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return statistics.median(ordered) * 1e3, p99 * 1e3


def ours(dp: HtbDatapath, ns: str, jobs: int, rounds: int, all_move: bool) -> dict[str, float]:
    dp.apply(spec(jobs, [min(i, NUM_BANDS - 1) for i in range(jobs)]))
    retrans0, drops0 = retransmits(ns), qdisc_drops(ns)
    samples = []
    for r in range(rounds):
        if all_move:
            bands = [(i + r + 1) % NUM_BANDS for i in range(jobs)]
        else:
            bands = [0 if i == (r + 1) % jobs else 1 for i in range(jobs)]
        target = spec(jobs, bands)
        start = time.perf_counter()
        dp.rotate(target)
        samples.append(time.perf_counter() - start)
        time.sleep(0.005)  # let traffic run between rotations
    median, p99 = percentiles(samples)
    return {
        "median_ms": median,
        "p99_ms": p99,
        "retrans": retransmits(ns) - retrans0,
        "qdisc_drops": qdisc_drops(ns) - drops0,
    }


def original_commands(jobs: int, green: int) -> list[list[str]]:
    """The prototype's rebuild (tensorlights.bench.legacy_tc) for `jobs` jobs, `green` on top."""
    return legacy_tc.htb_commands(
        "veth-a", RATE, [sorted(job_ports(i)) for i in range(jobs)],
        legacy_tc.original_prios(jobs, green),
    )  # fmt: skip


def original(ns: str, jobs: int, rounds: int) -> dict[str, float]:
    for cmd in original_commands(jobs, 0)[1:]:
        netns.run(["tc", "-n", ns, *cmd])
    retrans0 = retransmits(ns)
    samples = []
    discarded = 0
    for r in range(rounds):
        discarded += root_backlog_packets(ns)  # queued packets die with the deleted qdisc
        start = time.perf_counter()
        for cmd in original_commands(jobs, (r + 1) % jobs):
            netns.run(["tc", "-n", ns, *cmd])
        samples.append(time.perf_counter() - start)
        time.sleep(0.005)
    netns.run(["tc", "-n", ns, "qdisc", "del", "dev", "veth-a", "root"])
    median, p99 = percentiles(samples)
    return {
        "median_ms": median,
        "p99_ms": p99,
        "retrans": retransmits(ns) - retrans0,
        "discarded": discarded,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--original-rounds", type=int, default=10)
    parser.add_argument("--jobs", default="1,8,16,64")
    parser.add_argument("--ports-per-job", type=int, default=2)
    args = parser.parse_args()
    PORTS_PER_JOB[0] = args.ports_per_job
    sizes = [int(n) for n in args.jobs.split(",")]
    rows = []
    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as state:
        server = traffic.start_server(pair.a.ns, LOADED_PORTS, max_seconds=3600)
        targets = [f"{pair.a.ipv4}:{port}" for port in LOADED_PORTS]
        sink = subprocess.Popen(
            pair.b.exec_args(*traffic.sink_command(targets, 3600, 10)), stdout=subprocess.DEVNULL
        )
        try:
            for jobs in sizes:
                dp = open_datapath("htb", Path(state), netns=pair.a.ns)
                moved = ours(dp, pair.a.ns, jobs, args.rounds, all_move=False)
                everyone = ours(dp, pair.a.ns, jobs, args.rounds, all_move=True)
                dp.cleanup("veth-a")
                dp.sock.close()
                legacy = original(pair.a.ns, jobs, args.original_rounds)
                rows.append((jobs, moved, everyone, legacy))
                print(f"measured {jobs} jobs", file=sys.stderr)
        finally:
            sink.kill()
            server.kill()
    print(
        "| jobs | ours, green moves: median / p99 ms | ours, all move: median / p99 ms "
        "| ours: retransmits, qdisc drops | original rebuild: median / p99 ms "
        "| original: retransmits, packets discarded with the qdisc |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for jobs, moved, everyone, legacy in rows:
        print(
            f"| {jobs} | {moved['median_ms']:.3f} / {moved['p99_ms']:.3f} "
            f"| {everyone['median_ms']:.3f} / {everyone['p99_ms']:.3f} "
            f"| {moved['retrans'] + everyone['retrans']:.0f}, "
            f"{moved['qdisc_drops'] + everyone['qdisc_drops']:.0f} "
            f"| {legacy['median_ms']:.1f} / {legacy['p99_ms']:.1f} "
            f"| {legacy['retrans']:.0f}, ~{legacy['discarded']:.0f} |"
        )
    print(
        f"\n{args.rounds} rotations per 'ours' cell, {args.original_rounds} per original cell; "
        f"{args.ports_per_job} ports per job; "
        "200 Mbit veth, 3 backlogged TCP flows. Retransmits include those of flows starved in\n"
        "lower bands (strict priority at work, with or without rotation); the qdisc's drop\n"
        "counter and the backlog thrown away by a rebuild are what the rotation itself costs."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
