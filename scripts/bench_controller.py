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
        certificate and TLS connection: register, hold the plan stream, and report as agents
        do (rpc/agent_client.py): news at once, otherwise a heartbeat every heartbeat interval
        (--heartbeat, the controller's setting: 10 s by default; each reply renews the plan's
        lease, and the stream resends a plan only to an agent that has not renewed it for 0.8
        of a lease) (--every-second: a report every second, as agents did before). With
        --churn R, R
        job starts or stops per second across the cluster, each on a random agent, which
        reports it at once; the time until that agent's plan stream brings its new plan is
        the membership change's propagation. Prints report latency over time (a backlog
        would make it grow), propagation, reports and plans, the controller's CPU and RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tensorlights.controller.core import plan_update  # noqa: E402
from tensorlights.controller.planner import ClusterPolicy, Planner  # noqa: E402
from tensorlights.controller.registry import Registry  # noqa: E402
from tensorlights.model import HostReport, Mode, Registration, ReportedJob  # noqa: E402
from tensorlights.rpc.v1 import agent_link_pb2 as pb  # noqa: E402
from tensorlights.testbed.etcd import EtcdCluster  # noqa: E402
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


def bench_replan(hosts: int, jobs: int, repeat: int) -> None:
    """What one replan costs the controller under --policy pack: the registry's views of
    what every agent reported, then Planner.update (core.plan_update), after each kind of
    news a report brings."""
    members = membership(hosts, jobs)
    rng = random.Random(2)
    registry = Registry()
    sessions: dict[str, str] = {}
    seqs: dict[str, int] = {}
    for i in range(hosts):
        host = f"h{i:05d}"
        registration = Registration(host, 1, "bench", (("eth0", 25_000_000_000),), "pack")
        sessions[host] = registry.register(registration, 0.0).session
        seqs[host] = 0
    on_host: dict[str, dict[str, ReportedJob]] = {f"h{i:05d}": {} for i in range(hosts)}
    for job, job_hosts in members.items():
        measured = rng.random() < 0.9  # the others still being measured
        demand = rng.uniform(0.05, 0.9) if measured else None
        for host in job_hosts:
            on_host[host][job] = ReportedJob(
                job, frozenset(), 1, 4, period_s=0.5 if measured else None, demand=demand
            )

    def report(host: str) -> None:
        seqs[host] += 1
        report = HostReport(
            sessions[host], seqs[host], tuple(on_host[host].values()), (), Mode.PLAN, ""
        )
        registry.report(report, 100.0)

    for host in on_host:
        report(host)
    planner = Planner(3.0, 15.0, 1, ClusterPolicy.PACK)
    started = time.perf_counter()
    plan_update(registry, planner, 100.0)
    scratch = time.perf_counter() - started
    busy = [host for host, found in on_host.items() if found]
    timings: dict[str, list[float]] = {"a demand moved": [], "a job came": [], "a job left": []}
    views: list[float] = []
    changed: dict[str, int] = {}
    for run in range(repeat):
        for news in timings:
            host = rng.choice(busy)
            if news == "a demand moved":
                job, state = next(iter(on_host[host].items()))
                on_host[host][job] = replace(state, demand=rng.uniform(0.05, 0.9))
            elif news == "a job came":
                job = f"job/new{run}"
                on_host[host][job] = ReportedJob(job, frozenset(), 1, 4)
            else:
                job = f"job/new{run}"
                host = next(h for h, found in on_host.items() if job in found)
                del on_host[host][job]
            report(host)
            started = time.perf_counter()
            registry.membership(), registry.demands(), registry.iterative()
            registry.starving(), registry.young(100.0), registry.arrival_order()
            views.append(time.perf_counter() - started)
            started = time.perf_counter()
            changed[news] = len(plan_update(registry, planner, 100.0))
            timings[news].append(time.perf_counter() - started)
    print(
        f"replan (--policy pack, fed by a registry of {hosts} reporting hosts, {jobs} jobs, "
        f"90% measured): from scratch {scratch * 1000:.1f} ms"
    )
    for news, spent in timings.items():
        print(
            f"  {news:15s} median {statistics.median(spent) * 1000:7.1f} ms   "
            f"max {max(spent) * 1000:7.1f} ms   ({changed[news]} host plans changed)"
        )
    print(f"  of which the registry's views: median {statistics.median(views) * 1000:.1f} ms")


