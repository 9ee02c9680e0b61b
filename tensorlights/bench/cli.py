"""python -m tensorlights.bench: run the benchmark, rebuild its report, list its scenarios."""

from __future__ import annotations

import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import click

from tensorlights.bench import report, traces
from tensorlights.bench.agent_settings import agent_settings_toml
from tensorlights.bench.results import Trial, alone_jct, profile_key, summarize
from tensorlights.bench.runner import HOSTS, RunOptions, agent_policy, run_trial
from tensorlights.bench.scenarios import (
    COMPARED,
    FAULT_AT_S,
    FAULT_DOWN_S,
    FAULTS,
    MAX_ORDER_JOBS,
    SCENARIOS,
    Policy,
    Scenario,
    StaticOrder,
    select,
    select_policies,
)
from tensorlights.errors import ConfigError
from tensorlights.testbed.cluster import cluster
from tensorlights.units import format_rate, parse_duration, parse_rate

TRIALS = "trials.jsonl"
META = "meta.json"
STATUS = "status"
"""Where --status-traces keeps the agents' status reads."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """The TensorLights benchmark: scenarios of synthetic PS jobs on an emulated cluster,
    every policy side by side, the lower bound on average JCT, a Markdown + PNG report."""


@main.command()
@click.option(
    "--scenarios", default="all", show_default=True, help="Keys, e.g. a,c (see `scenarios`)."
)
@click.option(
    "--policies", default="all", show_default=True,
    help=f"Of: {', '.join(COMPARED)}; `{Policy.ORDERS}`: every fixed priority order of "
    f"each scenario of up to {MAX_ORDER_JOBS} jobs, built with tc (the reference each policy "
    f"is reported against); and faults during controller-pack: {', '.join(FAULTS)} (the "
    "controller killed, or killed and restarted, or the first PS host's agent restarted, "
    "--fault-at into the run); `pack-iterations` and `controller-pack-iterations`: pack, "
    "hosts alone or under the controller, with every job declaring its iterations "
    "(TENSORLIGHTS_ITERATIONS). The last three kinds are not in `all`.",
)  # fmt: skip
@click.option("--reps", type=click.IntRange(1, 50), default=3, show_default=True)
@click.option("--rate", default="300mbit", show_default=True, help="The PS host's link.")
@click.option("--interval", default="3s", show_default=True, help="The agent's rotation slot.")
@click.option(
    "--original-interval", default="20s", show_default=True,
    help="The original prototype's rebuild period.",
)  # fmt: skip
@click.option(
    "--starvation-window", default="30s", show_default=True,
    help="The agent's starvation window under policy pack.",
)  # fmt: skip
@click.option(
    "--fault-at", default=f"{FAULT_AT_S:g}s", show_default=True,
    help="When a fault run's fault comes, after the jobs' start.",
)  # fmt: skip
@click.option(
    "--fault-down", default=f"{FAULT_DOWN_S:g}s", show_default=True,
    help="How long the controller stays down in controller-pack-restarted.",
)  # fmt: skip
@click.option(
    "--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
    help="Where the real PyTorch jobs' workers run their model: cuda puts the forward and "
    "backward on the GPU (each scenario's compute time still pads the step).",
)  # fmt: skip
@click.option(
    "--scale", type=float, default=1.0, show_default=True,
    help="Multiply every job's iterations and arrival offsets (0.2 for a quick look).",
)  # fmt: skip
@click.option(
    "--out", type=click.Path(path_type=Path), required=True,
    help="Results folder: trials.jsonl, meta.json, report.md, PNGs. An existing one with the "
    "same settings is resumed (runs already recorded are skipped).",
)  # fmt: skip
@click.option(
    "--status-traces", is_flag=True,
    help="Keep each agent's status, read every 0.5 s, in OUT/status/SCENARIO-POLICY-REP-HOST"
    ".jsonl.gz (`zcat` reads it): the JSON `tensorlights-agent status --json` prints (each "
    "job's measured load, the starvation guard's lags and slack, the bands), with at_s, "
    "seconds from the jobs' start as the report times the light. To see why a policy did "
    "what it did.",
)  # fmt: skip
@click.option(
    "--rerun-disturbed", is_flag=True,
    help="Resuming, run again the runs recorded with other work beside them (listed under "
    "'Other work beside the runs' in the report). Their earlier records stay in "
    "trials.jsonl; a run's latest record is the one reported.",
)  # fmt: skip
@click.option(
    "--agent-setting", "agent_settings", multiple=True, metavar="KEY=VALUE",
    help="A setting for every agent's config file, as a TOML key and value (dotted for a "
    "table's key, strings quoted): --agent-setting dscp.enabled=false, --agent-setting "
    "'telemetry.sample_interval=\"50ms\"'. For an experiment: kept in meta.json and the "
    "report's header, and a folder resumes only with the same ones. Repeatable. The "
    "settings the bench makes itself (its options, discovery, the controller) are refused.",
)  # fmt: skip
@click.option("--no-plots", is_flag=True, help="Markdown only (no matplotlib).")
def run(
    scenarios: str,
    policies: str,
    reps: int,
    rate: str,
    interval: str,
    original_interval: str,
    starvation_window: str,
    fault_at: str,
    fault_down: str,
    device: str,
    scale: float,
    out: Path,
    status_traces: bool,
    rerun_disturbed: bool,
    agent_settings: tuple[str, ...],
    no_plots: bool,
) -> None:
    """Run every scenario under every policy, REPS times, plus each job profile alone; then
    write the report. Needs root (network namespaces), and a machine left to it: each run
    also reads the CPU that other processes take meanwhile, and warns from 0.1 cores (its
    figures measure that load too). Records each run as it ends."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        chosen = [s.scaled(scale) for s in select(scenarios)]
        compared = select_policies(policies)
        parse_duration(interval)
        parse_duration(starvation_window)
        agents = [p for p in map(agent_policy, compared) if p is not None]
        options = RunOptions(
            parse_rate(rate), interval, parse_duration(original_interval), starvation_window,
            fault_at_s=parse_duration(fault_at), fault_down_s=parse_duration(fault_down),
            device=device, status_traces=out / STATUS if status_traces else None,
            agent_settings=agent_settings_toml(agent_settings, agents),
        )  # fmt: skip
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if os.geteuid() != 0:
        raise click.ClickException("needs root: the testbed creates network namespaces")
    meta = {
        "rate": format_rate(options.rate_bps),
        "rate_bps": options.rate_bps,
        "scenarios": [s.key for s in chosen],
        "policies": [p.value for p in compared],
        "reps": reps,
        "scale": scale,
        "interval": interval,
        "original_interval_s": options.original_interval_s,
        "starvation_window": starvation_window,
        "fault_at_s": options.fault_at_s,
        "fault_down_s": options.fault_down_s,
        "device": options.device,
        "agent_settings": list(agent_settings),
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, Linux {platform.release()}",
    }
    out.mkdir(parents=True, exist_ok=True)
    recorded = _resume(out, meta)
    plan = _plan(chosen, compared, reps)
    keys = [_key(*step[:3]) for step in plan]
    again = {key for key in keys if rerun_disturbed and key in recorded and recorded[key].disturbed}
    todo = [
        step for step, key in zip(plan, keys, strict=True) if key not in recorded.keys() - again
    ]
    rerun = f", {len(again)} of them disturbed, run again" if rerun_disturbed else ""
    already = sum(key in recorded for key in keys)
    click.echo(f"{len(plan)} runs ({already} already recorded{rerun}) -> {out}")
    began = time.monotonic()
    with cluster(HOSTS) as testbed, tempfile.TemporaryDirectory() as tmp:
        for number, (scenario, policy, rep, scenario_obj, jobs) in enumerate(todo, 1):
            trial = run_trial(
                testbed, scenario, jobs, policy, rep, options,
                Path(tmp) / f"{number}", profile=scenario_obj if policy is Policy.ALONE else "",
            )  # fmt: skip
            with open(out / TRIALS, "a") as handle:
                handle.write(json.dumps(trial.to_dict()) + "\n")
            own = "" if trial.own_cores is None else f", CPU {trial.own_cores:.2f}/{trial.cores}"
            own += "" if trial.daemon_cores is None else f" (daemons {trial.daemon_cores:.3f})"
            click.echo(
                f"[{number}/{len(todo)}] {scenario} {policy.value} rep {rep}: avg JCT "
                f"{trial.avg_jct_s:.2f} s,"
                f" link {trial.utilisation:.0%}{own} ({(time.monotonic() - began) / 60:.1f} min)"
            )
    _write_report(out, _recorded(meta), no_plots)


