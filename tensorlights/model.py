"""Domain types shared by every layer (frozen, validated on construction)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from tensorlights.errors import ConfigError

NUM_BANDS = 8
"""HTB has eight priorities (0-7); band 0 is the green light."""
GREEN_BAND = 0
MAX_PORT = 65535


@dataclass(frozen=True)
class JobShaping:
    """One job's PS traffic on this host and the band it is in now.

    `ports` are the local (source) ports of the job's PS sockets on this host: its
    listeners and its established connections. A port belongs to at most one job.
    """

    job: str
    band: int
    ports: frozenset[int]

    def __post_init__(self) -> None:
        if not self.job or len(self.job) > 256 or not self.job.isprintable():
            raise ConfigError(f"job id {self.job!r} must be 1-256 printable characters")
        if not 0 <= self.band < NUM_BANDS:
            raise ConfigError(f"job {self.job}: band {self.band} is outside 0..{NUM_BANDS - 1}")
        bad = sorted(p for p in self.ports if not 1 <= p <= MAX_PORT)
        if bad:
            raise ConfigError(f"job {self.job}: ports {bad[:5]} are outside 1..{MAX_PORT}")


@dataclass(frozen=True)
class DatapathSpec:
    """Everything the datapath must make true on one interface."""

    interface: str
    link_rate_bps: int
    jobs: tuple[JobShaping, ...] = ()
    unmanaged_share: float = 0.05
    """Share of the link guaranteed to traffic that is not a managed PS (never starved)."""
    unmanaged_band: int = NUM_BANDS - 1
    """Priority at which unmanaged traffic borrows beyond its guaranteed share."""

    def __post_init__(self) -> None:
        if not self.interface or len(self.interface) > 15 or "/" in self.interface:
            raise ConfigError(f"interface name {self.interface!r} is not a valid Linux name")
        if self.link_rate_bps <= 0:
            raise ConfigError(f"link rate must be positive, got {self.link_rate_bps}")
        if not (math.isfinite(self.unmanaged_share) and 0.0 < self.unmanaged_share <= 0.5):
            raise ConfigError(
                f"unmanaged_share {self.unmanaged_share} must be in (0, 0.5]: non-PS traffic "
                "needs a guaranteed share and PS jobs need the rest"
            )
        if not 0 <= self.unmanaged_band < NUM_BANDS:
            raise ConfigError(f"unmanaged_band {self.unmanaged_band} is outside 0..{NUM_BANDS - 1}")
        seen_jobs: set[str] = set()
        port_owner: dict[int, str] = {}
        for job in self.jobs:
            if job.job in seen_jobs:
                raise ConfigError(f"job {job.job} appears twice in the datapath spec")
            seen_jobs.add(job.job)
            for port in job.ports:
                other = port_owner.setdefault(port, job.job)
                if other != job.job:
                    raise ConfigError(f"port {port} is claimed by both {other} and {job.job}")

    def band_of(self) -> dict[str, int]:
        return {job.job: job.band for job in self.jobs}


@dataclass(frozen=True)
class PreviousRootQdisc:
    """The root qdisc that was on an interface before TensorLights took it over.

    `options` is the raw TCA_OPTIONS payload, replayed verbatim on cleanup.
    `handle == 0` with `is_default` means the kernel's own default, which comes back by itself
    when our qdisc is deleted.
    """

    kind: str
    handle: int
    is_default: bool
    options: bytes = field(default=b"", repr=False)
