#!/usr/bin/env python3
"""DSCP mark rotation cost: one nftables transaction through libnftables, in a namespace.

For 1, 8, 16 and 64 jobs (2 PS ports each) it times a rotation where the green light moves
(2 job chains rewritten) and one where every job changes band (all chains), next to the cost
of the same transaction through a spawned `nft -f` (what the prototype-style shell-out would
pay). Needs root. Prints a Markdown table.

    .venv/bin/python scripts/bench_dscp.py [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tensorlights.datapath.dscp import DscpMarker
from tensorlights.datapath.nft import Nft
from tensorlights.policy.dscp_plan import (
    DEFAULT_BAND_DSCP,
    DscpLayout,
    chain_name,
    render_rotation,
)
from tensorlights.testbed import netns


def layout(jobs: int, green: int, shift: int) -> DscpLayout:
    chain_dscp = {}
    port_chain = {}
    for job in range(jobs):
        band = 0 if job == green else min(1 + (job + shift) % 6, 6)
        chain_dscp[chain_name(job + 1)] = DEFAULT_BAND_DSCP[band]
        port_chain[5001 + job] = port_chain[20001 + job] = chain_name(job + 1)
    return DscpLayout("veth-a", chain_dscp, port_chain)


def millis(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1e3:.3f} / {p99 * 1e3:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    print(
        "| jobs | green moves: median / p99 ms | every job moves: median / p99 ms"
        " | same all-move transaction via `nft -f` spawn: median ms |"
    )
    print("|---:|---:|---:|---:|")
    with netns.host_pair() as pair, tempfile.TemporaryDirectory() as workdir:
        marker = DscpMarker(Nft(pair.a.ns))
        for jobs in (1, 8, 16, 64):
            marker.apply(layout(jobs, 0, 0))
            green_moves, all_move = [], []
            for i in range(args.rounds):
                start = time.perf_counter()
                marker.rotate(layout(jobs, (i + 1) % jobs, 0))
                green_moves.append(time.perf_counter() - start)
            for i in range(args.rounds):
                start = time.perf_counter()
                marker.rotate(layout(jobs, i % jobs, i + 1))
                all_move.append(time.perf_counter() - start)
            spawned = []
            script = Path(workdir) / "rotation.nft"
            for i in range(20):
                old, new = layout(jobs, i % jobs, i), layout(jobs, (i + 1) % jobs, i + 1)
                script.write_text(render_rotation(old, new) or "")
                marker.apply(old)
                start = time.perf_counter()
                subprocess.run(pair.a.exec_args("nft", "-f", str(script)), check=True)
                spawned.append(time.perf_counter() - start)
            print(
                f"| {jobs} | {millis(green_moves)} | {millis(all_move)}"
                f" | {statistics.median(spawned) * 1e3:.1f} |",
                flush=True,
            )
        marker.cleanup()
        marker.close()


if __name__ == "__main__":
    main()
