"""Other proposals for sharing a cluster's links between training jobs, as the simulator runs
them (simulator only: they are not TensorLights' policies, and are built from the papers'
descriptions, not their code).

CASSINI (Rajasekaran et al., NSDI'24): jobs sharing a link are given time shifts of their
iterations so that their communication phases interleave instead of colliding; no
priorities, the link stays FIFO. Here: per link, a cycle as long as the longest standalone
iteration among the jobs on it, each job a window of its pushes' link time, back to back in
arrival order; a job ready to push waits for the start of its next window (on the first of
its links it shares: the paper's affinity graph, which aligns shifts across links, is not
built). A shift is
applied once, to the next push of every job on the link, whenever the jobs on it change;
the iterations then run free, as a shifted job does (its period keeps the interleaving
while the jobs fit). Where the windows do not fit in the cycle (the link is overloaded),
they overlap and pushes share the link FIFO, as the paper's jobs then do.

Crux (Cao et al., SIGCOMM'24): priorities by GPU intensity, the computation a job does per
byte it communicates, highest first, compressed into the few priority levels the network
has. Here: intensity = workers x compute per iteration / bytes pushed per iteration, one
cluster-wide order, folded into the PS bands as our agents fold theirs (bands.fold_bands);
strict priority on every link.
"""

from __future__ import annotations

import math
from collections.abc import Collection

from tensorlights.model import NUM_BANDS
from tensorlights.policy.bands import fold_bands
from tensorlights.sim.drivers import DriverBase
from tensorlights.sim.engine import SimJob


class CassiniShifts(DriverBase):
    def __init__(self) -> None:
        self._windows: dict[str, tuple[float, float, float]] = {}
        """Job -> (cycle, offset in it, the cycle's epoch) on its anchor (the first of its
        hosts it shares), until its next push has been shifted."""
        self._jobs: dict[str, set[str]] = {}
        """Host -> the jobs its shifts were computed for."""

    def evaluate(self, now: float, hosts: Collection[str]) -> None:
        """A shared link's shifts are recomputed whenever its jobs change; a job alone on
        every link it has is not shifted (nothing to interleave with)."""
        sim = self.sim
        for host in hosts:
            present = sim.host_jobs(host)
            if present == self._jobs.get(host, set()):
                continue
            self._jobs[host] = present
            if len(present) < 2:
                for name in present:
                    if all(len(sim.host_jobs(h)) < 2 for h in sim.jobs[name].hosts):
                        self._windows.pop(name, None)
                continue
            rate = sim.links[host].rate_bps
            jobs = [sim.jobs[name] for name in present]
            mine = sorted(
                (job for job in jobs if self._anchor(job) == host),
                key=lambda job: (job.arrival_s, job.name),
            )
            if not mine:
                continue
            cycle = max(_period(job, rate) for job in jobs)
            offset = 0.0
            for job in mine:
                self._windows[job.name] = (cycle, offset % cycle, now)
                offset += job.link_s(rate)

    def _anchor(self, job: SimJob) -> str:
        """The link a job's shift is computed on: the first of its hosts it shares."""
        return next((h for h in job.hosts if len(self.sim.host_jobs(h)) >= 2), job.hosts[0])

    def release(self, job: str, now: float) -> float:
        window = self._windows.pop(job, None)
        if window is None:
            return now
        cycle, offset, epoch = window
        k = math.ceil((now - epoch - offset) / cycle - 1e-9)
        return max(now, epoch + offset + k * cycle)


class CruxIntensity(DriverBase):
    """The order changes only with arrivals and departures; a link's bands matter only
    where two jobs or more share it, so only those links are set."""

    def __init__(self, ps_bands: int = NUM_BANDS - 1) -> None:
        self.ps_bands = ps_bands
        self._running: set[str] = set()
        self._shared: set[str] = set()
        """Hosts whose bands were set (two jobs or more at the time)."""

    def evaluate(self, now: float, hosts: Collection[str]) -> None:
        sim = self.sim
        running = set(sim.running)
        if running == self._running:
            return
        self._running = running
        order = sorted(running, key=lambda name: (-intensity(sim.jobs[name]), name))
        bands = dict(zip(order, fold_bands(len(order), self.ps_bands), strict=True))
        shared = {host for host, jobs in sim.measured.items() if len(jobs) >= 2}
        for host in shared | self._shared:
            sim.set_bands(host, {name: bands[name] for name in sim.host_jobs(host)})
        self._shared = shared


def intensity(job: SimJob) -> float:
    """Computation per byte communicated: a GPU's seconds per iteration over the bytes of
    the model it exchanges (a PS worker's pull, a rank's gradient)."""
    return job.compute_s / job.model_bytes


def _period(job: SimJob, rate_bps: float) -> float:
    return job.link_s(rate_bps) + job.compute_s + job.overhead_s