def _controller(
    work: Path, pki: Path, port: int, *args: str
) -> tuple[subprocess.Popen[bytes], int]:
    """A controller process (mutual TLS) on `port` with `args`; its metrics port."""
    work.mkdir(parents=True, exist_ok=True)
    (work / "none.toml").write_text("")
    metrics_port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tensorlights.cli.controller", "run", "--config",
         str(work / "none.toml"), "--listen", f"127.0.0.1:{port}", "--socket",
         str(work / "ctl.sock"), "--metrics-address", f"127.0.0.1:{metrics_port}",
         "--state-dir", str(work / "state"), "--tls-ca", str(pki / "ca.pem"),
         "--tls-cert", str(pki / "controller.pem"), "--tls-key", str(pki / "controller.key"),
         "--log-level", "warning", *args],
        cwd=ROOT,
    )  # fmt: skip
    return process, metrics_port


def bench_ha(seconds: float) -> None:
    """What high availability costs, idle: one controller alone, then three replicas on a
    real 3-member etcd (ttl 5 s, the default) -- every process's CPU over `seconds`. Agents
    cost the leader what they cost a controller alone (followers refuse them)."""
    work = Path(tempfile.mkdtemp(prefix="tl-bench-ha-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        pki = work / "pki"
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), str(pki), "--controller",
             "127.0.0.1"], check=True, capture_output=True,
        )  # fmt: skip
        alone, metrics = _controller(work / "alone", pki, free_port())
        processes.append(alone)
        _wait_metrics(metrics)
        cpu = _cpu_over([alone.pid], seconds)
        print(f"ha: {seconds:.0f} s idle, CPU in % of one core")
        print(f"  one controller (no etcd): {cpu[0]:.2f}%")
        alone.terminate()
        alone.wait(15)
        (work / "etcd").mkdir()
        with EtcdCluster(work / "etcd", members=3) as etcd:
            endpoints = ",".join(etcd.endpoints)
            replicas = []
            try:
                for index in range(3):
                    port = free_port()
                    replica, metrics = _controller(
                        work / f"r{index}", pki, port, "--etcd", endpoints,
                        "--advertise", f"127.0.0.1:{port}",
                    )  # fmt: skip
                    processes.append(replica)
                    replicas.append((replica, metrics))
                for _, metrics in replicas:
                    _wait_metrics(metrics)
                members = [proc.pid for proc in etcd.procs if proc is not None]
                cpu = _cpu_over([r.pid for r, _ in replicas] + members, seconds)
                leads = [scrape(f"http://127.0.0.1:{m}/metrics").get(
                    "tensorlights_controller_leader", 0.0) for _, m in replicas]  # fmt: skip
            finally:  # the replicas first: without etcd they would warn as they stop
                for replica, _ in replicas:
                    replica.terminate()
                    replica.wait(15)
        for index, share in enumerate(cpu[:3]):
            print(f"  replica {index} ({'leader' if leads[index] else 'follower'}): {share:.2f}%")
        for index, share in enumerate(cpu[3:]):
            print(f"  etcd member {index}: {share:.2f}%")
        print(f"  three replicas and etcd together: {sum(cpu):.2f}%")
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
                process.wait(15)
        shutil.rmtree(work, ignore_errors=True)


