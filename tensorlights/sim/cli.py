"""python -m tensorlights.sim: the flow-level simulator's commands."""

from __future__ import annotations

from pathlib import Path

import click

from tensorlights.sim.calibrate import Measured, baselines, calibration, fit_tcp
from tensorlights.sim.report import (
    GOAL,
    baselines_markdown,
    calibration_markdown,
    plot_calibration,
)

CALIBRATION_SOURCES = ("results/bench", "results/bench-real", "results/bench-multihost",
                       "results/bench-long", "results/bench-collective")  # fmt: skip
"""The benchmark's results on the 2-core VM (bench-gpu ran on another machine)."""
FIT_SOURCE = "results/bench"
"""Where the TCP ramp is fitted (scenarios a-f, FIFO and fair)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """A flow-level simulator of PS and all-reduce jobs on shared links, driving TensorLights'
    real policy code (agents' bands, pack, the controller's registry and planner) on a
    simulated clock."""


@main.command()
@click.option(
    "--results", "sources", multiple=True, type=click.Path(path_type=Path, file_okay=False),
    default=CALIBRATION_SOURCES, show_default=True,
    help="Benchmark results folders (meta.json + trials.jsonl) to simulate; repeatable.",
)  # fmt: skip
@click.option(
    "--fit", type=click.Path(path_type=Path, file_okay=False), default=FIT_SOURCE,
    show_default=True, help="The folder whose FIFO and fair runs of a-f fit the TCP ramp.",
)  # fmt: skip
@click.option(
    "--out", type=click.Path(path_type=Path), default="results/sim-calibration",
    show_default=True, help="Where report.md (and calibration.png) go.",
)  # fmt: skip
@click.option("--no-plots", is_flag=True, help="Markdown only (no matplotlib).")
def calibrate(sources: tuple[Path, ...], fit: Path, out: Path, no_plots: bool) -> None:
    """Simulate every scenario and policy of the benchmark's results and compare each
    average JCT with the measured median (goal: within 10%, rankings kept); then the
    synthetic scenarios under CASSINI-style and Crux-style baselines too."""
    for folder in (fit, *sources):
        if not (folder / "meta.json").exists() or not (folder / "trials.jsonl").exists():
            raise click.UsageError(f"{folder}: no meta.json and trials.jsonl (a bench --out)")
    tcp, fit_error = fit_tcp(Measured.load(fit))
    folders = {folder.name: Measured.load(folder) for folder in sources}
    rows = calibration(folders, tcp)
    out.mkdir(parents=True, exist_ok=True)
    text = calibration_markdown(rows, tcp, fit_error, [str(s) for s in sources])
    if not no_plots:
        name = plot_calibration(rows, out)
        text += f"\n![measured against simulated]({name})\n"
    text += "\n" + baselines_markdown(baselines(folders, tcp))
    (out / "report.md").write_text(text)
    within = sum(abs(row.error) <= GOAL for row in rows)
    click.echo(f"TCP ramp: weight {tcp.ramp_weight:g} for {tcp.ramp_s:g} s (fit {fit_error:.1%})")
    click.echo(f"{within} of {len(rows)} rows within {GOAL:.0%} -> {out / 'report.md'}")
