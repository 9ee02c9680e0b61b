"""The agent's status over a local Unix socket (mode 0660): `tensorlights-agent status`
(status.py holds the document and the client side).

Protocol: connect, read one JSON document, the server closes. Root and the socket's group
(set by the directory, e.g. by systemd's RuntimeDirectory) may read it; others get EACCES.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensorlights.errors import ConfigError
from tensorlights.threads import daemon_thread


class StatusBoard:
    """The latest status, published by the loop as a function of immutable state and only
    rendered when someone asks (the loop runs 4 times a second; `status` rarely)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._render: Callable[[], dict[str, Any]] = lambda: {"state": "starting"}

    def publish(self, render: Callable[[], dict[str, Any]]) -> None:
        with self._lock:
            self._render = render

    def document(self) -> dict[str, Any]:
        with self._lock:
            render = self._render
        return render()

    def encoded(self) -> bytes:
        return json.dumps(self.document(), sort_keys=True).encode()


def _answers(path: Path) -> bool:
    """Whether a process listens on the Unix socket at `path` (else it is stale)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


class StatusServer:
    def __init__(self, path: Path, board: StatusBoard) -> None:
        self.path = path
        self._board = board
        try:
            path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            if path.is_socket():
                if _answers(path):
                    raise ConfigError(
                        f"another agent serves its status on {path}: stop it, or give this "
                        "one another status_socket"
                    )
                path.unlink()  # a stale socket from a killed agent
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            old_umask = os.umask(0o117)
            try:
                self._sock.bind(str(path))
            finally:
                os.umask(old_umask)
            os.chmod(path, 0o660)
            self._sock.listen(16)
        except OSError as exc:
            raise ConfigError(f"cannot serve status on {path}: {exc.strerror or exc}") from exc
        self._stopping = False
        self._thread = daemon_thread(self._serve, "status-socket")

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while not self._stopping:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(2.0)
                    conn.sendall(self._board.encoded())
                except OSError:
                    pass

    def close(self) -> None:
        self._stopping = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