def _wait_metrics(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            scrape(f"http://127.0.0.1:{port}/metrics")
            return
        time.sleep(0.2)
    raise RuntimeError("the controller did not come up")


def _cpu_over(pids: list[int], seconds: float) -> list[float]:
    """Each process's CPU over the next `seconds`, in % of one core."""
    before = [proc_cpu_s(pid) for pid in pids]
    time.sleep(seconds)
    return [(proc_cpu_s(pid) - b) / seconds * 100 for pid, b in zip(pids, before, strict=True)]


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


@dataclass
class Run:
    """What the simulated agents measured."""

    start_at: float
    every_second: bool
    latencies: list[tuple[float, float]] = field(default_factory=list)
    """(seconds into the run, report latency)"""
    propagation: list[float] = field(default_factory=list)
    counters: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    """Reports that failed (the agent stopped there), by status and time into the run."""
    churning: bool = False


async def simulated_agent(index: int, target: str, pki: Path, seconds: float, run: Run) -> None:
    host = f"sim{index:05d}"
    credentials = grpc.ssl_channel_credentials(
        (pki / "ca.pem").read_bytes(),
        (pki / f"{host}.key").read_bytes(),
        (pki / f"{host}.pem").read_bytes(),
    )
    # Registrations ramp up (a real restart's agents come back over their 0.5-3 s backoff);
    # all at once, TLS handshakes queue past the controller's handshake_timeout.
    await asyncio.sleep(index / REGISTER_RATE)
    async with grpc.aio.secure_channel(target, credentials) as channel:
        register = channel.unary_unary("/tensorlights.rpc.v1.AgentLink/Register")
        report = channel.unary_unary("/tensorlights.rpc.v1.AgentLink/Report")
        watch = channel.unary_stream("/tensorlights.rpc.v1.AgentLink/WatchPlan")
        request = pb.RegisterRequest(
            host=host, agent_incarnation=time.time_ns(), agent_version="bench",
            interfaces=[pb.Interface(name="eth0", link_rate_bps=10**10)], fallback_policy="rotate",
        )  # fmt: skip
        reply = pb.RegisterReply.FromString(await register(request.SerializeToString(), timeout=60))
        stream = watch(pb.WatchPlanRequest(session=reply.session).SerializeToString())
        changed_at: list[float] = []

        async def plans() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                async for _ in stream:
                    run.counters["plans"] += 1
                    if changed_at:
                        run.propagation.append(time.monotonic() - changed_at.pop())

        reader = asyncio.create_task(plans())
        rng = random.Random(index)
        jobs = [  # two distinct jobs (one twice is a malformed report: INVALID_ARGUMENT)
            pb.PsJob(job=f"job/{drawn}", ports=[2000 + i, 3000 + i], processes=1,
                     connections=16)
            for i, drawn in enumerate(rng.sample(range(1000), 2))
        ]  # fmt: skip
        await asyncio.sleep(max(0.0, run.start_at - time.monotonic()) + rng.random())
        seq = 0
        end = run.start_at + seconds
        heartbeat_s = 1.0 if run.every_second else reply.heartbeat_interval_ms / 1000 or 1.0
        news = asyncio.Event()
        if run.churning:
            agents_news[index] = news
        next_beat = time.monotonic()
        while time.monotonic() < end:
            if news.is_set():  # a job started or stopped here
                news.clear()
                if len(jobs) > 1 and rng.random() < 0.5:
                    jobs.pop(rng.randrange(len(jobs)))
                else:
                    port = 4000 + seq
                    jobs.append(pb.PsJob(job=f"new/{index}/{seq}", ports=[port], processes=1))
                changed_at[:] = [time.monotonic()]
            seq += 1
            message = pb.AgentReport(session=reply.session, seq=seq, jobs=jobs, mode="plan")
            sent = time.monotonic()
            try:
                raw = await report(message.SerializeToString(), timeout=60)
            except grpc.aio.AioRpcError as exc:  # counted, and this agent stops
                run.failures[f"{exc.code().name} at {sent - run.start_at:.0f} s"] += 1
                break
            answer = pb.ReportReply.FromString(raw)
            run.latencies.append((sent - run.start_at, time.monotonic() - sent))
            run.counters["reports"] += 1
            run.counters["renewals"] += answer.lease_ms > 0
            next_beat = sent + heartbeat_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    news.wait(), max(0.0, min(next_beat, end) - time.monotonic())
                )
        stream.cancel()
        reader.cancel()


