#!/usr/bin/env python3
"""Agent cost at steady state: CPU share of one core and RSS of the real agent process.

16 PS jobs (processes found by TENSORLIGHTS_JOB/ROLE) in one namespace hold 16 connections
each to a worker namespace (256 connections); the agent shapes veth-a at 200 Mbit and rotates
the green light every second (with --policy pack, the default policy, the light moves only as
the demands measured say: idle jobs measure none, and it stays). After a warm-up, the agent's
CPU time (the scheduler's exact count, not the tick-sampled utime + stime), split by thread
(the agent names its threads in the kernel; a thread that ended meanwhile is in the total
only), and VmRSS are sampled over --seconds, once the PS are no longer young (found more than
YOUNG_PS_S ago); the CPU share while they were young is printed too. Then the detection
latency, listen() -> the port shaped. Needs root.

With --pushing N, N more jobs push for real through veth-a all along (synthetic PS jobs, 3
workers each, --push-bytes a push, --push-compute between pushes: iterations with short
gaps, which the sampler follows every 5-20 ms): the cost of telemetry while jobs train,
not only while they idle; the iterations it reported for them are counted.

    .venv/bin/python scripts/bench_agent.py [--seconds 60] [--jobs 16] [--connections 16]
        [--policy rotate|pack]
        [--pushing 2 --push-bytes 1000000 --push-compute 0.02]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorlights.agent.status import Shaping, read_status
from tensorlights.discovery.scanner import YOUNG_PS_S
from tensorlights.errors import TransientError
from tensorlights.testbed import netns
from tensorlights.testbed.psjob import RunningJob
from tensorlights.testbed.socket_holder import Holder, clean_env, start_holder
from tensorlights.testbed.workloads import JobShape, Workload, start_workload

CPUCLOCK_SCHED = 2


def cpu_seconds(pid: int) -> float:
    """The process's CPU time from the scheduler's own count (clock_gettime on its CPU clock):
    exact. utime + stime in /proc/PID/stat are sampled at the tick on these kernels
    (TICK_CPU_ACCOUNTING, 250 Hz), which overcharges a process that wakes briefly on a timer:
    they showed the telemetry thread at twice its real cost."""
    return time.clock_gettime((~pid << 3) | CPUCLOCK_SCHED)


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds per thread name (the scheduler's exact count, /proc/PID/task/TID/schedstat),
    the main thread as "main": the agent names its threads in the kernel (tensorlights.threads)."""
    by_name: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            seconds = int((task / "schedstat").read_text().split()[0]) / 1e9
        except (FileNotFoundError, ProcessLookupError):
            continue  # ended meanwhile
        by_name[name] = by_name.get(name, 0.0) + seconds
    return by_name


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


