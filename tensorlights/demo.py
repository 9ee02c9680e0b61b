"""The demo: four synthetic parameter-server jobs share one host's 200 Mbit link, first under
plain FIFO, then with TensorLights: the controller (on the worker host) and the agent on the
PS host, which finds the PS processes by their TF_CONFIG, reports them, follows the
controller's rotation plan (mutual TLS, a throw-away development CA) and shapes the link.
Prints the green light as `tlctl rotations` sees it, job completion times and median
straggler spread for both runs from the workers' own logs, and the spread the agent's
telemetry measured from the host.

    python -m tensorlights.demo [--rate 200mbit] [--policy pack|rotate|static] [--interval 2s]

Runs in network namespaces of its own (PS host, worker host) and removes them on exit, as
well as every process it started. Needs root. Takes about a minute.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tensorlights.agent.status import read_status
from tensorlights.devca import make_pki
from tensorlights.errors import TensorLightsError, TransientError
from tensorlights.model import Mode
from tensorlights.rpc.operator_client import OperatorClient
from tensorlights.testbed import netns
from tensorlights.testbed.daemons import controller_command, controller_section
from tensorlights.testbed.psjob import RunningJob, start_job, tf_job_id, tf_launcher_env
from tensorlights.testbed.socket_holder import clean_env

JOBS = ("a", "b", "c", "d")
"""Four jobs at 20 ms of compute, nearly link-bound: 10 runs on 2026-11-26 gave 10.8-17.9%
lower average JCT with TensorLights in 10 (TensorLights 10.2-10.4 s, FIFO 11.5-12.6 s). What
limits it is FIFO's luck, not ours: now and then FIFO runs the jobs two by two, close to an
order. The closer to link-bound, the less such a pairing gains against one job at a time:
at 150 ms, 9 runs in 10 gave 12-18% and one 2%; at 50 ms, 10-27% in 10 (the lowest only
about 10%), and with 3 workers a job 5.4-22% in 7. On 2026-12-03, 20 runs: 8.6-24.4% and
9.0-16.3%, under 10% in 2 (TensorLights 10.1-10.4 s, FIFO 11.5-12.4 s in the second 10);
later that day 11.2-24.6% in 10 of 10; on 2026-12-04, 11.4-20.8% in 10 of 10 (TensorLights
9.9-10.1 s, FIFO 11.3-12.7 s)."""
PS_HOST = "ps-host"
CONTROLLER_PORT = 9740


def _run_jobs(
    pair: netns.HostPair,
    args: argparse.Namespace,
    console: Console,
    client: OperatorClient | None,
) -> dict[str, dict[str, float]]:
    """Start the jobs together, wait for them; per job: JCT and median straggler spread."""
    jobs: dict[str, RunningJob] = {}
    started = time.monotonic()
    try:
        for tag in JOBS:
            jobs[tag] = start_job(
                pair.a.exec_args(), [pair.b.exec_args()], pair.a.ipv4,
                clean_env(tf_launcher_env(tag, args.workers)), args.workers, args.model_bytes,
                args.iterations, args.compute,
            )  # fmt: skip
        last_green = None
        while any(job.ps.poll() is None for job in jobs.values()):
            if client is not None:
                last_green = _show_green(client, console, started, last_green, args.workers)
            time.sleep(0.2)
        results = {}
        for tag, job in jobs.items():
            received = job.received(timeout=60)
            ends = [max(times) for times in zip(*received, strict=False)]
            spreads = [max(times) - min(times) for times in zip(*received, strict=False)]
            results[tag] = {"jct": ends[-1] - started, "spread": statistics.median(spreads)}
        return results
    finally:
        for job in jobs.values():
            job.kill()


def _show_green(
    client: OperatorClient, console: Console, started: float, last: str | None, workers: int
) -> str | None:
    """Print the PS host's green job when it changes, as the controller reports it."""
    try:
        hosts = client.rotations(PS_HOST)["hosts"]
    except TensorLightsError:
        return last
    green = hosts[0]["green"] if hosts else None
    if green and green != last:
        tags = _tag_of_jobs(workers)
        nxt = hosts[0]["next"]
        console.print(
            f"  {time.monotonic() - started:5.1f} s  green light -> job {tags.get(green, green)}"
            f"  (tlctl rotations: next {tags.get(nxt, nxt) or '-'})"
        )
    return green if green else last


def _tag_of_jobs(workers: int) -> dict[str, str]:
    """The agent names jobs by their TF_CONFIG (tf/<hash>); map them back to a, b, c."""
    return {tf_job_id(tag, workers): tag for tag in JOBS}


def _agent_spreads(sock: Path, workers: int) -> dict[str, float]:
    """Median spread per job as the agent's own telemetry measured it."""
    try:
        status = read_status(sock)
    except (TransientError, OSError, json.JSONDecodeError):
        return {}
    if status is None or status.telemetry is None:
        return {}
    tags = _tag_of_jobs(workers)
    return {
        tags[job]: statistics.median(item.spread_s for item in items)
        for job, items in status.telemetry.iterations.items()
        if job in tags and items
    }


