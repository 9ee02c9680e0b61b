"""The datapath demo: two PS-like jobs share one 200 Mbit host link, first under plain FIFO,
then with TensorLights giving one job at a time the green light and rotating it.

    python -m tensorlights.demo [--rate 200mbit] [--phase-seconds 6] [--rotate-every 2]

Runs in its own network namespaces and removes them on exit. Needs root. Until discovery and
the agent land, the demo tells the datapath the PS ports itself (5001 and 5002).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tensorlights.datapath import open_datapath
from tensorlights.model import DatapathSpec, JobShaping
from tensorlights.testbed import netns, traffic
from tensorlights.units import parse_duration, parse_rate

JOBS = {"job-a": 5001, "job-b": 5002}


def _run_phase(pair: netns.HostPair, seconds: float) -> dict[str, list[float]]:
    targets = [f"{pair.a.ipv4}:{port}" for port in JOBS.values()]
    command = traffic.sink_command(targets, seconds, interval=1)
    out = subprocess.run(pair.b.exec_args(*command), capture_output=True, text=True, check=True)
    flows = json.loads(out.stdout)["flows"]
    return {
        job: [b * 8 / 1e6 for b in flows[f"{pair.a.ipv4}:{port}"]] for job, port in JOBS.items()
    }


def _table(title: str, mbit: dict[str, list[float]], green: list[str] | None) -> Table:
    table = Table(title=title)
    table.add_column("second")
    for job in JOBS:
        table.add_column(f"{job} Mbit/s", justify="right")
    if green is not None:
        table.add_column("green")
    for second in range(len(next(iter(mbit.values())))):
        row = [str(second + 1)] + [f"{mbit[job][second]:.0f}" for job in JOBS]
        if green is not None:
            row.append(green[second] if second < len(green) else "")
        table.add_row(*row)
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", default="200mbit")
    parser.add_argument("--phase-seconds", type=int, default=6)
    parser.add_argument("--rotate-every", default="2s")
    args = parser.parse_args(argv)
    rate = parse_rate(args.rate)
    rotate_every = parse_duration(args.rotate_every)
    console = Console()
    console.print(f"[bold]TensorLights datapath demo[/]: 2 jobs, one {args.rate} host link")
    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as state:
        server = traffic.start_server(pair.a.ns, list(JOBS.values()))
        try:
            # Baseline: every job in the same band, i.e. FIFO between the two PS flows.
            datapath = open_datapath("htb", Path(state), netns=pair.a.ns)
            same_band = DatapathSpec(
                "veth-a",
                rate,
                tuple(JobShaping(job, 1, frozenset({port})) for job, port in JOBS.items()),
            )
            datapath.apply(same_band)
            fifo = _run_phase(pair, args.phase_seconds)
            console.print(_table("Without TensorLights: both jobs share the link", fifo, None))

            order = list(JOBS)
            green_log: list[str] = []
            stop = threading.Event()

            def rotate() -> None:
                index = 0
                while not stop.is_set():
                    green = order[index % len(order)]
                    datapath.rotate(
                        DatapathSpec(
                            "veth-a",
                            rate,
                            tuple(
                                JobShaping(job, 0 if job == green else 1, frozenset({port}))
                                for job, port in JOBS.items()
                            ),
                        )
                    )
                    green_log.extend([green] * max(1, round(rotate_every)))
                    index += 1
                    stop.wait(rotate_every)

            rotator = threading.Thread(target=rotate, daemon=True)
            rotator.start()
            lights = _run_phase(pair, args.phase_seconds)
            stop.set()
            rotator.join()
            console.print(
                _table(
                    f"With TensorLights: green light rotates every {args.rotate_every}",
                    lights,
                    green_log,
                )
            )
            console.print(datapath.cleanup("veth-a"))
        finally:
            server.kill()
            server.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