def port_shaped_after(sock: Path, port: int, since: float, deadline_s: float = 10) -> float:
    """Seconds from `since` until the agent's status lists `port` among a job's ports (the
    pass that writes its filter publishes the status after the kernel write)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            status = read_status(sock)
        except (TransientError, OSError, json.JSONDecodeError):
            status = None
        if status is not None and status.shaping is not None:
            ports = status.shaping.discovery["job_ports"].values()
            if any(port in job_ports for job_ports in ports):
                return time.monotonic() - since
        time.sleep(0.005)
    return float("inf")


def detection_latencies(
    sock: Path, pair: netns.HostPair, old_ps: list[Holder], trials: int
) -> tuple[list[float], list[float]]:
    """listen() -> shaped, for a new PS process and for a new listener of a PS found long ago."""
    new_ps, old = [], []
    for trial in range(trials):
        env = {"TENSORLIGHTS_JOB": f"new-{trial}", "TENSORLIGHTS_ROLE": "ps"}
        holder = start_holder(env, "--host", pair.a.ipv4, prefix=pair.a.exec_args())
        try:
            new_ps.append(
                port_shaped_after(sock, holder.report["listen_port"], holder.report["listened_at"])
            )
        finally:
            holder.stop()
    # No process starts or exits meanwhile (their events would make scans), at a random
    # point of the scan cycle so that the figures span it.
    for trial in range(trials):
        time.sleep(1.5 + random.random())
        reply = old_ps[trial % len(old_ps)].listen_more_report()
        old.append(port_shaped_after(sock, reply["listen_port"], reply["listened_at"]))
    return new_ps, old


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--connections", type=int, default=16)
    parser.add_argument("--scan-interval", default="1s")
    parser.add_argument("--poll-interval", default="100ms")
    parser.add_argument(
        "--process-events", choices=["on", "off"], default="on", help="off: list /proc instead"
    )
    parser.add_argument("--profile", metavar="FILE", help="run the agent under cProfile")
    parser.add_argument(
        "--policy", choices=["rotate", "pack"], default="rotate",
        help="rotate (default): the light moves every second, a rotation's kernel writes at "
        "every pass; pack, the agent's default: it moves only when the measured demands say",
    )  # fmt: skip
    parser.add_argument("--telemetry", choices=["on", "off"], default="on")
    parser.add_argument("--sample-interval", default="100ms")
    parser.add_argument("--detections", type=int, default=10, help="listen() -> shaped trials")
    parser.add_argument("--pushing", type=int, default=0, help="jobs that push all along")
    parser.add_argument("--push-bytes", type=int, default=1_000_000)
    parser.add_argument("--push-compute", type=float, default=0.02, help="seconds")
    args = parser.parse_args()

    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as workdir:
        holders: list[Holder] = []
        pushing: list[RunningJob] = []
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
                f'scan_interval = "{args.scan_interval}"\n'
                f'poll_interval = "{args.poll_interval}"\n'
                f"process_events = {'true' if args.process_events == 'on' else 'false'}\n"
                "[telemetry]\n"
                f"enabled = {'true' if args.telemetry == 'on' else 'false'}\n"
                f'sample_interval = "{args.sample_interval}"\n'
            )
            for i in range(args.pushing):  # as many iterations as outlast the benchmark
                shape = JobShape(3, args.push_bytes, 1_000_000, args.push_compute)
                pushing.append(
                    start_workload(Workload.SYNTHETIC, f"push-{i}", pair.a, [pair.b], shape)
                )
            sock = Path(workdir) / "agent.sock"
            command = [
                sys.executable, *(["-m", "cProfile", "-o", args.profile] if args.profile else []),
                "-m", "tensorlights.cli.agent", "run", "--config", str(config),
                "--interface", "veth-a", "--link-rate", "200mbit", "--policy", args.policy,
                "--interval", "1s", "--standalone", "--trust", "any", "--status-socket", str(sock),
                "--state-dir", str(Path(workdir) / "state"), "--log-level", "warning",
            ]  # fmt: skip
            agent = subprocess.Popen(pair.a.exec_args(*command), env=clean_env())
            shaping = wait_for_jobs(sock, args.jobs + args.pushing)
            found_at = time.monotonic()
            connections = sum(len(task["connections"]) for task in shaping.discovery["tasks"])
            time.sleep(5)  # warm-up: imports done, caches filled
            young_cpu, young_start = cpu_seconds(agent.pid), time.monotonic()
            # The PS are young (any change of their descriptors makes a scan, not only more
            # of them) for YOUNG_PS_S after they were found: measured apart from the steady
            # state that follows.
            time.sleep(max(0.0, YOUNG_PS_S + 1 - (time.monotonic() - found_at)))
            young_share = (cpu_seconds(agent.pid) - young_cpu) / (time.monotonic() - young_start)
            start_cpu, start = cpu_seconds(agent.pid), time.monotonic()
            start_threads = thread_cpu_seconds(agent.pid)
            rss = []
            while time.monotonic() - start < args.seconds:
                time.sleep(1)
                rss.append(rss_mib(agent.pid))
            cpu = cpu_seconds(agent.pid) - start_cpu
            wall = time.monotonic() - start
            threads = {
                name: seconds - start_threads.get(name, 0.0)
                for name, seconds in thread_cpu_seconds(agent.pid).items()
            }
            status = read_status(sock)
            rotations = len(status.recent_rotations) if status is not None else 0
            reported = {
                job.job: len(status.telemetry.iterations.get(job.job, ()))
                if status is not None and status.telemetry is not None
                else 0
                for job in pushing
            }
            source = status.shaping.discovery["processes_from"] if status and status.shaping else ""
            new_ps, old_ps = detection_latencies(sock, pair, holders[1:], args.detections)
        finally:
            if agent is not None:
                agent.terminate()
                agent.wait(20)
            for holder in holders:
                holder.stop()
            for job in pushing:
                job.kill()
    print(
        f"jobs {args.jobs}, PS connections {connections}, "
        + ("rotation every 1 s, " if args.policy == "rotate" else "policy pack, ")
        + f"scan every {args.scan_interval}, poll every {args.poll_interval}, "
        f"processes from {source}, telemetry {args.telemetry} "
        f"(every {args.sample_interval}), {wall:.0f} s measured"
    )
    if pushing:
        print(
            f"jobs pushing all along: {args.pushing} ({args.push_bytes} bytes to each of 3 "
            f"workers, {args.push_compute * 1e3:.0f} ms between); iterations in the status "
            "(the latest kept): " + ", ".join(f"{job} {n}" for job, n in reported.items())
        )
    print(f"agent CPU: {100 * cpu / wall:.2f}% of one core (steady state)")
    by_thread = sorted(threads.items(), key=lambda item: -item[1])
    print("  by thread: " + ", ".join(f"{name} {100 * s / wall:.2f}%" for name, s in by_thread))
    print(
        f"agent CPU while the PS were young (their first {YOUNG_PS_S:.0f} s, watched for "
        f"descriptors closed too): {100 * young_share:.2f}% of one core"
    )
    print(
        f"agent RSS: median {statistics.median(rss):.1f} MiB, max {max(rss):.1f} MiB "
        f"(rotations seen in status: {rotations} of the last 20 kept)"
    )
    for what, latencies in (
        ("a new PS process", new_ps),
        (f"a new listener of a PS found over {YOUNG_PS_S:.0f} s ago", old_ps),
    ):
        if not latencies:  # --detections 0
            continue
        print(
            f"listen() -> shaped, {what} ({len(latencies)} trials): median "
            f"{statistics.median(latencies) * 1e3:.0f} ms, max {max(latencies) * 1e3:.0f} ms"
        )


if __name__ == "__main__":
    main()
