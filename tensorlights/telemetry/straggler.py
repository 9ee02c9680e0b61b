"""Parameter pushes, their completion per worker, and the straggler spread (pure).

Input: samples of each PS connection's tcp_info (bytes acked, data in flight, and the age of
the last ACK in milliseconds), taken every ~100 ms. A connection is *idle* when nothing is in
flight or waiting to be sent. A push to a worker has completed when the connection is idle
again and its acked bytes grew by at least `min_push_bytes` since it was last idle; it
completed when the last ACK arrived: sample time - last_ack_recv. That is exact to the
millisecond however coarse the sampling, as long as a sample falls in the idle gap between two
pushes (the workers' compute time): sample at least twice as often as that gap is long.

Each push lies in its *start window*: after the last sample that saw the connection idle, no
later than the first sample that saw it busy (or the completion). The pushes of one iteration
need not start together: gloo's PS, for one, pushes to one worker after the other. What
separates two iterations is the workers' compute, when the whole job is *quiet*: a sampling
round in which none of its connections was busy. A completion belongs to the open iteration
unless its connection already completed there, or a quiet round fell between the open
iteration's first push (the earliest start_by) and this push's start (its start_after). While
sampling is under half the compute time, a quiet round falls between any two iterations. An
iteration closes when every connection of the job has completed in it, when the next one
begins, or when the job ends. The iteration's start window is that of its first push. Spread =
last completion - first; period = time between the last completions of consecutive
iterations; push time = last completion - the earliest estimated push start (completion -
bytes / delivery rate: an estimate).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from tensorlights.model import TcpInfo

DEFAULT_MIN_PUSH_BYTES = 16 * 1024
MAX_OPEN_ITERATION_S = 30.0
QUIET_ROUNDS_KEPT = 8
"""Recent quiet rounds remembered per job: more than fall inside one iteration's pushes."""


@dataclass(frozen=True)
class Completion:
    connection: str
    at: float
    pushed_bytes: int
    started_at: float
    """Estimated: completion - bytes / delivery rate."""
    start_after: float
    start_by: float
    """The push started in (start_after, start_by]: sample times around it."""


@dataclass(frozen=True)
class Iteration:
    job: str
    first_done: float
    last_done: float
    connections: int
    push_seconds: float
    period: float
    """Since the previous iteration's last completion."""
    pushed_bytes: int = 0
    """What the PS pushed to all its workers in this iteration."""
    idle_before_s: float | None = None
    """From the previous iteration's last completion to this push's start (the middle of
    the pushes' common start window): the workers' compute, gradient and barrier -- what
    does not need the link. Unaffected by how long the push then waits in a queue."""

    @property
    def spread(self) -> float:
        return self.last_done - self.first_done


@dataclass
class _Connection:
    job: str
    acked_when_idle: int
    acked_last: int
    primed: bool
    """Seen idle at least once: the next push is measured from its start."""
    idle_at: float
    segs_last: int = 0
    busy_at: float | None = None
    pushed: bool = False
    """Has completed a push: not one of the job's control connections (a TCPStore's, a
    launcher's), which stay idle while the pushes go out on the others."""


@dataclass
class _Job:
    open: dict[str, Completion] = field(default_factory=dict)
    window: tuple[float, float] = (float("-inf"), float("inf"))
    """Where the open iteration's first push started."""
    quiet: deque[float] = field(default_factory=lambda: deque(maxlen=QUIET_ROUNDS_KEPT))
    """Times of the latest rounds in which none of the job's connections was busy."""
    known: set[str] = field(default_factory=set)
    last_done: float | None = None
    warming_up: bool = True
    """Some connection was first seen mid-push: iterations are incomplete, not reported."""


