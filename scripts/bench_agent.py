#!/usr/bin/env python3
"""Agent cost at steady state: CPU share of one core and RSS of the real agent process.

16 PS jobs (processes found by TENSORLIGHTS_JOB/ROLE) in one namespace hold 16 connections
each to a worker namespace (256 connections); the agent shapes veth-a at 200 Mbit and rotates
the green light every second. After a warm-up, CPU time (utime + stime from /proc/PID/stat)
and VmRSS are sampled over --seconds. Needs root.

    .venv/bin/python scripts/bench_agent.py [--seconds 60] [--jobs 16] [--connections 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorlights.agent.status import Shaping, read_status
from tensorlights.errors import TransientError
from tensorlights.testbed import netns
from tensorlights.testbed.socket_holder import Holder, clean_env, start_holder

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def wait_for_jobs(sock: Path, jobs: int, deadline_s: float = 60) -> Shaping:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            status = read_status(sock)
            if status is not None and status.shaping and len(status.shaping.bands) == jobs:
                return status.shaping
        except (TransientError, OSError, json.JSONDecodeError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the agent did not find {jobs} jobs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--scan-interval", default="250ms")
    parser.add_argument("--profile", metavar="FILE", help="run the agent under cProfile")
    parser.add_argument("--telemetry", choices=["on", "off"], default="on")
    parser.add_argument("--sample-interval", default="100ms")
    args = parser.parse_args()

    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as workdir:
        holders: list[Holder] = []
        agent = None
        try:
            worker = start_holder({}, "--host", pair.b.ipv4, prefix=pair.b.exec_args())
            holders.append(worker)
            target = f"{pair.b.ipv4}:{worker.report['listen_port']}"
            for i in range(args.jobs):
                env = {"TENSORLIGHTS_JOB": f"job-{i:02d}", "TENSORLIGHTS_ROLE": "ps"}
                connects = [arg for _ in range(args.connections) for arg in ("--connect", target)]
                holders.append(
                    start_holder(env, "--host", pair.a.ipv4, *connects, prefix=pair.a.exec_args())
                )
            config = Path(workdir) / "agent.toml"
            config.write_text(
                f'scan_interval = "{args.scan_interval}"\n[telemetry]\n'
                f"enabled = {'true' if args.telemetry == 'on' else 'false'}\n"
                f'sample_interval = "{args.sample_interval}"\n'
            )
            sock = Path(workdir) / "agent.sock"
            command = [
                sys.executable, *(["-m", "cProfile", "-o", args.profile] if args.profile else []),
                "-m", "tensorlights.cli.agent", "run", "--config", str(config),
                "--interface", "veth-a", "--link-rate", "200mbit", "--policy", "rotate",
                "--interval", "1s", "--standalone", "--trust", "any", "--status-socket", str(sock),
                "--state-dir", str(Path(workdir) / "state"), "--log-level", "warning",
            ]  # fmt: skip
            agent = subprocess.Popen(pair.a.exec_args(*command), env=clean_env())
            shaping = wait_for_jobs(sock, args.jobs)
            connections = sum(len(task["connections"]) for task in shaping.discovery["tasks"])
            time.sleep(5)  # warm-up: imports done, caches filled
            start_cpu, start = cpu_seconds(agent.pid), time.monotonic()
            rss = []
            while time.monotonic() - start < args.seconds:
                time.sleep(1)
                rss.append(rss_mib(agent.pid))
            cpu = cpu_seconds(agent.pid) - start_cpu
            wall = time.monotonic() - start
            status = read_status(sock)
            rotations = len(status.recent_rotations) if status is not None else 0
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(20)
            for holder in holders:
                holder.stop()
    print(
        f"jobs {args.jobs}, PS connections {connections}, rotation every 1 s, "
        f"scan every {args.scan_interval}, telemetry {args.telemetry} "
        f"(every {args.sample_interval}), {wall:.0f} s measured"
    )
    print(f"agent CPU: {100 * cpu / wall:.2f}% of one core")
    print(
        f"agent RSS: median {statistics.median(rss):.1f} MiB, max {max(rss):.1f} MiB "
        f"(rotations seen in status: {rotations} of the last 20 kept)"
    )


if __name__ == "__main__":
    main()
