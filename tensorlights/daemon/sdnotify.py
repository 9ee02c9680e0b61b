"""systemd's notify protocol (sd_notify(3)): one datagram to $NOTIFY_SOCKET per message.

Without NOTIFY_SOCKET (not started by systemd with Type=notify) every call does nothing.
"""

from __future__ import annotations

import contextlib
import os
import socket


class Notifier:
    def __init__(self, address: str | None) -> None:
        self._address = address
        self._sock: socket.socket | None = None
        if address:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)

    @classmethod
    def from_environment(cls) -> Notifier:
        return cls(os.environ.get("NOTIFY_SOCKET"))

    @property
    def enabled(self) -> bool:
        return self._sock is not None

    def send(self, **fields: str) -> None:
        """e.g. send(READY="1", STATUS="reconciling eth0")."""
        if self._sock is None or self._address is None:
            return
        address = "\0" + self._address[1:] if self._address.startswith("@") else self._address
        message = "\n".join(f"{key}={value}" for key, value in fields.items())
        # systemd gone or restarting: nothing useful to do, and never fatal.
        with contextlib.suppress(OSError):
            self._sock.sendto(message.encode(), address)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
