"""The CPU that other work on this machine took while a benchmark run ran: every process that
is not the run's own (the bench process and its descendants: agents, controller, jobs), the
kernel's own threads aside (their work is mostly the run's traffic). On the 2-core VM a test
suite running beside c2 doubled its JCTs (66-68 s against 31-35 s; docs/benchmarks.md,
2026-12-02) and nothing in the results said so: such a run measures the machine's load, not
the policy. The count is a lower bound: a process that lived less than one sample apart is
not seen, and one that ended loses its CPU since the sample before."""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Set

from tensorlights.discovery.procfs import ProcessGone, ProcessHidden, ProcFs, ProcKey, ProcStat

SAMPLE_S = 2.0
"""How often the run's loop reads /proc (one read of ~200 processes: a few ms)."""
DISTURBED_AT = 0.1
"""Cores of other work, on average over a run, from which the run is marked disturbed (the
VM idle: 0.00-0.01 measured)."""


def split_ours(
    stats: Iterable[ProcStat], root: int, known_ours: Set[ProcKey]
) -> tuple[dict[ProcKey, int], set[ProcKey]]:
    """The processes of `stats` that are not ours, each with its CPU ticks, and the ours:
    `root` and its descendants, and any process ours before (`known_ours`; a descendant whose
    parent ended is adopted by init and is still the run's). Kernel threads are neither."""
    by_parent: dict[int, list[ProcStat]] = {}
    listed = [stat for stat in stats if not stat.kernel_thread]
    for stat in listed:
        by_parent.setdefault(stat.ppid, []).append(stat)
    ours = {stat.key for stat in listed if stat.key in known_ours or stat.key.pid == root}
    frontier = [key.pid for key in ours]
    while frontier:
        for child in by_parent.get(frontier.pop(), ()):
            if child.key not in ours:
                ours.add(child.key)
                frontier.append(child.key.pid)
    others = {stat.key: stat.cpu_ticks for stat in listed if stat.key not in ours}
    return others, ours


def ticks_since(before: Mapping[ProcKey, int], after: Mapping[ProcKey, int]) -> int:
    """CPU ticks the processes of `after` took since `before`: a process not in `before`
    started since (or became another's since) and counts whole."""
    return sum(ticks - before.get(key, 0) for key, ticks in after.items())


class OtherWork:
    """Reads /proc at most every SAMPLE_S (`tick`, from the run's loop) and adds up the CPU of
    the processes that are not the run's; `cores` is their average over the span read."""

    def __init__(self, procfs: ProcFs | None = None, root_pid: int | None = None) -> None:
        self._procfs = procfs or ProcFs()
        self._root = os.getpid() if root_pid is None else root_pid
        self._ours: set[ProcKey] = set()
        self._last: dict[ProcKey, int] | None = None
        self._ticks = 0
        self._first_at = math.nan
        self._sampled_at = -math.inf

    def tick(self, now: float) -> None:
        if now - self._sampled_at >= SAMPLE_S:
            self.sample(now)

    def sample(self, now: float) -> None:
        stats = []
        for pid in self._procfs.pids():
            try:
                stats.append(self._procfs.stat(pid))
            except (ProcessGone, ProcessHidden):
                continue
        others, self._ours = split_ours(stats, self._root, self._ours)
        if self._last is None:
            self._first_at = now
        else:
            self._ticks += ticks_since(self._last, others)
        self._last = others
        self._sampled_at = now

    @property
    def cpu_s(self) -> float:
        return self._ticks / self._procfs.ticks_per_second

    def cores(self) -> float | None:
        """Other work's average cores from the first read to the latest; None before two."""
        span = self._sampled_at - self._first_at
        return self.cpu_s / span if span > 0 else None
