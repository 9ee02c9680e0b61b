"""Where a daemon's or tlctl's TLS material lives (a config value; no TLS library here, so
reading a config never pulls in grpc)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tensorlights.errors import ConfigError

ROLE_URI = "urn:tensorlights:role:"
"""A client certificate's role is a SAN URI, e.g. urn:tensorlights:role:agent (dev_ca.py
issues them; a CA of your own adds the same URI)."""


class Role(StrEnum):
    """What a client certificate may do at the controller."""

    AGENT = "agent"
    """Register and report as the host its common name names (AgentLink)."""
    OPERATOR = "operator"
    """Read the cluster's state over TCP: tlctl --controller (Operator)."""


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path

    def for_host(self, host: str) -> TlsFiles:
        """`{host}` in the paths replaced by `host` (one directory of every node's files)."""
        ca, cert, key = (
            Path(str(p).replace("{host}", host)) for p in (self.ca, self.cert, self.key)
        )
        return TlsFiles(ca, cert, key)

    def read(self, what: str) -> tuple[bytes, bytes, bytes]:
        """(ca, cert, key) bytes; ConfigError naming the file that cannot be read."""
        data = []
        for name, path in (("ca", self.ca), ("cert", self.cert), ("key", self.key)):
            try:
                data.append(path.read_bytes())
            except OSError as exc:
                raise ConfigError(f"{what}.{name} {path}: {exc.strerror}") from exc
        return data[0], data[1], data[2]
