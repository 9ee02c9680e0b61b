"""python -m tensorlights.sim: the flow-level simulator's commands."""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import asdict, replace
from pathlib import Path

import click

from tensorlights.bench.results import alone_jct
from tensorlights.bench.scenarios import MAX_ORDER_JOBS, StaticOrder
from tensorlights.bench.scenarios import select as select_scenarios
from tensorlights.errors import ConfigError
from tensorlights.sim.calibrate import (
    SIM_ONLY,
    SIMULATED,
    Measured,
    baselines,
    calibration,
    fit_tcp,
    simulate_jobs,
)
from tensorlights.sim.engine import TcpModel
from tensorlights.sim.report import (
    GOAL,
    baselines_markdown,
    calibration_markdown,
    plot_calibration,
    plot_scale,
    scale_markdown,
)
from tensorlights.sim.scale import (
    POLICIES,
    ScaleResult,
    Task,
    journal_line,
    read_journal,
    run_all,
    workload_of,
)
from tensorlights.sim.workload import ClusterSpec, PsPlacement
from tensorlights.units import parse_rate

CALIBRATION_SOURCES = ("results/bench", "results/bench-real", "results/bench-multihost",
                       "results/bench-long-held", "results/bench-collective")  # fmt: skip
"""The benchmark's results on the 2-core VM (bench-gpu ran on another machine)."""
FIT_SOURCE = "results/bench"
"""Where the TCP ramp is fitted (scenarios a-f, FIFO and fair)."""
FITTED_TCP = TcpModel(ramp_s=0.5, ramp_weight=0.05)
"""The ramp `calibrate` fits on FIT_SOURCE (results/sim-calibration/report.md says so)."""


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


@main.command()
@click.option("--scenarios", "keys", default="all", show_default=True,
              help="The benchmark's scenario keys, e.g. a,r2 (`python -m tensorlights.bench "
              "scenarios` lists them).")  # fmt: skip
@click.option(
    "--policies", default="static,tl-rr-original,pack,pack-iterations", show_default=True,
    help="Of: " + ", ".join((*SIMULATED, *SIM_ONLY)) + ".",
)  # fmt: skip
@click.option(
    "--scale", type=float, default=1.0, show_default=True,
    help="Every job's iterations and arrival offsets times this (bench --scale).",
)  # fmt: skip
@click.option(
    "--results", "sources", multiple=True, type=click.Path(path_type=Path, file_okay=False),
    default=CALIBRATION_SOURCES, show_default=True,
    help="Benchmark results folders whose standalone runs stretch each job profile's traffic.",
)  # fmt: skip
@click.option(
    "--every-order", is_flag=True,
    help="Each scenario once for every order its jobs can be found in (its jobs listed in "
    f"each order, their arrival times kept; up to {MAX_ORDER_JOBS} jobs): on the testbed "
    "discovery finds jobs that start together in an order that varies from run to run, "
    "and a policy starts from it.",
)  # fmt: skip
def scenarios(
    keys: str, policies: str, scale: float, sources: tuple[Path, ...], every_order: bool
) -> None:
    """The benchmark's scenarios simulated (the fitted TCP ramp of results/sim-calibration),
    a line each: every policy's average JCT and, in brackets, the largest slowdown against
    the job's simulated time alone. Seconds where the testbed takes minutes: what a policy
    change does, before the testbed measures it."""
    try:
        chosen = select_scenarios(keys)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from None
    rows = [(scenario.key, scenario) for scenario in chosen]
    if every_order:
        if too_many := [s.key for s in chosen if not StaticOrder.every(len(s.jobs))]:
            raise click.BadParameter(
                f"{', '.join(too_many)}: more than {MAX_ORDER_JOBS} jobs", param_hint="--scenarios"
            )
        rows = []
        for s in chosen:
            for found in StaticOrder.every(len(s.jobs)):
                jobs = tuple(s.jobs[i] for i in found.order)
                rows.append((f"{s.key} ({', '.join(j.name for j in jobs)})", replace(s, jobs=jobs)))
    named = [p.strip() for p in policies.split(",") if p.strip()]
    alone: dict[str, float] = {}
    for folder in sources:
        alone.update(alone_jct(Measured.load(folder).trials))
    meta = Measured.load(Path(FIT_SOURCE)).meta
    click.echo(f"| scenario (x{scale:g}) | " + " | ".join(named) + " |")
    click.echo("|---|" + "---:|" * len(named))
    for name, scenario in rows:
        cells = []
        for policy in named:
            try:
                runs = simulate_jobs(scenario, policy, meta, FITTED_TCP, alone, scale)
            except ValueError as exc:
                raise click.BadParameter(str(exc)) from None
            average = statistics.fmean(jct for jct, _ in runs)
            cells.append(f"{average:.2f} ({max(jct / t for jct, t in runs):.2f})")
        click.echo(f"| {name} | " + " | ".join(cells) + " |")


@main.command()
@click.option("--hosts", type=click.IntRange(2), default=1000, show_default=True)
@click.option("--jobs", type=click.IntRange(1), default=4000, show_default=True,
              help="Jobs arriving over the day.")  # fmt: skip
