"""The simulator's reports: Markdown tables and PNG plots (matplotlib)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tensorlights.bench.report import label
from tensorlights.errors import ConfigError
from tensorlights.model import JobKind
from tensorlights.sim.calibrate import TIE, Row, rankings_agree
from tensorlights.sim.engine import TcpModel
from tensorlights.sim.scale import ScaleResult
from tensorlights.sim.workload import GPUS_PER_HOST, Workload

GOAL = 0.10
"""Simulated average JCT within this of the measured median (issue 22)."""
CALIBRATION_PLOT = "calibration.png"
WHY = {
    ("r3", "static"): "the testbed's TL-One order is the order discovery found the jobs "
    "(the RPC job first), not the scenario's (the small job first, the best order)",
    ("r2", "tl-rr-original"): "likely the prototype's rebuild itself: deleting the qdisc "
    "every 20 s drops what is queued (TCP retransmits), which the model does not have; "
    "not verified",
    ("m3", "controller-pack"): "its runs spread 45.15-50.99 s: one within 1.2% of the "
    "simulation, two 14% slower; what in them (the guard's promotions, timed by the "
    "testbed's telemetry where the model's is exact) made the difference is not established",
    ("c1", "pack"): "the agents' telemetry misgroups a waiting ring's steps (docs/design.md), "
    "so each host's pack moved the light 3 times a run on the testbed, where the model's "
    "exact telemetry orders every host the same way at once (1 move)",
}
"""Known causes of rows outside the goal."""


def calibration_markdown(
    rows: Sequence[Row], tcp: TcpModel, fit_error: float, sources: Sequence[str]
) -> str:
    lines = [
        "# Simulator calibration",
        "",
        "Every scenario and policy of the benchmark's results "
        f"({', '.join(f'`{s}`' for s in sources)}) simulated (`python -m tensorlights.sim "
        "calibrate`), against the measured median average JCT. Fitted: each job profile's "
        "link time per byte (its standalone runs: a real framework's framing and pacing), "
        "and the TCP ramp on the FIFO and fair runs "
        f"of scenarios a-f: a push joining a busy link gets weight {tcp.ramp_weight:g} for "
        f"{tcp.ramp_s:g} s (largest error there {fit_error:.1%}). Every row with bands is a "
        "prediction, and so is every row of the real frameworks and collective jobs.",
        "",
        "| source | scenario | policy | measured s | simulated s | error |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        mark = " **(over 10%)**" if abs(row.error) > GOAL else ""
        lines.append(
            f"| {row.source} | {row.scenario} | {label(row.policy)} | {row.measured_s:.2f} | "
            f"{row.simulated_s:.2f} | {row.error:+.1%}{mark} |"
        )
    within = sum(abs(row.error) <= GOAL for row in rows)
    lines += [
        "",
        f"**{within} of {len(rows)} rows within {GOAL:.0%}.**",
        "",
        "## Rankings",
        "",
        f"Pairs of policies whose measured medians differ by more than {TIE:.0%} (closer ones "
        "are within the repetitions' spread); a flip is such a pair the simulation orders "
        f"the other way by more than {TIE:.0%}, a tie one it puts within {TIE:.0%}.",
        "",
        "| source | scenario | pairs | flips | ties |",
        "|---|---|---:|---|---|",
    ]
    for source, scenario in dict.fromkeys((row.source, row.scenario) for row in rows):
        mine = [row for row in rows if row.source == source]
        pairs, flips, ties = rankings_agree(mine, scenario)
        lines.append(f"| {source} | {scenario} | {pairs} | {_pairs(flips)} | {_pairs(ties)} |")
    off = [row for row in rows if abs(row.error) > GOAL]
    if off:
        lines += ["", "## Outside 10%", ""]
        for row in off:
            why = WHY.get((row.scenario, row.policy), "not explained yet")
            lines.append(
                f"* {row.source} {row.scenario} {label(row.policy)}: {row.error:+.1%} ({why})."
            )
    return "\n".join(lines) + "\n"


def _pairs(pairs: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{a} / {b}" for a, b in pairs) or "—"


def plot_calibration(rows: Sequence[Row], out: Path) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 6))
    for source in dict.fromkeys(row.source for row in rows):
        mine = [row for row in rows if row.source == source]
        ax.scatter([r.measured_s for r in mine], [r.simulated_s for r in mine], label=source)
    top = max(max(r.measured_s, r.simulated_s) for r in rows) * 1.05
    ax.plot([0, top], [0, top], color="black", linewidth=0.8)
    for factor in (1 - GOAL, 1 + GOAL):
        ax.plot([0, top], [0, top * factor], color="grey", linewidth=0.6, linestyle="--")
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("measured average JCT (s, median)")
    ax.set_ylabel("simulated average JCT (s)")
    ax.set_title("Simulator against the testbed (dashed: ±10%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / CALIBRATION_PLOT, dpi=110)
    plt.close(fig)
    return CALIBRATION_PLOT


SIM_LABELS = {"cassini": "CASSINI-style time shifts", "crux": "Crux-style GPU intensity"}


def baselines_markdown(table: Mapping[str, Mapping[str, float]]) -> str:
    scenarios = list(table)
    policies = list(dict.fromkeys(p for row in table.values() for p in row))
    best = {key: min(row.values()) for key, row in table.items()}
    lines = [
        "## Other proposals, simulated (CASSINI-style, Crux-style)",
        "",
        "The synthetic scenarios simulated under every policy, with CASSINI-style time "
        "shifts (no priorities) and Crux-style priorities by GPU intensity "
        "(`tensorlights/sim/baselines.py`: built from the papers' descriptions, simulator "
        "only). Average JCT, simulated seconds; the best of each scenario in bold:",
        "",
        "| policy | " + " | ".join(scenarios) + " |",
        "|---|" + "---:|" * len(scenarios),
    ]
    for policy in policies:
        cells = []
        for key in scenarios:
            value = table[key].get(policy)
            text = "-" if value is None else f"{value:.2f}"
            cells.append(
                f"**{text}**" if value is not None and value <= best[key] * 1.001 else text
            )
        name = SIM_LABELS.get(policy) or label(policy)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


SCALE_LABELS = {
    "fifo": "FIFO (no agent)",
    "static": "TL-One, per host",
    "tl-rr-original": "TL-RR (prototype, 20 s), per host",
    "pack": "our agents alone (pack)",
    "controller-pack": "our agents + controller (pack)",
    **SIM_LABELS,
}
SLOWDOWN_PLOT = "slowdowns.png"
REACH_PLOT = "reach.png"


def scale_markdown(
    workload: Workload,
    results: Sequence[ScaleResult],
    reach: Sequence[ScaleResult],
    speed: Sequence[ScaleResult],
    command: str,
) -> str:
    spec = workload.spec
    networked = workload.networked
    kinds = {kind: sum(job.kind == kind for job in networked) for kind in JobKind}
    shared = workload.sharing()
    carrying = {host for job in networked for host in job.hosts}
    lines = [
        "# The simulator at scale",
        "",
        f"`{command}`",
        "",
        "## The workload",
        "",
        f"{spec.hosts} hosts of {GPUS_PER_HOST} GPUs, each with a {spec.nic_bps / 1e9:g} "
        f"Gbit/s NIC; {spec.jobs} jobs arriving over {spec.day_s / 3600:g} h (seed "
        f"{spec.seed}). GPUs per job and run times drawn from the Philly trace's published "
        "distributions, models, kinds and placement assumed "
        "(`tensorlights/sim/workload.py` cites every number). PS tasks placed: "
        f"`{spec.ps_placement}`; PS jobs among the multi-GPU ones: {spec.ps_share:.0%}.",
        "",
        f"* GPUs busy on average over the day (run times alone): {workload.gpu_utilisation():.1%}.",
        f"* Jobs with network traffic: {len(networked)} of {len(workload.jobs)} "
        f"({kinds[JobKind.PS]} PS jobs, {kinds[JobKind.COLLECTIVE]} all-reduce jobs across "
        "hosts); the others train on one GPU, or on one host's GPUs (their JCT is their run "
        "time under every policy).",
        f"* Of those, {len(shared)} share a link with another at some time; "
        f"{len(carrying)} hosts carry any of their traffic.",
        "",
        "## Every policy",
        "",
        "Over the jobs with network traffic that would end within the day alone (the rest run "
        "too, as load): average and p95 JCT, the share slowed more than 2x (JCT over the run "
        "alone), the mean slowdown, and what the run cost on this 2-core machine (CPU "
        "seconds: the runs go side by side, `--workers`).",
        "",
        "| policy | jobs | avg JCT s | p95 JCT s | slowed > 2x | mean slowdown | unfinished "
        "| CPU s | events |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    best = min((r.avg_jct_s for r in results), default=0.0)
    for r in results:
        avg = f"{r.avg_jct_s:.0f}"
        lines.append(
            f"| {SCALE_LABELS.get(r.policy, r.policy)} | {r.counted} | "
            f"{f'**{avg}**' if r.avg_jct_s <= best * 1.001 else avg} | {r.p95_jct_s:.0f} | "
            f"{r.slowed_share:.1%} | {r.mean_slowdown:.2f} | {r.unfinished} | {r.cpu_s:.0f} | "
            f"{r.events:,} |"
        )
    if reach:
        lines += [
            "",
            "## The controller's reach",
            "",
            "Our agents following the controller on a share of the hosts (drawn at random); "
            "the others stay FIFO.",
            "",
            "| hosts with an agent | avg JCT s | p95 JCT s | slowed > 2x | mean slowdown |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in reach:
            lines.append(
                f"| {r.reach:.0%} | {r.avg_jct_s:.0f} | {r.p95_jct_s:.0f} | "
                f"{r.slowed_share:.1%} | {r.mean_slowdown:.2f} |"
            )
    controller = [r for r in (*results, *reach) if r.replans]
    if controller:
        r = max(controller, key=lambda r: r.reach)
        lines += [
            "",
            f"The controller's real Planner, called on every report with news: {r.replans:,} "
            f"replans over the run, {r.replan_mean_ms:.2f} ms each on average, p99 "
            f"{r.replan_p99_ms:.2f} ms ({spec.hosts} registered hosts).",
        ]
    if speed:
        lines += [
            "",
            f"## Speed: {spec.hosts} hosts x 1 simulated hour",
            "",
            "| policy | wall s | events | host evaluations | iterations run send by send "
            "| iterations skipped | settled components |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in speed:
            lines.append(
                f"| {SCALE_LABELS.get(r.policy, r.policy)} | {r.wall_s:.1f} | {r.events:,} | "
                f"{r.evaluations:,} | {r.pushed_iterations:,} | {r.skipped_iterations:,} | "
                f"{r.settles:,} |"
            )
    return "\n".join(lines) + "\n"


def plot_scale(
    results: Sequence[ScaleResult], reach: Sequence[ScaleResult], out: Path
) -> list[str]:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in results:
        ordered = sorted(r.slowdowns)
        if ordered:
            ys = [(i + 1) / len(ordered) for i in range(len(ordered))]
            ax.step(ordered, ys, where="post", label=SCALE_LABELS.get(r.policy, r.policy))
    ax.set_xscale("log")
    ax.set_xlabel("slowdown (JCT / run alone)")
    ax.set_ylabel("share of jobs with network traffic")
    ax.axvline(2.0, color="grey", linewidth=0.6, linestyle="--")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / SLOWDOWN_PLOT, dpi=110)
    plt.close(fig)
    names = [SLOWDOWN_PLOT]
    if reach:
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([r.reach * 100 for r in reach], [r.avg_jct_s for r in reach], marker="o")
        ax.set_xlabel("hosts with an agent (%)")
        ax.set_ylabel("average JCT (s)")
        ax.set_title("Coordinated pack by the controller's reach")
        fig.tight_layout()
        fig.savefig(out / REACH_PLOT, dpi=110)
        plt.close(fig)
        names.append(REACH_PLOT)
    return names


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "matplotlib is needed for the plots: pip install -e '.[bench]', or --no-plots"
        ) from None
    return plt
