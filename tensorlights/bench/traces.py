"""The agents' status traces of a results folder (`bench run --status-traces`), read back:
how many iterations each host's telemetry reported for each job, against the iterations its
workers logged. A host whose count is off judges that job's lag from a wrong count (a ring's
all-reduces split or merged: docs/design.md, straggler telemetry)."""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tensorlights.bench.results import Trial

TRACE_NAME = re.compile(
    r"^(?P<scenario>[^-]+)-(?P<policy>.+)-(?P<rep>\d+)-(?P<host>[^-]+)\.jsonl(\.gz)?$"
)
JOB_NAME = re.compile(r"-(j\d+)-")
"""A scenario job's name (j1, j2, ...) inside the job id discovery gave it."""


def trace_name(run: str, host: str) -> str:
    """The trace file of `run` (SCENARIO-POLICY-REP) on `host`, gzipped (folders recorded
    before 2026-12-06 hold them plain, or gzipped by hand: both read the same)."""
    return f"{run}-{host}.jsonl.gz"


@dataclass(frozen=True)
class TraceCount:
    scenario: str
    policy: str
    rep: int
    host: str
    job: str
    reported: int
    """Iterations the host's agent reported for the job (each counted once, however many
    status reads listed it; a report of merged all-reduces counts as many as it stands for)."""
    logged: int | None
    """Iterations the job's workers logged (None: the run is not in trials.jsonl)."""
    median_period_s: float | None


def _open(path: Path) -> IO[str]:
    return gzip.open(path, "rt") if path.suffix == ".gz" else path.open()


def _logged(trials: Iterable[Trial]) -> dict[tuple[str, str, int], dict[str, int]]:
    """(scenario, policy, rep) -> each job's iterations in its workers' log."""
    return {
        (t.scenario, t.policy, t.rep): {job.name: len(job.spreads_s) for job in t.jobs}
        for t in trials
    }


def _reported(path: Path) -> dict[str, tuple[int, float | None]]:
    """Job name -> (iterations the trace's agent reported, their median period)."""
    seen: dict[str, dict[float, tuple[float | None, int]]] = {}
    with _open(path) as trace:
        for line in trace:
            telemetry = json.loads(line)["status"].get("telemetry") or {}
            for job, iterations in telemetry.items():
                named = JOB_NAME.search(job)
                if named is None:
                    continue
                by_end = seen.setdefault(named.group(1), {})
                for iteration in iterations:  # the latest few, again at every read
                    by_end[round(iteration["last_done_monotonic"], 4)] = (
                        iteration["period_s"],
                        iteration.get("count", 1),  # a ring's merged all-reduces: several
                    )
    counts = {}
    for name, by_end in sorted(seen.items()):
        periods = [period for period, _ in by_end.values() if period]
        reported = sum(count for _, count in by_end.values())
        counts[name] = (reported, statistics.median(periods) if periods else None)
    return counts


def iteration_counts(trials: Iterable[Trial], status: Path) -> list[TraceCount]:
    """Every trace in the `status` folder, per job, with the folder's `trials` for what the
    workers logged."""
    truth = _logged(trials)
    counts = []
    for path in sorted(status.iterdir()):
        match = TRACE_NAME.match(path.name)
        if match is None:
            continue
        key = (match["scenario"], match["policy"], int(match["rep"]))
        for job, (reported, median) in _reported(path).items():
            logged = truth.get(key, {}).get(job)
            counts.append(TraceCount(*key, match["host"], job, reported, logged, median))
    return counts
