"""The machine's CPU while a benchmark run ran: what other work took (every process not the
bench's, plus the time the hypervisor stole from the VM) and what the run took (the rest of
the machine's busy time: the bench process and its descendants -- agents, controller, jobs --
and the kernel's threads and interrupts, whose work is mostly the run's traffic).

Other work: on the 2-core VM a test suite running beside c2 doubled its JCTs (66-68 s against
31-35 s; docs/benchmarks.md, 2026-12-02) and nothing in the results said so; such a run
measures the machine's load, not the policy. The run's own: where its processes keep every
core busy (c2's twelve ranks on 2 cores), the run compares CPU schedules as much as link
schedules. The run's own is read off the machine's busy ticks (/proc/stat), so nothing of
it is missed between reads; other work is a lower bound: an other process that lived less
than one read apart is not seen (its CPU counts as the run's), and one that ended loses its
CPU since the read before."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Set

from tensorlights.discovery.procfs import (
    MachineTicks,
    ProcessGone,
    ProcessHidden,
    ProcFs,
    ProcKey,
    ProcStat,
)

SAMPLE_S = 2.0
"""How often the run's loop reads /proc (one read of ~200 processes: a few ms)."""
DISTURBED_AT = 0.1
"""Cores of other work, on average over a run, from which the run is marked disturbed (the
VM idle: 0.00-0.01 measured)."""
CPU_BOUND_AT = 0.9
"""The share of the machine's cores the run's own processes used, on average, from which the
run is marked CPU-bound."""


def split_ours(
    stats: Iterable[ProcStat], root: int, known_ours: Set[ProcKey]
) -> tuple[dict[ProcKey, int], dict[ProcKey, int]]:
    """The processes of `stats` that are ours and those that are not, each with its CPU
    ticks. Ours: `root` and its descendants, and any process ours before (`known_ours`; a
    descendant whose parent ended is adopted by init and is still the run's). Kernel
    threads are neither."""
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
    mine = {stat.key: stat.cpu_ticks for stat in listed if stat.key in ours}
    others = {stat.key: stat.cpu_ticks for stat in listed if stat.key not in ours}
    return mine, others


def ticks_since(before: Mapping[ProcKey, int], after: Mapping[ProcKey, int]) -> int:
    """CPU ticks the processes of `after` took since `before`: a process not in `before`
    started since (or became another's since) and counts whole."""
    return sum(ticks - before.get(key, 0) for key, ticks in after.items())


class CpuUse:
    """Reads /proc at most every SAMPLE_S (`tick`, from the run's loop) and adds up the CPU of
    other work (other processes and steal) and of the run (the machine's busy time less other
    processes'); `own_cores` and `other_cores` are their averages over the span read. Of
    the run's, `daemon_cores`: what the processes named as the policy's own (agents,
    controller) took, from the first read that named any."""

    def __init__(self, procfs: ProcFs | None = None, root_pid: int | None = None) -> None:
        self._procfs = procfs or ProcFs()
        self._root = os.getpid() if root_pid is None else root_pid
        self._last: tuple[set[ProcKey], dict[ProcKey, int], MachineTicks] | None = None
        self._own_ticks = 0
        self._other_ticks = 0
        self._first_at = math.nan
        self._sampled_at = -math.inf
        self._daemons_first: dict[ProcKey, int] = {}
        self._daemons_latest: dict[ProcKey, int] = {}
        self._daemons_from = math.nan

    def tick(self, now: float, daemons: Callable[[], Collection[int]] = tuple) -> None:
        """A read if one is due; `daemons` is asked for the pids only then."""
        if now - self._sampled_at >= SAMPLE_S:
            self.sample(now, daemons())

    def sample(self, now: float, daemons: Collection[int] = ()) -> None:
        """One read; `daemons`: the pids of the policy's own processes now."""
        stats = []
        for pid in self._procfs.pids():
            try:
                stats.append(self._procfs.stat(pid))
            except (ProcessGone, ProcessHidden):
                continue
        machine = self._procfs.machine_ticks()
        mine, others = split_ours(stats, self._root, self._last[0] if self._last else set())
        if self._last is None:
            self._first_at = now
        else:
            _, others_before, machine_before = self._last
            other_processes = ticks_since(others_before, others)
            # Per-process ticks and the machine's are counted apart: the difference may dip
            # below 0 by a tick or two while the run is idle.
            busy = machine.busy - machine_before.busy
            self._own_ticks += max(busy - other_processes, 0)
            self._other_ticks += other_processes + machine.steal - machine_before.steal
        self._last = set(mine), others, machine
        self._sampled_at = now
        if daemons and math.isnan(self._daemons_from):
            self._daemons_from = now
        # Each daemon counts from when it is first named: not its start-up before the run
        # (an agent's imports, its first reads), and a restarted one anew.
        for stat in stats:
            if stat.key.pid in daemons:
                self._daemons_first.setdefault(stat.key, stat.cpu_ticks)
                self._daemons_latest[stat.key] = stat.cpu_ticks

    @property
    def other_cpu_s(self) -> float:
        return self._other_ticks / self._procfs.ticks_per_second

    @property
    def own_cpu_s(self) -> float:
        return self._own_ticks / self._procfs.ticks_per_second

    def _cores(self, cpu_s: float) -> float | None:
        span = self._sampled_at - self._first_at
        return cpu_s / span if span > 0 else None

    def other_cores(self) -> float | None:
        """Other work's average cores from the first read to the latest; None before two."""
        return self._cores(self.other_cpu_s)

    def own_cores(self) -> float | None:
        """The run's processes' average cores from the first read to the latest."""
        return self._cores(self.own_cpu_s)

    @property
    def daemon_cpu_s(self) -> float:
        ticks = sum(t - self._daemons_first[key] for key, t in self._daemons_latest.items())
        return ticks / self._procfs.ticks_per_second

    def daemon_cores(self) -> float | None:
        """The daemons' average cores from the first read that named one to the latest; None
        where none was named (no daemon: FIFO), or before two such reads."""
        span = self._sampled_at - self._daemons_from
        return self.daemon_cpu_s / span if span > 0 else None