@main.command(name="report")
@click.argument("folder", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--no-plots", is_flag=True, help="Markdown only (no matplotlib).")
def report_command(folder: Path, no_plots: bool) -> None:
    """Rebuild FOLDER/report.md (and plots) from FOLDER/trials.jsonl."""
    _write_report(folder, _recorded(json.loads((folder / META).read_text())), no_plots)


def _recorded(meta: dict[str, Any]) -> list[Scenario]:
    """The scenarios a results folder holds, at its scale: a resumed run's report covers the
    scenarios of the runs before it too."""
    return [SCENARIOS[key].scaled(meta["scale"]) for key in meta["scenarios"]]


@main.command(name="traces")
@click.argument("folder", type=click.Path(path_type=Path, exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per host and job.")
def traces_command(folder: Path, as_json: bool) -> None:
    """Per run, host and job of FOLDER (recorded with `run --status-traces`): the iterations
    each host's agent reported against those the job's workers logged, and the median
    period the agent measured. A count that is off is a wrong lag in that host's pack guard
    (a ring's all-reduces split or merged); counts differing by host, hosts deciding alone
    that disagree."""
    status = folder / STATUS
    if not status.is_dir():
        raise click.UsageError(f"{status} does not exist: record with `run --status-traces`")
    counts = traces.iteration_counts(_read_trials(folder), status)
    if as_json:
        for count in counts:
            click.echo(json.dumps(vars(count)))
        return
    click.echo("| run | host | job | reported | logged | median period s |")
    click.echo("|---|---|---|---:|---:|---:|")
    for c in counts:
        period = "-" if c.median_period_s is None else f"{c.median_period_s:.2f}"
        logged = "-" if c.logged is None else str(c.logged)
        click.echo(
            f"| {c.scenario} {c.policy} {c.rep} | {c.host} | {c.job} | {c.reported} | {logged} "
            f"| {period} |"
        )


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def scenarios(as_json: bool) -> None:
    """List the scenarios and their jobs."""
    if as_json:
        click.echo(
            json.dumps(
                {
                    key: {
                        "title": s.title,
                        "description": s.description,
                        "jobs": [vars(j) for j in s.jobs],
                    }
                    for key, s in SCENARIOS.items()
                },
                indent=2,
            )
        )
        return
    for s in SCENARIOS.values():
        click.echo(f"({s.key}) {s.title}: {s.description}")


def _key(scenario: str, policy: Policy | StaticOrder, rep: int) -> tuple[str, str, int]:
    return (scenario, policy.value, rep)


Step = tuple[str, Policy | StaticOrder, int, Any, list[Any]]


def _plan(chosen: list[Scenario], compared: list[Policy], reps: int) -> list[Step]:
    """Repetitions outermost (drift spreads over every policy); each distinct job profile
    alone once per repetition; the policies' order rotates from one repetition to the next."""
    steps: list[Step] = []
    for rep in range(reps):
        seen: set[str] = set()
        for scenario in chosen:
            for job in scenario.jobs:
                key = profile_key(job)
                if key not in seen:
                    seen.add(key)
                    alone = replace(job, start_s=0.0)
                    steps.append((f"alone:{key}", Policy.ALONE, rep, key, [alone]))
        for scenario in chosen:
            policies: list[Policy | StaticOrder] = []
            for policy in compared:
                if policy is Policy.ORDERS:
                    policies += StaticOrder.every(len(scenario.jobs))
                else:
                    policies.append(policy)
            order = policies[rep % len(policies) :] + policies[: rep % len(policies)]
            steps += [
                (scenario.key, policy, rep, scenario, list(scenario.jobs)) for policy in order
            ]
    return steps


def _resume(out: Path, meta: dict[str, Any]) -> dict[tuple[str, str, int], Trial]:
    """Runs already recorded in `out` with the same settings; refuse a folder with others."""
    meta_path = out / META
    if meta_path.exists():
        old = json.loads(meta_path.read_text())
        settings = (
            "rate_bps", "scale", "interval", "original_interval_s", "starvation_window",
            "fault_at_s", "fault_down_s", "device", "agent_settings",
        )  # fmt: skip
        # Folders from before these settings: theirs were the defaults.
        defaults = {
            "fault_at_s": FAULT_AT_S, "fault_down_s": FAULT_DOWN_S, "device": "cpu",
            "agent_settings": [],
        }  # fmt: skip
        if any(old.get(k, defaults.get(k)) != meta[k] for k in settings):
            raise click.ClickException(
                f"{out} holds runs with other settings ({ {k: old.get(k) for k in settings} }): "
                "choose another --out"
            )
        meta["scenarios"] = sorted(set(old["scenarios"]) | set(meta["scenarios"]))
        meta["policies"] = [
            *old["policies"],
            *(p for p in meta["policies"] if p not in old["policies"]),
        ]
        meta["reps"] = max(old["reps"], meta["reps"])
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return {(t.scenario, t.policy, t.rep): t for t in _read_trials(out)}


def _read_trials(out: Path) -> list[Trial]:
    """The runs recorded in `out` so far (one JSON line each), each run's latest record
    only: a run recorded again (`run --rerun-disturbed`) supersedes its earlier one."""
    if not (out / TRIALS).exists():
        return []
    latest: dict[tuple[str, str, int], Trial] = {}
    for line in (out / TRIALS).read_text().splitlines():
        if line:
            trial = Trial.from_dict(json.loads(line))
            latest[(trial.scenario, trial.policy, trial.rep)] = trial
    return list(latest.values())


def _write_report(out: Path, chosen: list[Scenario], no_plots: bool) -> None:
    meta = json.loads((out / META).read_text())
    trials = _read_trials(out)
    alone = alone_jct(trials)
    order = list(meta["policies"])
    summaries = [
        summarize(s, meta["rate_bps"], trials, alone, order)
        for s in sorted(chosen, key=lambda s: s.key)
        if all(profile_key(j) in alone for j in s.jobs)
    ]
    try:
        plots = {} if no_plots else report.plot(summaries, out, trials)
    except ConfigError as exc:
        raise click.ClickException(str(exc)) from None
    (out / "report.md").write_text(report.markdown(summaries, meta, plots, trials))
    click.echo(f"report: {out / 'report.md'}")
    for line in report.summary_table(summaries):
        click.echo(line)
    versus_best = report.best_order_table(summaries)
    if versus_best:
        click.echo("\nAverage JCT / the best static order's:")
        for line in versus_best:
            click.echo(line)


if __name__ == "__main__":
    sys.exit(main())
