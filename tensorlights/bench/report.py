"""The benchmark report: Markdown tables per scenario and PNG plots (matplotlib)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tensorlights.bench import bound
from tensorlights.bench.cpu_use import CPU_BOUND_AT, DISTURBED_AT
from tensorlights.bench.results import PolicySummary, ScenarioSummary, Trial
from tensorlights.bench.scenarios import StaticOrder
from tensorlights.errors import ConfigError

LABELS = {
    "fifo": "FIFO (no agent)",
    "fair": "fair (per-job classes)",
    "static": "TL-One (static)",
    "tl-rr-original": "TL-RR original (tc rebuild)",
    "rotate": "TensorLights rotate",
    "pack": "TensorLights pack",
    "pack-iterations": "TensorLights pack, iterations declared",
    "controller-pack": "TensorLights pack, controller",
    "controller-pack-iterations": "TensorLights pack, controller, iterations declared",
    "controller-rotate": "TensorLights rotate, controller",
    "controller-pack-killed": "pack, controller killed",
    "controller-pack-restarted": "pack, controller restarted",
    "controller-pack-agent-restarted": "pack, controller, an agent restarted",
}


BEST_ORDER = "best static order (every order, tc)"


def label(policy: str) -> str:
    return LABELS.get(policy, policy)


def _policy_grid(
    summaries: Sequence[ScenarioSummary],
    heads: Sequence[str],
    cell: Callable[[ScenarioSummary, PolicySummary], str],
) -> list[str]:
    """Policies x scenarios: a row per policy (in order of first appearance), `cell` for each
    scenario it ran in, "-" elsewhere."""
    policies: list[str] = []
    for summary in summaries:
        policies += [p.policy for p in summary.policies if p.policy not in policies]
    lines = ["| policy | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(summaries)]
    for policy in policies:
        cells = []
        for summary in summaries:
            found = [p for p in summary.policies if p.policy == policy]
            cells.append(cell(summary, found[0]) if found else "-")
        lines.append(f"| {label(policy)} | " + " | ".join(cells) + " |")
    return lines


def _against_bound(p: PolicySummary) -> str:
    return f"{p.ratio_to_bound:.2f}x ({p.max_slowdown:.2f})"


def summary_table(summaries: Sequence[ScenarioSummary]) -> list[str]:
    """Policies x scenarios: average JCT as a multiple of the lower bound (max slowdown)."""
    heads = [f"({s.scenario.key}) {s.scenario.title}" for s in summaries]
    lines = _policy_grid(summaries, heads, lambda _, p: _against_bound(p))
    bests = [summary.best_order for summary in summaries]
    if any(bests):
        cells = [_against_bound(best) if best else "-" for best in bests]
        lines.append(f"| {BEST_ORDER} | " + " | ".join(cells) + " |")
    return lines


def best_order_table(summaries: Sequence[ScenarioSummary]) -> list[str]:
    """Policies x scenarios: average JCT as a multiple of the best static order measured
    (scenarios where every order ran); [] where none did."""
    bests = [(s, s.best_order) for s in summaries if s.best_order is not None]
    if not bests:
        return []
    best_avg = {s.scenario.key: best.avg_jct_s for s, best in bests}
    lines = _policy_grid(
        [s for s, _ in bests],
        [f"({s.scenario.key})" for s, _ in bests],
        lambda s, p: f"{p.avg_jct_s / best_avg[s.scenario.key]:.2f}x",
    )
    cells = [f"1.00x ({_order_names(best.policy, s)})" for s, best in bests]
    lines.append(f"| {BEST_ORDER} | " + " | ".join(cells) + " |")
    return lines


def _order_names(policy: str, summary: ScenarioSummary) -> str:
    order = StaticOrder.parse(policy)
    return order.names([j.name for j in summary.scenario.jobs]) if order else policy


def scenario_section(
    summary: ScenarioSummary, plot: str | None, timeline: str | None = None
) -> list[str]:
    s = summary.scenario
    jobs = ", ".join(
        f"{j.name} ({j.workload}, {j.model_bytes / 1e6:g} MB x {j.workers} workers, "
        f"{j.compute_s * 1e3:.0f} ms"
        f" compute, {j.iterations} it{f', +{j.start_s:g} s' if j.start_s else ''})"
        for j in s.jobs
    )
    alone = ", ".join(f"{name} {value:.2f} s" for name, value in summary.alone_s.items())
    link = ", ".join(f"{name} {value:.2f} s" for name, value in summary.link_s.items())
    lines = [
        f"### ({s.key}) {s.title}",
        "",
        s.description,
        "",
        f"Jobs: {jobs}.",
        f"Standalone JCT: {alone}. Link time of all pushes: {link}.",
        f"**Lower bound on average JCT: {summary.lower_bound_s:.2f} s.**",
        "",
        "| policy | avg JCT s | x bound | per-job JCT s | slowdown vs alone (largest in a run) "
        "| straggler spread median / p90 ms | link use | light moves | reps |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|",
    ]
    for p in summary.policies:
        per_job = ", ".join(f"{name} {value:.1f}" for name, value in p.job_jct_s.items())
        slow = ", ".join(f"{value:.2f}" for value in p.slowdown.values())
        moves = "—" if p.light_moves is None else f"{p.light_moves:g}"
        lines.append(
            f"| {label(p.policy)} | {p.avg_jct_s:.2f} | {p.ratio_to_bound:.2f} | {per_job} "
            f"| {slow} ({p.max_slowdown:.2f}) "
            f"| {p.spread_median_s * 1e3:.0f} / {p.spread_p90_s * 1e3:.0f} "
            f"| {p.utilisation:.0%} | {moves} | {p.reps} |"
        )
    sharded = [
        p
        for p in summary.policies
        if p.shard_spread_median_s is not None or p.split_green is not None
    ]
    if sharded:
        lines += [
            "",
            "Sharded jobs: how long a worker waited from its first shard to its last (the "
            "slowest PS host holds it back), and the share of their time during which they "
            "were green on some but not all of their PS hosts (from each host's light: the "
            "agents' applied rotations, the prototype's rebuilds):",
            "",
            "| policy | wait for the last shard, median / p90 ms | green on some PS hosts only |",
            "|---|---:|---:|",
        ]
        for p in sharded:
            split = "—" if p.split_green is None else f"{p.split_green:.0%}"
            wait = "— (not logged: a TensorFlow chief sees a step's end only)"
            if p.shard_spread_median_s is not None and p.shard_spread_p90_s is not None:
                wait = f"{p.shard_spread_median_s * 1e3:.0f} / {p.shard_spread_p90_s * 1e3:.0f}"
            lines.append(f"| {label(p.policy)} | {wait} | {split} |")
    faulted = [p for p in summary.policies if p.events]
    clean = next((p for p in summary.policies if p.policy == "controller-pack"), None)
    if faulted:
        lines += [
            "",
            "Faults during controller pack (what was done and what the agents did, seconds "
            "after the start, first repetition; the cost against the clean run):",
            "",
            "| run | avg JCT s | against clean | green on some PS hosts only | events |",
            "|---|---:|---:|---:|---|",
        ]
        for p in faulted:
            cost = f"{p.avg_jct_s / clean.avg_jct_s - 1:+.1%}" if clean else "—"
            split = "—" if p.split_green is None else f"{p.split_green:.0%}"
            events = "; ".join(f"{at:.1f} s {what}" for at, what in p.events)
            lines.append(f"| {label(p.policy)} | {p.avg_jct_s:.2f} | {cost} | {split} | {events} |")
    best = summary.best_order
    if best is not None:
        lines += [
            "",
            "Every fixed priority order (built once with `tc`, the prototype's TL-One tree), "
            "green first:",
            "",
            "| order | avg JCT s | x bound | per-job JCT s "
            "| slowdown vs alone (largest in a run) | reps |",
            "|---|---:|---:|---|---|---:|",
        ]
        for p in summary.orders:
            per_job = ", ".join(f"{name} {value:.1f}" for name, value in p.job_jct_s.items())
            slow = ", ".join(f"{value:.2f}" for value in p.slowdown.values())
            mark = " (best)" if p is best else ""
            lines.append(
                f"| {_order_names(p.policy, summary)}{mark} | {p.avg_jct_s:.2f} "
                f"| {p.ratio_to_bound:.2f} | {per_job} | {slow} ({p.max_slowdown:.2f}) "
                f"| {p.reps} |"
            )
        versus = ", ".join(
            f"{label(p.policy)} {p.avg_jct_s / best.avg_jct_s:.2f}x" for p in summary.policies
        )
        lines += ["", f"Average JCT against the best order: {versus}."]
    if plot:
        lines += ["", f"![({s.key}) {s.title}]({plot})"]
    if timeline:
        lines += ["", f"Who is green on which host (first repetition): ![timeline]({timeline})"]
    return [*lines, ""]


def daemons_table(trials: Sequence[Trial]) -> list[str]:
    """The cores the policy's own processes took, per scenario and policy (median over its
    runs): on a machine the jobs keep busy, a policy's own cost is a cost to the jobs."""
    by_run: dict[tuple[str, str], list[float]] = {}
    for t in trials:
        if t.daemon_cores is not None:
            by_run.setdefault((t.scenario, t.policy), []).append(t.daemon_cores)
    if not by_run:
        return []
    lines = [
        "",
        "Of those, the policy's own processes (agents, controller; the prototype's port "
        "feed, not its `tc` commands), from when they were up to the jobs' end:",
        "",
        "| runs | policy | daemons' cores, median | largest |",
        "|---|---|---:|---:|",
    ]
    for (scenario, policy), cores in sorted(by_run.items()):
        lines.append(
            f"| {scenario} | {policy} | {statistics.median(cores):.3f} | {max(cores):.3f} |"
        )
    return lines


