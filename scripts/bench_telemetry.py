#!/usr/bin/env python3
"""Straggler telemetry accuracy: the real agent's measured spread and iteration period against
the workload's own log of when each worker had its parameters.

Two PS jobs in one namespace, 3 workers each in another, pushing --model-bytes through veth-a
shaped at 200 Mbit: synthetic (TF_CONFIG) or a real framework's (--workload torch-gloo,
torch-rpc, tf-ps: launched as their launchers launch them, testbed/workloads.py); the agent
runs with each of --policies. Per policy and job: iterations in the log, matched, share of
iterations whose spread / period is within 10% or 10 ms of the truth, and the median absolute
errors. --compute takes a list: one table block per compute time. --cpu-hogs N runs N busy
loops beside (a GPU host whose data loaders keep every core busy), --agent-nice the agent at
that niceness (the systemd unit's Nice=). Needs root.

    .venv/bin/python scripts/bench_telemetry.py [--iterations 30] [--model-bytes 3000000]
    .venv/bin/python scripts/bench_telemetry.py --workload torch-gloo --compute 0.02,0.15,1
    .venv/bin/python scripts/bench_telemetry.py --workload torch-gloo --cpu-hogs 4 --agent-nice -10
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tensorlights.agent.status import AgentStatus, read_status
from tensorlights.errors import TransientError
from tensorlights.telemetry.accuracy import Agreement, compare
from tensorlights.testbed import netns
from tensorlights.testbed.psjob import RunningJob, collect_iterations
from tensorlights.testbed.socket_holder import clean_env
from tensorlights.testbed.workloads import JobShape, Workload, start_workload


def status(sock: Path) -> AgentStatus | None:
    try:
        return read_status(sock)
    except (TransientError, OSError, json.JSONDecodeError):
        return None


def run_policy(
    policy: str, compute: float, args: argparse.Namespace
) -> list[tuple[str, Agreement]]:
    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as workdir:
        sock = Path(workdir) / "agent.sock"
        command = [
            sys.executable, "-m", "tensorlights.cli.agent", "run", "--config",
            str(Path(workdir) / "none.toml"), "--interface", "veth-a", "--link-rate", "200mbit",
            "--policy", policy, "--interval", "1s", "--standalone", "--trust", "any",
            "--status-socket", str(sock), "--state-dir", str(Path(workdir) / "state"),
            "--log-level", "warning",
        ]  # fmt: skip
        (Path(workdir) / "none.toml").write_text(
            f'[telemetry]\nsample_interval = "{args.sample_interval}"\n'
            "[discovery]\ntorch_ps_ranks = [0]\n"  # torchrun's rank 0 is the PS
        )
        if policy == "fifo":  # nothing shapes the link otherwise: a plain 200 Mbit bottleneck
            netns.fifo_bottleneck(pair.a.ns, "veth-a", "200mbit")
        niceness = ["nice", "-n", str(args.agent_nice)] if args.agent_nice else []
        agent = subprocess.Popen([*niceness, *pair.a.exec_args(*command)], env=clean_env())
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.cpu_hogs)
        ]
        jobs: dict[str, RunningJob] = {}
        try:
            end = time.monotonic() + 20
            while status(sock) is None and time.monotonic() < end:
                time.sleep(0.1)
            workload = Workload(args.workload)
            start_at = time.monotonic() + workload.start_up_s
            for tag in ("a", "b"):
                job = start_workload(
                    workload, f"{tag}-{policy}-{compute}", pair.a, [pair.b],
                    JobShape(3, args.model_bytes, args.iterations, compute),
                    start_at if workload.start_up_s else None,
                )  # fmt: skip
                jobs[job.job] = job
            truths, measured = collect_iterations(lambda: status(sock), jobs)
        finally:
            for process in hogs:
                process.kill()
                process.wait()
            for running in jobs.values():
                running.kill()
            agent.terminate()
            agent.wait(20)
    results = []
    for job, received in truths.items():
        results.append((job, compare(received, measured[job])))
        if args.verbose:
            for k, times in enumerate(zip(*received, strict=False)):
                near = min(measured[job], key=lambda m: abs(m.last_done - max(times)), default=None)
                print(
                    f"  {job} #{k}: truth last {max(times):.3f} spread "
                    f"{(max(times) - min(times)) * 1e3:.1f} ms; measured "
                    + (
                        f"last {near.last_done:.3f} spread {near.spread * 1e3:.1f} ms"
                        if near
                        else "-"
                    )
                )
    return results


def median_ms(values: tuple[float, ...]) -> str:
    return f"{statistics.median(abs(v) for v in values) * 1e3:.1f}" if values else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--model-bytes", type=int, default=3_000_000)
    parser.add_argument("--compute", default="0.25", help="seconds, a comma-separated list")
    parser.add_argument("--workload", default="synthetic", choices=[w.value for w in Workload])
    parser.add_argument("--policies", default="fifo,rotate")
    parser.add_argument("--sample-interval", default="100ms")
    parser.add_argument("--verbose", action="store_true", help="every iteration, side by side")
    parser.add_argument("--cpu-hogs", type=int, default=0, help="busy loops beside, at nice 0")
    parser.add_argument("--agent-nice", type=int, default=0, help="the agent's niceness")
    args = parser.parse_args()
    print(
        f"{args.workload}, {args.model_bytes} B model, 3 workers per job, "
        f"{args.cpu_hogs} busy loops beside, the agent at nice {args.agent_nice}\n\n"
        "| policy | compute | job | iterations | matched | spread within 10%/10 ms | period within"
        " 10%/10 ms | median abs error spread / period ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for compute in [float(c) for c in args.compute.split(",")]:
        for policy in args.policies.split(","):
            for job, got in run_policy(policy, compute, args):
                errors = f"{median_ms(got.spread_errors)} / {median_ms(got.period_errors)}"
                print(
                    f"| {policy} | {compute * 1e3:.0f} ms | {job} | {got.iterations} | "
                    f"{got.matched} | {got.spread_share:.0%} | {got.period_share:.0%} | "
                    f"{errors} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
