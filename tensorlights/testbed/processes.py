"""What starting and stopping the daemons a test runs needs: a free port, and a stop that
cannot hang."""

from __future__ import annotations

import socket
import subprocess
from typing import Any


def free_port() -> int:
    """A TCP port free on loopback when asked; another process may take it before ours binds
    it (tests only)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stop(proc: subprocess.Popen[Any], timeout_s: float = 10) -> None:
    """SIGTERM, then SIGKILL after `timeout_s`; reaped either way."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
