"""Daemon threads are named in the kernel (what top -H and /proc/PID/task/TID/comm show)."""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from tensorlights.threads import COMM_BYTES, daemon_thread


def _kernel_name_seen_by(name: str) -> tuple[str, str, bool]:
    seen: queue.Queue[tuple[str, str, bool]] = queue.Queue()

    def report() -> None:
        comm = Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()
        current = threading.current_thread()
        seen.put((comm, current.name, current.daemon))

    thread = daemon_thread(report, name)
    thread.start()
    thread.join(timeout=10)
    return seen.get(timeout=1)


def test_thread_carries_its_name_into_the_kernel() -> None:
    comm, python_name, daemon = _kernel_name_seen_by("telemetry")
    assert (comm, python_name, daemon) == ("telemetry", "telemetry", True)


def test_long_name_is_cut_to_what_the_kernel_keeps() -> None:
    comm, python_name, _ = _kernel_name_seen_by("a-name-longer-than-fifteen")
    assert comm == "a-name-longer-than-fifteen"[:COMM_BYTES]
    assert python_name == "a-name-longer-than-fifteen"


def test_arguments_reach_the_target() -> None:
    got: list[int] = []
    thread = daemon_thread(got.append, "args", (7,))
    thread.start()
    thread.join(timeout=10)
    assert got == [7]
