"""Samples tcp_info of every PS connection the latest discovery scan found, on its own thread
and socket, and turns the samples into iterations (straggler.py).

Each job is sampled at its own interval. A push is measured exactly only if a sample falls in
the idle gap after it (straggler.py), and the gaps are the workers' compute: 20 ms to seconds.
So a job is sampled GAP_SAMPLES times per gap, the shortest of its recent ones, between
MIN_INTERVAL_S and the configured interval: its gaps are the times before its workers' answers,
or where they do not answer on the push connections (TensorFlow's), the idle times before its
iterations' pushes (each measured to within the interval it was sampled at, so the interval
narrows as they do). A new job, whose gaps are not known yet, is sampled every
START_INTERVAL_S for START_FOR_S after connections of it appear (its first ones, and any new
ones: workers connect at their rendezvous, long after a launcher's or a store's connection)
and again after its first push is seen (a framework connects often many seconds before it
pushes), then at the configured interval until its gaps are known.

A job with a push in flight is also sampled just after that push should end (what is left to
send at the connection's delivery rate): in the instant between a push's end and whatever the
PS sends next on the connection (gloo's notice that it is ready for the gradient), whose ACK
would otherwise stand for the push's end. Until then, while that end is more than two
intervals away, a job whose gaps are known is sampled less often (STRETCH_MAX).

Cost: one batch of exact inet_diag lookups per round (no hash-table walk), ~7 us per
connection sampled; jobs at the configured interval whose workers are computing are sampled
through one connection per round (see sample_once), so the cost follows the share of time
spent pushing and, per job, how short its gaps are.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import islice

from tensorlights.discovery.sockdiag import SockDiag
from tensorlights.errors import TensorLightsError
from tensorlights.model import DiscoverySnapshot, TcpInfo
from tensorlights.policy.packing import JobLoad, Measured, job_load
from tensorlights.telemetry.ring_count import RingCounter
from tensorlights.telemetry.straggler import (
    DEFAULT_MIN_PUSH_BYTES,
    Iteration,
    StragglerTracker,
    tail_only,
)
from tensorlights.threads import daemon_thread

RECENT_ITERATIONS = 200
LOAD_ITERATIONS = 5
"""A job's bytes per iteration are the median of its last this many iterations..."""
COMPUTE_ITERATIONS = 50
"""...and its compute is read from its last this many (packing.job_load)."""
FULL_ROUND_EVERY = 10
MIN_INTERVAL_S = 0.005
START_INTERVAL_S = 0.02
START_FOR_S = 5.0
GAP_SAMPLES = 3
END_MARGIN_S = 0.002
STRETCH_MAX = 2.0
"""While a job with known gaps has pushes in flight, the first to end more than two intervals
away, its interval stretches toward half that time, up to this many times the gap-based one:
still under its shortest gap (GAP_SAMPLES / STRETCH_MAX samples per gap, whatever the
MIN_INTERVAL_S floor), so an idle gap between two pushes on a connection is seen all the same,
at a fraction of the rounds (a 1 MB push at a third of 200 Mbit lasts 120 ms: 18 rounds of
6.7 ms for 20 ms gaps, or 9)."""
KEEP_ENDED_JOBS_S = 60.0
"""A finished job's last iterations stay in `recent()` this long (its final push closes only
when its connections are gone, i.e. after it ended)."""