REGISTER_RATE = 200.0
"""Simulated agents registering per second."""


def settle_s(count: int) -> float:
    """When every simulated agent has registered: the measured window starts."""
    return count / REGISTER_RATE + 10


agents_news: dict[int, asyncio.Event] = {}
"""Each agent's news flag, for the churn (one process: a module dict)."""


async def churn(rate: float, run: Run, seconds: float) -> None:
    await asyncio.sleep(max(0.0, run.start_at - time.monotonic()) + 2)
    rng = random.Random(7)
    end = run.start_at + seconds - 2
    while time.monotonic() < end and agents_news:
        agents_news[rng.choice(list(agents_news))].set()
        run.counters["churn"] += 1
        await asyncio.sleep(rng.expovariate(rate))


async def run_agents(
    count: int, target: str, pki: Path, seconds: float, every_second: bool, rate: float
) -> Run:
    run = Run(time.monotonic() + settle_s(count), every_second)  # everyone registers first
    run.churning = rate > 0
    tasks = [simulated_agent(i, target, pki, seconds, run) for i in range(count)]
    if rate > 0:
        tasks.append(churn(rate, run, seconds))
    await asyncio.gather(*tasks)
    return run


def bench_agents(
    count: int, seconds: float, every_second: bool, rate: float, heartbeat: str
) -> None:
    # One descriptor per connection on each side (and the controller inherits the limit).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = Path(tempfile.mkdtemp(prefix="tl-bench-ctl-"))
    try:
        pki = work / "pki"
        agents = [arg for i in range(count) for arg in ("--agent", f"sim{i:05d}")]
        subprocess.run(
            [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), str(pki), "--controller",
             "127.0.0.1", *agents], check=True, capture_output=True,
        )  # fmt: skip
        port = free_port()
        controller, metrics_port = _controller(
            work, pki, port, "--policy", "pack", "--heartbeat-interval", heartbeat
        )
        try:
            deadline = time.monotonic() + 20
            while not (work / "ctl.sock").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            started = asyncio.run(_timed(count, f"127.0.0.1:{port}", pki, seconds, every_second,
                                         rate, controller.pid))  # fmt: skip
            run, cpu, wall = started
            rss = proc_rss_mib(controller.pid)
            samples = scrape(f"http://127.0.0.1:{metrics_port}/metrics")
        finally:
            controller.terminate()
            controller.wait(15)
        mode = (
            "a report every second"
            if every_second
            else f"news at once, heartbeats every {heartbeat}"
        )
        print(f"agents: {count} simulated agents (mTLS, one connection each), {mode}, "
              f"{seconds:.0f} s, churn {rate:g} job starts/stops per second")  # fmt: skip
        print(
            f"  reports {run.counters['reports']} ({run.counters['reports'] / seconds:.0f}/s), "
            f"plans received {run.counters['plans']} ({run.counters['renewals']} renewals by "
            f"replies), churn events {run.counters['churn']}"
        )
        if run.failures:
            print(f"  FAILED reports (each stopped its agent): {dict(run.failures)}")
        steady = sorted(lat for at, lat in run.latencies if at >= 0)
        if steady:
            print(
                f"  report latency p50 {_pct(steady, 0.5):6.1f} ms  "
                f"p99 {_pct(steady, 0.99):6.1f} ms"
            )
        if run.propagation:
            spread = sorted(run.propagation)
            print(
                f"  membership change -> the agent's new plan: p50 {_pct(spread, 0.5):6.1f} ms  "
                f"p99 {_pct(spread, 0.99):6.1f} ms ({len(spread)} changes)"
            )
        print(f"  controller CPU {cpu / wall * 100:.0f}% of one core over the measured window, "
              f"RSS {rss:.0f} MiB")  # fmt: skip
        handled = histogram(samples, "tensorlights_controller_report_seconds")
        sent = {
            why: samples.get(f'tensorlights_controller_plans_sent_total{{why="{why}"}}', 0.0)
            for why in ("changed", "lease")
        }
        print(
            f"  in the controller (every report, registration included): report handling "
            f"p50 <= {bucket_quantile(handled, 0.5) * 1000:g} ms, "
            f"p99 <= {bucket_quantile(handled, 0.99) * 1000:g} ms; plans sent: "
            f"{sent['changed']:.0f} changed, {sent['lease']:.0f} resent for the lease"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _timed(
    count: int, target: str, pki: Path, seconds: float, every_second: bool, rate: float, pid: int
) -> tuple[Run, float, float]:
    """The run, and the controller's CPU seconds and the wall seconds of its measured window
    (after every agent registered)."""
    task = asyncio.create_task(run_agents(count, target, pki, seconds, every_second, rate))
    await asyncio.sleep(0)
    while not agents_news and rate > 0 and not task.done():
        await asyncio.sleep(0.1)
    await asyncio.sleep(settle_s(count) + 1)  # registration done (start_at)
    cpu_before, wall_before = proc_cpu_s(pid), time.monotonic()
    run = await task
    return run, proc_cpu_s(pid) - cpu_before, time.monotonic() - wall_before


def scrape(url: str) -> dict[str, float]:
    """The controller's metrics, sample name (with labels) -> value."""
    with urllib.request.urlopen(url, timeout=10) as page:
        lines = page.read().decode().splitlines()
    return {
        name: float(value)
        for name, value in (line.rsplit(" ", 1) for line in lines if line and line[0] != "#")
    }


def histogram(samples: dict[str, float], name: str) -> list[tuple[float, float]]:
    """A Prometheus histogram's cumulative buckets: (upper bound, count), ascending."""
    buckets = []
    for key, count in samples.items():
        if key.startswith(f'{name}_bucket{{le="'):
            bound = key.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(bound), count))
    return sorted(buckets)


