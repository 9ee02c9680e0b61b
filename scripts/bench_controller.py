#!/usr/bin/env python3
"""Controller benchmarks (issue 5's goals: plan <= 100 ms for 10,000 hosts / 5,000 jobs;
500 agents' reports handled without backlog).

    .venv/bin/python scripts/bench_controller.py plan [--hosts 10000 --jobs 5000]
    .venv/bin/python scripts/bench_controller.py agents [--agents 500 --seconds 30]

plan    times Planner.update (the coordinated schedule plus every host's slot orders) on a
        random membership: 70% of jobs with one PS host, 20% with two, 10% with four; first
        from scratch, then after one job arrives (what a report usually causes).
agents  starts a real controller process on loopback (mutual TLS, certificates from
        scripts/dev_ca.py) and N simulated agents in one asyncio process, each with its own
        certificate and TLS connection: register, hold the plan stream, report every report
        interval (1 s) with two jobs. Prints report latency over time (a backlog would make it
        grow), reports accepted vs sent, plans received, and the controller's CPU and RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tensorlights.controller.planner import Planner  # noqa: E402
from tensorlights.rpc.v1 import agent_link_pb2 as pb  # noqa: E402
from tensorlights.testbed.processes import free_port  # noqa: E402


def membership(hosts: int, jobs: int, seed: int = 1) -> dict[str, frozenset[str]]:
    rng = random.Random(seed)
    names = [f"h{i:05d}" for i in range(hosts)]
    result = {}
    for j in range(jobs):
        draw = rng.random()
        width = 1 if draw < 0.7 else 2 if draw < 0.9 else 4
        result[f"job/{j:05d}"] = frozenset(rng.sample(names, width))
    return result


def bench_plan(hosts: int, jobs: int, repeat: int) -> None:
    members = membership(hosts, jobs)
    host_set = {f"h{i:05d}" for i in range(hosts)}
    full, incremental = [], []
    for run in range(repeat):
        planner = Planner(3.0, 15.0, 1)
        started = time.perf_counter()
        planner.update(members, host_set)
        full.append(time.perf_counter() - started)
        grown = {**members, f"job/new{run}": frozenset({"h00001", "h00002"})}
        started = time.perf_counter()
        changed = planner.update(grown, host_set)
        incremental.append(time.perf_counter() - started)
    schedule = planner.schedule
    busiest = max(Counter(h for hosts in members.values() for h in hosts).values())
    placements = sum(len(m) for m in members.values())
    print(
        f"plan: {hosts} hosts, {jobs} jobs ({placements} PS placements), "
        f"{len(schedule.slots)} slots in the cycle (the busiest host has {busiest} jobs)"
    )
    print(
        f"  from scratch       median {statistics.median(full) * 1000:7.1f} ms   "
        f"max {max(full) * 1000:7.1f} ms   ({repeat} runs)"
    )
    print(
        f"  one job arrives    median {statistics.median(incremental) * 1000:7.1f} ms   "
        f"max {max(incremental) * 1000:7.1f} ms   ({len(changed)} host plans changed)"
    )


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def simulated_agent(
    index: int, target: str, pki: Path, seconds: float, latencies: list[tuple[float, float]],
    counters: dict[str, int], start_at: float,
) -> None:  # fmt: skip
    host = f"sim{index:04d}"
    credentials = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / f"{host}.key").read_bytes(),
        (pki / f"{host}.pem").read_bytes(),
    )
    async with grpc.aio.secure_channel(target, credentials) as channel:
        register = channel.unary_unary("/tensorlights.rpc.v1.AgentLink/Register")
        report = channel.unary_unary("/tensorlights.rpc.v1.AgentLink/Report")
        watch = channel.unary_stream("/tensorlights.rpc.v1.AgentLink/WatchPlan")
        request = pb.RegisterRequest(
            host=host, agent_incarnation=time.time_ns(), agent_version="bench",
            interfaces=[pb.Interface(name="eth0", link_rate_bps=10**10)], fallback_policy="rotate",
        )  # fmt: skip
        reply = pb.RegisterReply.FromString(await register(request.SerializeToString(), timeout=30))
        stream = watch(pb.WatchPlanRequest(session=reply.session).SerializeToString())

        async def plans() -> None:
            async for _ in stream:
                counters["plans"] += 1

        reader = asyncio.create_task(plans())
        rng = random.Random(index)
        jobs = [
            pb.PsJob(job=f"job/{rng.randrange(1000)}", ports=[2000 + i, 3000 + i], processes=1,
                     connections=16)
            for i in range(2)
        ]  # fmt: skip
        await asyncio.sleep(max(0.0, start_at - time.monotonic()) + rng.random())
        seq = 0
        end = start_at + seconds
        while time.monotonic() < end:
            seq += 1
            message = pb.AgentReport(session=reply.session, seq=seq, jobs=jobs, mode="plan")
            sent = time.monotonic()
            await report(message.SerializeToString(), timeout=30)
            latencies.append((sent - start_at, time.monotonic() - sent))
            counters["reports"] += 1
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - sent)))
        stream.cancel()
        reader.cancel()


async def run_agents(count: int, target: str, pki: Path, seconds: float) -> dict[str, object]:
    latencies: list[tuple[float, float]] = []
    counters = {"reports": 0, "plans": 0}
    start_at = time.monotonic() + 10  # everyone registers first
    await asyncio.gather(
        *(simulated_agent(i, target, pki, seconds, latencies, counters, start_at)
          for i in range(count))
    )  # fmt: skip
    return {"latencies": latencies, **counters}


def bench_agents(count: int, seconds: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="tl-bench-ctl-"))
    try:
        pki = work / "pki"
        agents = [arg for i in range(count) for arg in ("--agent", f"sim{i:04d}")]
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), str(pki), "--controller",
             "127.0.0.1", *agents], check=True, capture_output=True,
        )  # fmt: skip
        port = free_port()
        (work / "none.toml").write_text("")
        controller = subprocess.Popen(
            [sys.executable, "-m", "tensorlights.cli.controller", "run", "--config",
             str(work / "none.toml"), "--listen", f"127.0.0.1:{port}", "--socket",
             str(work / "ctl.sock"), "--metrics-address", f"127.0.0.1:{free_port()}",
             "--state-dir", str(work / "state"), "--tls-ca", str(pki / "ca.pem"),
             "--tls-cert", str(pki / "controller.pem"), "--tls-key",
             str(pki / "controller.key"), "--log-level", "warning"],
            cwd=ROOT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 20
            while not (work / "ctl.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            cpu_before = proc_cpu_s(controller.pid)
            wall_before = time.monotonic()
            result = asyncio.run(run_agents(count, f"127.0.0.1:{port}", pki, seconds))
            cpu = proc_cpu_s(controller.pid) - cpu_before
            wall = time.monotonic() - wall_before
            rss = proc_rss_mib(controller.pid)
        finally:
            controller.terminate()
            controller.wait(15)
        latencies = result["latencies"]
        assert isinstance(latencies, list)
        print(
            f"agents: {count} simulated agents (mTLS, one connection each), "
            f"{seconds:.0f} s of reports at 1/s each"
        )
        print(
            f"  reports accepted {result['reports']} (offered about {count * seconds:.0f}), "
            f"plans received {result['plans']}"
        )
        tenth = seconds / 10
        for name, lo, hi in (("first", 0, tenth * 3), ("last", seconds - tenth * 3, seconds)):
            window = sorted(lat for at, lat in latencies if lo <= at < hi)
            if window:
                p50 = window[len(window) // 2] * 1000
                p99 = window[int(len(window) * 0.99)] * 1000
                print(
                    f"  report latency, {name} 30%: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms "
                    f"({len(window)} reports)"
                )
        print(
            f"  controller CPU {cpu / wall * 100:.0f}% of one core over the run "
            f"(with registration), RSS {rss:.0f} MiB"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    plan = sub.add_parser("plan")
    plan.add_argument("--hosts", type=int, default=10_000)
    plan.add_argument("--jobs", type=int, default=5_000)
    plan.add_argument("--repeat", type=int, default=5)
    agents = sub.add_parser("agents")
    agents.add_argument("--agents", type=int, default=500)
    agents.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    if args.what == "plan":
        bench_plan(args.hosts, args.jobs, args.repeat)
    else:
        bench_agents(args.agents, args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
