"""Egress links shared by flows, as rates that stay constant between events.

A link's flows are served by discipline:
  PRIORITY  strict priority between bands with work conservation, as our HTB tree behaves:
            the lowest band number with a flow in flight takes the whole link, its flows
            sharing it equally (TCP flows in one FIFO band); jobs without a band sit in the
            unmanaged band after the PS bands. With no bands at all this is FIFO: every flow
            an equal share (processor sharing).
  FAIR      per-job classes of equal rate (the `fair` baseline): the link split equally
            between the jobs with a flow in flight, each job's share between its flows.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tensorlights.model import NUM_BANDS

UNMANAGED_BAND = NUM_BANDS
"""Where a job the policy gives no band is served (after every PS band)."""
DONE_BYTES = 1e-3
"""A flow with fewer bytes left than this is done (floating-point residue: a thousandth of
a byte, 3e-11 s at 300 Mbit/s)."""


class Discipline(StrEnum):
    PRIORITY = "priority"
    FAIR = "fair"


@dataclass(eq=False)
class Flow:
    job: str
    remaining: float
    """Bytes on the wire still to send (all its streams together)."""
    done: Callable[[float], None]
    """Called with the time the last byte left."""
    streams: int = 1
    """TCP connections it stands for, started together with equal bytes (a PS task's push
    to each of its workers): they share the link as that many flows and end together, so
    one flow of their weight is exact and costs one completion instead of `streams`."""
    rate: float = 0.0
    """Bytes per second, until the link's next change."""
    ramp_until: float = 0.0
    """Until then it joined a busy link and gets `Link.ramp_weight` of an equal share."""


@dataclass(eq=False)
class Link:
    host: str
    rate_bps: float
    discipline: Discipline = Discipline.PRIORITY
    flows: list[Flow] = field(default_factory=list)
    bands: dict[str, int] = field(default_factory=dict)
    at: float = 0.0
    """When the flows' `remaining` was last brought up to date."""
    version: int = 0
    """Grows at every change: a completion computed before it is stale."""
    busy_s: float = 0.0
    """Time with at least one flow in flight (for link use)."""
    ramp_s: float = 0.0
    ramp_weight: float = 1.0
    """A flow that starts while others are in flight (a push after a compute gap: TCP
    restarts from slow start after idle, into a queue the incumbents keep full) gets this
    weight against theirs for `ramp_s`: what keeps real jobs sharing a FIFO link from
    staying in lockstep (exact processor sharing keeps any offset between two pushes as it
    is, and two jobs that start together never interleave)."""

    def advance(self, now: float) -> None:
        elapsed = now - self.at
        if elapsed > 0:
            if self.flows:
                self.busy_s += elapsed
            for flow in self.flows:
                flow.remaining -= flow.rate * elapsed
        self.at = now

    def add(self, flow: Flow, now: float) -> None:
        self.advance(now)
        if self.ramp_s > 0 and any(f.job != flow.job for f in self.flows):
            flow.ramp_until = now + self.ramp_s
        self.flows.append(flow)
        self._allocate(now)

    def remove_job(self, job: str, now: float) -> bool:
        """Take `job`'s flows off the link (the engine runs it in one event instead); whether
        it had any."""
        if not any(flow.job == job for flow in self.flows):
            return False
        self.advance(now)
        self.flows = [flow for flow in self.flows if flow.job != job]
        self._allocate(now)
        return True

    def next_change(self) -> float | None:
        """The next flow completion, or the next end of a ramp (rates change then)."""
        done = self.next_completion()
        ramps = [f.ramp_until for f in self.flows if f.ramp_until > self.at]
        return min([*([done] if done is not None else []), *ramps], default=None)

    def set_bands(self, bands: Mapping[str, int], now: float) -> bool:
        """New bands; False when nothing changed."""
        if bands == self.bands:
            return False
        self.advance(now)
        self.bands = dict(bands)
        self._allocate(now)
        return True

    def finish(self, now: float) -> list[Flow]:
        """Remove and return the flows done by `now` (the link advanced to it)."""
        self.advance(now)
        finished = [flow for flow in self.flows if self._done(flow, now)]
        if finished:
            self.flows = [flow for flow in self.flows if not self._done(flow, now)]
        self._allocate(now)
        return finished

    @staticmethod
    def _done(flow: Flow, now: float) -> bool:
        """Nothing left, or so little that sending it takes no time the clock can tell
        (its completion would fall on `now` again: 1e-6 bytes at 37.5 MB/s is 3e-14 s,
        under a float's step at 265 s, and the link kept finishing it)."""
        if flow.remaining <= DONE_BYTES:
            return True
        return flow.rate > 0 and now + flow.remaining / flow.rate <= now

    def next_completion(self) -> float | None:
        times = [flow.remaining / flow.rate for flow in self.flows if flow.rate > 0]
        return self.at + max(0.0, min(times)) if times else None

    def _allocate(self, now: float) -> None:
        self.version += 1
        capacity = self.rate_bps / 8
        for flow in self.flows:
            flow.rate = 0.0
        if not self.flows:
            return
        residue = [flow for flow in self.flows if flow.remaining <= DONE_BYTES]
        if residue:
            # Flows done but for rounding finish at once, whatever their band: held behind
            # a flow that starts the same instant, one would wait for it (a rounding apart,
            # a push ended before the other began or after, and the runs diverged).
            for flow in residue:
                flow.rate = capacity / len(residue)
            return

        def weight(flow: Flow) -> float:
            return flow.streams * (self.ramp_weight if flow.ramp_until > now else 1.0)

        if self.discipline is Discipline.FAIR:
            by_job: dict[str, list[Flow]] = {}
            for flow in self.flows:
                by_job.setdefault(flow.job, []).append(flow)
            job_weight = {
                job: max(self.ramp_weight if f.ramp_until > now else 1.0 for f in flows)
                for job, flows in by_job.items()
            }
            total_jobs = sum(job_weight.values())
            for job, flows in by_job.items():
                share = capacity * job_weight[job] / total_jobs
                total = sum(map(weight, flows))
                for flow in flows:
                    flow.rate = share * weight(flow) / total
            return
        top = min(self.bands.get(flow.job, UNMANAGED_BAND) for flow in self.flows)
        served = [f for f in self.flows if self.bands.get(f.job, UNMANAGED_BAND) == top]
        total = sum(map(weight, served))
        for flow in served:
            flow.rate = capacity * weight(flow) / total