@click.option("--nic", default="25gbit", show_default=True, help="Each host's NIC egress rate.")
@click.option("--ps-share", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="PS jobs among the multi-GPU ones (the others all-reduce).")  # fmt: skip
@click.option(
    "--ps-placement", type=click.Choice([p.value for p in PsPlacement]), default="pack",
    show_default=True,
    help="PS tasks on the fullest host with room (bin packing) or the emptiest.",
)  # fmt: skip
@click.option("--seed", type=int, default=1, show_default=True)
@click.option(
    "--policies", default=",".join(POLICIES), show_default=True,
    help="Comma-separated, of: " + ", ".join(POLICIES),
)  # fmt: skip
@click.option(
    "--reach", default="0.25,0.5,0.75", show_default=True,
    help="Shares of hosts with an agent to run coordinated pack at (besides all); '' for none.",
)  # fmt: skip
@click.option("--speed/--no-speed", default=True, show_default=True,
              help="Also time each policy over the first simulated hour.")  # fmt: skip
@click.option(
    "--out", type=click.Path(path_type=Path), default="results/sim-scale", show_default=True,
    help="Where report.md, results.json, the plots and the runs' journal (runs.jsonl) go.",
)  # fmt: skip
@click.option(
    "--workers", type=click.IntRange(1), default=1, show_default=True,
    help="Day runs at once, each in a process of its own (up to one per core: the runs are "
    "CPU-bound). The first-hour speed runs always run one at a time.",
)  # fmt: skip
@click.option(
    "--resume", is_flag=True,
    help="Take the runs OUT/runs.jsonl already holds for this workload (each run is written "
    "there as it ends: a day's runs take hours) and run only the others.",
)  # fmt: skip
@click.option("--no-plots", is_flag=True, help="Markdown only (no matplotlib).")
def scale(
    hosts: int, jobs: int, nic: str, ps_share: float, ps_placement: str, seed: int,
    policies: str, reach: str, speed: bool, workers: int, out: Path, resume: bool,
    no_plots: bool,
) -> None:  # fmt: skip
    """A cluster's day (jobs and placements drawn from public traces' distributions, see
    tensorlights/sim/workload.py) under every policy: average and p95 JCT and the share of
    jobs slowed past 2x; coordinated pack with agents on part of the hosts; and how long a
    simulated hour takes."""
    chosen = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = sorted(set(chosen) - set(POLICIES))
    if unknown or not chosen:
        raise click.BadParameter(f"unknown {unknown or policies!r}; of: {', '.join(POLICIES)}")
    try:
        shares = [float(r) for r in reach.split(",") if r.strip()]
        spec = ClusterSpec(hosts, jobs, nic_bps=parse_rate(nic), ps_share=ps_share,
                           ps_placement=PsPlacement(ps_placement), seed=seed)  # fmt: skip
    except (ValueError, ConfigError) as exc:
        raise click.BadParameter(str(exc)) from None
    if any(not 0 <= share < 1 for share in shares):
        raise click.BadParameter("--reach: shares within [0, 1) (all hosts always runs)")
    workload = workload_of(spec)
    click.echo(f"{len(workload.networked)} of {len(workload.jobs)} jobs with network traffic")
    days = [Task(policy) for policy in chosen]
    sweep = (
        [Task("controller-pack", share) for share in shares] if "controller-pack" in chosen else []
    )
    hours = [Task(policy, until_s=3600.0) for policy in chosen] if speed else []
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "runs.jsonl"
    finished = read_journal(journal.read_text(), spec) if resume and journal.exists() else {}
    if finished:
        click.echo(f"{len(finished)} run(s) taken from {journal}")
    elif journal.exists():
        journal.unlink()

    def done(task: Task, result: ScaleResult) -> None:
        with journal.open("a") as lines:
            lines.write(journal_line(spec, task, result) + "\n")
        if task.until_s is None:
            click.echo(_line(result))
        else:
            click.echo(f"1 h, {result.policy}: {result.wall_s:.1f} s")

    # The speed runs alone: timed beside another run, a core shared would count against them.
    every = run_all(spec, [*days, *sweep], workers, done, finished)
    results, swept = every[: len(days)], every[len(days) :]
    if sweep:
        swept.append(next(r for r in results if r.policy == "controller-pack"))
    timed = run_all(spec, hours, 1, done, finished)
    command = "python -m tensorlights.sim scale " + " ".join(sys.argv[2:])
    text = scale_markdown(workload, results, swept, timed, command.strip())
    if not no_plots:
        for name in plot_scale(results, swept, out):
            text += f"\n![{name}]({name})\n"
    (out / "report.md").write_text(text)
    (out / "results.json").write_text(
        json.dumps([asdict(r) for r in (*results, *swept, *timed)], indent=1) + "\n"
    )
    click.echo(f"-> {out / 'report.md'}")


def _line(result: ScaleResult) -> str:
    return (
        f"{result.policy} (agents on {result.reach:.0%}): avg JCT {result.avg_jct_s:.0f} s, "
        f"p95 {result.p95_jct_s:.0f} s, slowed > 2x {result.slowed_share:.1%} "
        f"({result.cpu_s:.0f} s of CPU)"
    )
