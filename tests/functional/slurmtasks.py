"""What the tests that run a real Slurm share: their marks and the task program they submit."""

from __future__ import annotations

import shutil

import pytest

SLURM_TESTS = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("slurmctld") is None, reason="Slurm not installed"),
]
"""pytestmark of a module that starts Slurm (scripts/setup.sh test installs it)."""

LISTENING_TASK = (
    "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "time.sleep(120)"
)
"""`python -c` program: a task that listens on an ephemeral port until killed."""

CONNECTED_TASK = (
    "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
    "c = socket.create_connection(s.getsockname()); time.sleep(120)"
)
"""The same with one connection to itself (traffic a PS band can carry)."""
