#!/usr/bin/env python3
"""How far the at-scale runs' settled fast-forward is from the exact simulation.

The cluster's day (python -m tensorlights.sim scale) settles jobs that share links at their
measured periods (tensorlights/sim/engine.py: after 8 steady iterations since anything
changed there, or 60 s). This runs smaller days of the same workload generator both ways,
every policy, and prints average JCT, p95 and the share slowed past 2x exact against
settled, with the wall time of each.

    .venv/bin/python scripts/sim_settle_error.py --hosts 60 --jobs 240 --hours 4 --seeds 1,2,3
"""

from __future__ import annotations

import statistics

import click

from tensorlights.sim.scale import POLICIES, ScaleResult, run
from tensorlights.sim.workload import ClusterSpec, generate


def _error(settled: float, exact: float) -> float:
    return (settled - exact) / exact * 100 if exact else 0.0


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--hosts", type=click.IntRange(2), default=60, show_default=True)
@click.option("--jobs", type=click.IntRange(1), default=240, show_default=True)
@click.option("--hours", type=click.FloatRange(0.1), default=4.0, show_default=True,
              help="The simulated day's length (jobs arrive over it).")  # fmt: skip
@click.option("--seeds", default="1,2,3", show_default=True, help="Comma-separated.")
@click.option("--policies", default=",".join(POLICIES), show_default=True)
def main(hosts: int, jobs: int, hours: float, seeds: str, policies: str) -> None:
    chosen = [p.strip() for p in policies.split(",") if p.strip()]
    errors: dict[str, list[float]] = {policy: [] for policy in chosen}
    click.echo(
        "| seed | policy | counted | avg JCT exact | settled | error | p95 error "
        "| slowed > 2x exact / settled | CPU exact / settled | settles |"
    )
    click.echo("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in (int(s) for s in seeds.split(",")):
        workload = generate(ClusterSpec(hosts, jobs, day_s=hours * 3600.0, seed=seed))
        for policy in chosen:
            exact: ScaleResult = run(workload, policy, settle=False)
            settled = run(workload, policy)
            error = _error(settled.avg_jct_s, exact.avg_jct_s)
            errors[policy].append(error)
            click.echo(
                f"| {seed} | {policy} | {exact.counted} | {exact.avg_jct_s:.0f} s "
                f"| {settled.avg_jct_s:.0f} s | {error:+.1f}% "
                f"| {_error(settled.p95_jct_s, exact.p95_jct_s):+.1f}% "
                f"| {exact.slowed_share:.1%} / {settled.slowed_share:.1%} "
                f"| {exact.cpu_s:.0f} / {settled.cpu_s:.0f} s | {settled.settles} |"
            )
    click.echo("\nper policy, average JCT error: mean of |error|, largest")
    for policy, values in errors.items():
        absolute = [abs(v) for v in values]
        click.echo(f"  {policy}: {statistics.fmean(absolute):.1f}%, {max(absolute):.1f}%")


if __name__ == "__main__":
    main()
