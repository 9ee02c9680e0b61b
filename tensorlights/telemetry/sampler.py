"""Samples tcp_info of every PS connection the latest discovery scan found, on its own thread
and socket, and turns the samples into iterations (straggler.py).

Cost: one batch of exact inet_diag lookups per round (no hash-table walk), ~7 us per
connection sampled; jobs whose workers are computing are sampled through one connection per
round (see sample_once), so the cost follows the share of time spent pushing.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from itertools import islice

from tensorlights.discovery.sockdiag import SockDiag
from tensorlights.errors import TensorLightsError
from tensorlights.model import DiscoverySnapshot
from tensorlights.policy.packing import JobLoad, job_load
from tensorlights.telemetry.straggler import DEFAULT_MIN_PUSH_BYTES, Iteration, StragglerTracker

RECENT_ITERATIONS = 200
LOAD_ITERATIONS = 5
"""A job's load is the median of its last this many iterations."""
FULL_ROUND_EVERY = 10
KEEP_ENDED_JOBS_S = 60.0
"""A finished job's last iterations stay in `recent()` this long (its final push closes only
when its connections are gone, i.e. after it ended)."""


class TelemetrySampler:
    def __init__(
        self,
        interval_s: float = 0.1,
        min_push_bytes: int = DEFAULT_MIN_PUSH_BYTES,
        on_iteration: Callable[[Iteration], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.interval_s = interval_s
        self.tracker = StragglerTracker(min_push_bytes)
        self._on_iteration = on_iteration
        self._clock = clock
        self._targets: (
            tuple[dict[str, list[tuple[str, tuple[int, bytes]]]], dict[str, set[str]]] | None
        ) = None
        self._lock = threading.Lock()
        self._recent: dict[str, deque[Iteration]] = {}
        self._last_seen: dict[str, float] = {}
        self._iterations: dict[str, int] = {}
        self._diag: SockDiag | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""
        self._round = 0
        self._known_jobs: set[str] = set()
        self.sampled_connections = 0
        """Connection samples taken so far (the cost driver)."""

    def set_snapshot(self, snapshot: DiscoverySnapshot) -> None:
        """The PS connections to sample from now on (called by the loop after each scan; the
        per-round work is prepared here, once per scan, not once per round)."""
        by_job: dict[str, list[tuple[str, tuple[int, bytes]]]] = {}
        for task in snapshot.tasks:
            if not task.in_agent_netns:
                continue  # its connections live in another namespace's tables
            # A job stays present while its PS runs, even between connections (a PS closes
            # them before it exits): its counters must not vanish before it does.
            by_job.setdefault(task.job, [])
            for conn in task.connections:
                if conn.kernel_id:
                    by_job[task.job].append((conn.kernel_id.hex(), (conn.family, conn.kernel_id)))
        present = {job: {key for key, _ in conns} for job, conns in by_job.items()}
        self._targets = (by_job, present)

    def recent(self) -> dict[str, list[Iteration]]:
        with self._lock:
            return {job: list(items) for job, items in self._recent.items()}

    def loads(self, link_rate_bps: float) -> dict[str, JobLoad]:
        """Per job with measured iterations: its load on a link of `link_rate_bps`."""
        with self._lock:
            busy = self.tracker.busy_jobs()
            loads = {}
            for job, items in self._recent.items():
                # The newest few, without copying the whole history (this runs every pass).
                last = list(islice(reversed(items), LOAD_ITERATIONS))
                load = job_load(
                    [i.pushed_bytes for i in last],
                    [i.idle_before_s for i in last if i.idle_before_s is not None],
                    self._iterations.get(job, 0),
                    job in busy,
                    link_rate_bps,
                )
                if load is not None:
                    loads[job] = load
            return loads

    def sent_counters(self) -> dict[str, tuple[int, int]]:
        """Per job: (bytes acknowledged, data segments sent) since tracking began."""
        with self._lock:
            packets = self.tracker.sent_packets
            return {job: (n, packets.get(job, 0)) for job, n in self.tracker.sent_bytes.items()}

    def sample_once(self) -> list[Iteration]:
        """One round. A job whose connections are all idle (its workers computing) has one
        connection sampled per round, in turn, and all of them every FULL_ROUND_EVERY
        rounds: every push of a job starts at once, so one connection going busy shows the
        push began, and from the next round on all are sampled until all are idle again."""
        targets = self._targets
        if targets is None:
            return []
        by_job, present = targets
        self._round += 1
        keys: list[tuple[str, str]] = []
        ids: list[tuple[int, bytes]] = []
        busy = self.tracker.busy_jobs()
        for job, conns in by_job.items():
            if not conns:
                continue
            if self._round % FULL_ROUND_EVERY == 0 or job in busy or job not in self._known_jobs:
                chosen = conns
            else:
                chosen = [conns[self._round % len(conns)]]
            for key, kernel_id in chosen:
                keys.append((job, key))
                ids.append(kernel_id)
        if self._diag is None:
            self._diag = SockDiag()
        infos = self._diag.tcp_info(ids) if ids else []
        now = self._clock()
        gone = {key for (_, key), info in zip(keys, infos, strict=True) if info is None}
        if gone:  # closed since the last scan
            present = {job: keys - gone for job, keys in present.items()}
        samples = [(job, key, info) for (job, key), info in zip(keys, infos, strict=True) if info]
        self.sampled_connections += len(ids)
        self._known_jobs = set(by_job)
        with self._lock:
            closed = self.tracker.observe(now, samples, present)
            for job in present:
                self._last_seen[job] = now
            for job, seen in list(self._last_seen.items()):
                if now - seen > KEEP_ENDED_JOBS_S:
                    del self._last_seen[job]
                    self._recent.pop(job, None)
                    self._iterations.pop(job, None)
            for iteration in closed:
                self._iterations[iteration.job] = self._iterations.get(iteration.job, 0) + 1
                self._last_seen.setdefault(iteration.job, now)
                self._recent.setdefault(iteration.job, deque(maxlen=RECENT_ITERATIONS)).append(
                    iteration
                )
        for iteration in closed:
            self._on_iteration(iteration)
        return closed

    # Thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="telemetry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        next_at = self._clock()
        while not self._stop.is_set():
            try:
                self.sample_once()
                self.last_error = ""
            except (TensorLightsError, OSError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self._diag is not None:
                    self._diag.close()
                    self._diag = None
            next_at += self.interval_s
            delay = next_at - self._clock()
            if delay < 0:  # fell behind: keep the cadence, skip the missed rounds
                next_at = self._clock()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._diag is not None:
            self._diag.close()
            self._diag = None