@dataclass(frozen=True)
class _Target:
    key: str
    """Names the connection for the tracker (unique across namespaces)."""
    netns: int | None
    """The pod's network namespace (inode); None: the agent's own."""
    kernel_id: tuple[int, bytes]
    """(family, inet_diag sockid)."""


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
        self._targets: tuple[dict[str, list[_Target]], dict[str, set[str]]] | None = None
        self._lock = threading.Lock()
        self._recent: dict[str, deque[Iteration]] = {}
        self._ended: dict[str, float] = {}
        """When each job with iterations kept was last found gone (KEEP_ENDED_JOBS_S)."""
        self._present: dict[str, set[str]] | None = None
        """The connections by job the tracker was last given (a scan's, until the next)."""
        self._iterations: dict[str, int] = {}
        self._rings: dict[str, RingCounter] = {}
        """Per collective job: its pieces regrouped into all-reduces (ring_count.py)."""
        self._loads: dict[str, tuple[int, float, JobLoad | None]] = {}
        """Per job: (its iteration count, the link rate, its load) when last worked out."""
        self._diags: dict[int | None, SockDiag] = {}
        """inet_diag sockets: the agent's own namespace (None) and each pod's (by inode)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error = ""
        self._paths: dict[int | None, str] = {}
        self._known_jobs: set[str] = set()
        self._due: dict[str, float] = {}
        """When each job is to be sampled next."""
        self._first_seen: dict[str, float] = {}
        self._turns: dict[str, int] = {}
        """Rounds each job was sampled in (its own count: see sample_once)."""
        self._first_busy: dict[str, float] = {}
        """When each job's connections, and its first push, were first seen."""
        self.sampled_connections = 0
        """Connection samples taken so far (the cost driver)."""

    def set_snapshot(self, snapshot: DiscoverySnapshot, pods: bool = False) -> None:
        """The PS connections to sample from now on (called by the loop after each scan; the
        per-round work is prepared here, once per scan, not once per round). With `pods`,
        PS tasks in other network namespaces are this host's pods: their connections are
        sampled in their namespace's own tables."""
        by_job: dict[str, list[_Target]] = {}
        namespaces: dict[int | None, str] = {}
        for task in snapshot.tasks:
            if not (task.in_agent_netns or pods):
                continue  # another host's (an emulated cluster): not ours to measure
            where = None if task.in_agent_netns else task.netns
            if where is not None:
                namespaces.setdefault(where, f"/proc/{task.pid}/ns/net")
            # A job stays present while its PS runs, even between connections (a PS closes
            # them before it exits): its counters must not vanish before it does.
            by_job.setdefault(task.job, [])
            for conn in task.connections:
                if conn.kernel_id:
                    key = f"{where or ''}:{conn.kernel_id.hex()}"
                    by_job[task.job].append(_Target(key, where, (conn.family, conn.kernel_id)))
        present = {job: {target.key for target in conns} for job, conns in by_job.items()}
        self._targets = (by_job, present)
        self._paths = namespaces
        # Jobs of ranks: their ring's steps are joined into iterations, and their bytes per
        # iteration do not hold while they wait (JobLoad.bytes_hold_waiting).
        collective = snapshot.collective_jobs
        with self._lock:
            self.tracker.collective = collective

    def recent(self) -> dict[str, list[Iteration]]:
        with self._lock:
            return {job: list(items) for job, items in self._recent.items()}

    def loads(self, link_rate_bps: float) -> dict[str, JobLoad]:
        """Per job with measured iterations (a ring not counted yet: its pieces): its load on
        a link of `link_rate_bps`. Worked out again only when the job completed an iteration
        since (this runs every pass)."""
        with self._lock:
            busy = self.tracker.busy_jobs()
            loads = {}
            for job, items in self._recent.items():
                count = self._iterations.get(job, 0)
                cached = self._loads.get(job)
                if cached is None or cached[:2] != (count, link_rate_bps):
                    newest = list(islice(reversed(items), COMPUTE_ITERATIONS))[::-1]
                    load = self._load(job, newest, count, link_rate_bps)
                    cached = self._loads[job] = (count, link_rate_bps, load)
                if cached[2] is not None:
                    loads[job] = self._as_now(job, cached[2], busy)
            # A ring reports nothing until its counter has learnt its bytes per all-reduce
            # (ring_count.MIN_MARKED ends: 7-16 s of iterations on a 2-core VM). Meanwhile it
            # is measured from its pieces, each one an iteration, as before the counter.
            # Without a load the green ring was judged not iterative at 2.5-7.3 s and put
            # behind, and waiting rings had their start-up (DDP's first broadcast, 6-9 s
            # before their iterations on two of four hosts) counted as lag and were promoted
            # on those hosts alone (c2 with hosts deciding alone: 1.60x, docs/benchmarks.md).
            present = self._present or {}
            for job, ring in self._rings.items():
                if job not in self._recent and job in present:
                    load = self._load(job, list(ring.pieces), ring.seen, link_rate_bps)
                    if load is not None:
                        loads[job] = self._as_now(job, load, busy)
            return loads

    def _load(
        self, job: str, items: list[Iteration], count: int, link_rate_bps: float
    ) -> JobLoad | None:
        """The job's load from its recent `items`, oldest first, having done `count`."""
        if job not in self.tracker.collective:
            # A PS's push to a worker that has not pushed before is not waited for, and
            # gloo's go out one after the other: its first iterations may close in parts,
            # each reaching fewer of its connections (a waiting job's first 4 MB of 8 read
            # as an iteration of its own, and made an equal job look smaller: r2, 2026-12-07).
            # Read without those reaching fewer connections than a later one (a worker that
            # leaves is not waited for: the iterations after it reach fewer).
            items = _without_parts(items)
        # The first measured has no period: its bytes count, its push gives no compute (as
        # the simulator reads a job's first push).
        measured = [
            Measured(i.pushed_bytes // i.count, None, i.push_seconds)
            if i.period is None
            else Measured(i.pushed_bytes // i.count, i.idle_before_s, i.period)
            for i in items
        ]
        answers = self.tracker.answer_gaps(job)
        return job_load(measured, LOAD_ITERATIONS, count, False, link_rate_bps, answers)

    def _as_now(self, job: str, load: JobLoad, busy: set[str]) -> JobLoad:
        """`load` with what holds of the job now: busy or not, a ring or a PS, counted from its
        start or met mid-run."""
        return replace(
            load,
            busy=job in busy,
            bytes_hold_waiting=job not in self.tracker.collective,
            counted_from_start=job not in self.tracker.met_mid_run,
        )

    def started(self) -> dict[str, float]:
        """Jobs that have pushed at least a push's worth of bytes since tracking began (past
        their start-up: imports, rendezvous, data loading, in which they send nothing), each
        with when that first push began (StragglerTracker.first_push_began)."""
        with self._lock:
            return dict(self.tracker.first_push_began)

    def sent_counters(self) -> dict[str, tuple[int, int]]:
        """Per job: (bytes acknowledged, data segments sent) since tracking began."""
        with self._lock:
            packets = self.tracker.sent_packets
            return {job: (n, packets.get(job, 0)) for job, n in self.tracker.sent_bytes.items()}

    def sample_once(self) -> list[Iteration]:
        """One round. A job whose connections are all idle (its workers computing) has one
        connection sampled per round, in turn among those that have pushed before (a PS
        also holds control connections that never push: a framework's TCPStore, its
        launcher's), and all of them every FULL_ROUND_EVERY rounds: an iteration's pushes
        go out together or one right after the other, so one pushing connection going busy
        shows the push began, and from the next round on all are sampled until all are idle
        again. A connection never sampled (new) has all of its job's sampled in the job's
        next round: it is to be seen idle before it pushes. A job none of whose connections
        has pushed yet (its workers still loading, at their rendezvous) has each connection
        sampled once every FULL_ROUND_EVERY rounds, a share of them each round: its first
        push is seen as soon as by all of them at once every FULL_ROUND_EVERY rounds, and
        the one-a-round sample, which would not know which connection to watch, is spared
        (16 such jobs of 16 connections: 256 lookups a second instead of 400)."""
        targets = self._targets
        if targets is None:
            return []
        by_job, present = targets
        keys: list[tuple[str, str]] = []
        chosen_targets: list[_Target] = []
        round_at = self._clock()
        due_by = round_at + MIN_INTERVAL_S / 2
        due = []
        for job, conns in by_job.items():
            if not conns:  # between connections: due again once it has some
                self._due.pop(job, None)
            elif self._due.get(job, due_by) <= due_by:
                due.append((job, conns))
        # Asked of the due jobs' connections only: a job sampled every 5 ms would otherwise
        # make every round go over every connection of every job.
        scope = [target.key for _, conns in due for target in conns]
        busy, sending, pushing, unseen = self.tracker.watch_state(scope)
        for job in sending:
            self._first_busy.setdefault(job, round_at)
        intervals = {}
        stretch_to: dict[str, float] = {}
        for job, conns in due:
            gaps = self.tracker.answer_gaps(job) or self.tracker.idle_gaps(job)
            intervals[job] = interval = self._interval(job, due_by, gaps)
            if gaps and job not in self.tracker.collective:  # a ring's gaps are its steps'
                stretch_to[job] = min(gaps) * STRETCH_MAX / GAP_SAMPLES
            # The job's own rounds: another job sampled faster adds rounds, and a count
            # shared with it could keep meeting this job on the same residues.
            turn = self._turns[job] = self._turns.get(job, 0) + 1
            if (
                job in busy
                or job not in self._known_jobs
                or interval < self.interval_s
                or (unseen and any(target.key in unseen for target in conns))
            ):
                chosen = conns
            elif not (watch := [target for target in conns if target.key in pushing]):
                # None has pushed yet: each once every FULL_ROUND_EVERY, spread over them.
                chosen = conns[turn % FULL_ROUND_EVERY :: FULL_ROUND_EVERY]
            elif turn % FULL_ROUND_EVERY == 0:
                chosen = conns
            else:
                chosen = [watch[turn % len(watch)]]
            for target in chosen:
                keys.append((job, target.key))
                chosen_targets.append(target)
        ids = [target.kernel_id for target in chosen_targets]
        now, infos = self._tcp_info(chosen_targets)
        gone = {key for (_, key), info in zip(keys, infos, strict=True) if info is None}
        if gone:  # closed since the last scan
            present = {job: keys - gone for job, keys in present.items()}
        same_present = present is self._present
        if not same_present:
            # Connections that appear restart a job's start (its workers connect at their
            # rendezvous, long after the job's first connection: a launcher's, a store's).
            previous = self._present or {}
            for job, job_keys in present.items():
                if not job_keys <= previous.get(job, set()):
                    self._first_seen[job] = now
        self._present = present
        samples = [(job, key, info) for (job, key), info in zip(keys, infos, strict=True) if info]
        ends = _push_ends(samples)
        for job, interval in intervals.items():
            interval = next_interval(interval, ends.get(job), stretch_to.get(job), self.interval_s)
            if interval >= self.interval_s:  # on one grid: such jobs share their rounds
                self._due[job] = (round(now / interval) + 1) * interval
            else:
                self._due[job] = now + interval
        self.sampled_connections += len(ids)
        self._known_jobs = set(by_job)
        with self._lock:
            closed = self._counted(self.tracker.observe(now, samples, present, same_present))
            if not same_present:  # jobs came or went (a scan, or sockets closed)
                for job in self._due.keys() - present.keys():
                    self._due.pop(job)
                    self._first_seen.pop(job, None)
                    self._first_busy.pop(job, None)
                    self._turns.pop(job, None)
                for job in self._recent.keys() - present.keys():
                    self._ended.setdefault(job, now)
                for job in present:
                    self._ended.pop(job, None)
            for job, ended in list(self._ended.items()):
                if now - ended > KEEP_ENDED_JOBS_S:
                    del self._ended[job]
                    self._recent.pop(job, None)
                    self._iterations.pop(job, None)
                    self._loads.pop(job, None)
                    self._rings.pop(job, None)
            for iteration in closed:
                ring = self._rings.get(iteration.job)
                self._iterations[iteration.job] = (
                    ring.total if ring else self._iterations.get(iteration.job, 0) + 1
                )
                if iteration.job not in present:  # its last, closed as it ended
                    self._ended.setdefault(iteration.job, now)
                self._recent.setdefault(iteration.job, deque(maxlen=RECENT_ITERATIONS)).append(
                    iteration
                )
        for iteration in closed:
            self._on_iteration(iteration)
        return closed

    def _counted(self, closed: list[Iteration]) -> list[Iteration]:
        """The tracker's iterations, a collective job's regrouped by its bytes (its pieces
        of all-reduces in, whole all-reduces out: ring_count.py)."""
        collective = self.tracker.collective
        counted = []
        for piece in closed:
            if piece.job in collective:
                counted.extend(self._rings.setdefault(piece.job, RingCounter()).add(piece))
            else:
                counted.append(piece)
        return counted

    def _interval(self, job: str, now: float, gaps: list[float]) -> float:
        """How long until `job` is sampled again (see the module doc); `gaps`: its answer
        gaps, or its idle times (tracker.answer_gaps, idle_gaps)."""
        if gaps:
            interval = min(gaps) / GAP_SAMPLES
        elif (
            now - self._first_seen.setdefault(job, now) < START_FOR_S
            or now - self._first_busy.get(job, -math.inf) < START_FOR_S
        ):
            interval = START_INTERVAL_S
        else:
            interval = self.interval_s
        return min(max(interval, MIN_INTERVAL_S), self.interval_s)

    def _tcp_info(self, targets: list[_Target]) -> tuple[float, list[TcpInfo | None]]:
        """When the lookups were sent, and one batch of exact lookups per network namespace,
        answers in `targets`' order. A pod's namespace that cannot be entered any more (its
        PS is gone) answers None.

        The kernel computes each connection's last-ACK age while it answers, inside the send:
        the round's time is read just before, not after the answers are parsed -- a thread
        descheduled in between (2 cores shared with the jobs, the GIL with the main loop)
        would date every completion of the round that much late (32 ms seen in CI)."""
        by_netns: dict[int | None, list[int]] = {}
        for index, target in enumerate(targets):
            by_netns.setdefault(target.netns, []).append(index)
        diags = {netns: self._diag_in(netns) for netns in by_netns}  # setns first: it is slow
        infos: list[TcpInfo | None] = [None] * len(targets)
        now = self._clock()
        for netns, indexes in by_netns.items():
            diag = diags[netns]
            if diag is None:
                continue
            answers = diag.tcp_info([targets[i].kernel_id for i in indexes])
            for index, info in zip(indexes, answers, strict=True):
                infos[index] = info
        # A pod the latest scan no longer has (not merely one idle this round: its socket
        # stays open rather than being made again next round).
        for netns in set(self._diags) - set(self._paths) - {None}:
            self._diags.pop(netns).close()
        return now, infos

    def _diag_in(self, netns: int | None) -> SockDiag | None:
        diag = self._diags.get(netns)
        if diag is None:
            try:
                diag = SockDiag(None if netns is None else self._paths[netns])
            except (OSError, KeyError, TensorLightsError):
                if netns is None:
                    raise
                return None
            self._diags[netns] = diag
        return diag

    def _close_diags(self) -> None:
        for diag in self._diags.values():
            diag.close()
        self._diags.clear()

    # Thread ----------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = daemon_thread(self._run, "telemetry")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample_once()
                self.last_error = ""
            except (TensorLightsError, OSError) as exc:
                self.last_error = f"{type(exc).__name__}: {exc}"
                self._close_diags()
                self._stop.wait(self.interval_s)  # not at once: the dues were not moved on
                continue
            # The next job due; each keeps its own cadence (a late round is not made up).
            now = self._clock()
            next_at = min(self._due.values(), default=now + self.interval_s)
            self._stop.wait(min(max(next_at - now, 0.0), self.interval_s))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._close_diags()


def next_interval(
    interval: float, end: float | None, stretch_to: float | None, most: float
) -> float:
    """A job's next interval, from its own (`interval`) and when its first push in flight
    should end (`end`, seconds from now; None: none in flight): sampled again right after that
    end, and until then, if `stretch_to` (its gaps are known), less often while the end is
    more than two intervals away (STRETCH_MAX), never over `stretch_to` or `most`."""
    if end is None:
        return interval
    if stretch_to is not None:
        interval = max(interval, min(end / 2, stretch_to, most))
    return min(interval, max(end + END_MARGIN_S, MIN_INTERVAL_S))


def _push_ends(samples: list[tuple[str, str, TcpInfo]]) -> dict[str, float]:
    """Per job with a push in flight: how soon the first of its pushes should end."""
    ends: dict[str, float] = {}
    for job, _, info in samples:
        if (info.unacked == 0 and info.notsent_bytes == 0) or tail_only(info):
            continue  # done (but for a small message after it, its ACK held back)
        left = info.notsent_bytes + info.outstanding
        end = left / info.delivery_rate if info.delivery_rate > 0 else math.inf
        ends[job] = min(ends.get(job, math.inf), end)
    return {job: end for job, end in ends.items() if math.isfinite(end)}


def _without_parts(items: list[Iteration]) -> list[Iteration]:
    """`items` (oldest first) without those that reached fewer connections than one after."""
    kept: list[Iteration] = []
    most_after = 0
    for item in reversed(items):
        if item.connections >= most_after:
            kept.append(item)
        most_after = max(most_after, item.connections)
    return kept[::-1]
