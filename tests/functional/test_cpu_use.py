"""The CPU of a benchmark run and of other work beside it, read from the real /proc: a busy
process that is not the bench's is other work, the bench's own busy child is the run's."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tensorlights.bench.cpu_use import CpuUse, split_ours
from tensorlights.discovery.procfs import ProcFs, ProcKey

BUDGET_S = 1.0
SPINNER = f"""
import os, sys, time
open(sys.argv[1] + ".pid", "w").write(str(os.getpid()))
while time.process_time() < {BUDGET_S}:
    pass
open(sys.argv[1], "w").close()
time.sleep(120)
"""


def _wait_for(*paths: Path, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while not all(path.exists() for path in paths):
        assert time.monotonic() < end, f"spinners not done: {paths}"
        time.sleep(0.05)


def test_a_detached_busy_process_is_other_work_and_the_bench_child_is_the_runs(
    tmp_path: Path,
) -> None:
    procfs = ProcFs()
    other, child = tmp_path / "other", tmp_path / "child"
    pids: list[int] = []
    ours: subprocess.Popen[bytes] | None = None
    try:
        # setsid -f forks and its first process exits: init adopts the spinner, as it would
        # a process started by someone else.
        subprocess.run(["setsid", "-f", sys.executable, "-c", SPINNER, str(other)], check=True)
        _wait_for(Path(f"{other}.pid"))
        pids.append(int(Path(f"{other}.pid").read_text()))
        work = CpuUse(procfs)
        work.sample(time.monotonic())
        ours = subprocess.Popen([sys.executable, "-c", SPINNER, str(child)])
        pids.append(ours.pid)
        _wait_for(other, child)
        work.sample(time.monotonic())

        stats = [procfs.stat(pid) for pid in (os.getpid(), *pids)]
        mine, others = split_ours(stats, os.getpid(), set())
        other_key = procfs.stat(pids[0]).key
        assert set(others) == {other_key} and ProcKey(ours.pid, stats[2].key.start_ticks) in mine
        # Each spinner's CPU since the first read, to the tick, on its side (the detached
        # one's before that read is not counted; other work besides may add to either).
        assert work.other_cpu_s >= 0.8 * BUDGET_S and work.own_cpu_s >= 0.8 * BUDGET_S
        other_cores, own_cores = work.other_cores(), work.own_cores()
        assert other_cores is not None and own_cores is not None and own_cores > 0
        assert procfs.stat(2).kernel_thread  # kthreadd
        assert not procfs.stat(os.getpid()).kernel_thread
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if ours is not None:
            ours.wait(timeout=10)
