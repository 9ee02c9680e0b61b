"""Daemon threads that carry their name into the kernel.

Python names its threads for itself only: `top -H`, `ps -T` and /proc/PID/task/TID/comm show
every thread of an agent as "python". Named there too, an operator sees which one spends the
CPU (the telemetry thread, the process-events reader, the main loop), and
`scripts/bench_agent.py` splits the agent's cost by thread.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from typing import Any

PR_SET_NAME = 15
COMM_BYTES = 15
"""The kernel keeps a thread's name in 16 bytes with the terminating NUL."""


def name_this_thread(name: str) -> None:
    """Set the calling thread's kernel name (cut to COMM_BYTES). Best effort: a libc that
    cannot be loaded leaves the name as it was."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    libc.prctl(PR_SET_NAME, name.encode()[:COMM_BYTES], 0, 0, 0)


def daemon_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = ()
) -> threading.Thread:
    """A daemon thread (not started) running `target(*args)`, named `name` for Python and
    for the kernel."""

    def run() -> None:
        name_this_thread(name)
        target(*args)

    return threading.Thread(target=run, name=name, daemon=True)