def cpu_section(trials: Sequence[Trial]) -> list[str]:
    """The CPU the runs' own processes took, per scenario (how CPU-bound its runs were), and
    what other work on the machine took and the runs it disturbed (results.Trial.disturbed);
    nothing for runs recorded before the CPU was read."""
    measured = [t for t in trials if t.other_cores is not None]
    if not measured:
        return []
    lines = [
        "## The machine's CPU during the runs",
        "",
        "Cores the runs took (the machine's busy time less other work's: the bench, agents, "
        "controller, jobs, and the kernel's work for their traffic), on average over each "
        "run, of the machine's: from "
        f"{CPU_BOUND_AT:.0%} of them a run is CPU-bound, and it compares CPU schedules as "
        "much as link schedules.",
        "",
        "| runs | own cores, median | largest | of | CPU-bound runs |",
        "|---|---:|---:|---:|---:|",
    ]
    by_scenario: dict[str, list[Trial]] = {}
    for t in measured:
        by_scenario.setdefault(t.scenario, []).append(t)
    for scenario, runs in sorted(by_scenario.items()):
        own = [t.own_cores or 0.0 for t in runs]
        cores = "/".join(str(c) for c in sorted({t.cores for t in runs if t.cores}))
        bound = sum(t.cpu_bound for t in runs)
        lines.append(
            f"| {scenario} | {statistics.median(own):.2f} | {max(own):.2f} | {cores or '?'} "
            f"| {bound} of {len(runs)} |"
        )
    lines += daemons_table(measured)
    worst = max(t.other_cores or 0.0 for t in measured)
    lines += [
        "",
        f"Other work (processes not the bench's, and time the hypervisor stole) took at most "
        f"{worst:.2f} cores during a run "
        f"({len(measured)} of {len(trials)} runs read). From {DISTURBED_AT:g} cores a run is "
        "marked disturbed: its figures measure that load too; `bench run --rerun-disturbed` "
        "runs it again.",
        "",
    ]
    disturbed = [t for t in measured if t.disturbed]
    if not disturbed:
        return [*lines, "No run was disturbed.", ""]
    lines += ["| run | other work, cores | avg JCT s |", "|---|---:|---:|"]
    for t in disturbed:
        lines.append(
            f"| {t.scenario} {t.policy} {t.rep} | {t.other_cores:.2f} | {t.avg_jct_s:.2f} |"
        )
    return [*lines, ""]


