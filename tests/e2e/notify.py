"""The receiving end of systemd's notify protocol, for running units' ExecStart lines."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class NotifyReceiver:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[str] = []
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.bind(str(path))
        self._sock.settimeout(0.5)

    def wait_for(
        self, done: Callable[[list[str]], bool], proc: subprocess.Popen[bytes], deadline_s: float
    ) -> None:
        """Collect messages until `done(messages)`; fail if the process exits first."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and not done(self.messages):
            try:
                self.messages += self._sock.recv(4096).decode().split("\n")
            except TimeoutError:
                if proc.poll() is not None:
                    err = proc.stderr.read() if proc.stderr else b""
                    raise AssertionError(f"exited {proc.returncode}: {err.decode()}") from None
        assert done(self.messages), self.messages

    def drain(self) -> list[str]:
        while True:
            try:
                self.messages += self._sock.recv(4096).decode().split("\n")
            except TimeoutError:
                return self.messages

    def close(self) -> None:
        self._sock.close()
        os.unlink(self.path)