def bucket_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """The upper bound of the bucket holding quantile `q` (what a histogram can say)."""
    total = buckets[-1][1] if buckets else 0.0
    return next((bound for bound, count in buckets if count >= q * total), float("nan"))


def _pct(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    plan = sub.add_parser("plan")
    plan.add_argument("--hosts", type=int, default=10_000)
    plan.add_argument("--jobs", type=int, default=5_000)
    plan.add_argument("--repeat", type=int, default=5)
    replan = sub.add_parser("replan")
    replan.add_argument("--hosts", type=int, default=10_000)
    replan.add_argument("--jobs", type=int, default=5_000)
    replan.add_argument("--repeat", type=int, default=5)
    ha = sub.add_parser("ha")
    ha.add_argument("--seconds", type=float, default=60)
    agents = sub.add_parser("agents")
    agents.add_argument("--agents", type=int, default=500)
    agents.add_argument("--seconds", type=float, default=30)
    agents.add_argument("--every-second", action="store_true", help="report every second")
    agents.add_argument("--churn", type=float, default=0.0, help="job starts/stops per second")
    agents.add_argument(
        "--heartbeat", default="10s", help="the controller's heartbeat_interval (default 10s)"
    )
    args = parser.parse_args()
    if args.what == "plan":
        bench_plan(args.hosts, args.jobs, args.repeat)
    elif args.what == "ha":
        bench_ha(args.seconds)
    elif args.what == "replan":
        bench_replan(args.hosts, args.jobs, args.repeat)
    else:
        bench_agents(args.agents, args.seconds, args.every_second, args.churn, args.heartbeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