def _wait(done: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if done():
            return
        if proc.poll() is not None:
            raise RuntimeError(f"the {what} exited with {proc.returncode}")
        time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the {what} did not come up within 30 s")


def _start_controller(
    pair: netns.HostPair, workdir: Path, args: argparse.Namespace
) -> subprocess.Popen[str]:
    """The controller on the worker host (it could be anywhere the agents can reach)."""
    (workdir / "controller.toml").write_text("")
    pki = workdir / "pki"
    command = controller_command(
        workdir / "controller.toml", f"{pair.b.ipv4}:{CONTROLLER_PORT}", workdir / "tlctl.sock",
        workdir / "ctl-state", pki, "--slot", args.interval,
        "--policy", "pack" if args.policy == "pack" else "rotate", "--log-level", "error",
    )  # fmt: skip
    controller = subprocess.Popen(pair.b.exec_args(*command), env=clean_env(), text=True)
    _wait(lambda: (workdir / "tlctl.sock").exists(), controller, "controller")
    return controller


def _start_agent(
    pair: netns.HostPair, workdir: Path, args: argparse.Namespace
) -> subprocess.Popen[str]:
    pki = workdir / "pki"
    # The emulated host has one tenant (root runs every job): believe the jobs' own variables.
    (workdir / "agent.toml").write_text(
        'trust = "any"\n' + controller_section(f"{pair.b.ipv4}:{CONTROLLER_PORT}", pki, PS_HOST)
    )
    command = [
        sys.executable, "-m", "tensorlights.cli.agent", "run", "--config",
        str(workdir / "agent.toml"), "--interface", "veth-a", "--link-rate", args.rate,
        "--policy", args.policy, "--interval", args.interval,
        "--status-socket", str(workdir / "agent.sock"), "--state-dir", str(workdir / "state"),
        "--log-level", "error",
    ]  # fmt: skip
    agent = subprocess.Popen(pair.a.exec_args(*command), env=clean_env(), text=True)

    def following() -> bool:
        try:
            status = read_status(workdir / "agent.sock")
            return status is not None and status.mode is Mode.PLAN
        except (TransientError, OSError, json.JSONDecodeError):
            return False

    _wait(following, agent, "agent")
    return agent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", default="200mbit", help="the PS host's link (default 200mbit)")
    parser.add_argument(
        "--policy",
        default="pack",
        choices=["static", "rotate", "pack"],
        help="pack: the controller ranks jobs by measured demand (and the agent falls back to "
        "pack); otherwise the controller rotates and the agent falls back to this policy",
    )
    parser.add_argument("--interval", default="2s", help="rotation slot (default 2s)")
    parser.add_argument("--iterations", type=int, default=15)
    parser.add_argument("--workers", type=int, default=2, help="workers per job (default 2)")
    parser.add_argument("--model-bytes", type=int, default=3_000_000)
    parser.add_argument(
        "--compute", type=float, default=0.02, help="seconds per iteration (default 0.02)"
    )
    args = parser.parse_args(argv)
    console = Console()

    console.print(
        f"[bold]TensorLights demo[/bold]: {len(JOBS)} PS jobs x {args.workers} workers, "
        f"{args.model_bytes / 1e6:.0f} MB model, {args.compute * 1e3:.0f} ms compute, "
        f"{args.iterations} iterations, one {args.rate} PS host link"
    )
    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        console.print("\n[bold]1. FIFO[/bold] (no TensorLights: the link interleaves every push)")
        netns.fifo_bottleneck(pair.a.ns, "veth-a", args.rate)
        fifo = _run_jobs(pair, args, console, None)
        netns.run(["tc", "-n", pair.a.ns, "qdisc", "del", "dev", "veth-a", "root"])

        plan = (
            "ranking jobs by the demand the agent measures"
            if args.policy == "pack"
            else f"rotating the light every {args.interval}"
        )
        console.print(
            f"\n[bold]2. TensorLights[/bold] (controller on the worker host, {plan}; agent "
            f"on the PS host, --policy {args.policy} if the controller is lost; it finds the "
            "PS processes by their TF_CONFIG)"
        )
        make_pki(workdir / "pki", [pair.b.ipv4], [PS_HOST], operator=True)
        controller = _start_controller(pair, workdir, args)
        agent = None
        try:
            agent = _start_agent(pair, workdir, args)
            client = OperatorClient(socket_path=workdir / "tlctl.sock")
            lights = _run_jobs(pair, args, console, client)
            client.close()
            time.sleep(1.0)  # the final pushes close once the connections are gone
            measured = _agent_spreads(workdir / "agent.sock", args.workers)
        finally:
            for proc in (agent, controller):
                if proc is not None:
                    proc.terminate()
                    proc.wait(20)

    table = Table(
        title="Job completion time (JCT) and median straggler spread (workers' logs; agent)"
    )
    columns = ("job", "FIFO JCT s", "TL JCT s", "FIFO spread ms", "TL spread ms")
    for column in (*columns, "TL spread ms (agent)"):
        table.add_column(column, justify="right")
    for tag in JOBS:
        table.add_row(
            tag,
            f"{fifo[tag]['jct']:.1f}",
            f"{lights[tag]['jct']:.1f}",
            f"{fifo[tag]['spread'] * 1e3:.0f}",
            f"{lights[tag]['spread'] * 1e3:.0f}",
            f"{measured[tag] * 1e3:.0f}" if tag in measured else "-",
        )
    avg_fifo = statistics.mean(r["jct"] for r in fifo.values())
    avg_lights = statistics.mean(r["jct"] for r in lights.values())
    table.add_row(
        "average",
        f"{avg_fifo:.1f}",
        f"{avg_lights:.1f}",
        f"{statistics.mean(r['spread'] for r in fifo.values()) * 1e3:.0f}",
        f"{statistics.mean(r['spread'] for r in lights.values()) * 1e3:.0f}",
        "",
    )
    console.print()
    console.print(table)
    change = (avg_lights - avg_fifo) / avg_fifo
    console.print(f"average JCT with TensorLights: {change:+.1%} vs FIFO")
    console.print("namespaces and processes removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