def markdown(
    summaries: Sequence[ScenarioSummary],
    meta: dict[str, Any],
    plots: dict[str, str],
    trials: Sequence[Trial] = (),
) -> str:
    gpu_note = (
        "PyTorch workers compute on the GPU (--device cuda; the compute time pads each step). "
        if meta.get("device", "cpu") != "cpu"
        else ""
    )
    settings = meta.get("agent_settings") or []
    settings_note = (
        f"Every agent ran with {', '.join(f'`{s}`' for s in settings)} (--agent-setting). "
        if settings
        else ""
    )
    lines = [
        "# TensorLights benchmark",
        "",
        f"Emulated cluster (network namespaces): one PS host whose {meta['rate']} egress is "
        "the bottleneck, two worker hosts (in the m scenarios two or three PS hosts, each "
        "shaped, a policy on each). PS jobs found by discovery alone: synthetic ones "
        "(tensorlights.testbed.psjob, TF_CONFIG) and, in the r scenarios, real frameworks' "
        "(testbed/workloads.py: PyTorch gloo and RPC with torchrun's variables, TensorFlow "
        f"with TF_CONFIG). {meta['reps']} repetition(s), medians reported. "
        f"Agent rotation slot {meta['interval']}; the original prototype rebuilds its qdisc "
        f"every {meta['original_interval_s']:g} s. Policy pack: max slowdown 2 over a "
        f"{meta.get('starvation_window', '120s')} window. Machine: {meta.get('machine', '?')}. "
        + gpu_note
        + settings_note
        + "Light moves: how often the green light passed to another job (median; the agent's "
        "applied rotations, the prototype's rebuilds; — for policies without a light or runs "
        "recorded before moves were).",
        "",
        "Average JCT as a multiple of the lower bound (in brackets the largest slowdown vs "
        "alone in a run, median over runs):",
        "",
        *summary_table(summaries),
        "",
    ]
    versus_best = best_order_table(summaries)
    if versus_best:
        lines += [
            "Average JCT as a multiple of the best static order measured (every fixed order "
            "of the scenario's jobs run, the best one by median average JCT):",
            "",
            *versus_best,
            "",
        ]
    if "overview" in plots:
        lines += [f"![overview]({plots['overview']})", ""]
    lines += cpu_section(trials)
    lines += [
        "## Lower bound",
        "",
        "For each job i: arrival a_i, standalone JCT T_i (median of its runs alone on the "
        f"FIFO link) and link time p_i = payload x {bound.MSS + bound.HEADER_BYTES}/{bound.MSS}"
        " x 8 / rate (wire bytes with Ethernet, IP, TCP and timestamp headers at 1448-byte "
        "segments). M(S) = the earliest time one link can send all pushes of the jobs in S, "
        "none before its job arrives (sort S by arrival; t = max(t, a_j) + p_j); with several "
        "shaped links, the largest over them of each link's M of the pushes it carries (a "
        "sharded job's shard on each of its PS hosts). The k-th job "
        "to finish, in any schedule, ends no sooner than max(a + T of itself, M(first k "
        "jobs)); the bound is the minimum over completion orders of the average of "
        "those, minus arrivals. No policy beats it; compute overlapping other jobs' pushes "
        "is not credited, so it is optimistic, never pessimistic.",
        "",
        "## Scenarios",
        "",
    ]
    for summary in summaries:
        key = summary.scenario.key
        lines += scenario_section(summary, plots.get(key), plots.get(f"{key}{TIMELINE}"))
    lines += [
        "Rerun: `scripts/benchmark.sh` (see `python -m tensorlights.bench run --help`); "
        "`python -m tensorlights.bench report DIR` rebuilds this report from DIR/trials.jsonl.",
        "",
    ]
    return "\n".join(lines)