class StragglerTracker:
    def __init__(self, min_push_bytes: int = DEFAULT_MIN_PUSH_BYTES) -> None:
        self.min_push_bytes = min_push_bytes
        self._connections: dict[str, _Connection] = {}
        self._jobs: dict[str, _Job] = {}
        self.sent_bytes: dict[str, int] = {}
        """Bytes acknowledged per job since tracking began (for byte counters)."""
        self.sent_packets: dict[str, int] = {}
        """Data segments sent per job since tracking began."""

    def busy_jobs(self) -> set[str]:
        """Jobs with a connection last seen pushing (or not primed yet)."""
        return {
            conn.job
            for conn in self._connections.values()
            if conn.busy_at is not None or not conn.primed
        }

    def pushing_connections(self) -> set[str]:
        """Connections that have completed a push: the ones that show a job's push begin."""
        return {key for key, conn in self._connections.items() if conn.pushed}

    def observe(
        self,
        now: float,
        samples: Iterable[tuple[str, str, TcpInfo]],
        present: Mapping[str, set[str]] | None = None,
    ) -> list[Iteration]:
        """One sampling round: (job, connection key, tcp_info) for the connections sampled
        now; `present`: every connection that exists, by job (default: those sampled).
        Returns the iterations that closed. Connections and jobs no longer present are
        forgotten (their process or socket is gone)."""
        samples = list(samples)
        if present is None:
            present = {}
            for job, key, _ in samples:
                present.setdefault(job, set()).add(key)
        completions: dict[str, list[Completion]] = {}
        for job, key, info in samples:
            completion = self._observe_connection(now, job, key, info)
            if completion is not None:
                completions.setdefault(job, []).append(completion)
        for key in self._connections.keys() - set().union(*present.values()):
            del self._connections[key]
        closed: list[Iteration] = []
        for job in self._jobs.keys() - present.keys():
            state = self._jobs.pop(job)  # the job ended: its last iteration is complete
            if state.open:
                closed.extend(self._close(job, state))
            self.sent_bytes.pop(job, None)
            self.sent_packets.pop(job, None)
        for job, finished in completions.items():
            state = self._jobs.setdefault(job, _Job())
            self._update_membership(state, present.get(job, set()))
            for completion in sorted(finished, key=lambda c: c.at):
                after, by = state.window
                if state.open and (
                    completion.connection in state.open
                    or any(by <= quiet <= completion.start_after for quiet in state.quiet)
                ):
                    closed.extend(self._close(job, state))
                    after, by = state.window
                state.open[completion.connection] = completion
                if completion.start_by < by:  # the first push so far
                    after, by = completion.start_after, completion.start_by
                state.window = (after, by)
        for job, state in self._jobs.items():
            keys = present.get(job, set())
            if not any(
                (conn := self._connections.get(key)) is not None and conn.busy_at is not None
                for key in keys
            ):
                state.quiet.append(now)
            if not state.open:
                continue
            self._update_membership(state, keys)
            if state.known <= state.open.keys() or (
                now - min(c.at for c in state.open.values()) > MAX_OPEN_ITERATION_S
            ):
                closed.extend(self._close(job, state))
        return closed

    def _update_membership(self, state: _Job, keys: set[str]) -> None:
        """Every measurable connection of the job: an iteration is complete when each has
        finished its push (one that never pushes delays the close by one iteration)."""
        state.known = {
            key for key in keys if (conn := self._connections.get(key)) is not None and conn.primed
        }
        state.warming_up = len(state.known) < len(keys)

    def _observe_connection(
        self, now: float, job: str, key: str, info: TcpInfo
    ) -> Completion | None:
        state = self._connections.get(key)
        idle = info.unacked == 0 and info.notsent_bytes == 0
        if state is None:
            self._connections[key] = _Connection(
                job, info.bytes_acked, info.bytes_acked, idle, idle_at=now,
                segs_last=info.data_segs_out,
            )  # fmt: skip
            return None
        if info.bytes_acked > state.acked_last:
            self.sent_bytes[job] = self.sent_bytes.get(job, 0) + info.bytes_acked - state.acked_last
        state.acked_last = info.bytes_acked
        if info.data_segs_out > state.segs_last:
            self.sent_packets[job] = (
                self.sent_packets.get(job, 0) + info.data_segs_out - state.segs_last
            )
        state.segs_last = info.data_segs_out
        grown = info.bytes_acked - state.acked_when_idle
        if not idle:
            if state.busy_at is None:
                state.busy_at = now
            return None
        idle_before, busy_at = state.idle_at, state.busy_at
        state.acked_when_idle, state.idle_at, state.busy_at = info.bytes_acked, now, None
        if not state.primed:  # first seen mid-push: that push's start is unknown
            state.primed = True
            return None
        if grown < self.min_push_bytes:
            return None
        state.pushed = True
        at = now - info.last_ack_recv_ms / 1000.0
        duration = grown / info.delivery_rate if info.delivery_rate > 0 else 0.0
        return Completion(
            connection=key,
            at=at,
            pushed_bytes=grown,
            started_at=at - duration,
            start_after=idle_before,
            start_by=min(busy_at if busy_at is not None else at, at),
        )

    def _close(self, job: str, state: _Job) -> list[Iteration]:
        """The open iteration, closed; [] while the job is warming up (then it only marks
        where the next period starts)."""
        done = list(state.open.values())
        started_after, started_by = state.window
        state.open = {}
        state.window = (float("-inf"), float("inf"))
        if state.warming_up or state.last_done is None:
            # Warming up, or the first iteration after: connections primed during it may
            # have had their push there unmeasured. It only marks where the next period starts.
            state.last_done = max(c.at for c in done) if not state.warming_up else None
            return []
        first = min(c.at for c in done)
        last = max(c.at for c in done)
        idle = None
        if math.isfinite(started_after) and math.isfinite(started_by):
            idle = max(0.0, (started_after + started_by) / 2 - state.last_done)
        iteration = Iteration(
            job=job,
            first_done=first,
            last_done=last,
            connections=len(done),
            push_seconds=last - min(c.started_at for c in done),
            period=last - state.last_done,
            pushed_bytes=sum(c.pushed_bytes for c in done),
            idle_before_s=idle,
        )
        state.last_done = last
        return [iteration]