TIMELINE = "-timeline"


def plot(
    summaries: Sequence[ScenarioSummary], out: Path, trials: Sequence[Trial] = ()
) -> dict[str, str]:
    """PNG plots next to the report; returns their names relative to it (a scenario's key,
    and for scenarios with several lit hosts its key + TIMELINE: who was green where)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError(
            "matplotlib is needed for the plots: pip install -e '.[bench]' "
            "(scripts/benchmark.sh does), or pass --no-plots"
        ) from None
    names: dict[str, str] = {}
    policies: list[str] = []
    for summary in summaries:
        policies += [p.policy for p in summary.policies if p.policy not in policies]
    width = 0.8 / max(len(policies), 1)

    fig, ax = plt.subplots(figsize=(10, 4.5))
    for k, policy in enumerate(policies):
        xs, ys = [], []
        for i, summary in enumerate(summaries):
            for p in summary.policies:
                if p.policy == policy:
                    xs.append(i + k * width)
                    ys.append(p.ratio_to_bound)
        ax.bar(xs, ys, width, label=label(policy))
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--", label="lower bound")
    ax.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(summaries))])
    ax.set_xticklabels([f"({s.scenario.key}) {s.scenario.title}" for s in summaries], fontsize=8)
    ax.set_ylabel("average JCT / lower bound")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "overview.png", dpi=110)
    plt.close(fig)
    names["overview"] = "overview.png"

    for summary in summaries:
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        jobs = [j.name for j in summary.scenario.jobs]
        bar = 0.8 / max(len(summary.policies), 1)
        for k, p in enumerate(summary.policies):
            xs = [i + k * bar for i in range(len(jobs))]
            left.bar(xs, [p.slowdown[name] for name in jobs], bar, label=label(p.policy))
        left.axhline(1.0, color="black", linewidth=1, linestyle="--")
        left.set_xticks([i + bar * (len(summary.policies) - 1) / 2 for i in range(len(jobs))])
        left.set_xticklabels(jobs)
        left.set_ylabel("JCT / standalone JCT")
        left.set_title("slowdown per job")
        left.legend(fontsize=7)
        names_ = [label(p.policy) for p in summary.policies]
        right.barh(names_, [p.spread_median_s * 1e3 for p in summary.policies], label="median")
        right.barh(
            names_,
            [(p.spread_p90_s - p.spread_median_s) * 1e3 for p in summary.policies],
            left=[p.spread_median_s * 1e3 for p in summary.policies],
            alpha=0.4,
            label="to p90",
        )
        right.set_xlabel("straggler spread, ms")
        right.set_title("straggler spread per iteration")
        right.legend(fontsize=7)
        fig.suptitle(f"({summary.scenario.key}) {summary.scenario.title}")
        fig.tight_layout()
        name = f"scenario_{summary.scenario.key}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        names[summary.scenario.key] = name
        timeline = _timeline(plt, summary, trials, out)
        if timeline:
            names[summary.scenario.key + TIMELINE] = timeline
    return names


def _timeline(plt: Any, summary: ScenarioSummary, trials: Sequence[Trial], out: Path) -> str:
    """Per policy with a light on several hosts (its first repetition): each host's green job
    over time, one colour per job, each job's lifetime drawn below. '' if none has one."""
    key = summary.scenario.key
    runs = []
    for p in summary.policies:
        lit = [t for t in trials if t.scenario == key and t.policy == p.policy and t.host_greens]
        if lit:
            runs.append(min(lit, key=lambda t: t.rep))
    if not runs:
        return ""
    jobs = [j.name for j in summary.scenario.jobs]
    colours = {job: plt.get_cmap("tab10")(i % 10) for i, job in enumerate(jobs)}
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.0 + 1.2 * len(runs)), squeeze=False)
    for ax, trial in zip(axes[:, 0], runs, strict=True):
        end = max(run.arrival_s + run.jct_s for run in trial.jobs)
        hosts = sorted(trial.host_greens)
        for row, host in enumerate(hosts):
            moves = sorted(trial.host_greens[host])
            for (at, job), (until, _) in zip(moves, [*moves[1:], (end, "")], strict=True):
                ax.barh(row, until - at, left=at, color=colours.get(job, "grey"), height=0.8)
        for k, run in enumerate(trial.jobs):
            y = len(hosts) + 0.2 + 0.3 * k
            ax.plot([run.arrival_s, run.arrival_s + run.jct_s], [y, y], color=colours[run.name],
                    linewidth=3)  # fmt: skip
        ax.set_yticks(range(len(hosts)), hosts)
        ax.set_xlim(0, end)
        ax.set_title(f"{label(trial.policy)} (lines above: each job's run)", fontsize=8)
    axes[-1, 0].set_xlabel("seconds; bars: the job green on each host")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[job]) for job in jobs]
    fig.legend(handles, jobs, loc="upper right", fontsize=7)
    fig.tight_layout()
    name = f"timeline_{key}.png"
    fig.savefig(out / name, dpi=110)
    plt.close(fig)
    return name
