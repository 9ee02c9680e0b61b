"""Parameter pushes, their completion per worker, and the straggler spread (pure).

Input: samples of each PS connection's tcp_info (bytes acked and received, data in flight,
the ages of the last ACK and the last data received in milliseconds), taken every 5-100 ms.
A connection is *idle* when nothing is in flight or waiting to be sent. A push to a worker
has completed when the connection is idle again and its acked bytes grew by at least
`min_push_bytes` since it was last idle; it completed when the last ACK arrived: sample
time - last_ack_recv. That is exact to the millisecond however coarse the sampling, as long
as a sample falls in the idle gap between two pushes (the workers' compute time): sample at
least twice as often as that gap is long.

Each push lies in its *start window*: after the last sample that saw the connection idle, no
later than the first sample that saw it busy (or the completion). The pushes of one iteration
need not start together: gloo's PS, for one, pushes to one worker after the other. What
separates two iterations is the workers' compute, when the whole job is *quiet*: a sampling
round in which none of its connections was busy. A completion belongs to the open iteration
unless its connection already completed there, or a quiet round fell between the open
iteration's first push (the earliest start_by) and this push's start (its start_after). While
sampling is under half the compute time, a quiet round falls between any two iterations. An
iteration closes when every connection of the job that pushes has completed in it (every
connection, until one iteration has closed), when the next one begins, or when the job ends.
The job's first iteration watched whole (every connection seen idle before it began) is
reported without a period; one seen in part only anchors the next one's period -- unless
each of its connections was first seen during that push, and the bytes it had carried in
all its life by that push's end were no more than FIRST_PUSH_SLACK of its next push's: its
first push, whose end was measured (only its start is unknown). Frameworks open their data
connections at the first push (TensorFlow's workers connect to their PS at their first read,
gloo's pairs at their first send), where discovery cannot see them before; then the first
iteration is reported, without a period, once the next one is (the next push tells).

Workers *answer* on the connection a push came on: their gradient (gloo, the synthetic
job), an RPC's response (torch.distributed.rpc), the next request (TensorFlow's reads and
updates). An answer is ANSWER_MIN_BYTES or more received while the connection is between
pushes, dated by the kernel's last_data_recv. Once a job has answered, its pushes are grouped
by the answers, not by quiet rounds, so fast sampling neither splits one iteration at the
instant between gloo's one-after-the-other pushes nor counts one push written in parts (RPC
framing, several tensors, gRPC's flow-control stalls) as two: a completion on a connection
that has not answered since its previous completion is the same push, joined; one on a
connection that has answered since begins the next iteration, and so does a push that
started after every push of the open iteration had been answered (a synchronous PS pushes
again only then; gloo pushes to the next worker in line before the first answers). Such an
iteration closes once every connection that pushes has completed in it and answered. This
holds once every connection that pushes has answered; until then quiet rounds group the
pushes, what they close is held, and the completions are kept: once every connection has
answered they are regrouped by the answers, and what that closes is reported (none of a
job's first iterations is lost to the decision, however late its answers come). Where one
connection pushes for ONE_WAY_AFTER_S without answering (the TensorFlow PS job answers on
some of its pushing connections only), or no worker answers by then, quiet rounds group the
pushes, and what was held is reported. The sampler keeps each job's sampling interval under
the gaps before its answers (sampler.py).

A collective job's ranks (a ring all-reduce) send each iteration in steps on the same
connection (reduce-scatter, then all-gather), their peers' steps arriving in between: a sample
between two steps would see one push end, an answer, and the next push. Where the next push
on a connection starts within half the job's usual idle time of the last one's end, it is
the same all-reduce's next step, joined; the iteration closes only that long after its last
completion. The usual idle time is the shortest idle_before_s of its last IDLES_KEPT
iterations and the open one's but those under their upper median / STEP_CUT: a step
measured apart (after a gap of milliseconds) is one of those while no more than half of
them are (once joined, none is; the open iteration's own idle time is what keeps a ring
split at every all-reduce at half), so what is left is the compute between all-reduces,
whose shortest is the one that matters (DDP ranks on 2 busy cores: 0.09-0.28 s between
all-reduces for 100 ms of padded compute; the steps' gaps 20-40 ms); no pause or long wait
at the start counts. A start window's middle stands for when a push began, as in
idle_before_s. Should iterations be joined all the same, one open for MAX_OPEN_ITERATION_S
closes and the idle times are learnt again.

The iteration's start window is that of its first push. Spread = last completion - first;
period = time between the last completions of consecutive iterations; push time = last
completion - the earliest estimated push start (completion - bytes / delivery rate: an
estimate).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from tensorlights.model import TcpInfo

DEFAULT_MIN_PUSH_BYTES = 16 * 1024
MAX_OPEN_ITERATION_S = 30.0
QUIET_ROUNDS_KEPT = 8
"""Recent quiet rounds remembered per job: more than fall inside one iteration's pushes."""
ANSWER_MIN_BYTES = 1024
"""Received between pushes, this is a worker's answer; less is protocol chatter (HTTP/2
WINDOW_UPDATE and PING frames are 13-17 bytes)."""
ANSWER_AFTER_S = 0.004
"""An answer arrives this long after the push it answers ended (the kernel's 4 ms tick): a
frame read at the push's last byte is the receiver's, not an answer."""
ONE_WAY_AFTER_S = 1.0
"""A job none of whose workers answered this long after its first push completed does not
answer (its pushes are grouped by quiet rounds)."""
ANSWERS_KEPT = 32
"""Answers remembered per connection: enough to regroup a job's first second of pushes by
them once the grouping is decided (see `_regroup`)."""
UNDECIDED_KEPT = 1024
"""Completions remembered per job while its grouping is undecided (to regroup them)."""
TAIL_BYTES = 1024
"""A control message's size at most, what a push may leave unacknowledged after it (gloo's
is tens of bytes; gRPC's trailers after a TensorFlow PS's response ~0.6 KB, their ACK held
back 40 ms or until the worker's next request)."""
GAPS_KEPT = 8
FIRST_PUSH_SLACK = 1.5
"""A connection first seen mid-push carried one push in all its life by that push's end if
its bytes acked were no more than this many times its next push's (its handshake besides;
two pushes would be twice)."""
IDLES_KEPT = 9
"""Recent iterations' idle times before remembered per job (see `_step_window`)."""
IDLES_TO_JOIN = 3
"""A collective job's steps are joined once it has this many idle times measured (of two,
the start's long wait would make the median)."""
STEP_CUT = 2.5
"""A collective job's idle time under its recent ones' upper median / this is a step's (a
split all-reduce's); the shortest of the rest is its compute. With 3 a step that waited 20
ms for its peer, measured at 33 ms sampling (the sampler's pace for 100 ms of compute),
passed for compute and the ring stayed split; with 2, compute varying 0.5-3x merged more
all-reduces (docs/design.md)."""


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
    first_push: Completion | None = None
    """The connection's push before this one where that was its first, seen in part (its
    start unknown): the first iteration's, should this one be in the second."""


@dataclass(frozen=True)
class Iteration:
    job: str
    first_done: float
    last_done: float
    connections: int
    push_seconds: float
    period: float | None
    """Since the previous iteration's last completion (None: the first measured, whole but
    with no iteration measured before it)."""
    pushed_bytes: int = 0
    """What the PS pushed to all its workers in this iteration."""
    idle_before_s: float | None = None
    """From the previous iteration's last completion to this push's start (the middle of
    the pushes' common start window): the workers' compute, gradient and barrier -- what
    does not need the link. Unaffected by how long the push then waits in a queue."""
    count: int = 1
    """The job's iterations this one stands for: more than one where a ring's all-reduces
    were measured merged (its bytes span that many of its bytes per iteration: ring_count.py);
    `period` is then their mean, `pushed_bytes` their sum."""

    @property
    def spread(self) -> float:
        return self.last_done - self.first_done


class WatchState(NamedTuple):
    busy: set[str]
    """Jobs with a connection last seen pushing (or not primed yet)."""
    sending: set[str]
    """Jobs with a connection seen sending after it was seen idle: a push began."""
    pushing: set[str]
    """Connections that have completed a push: the ones that show a job's push begin."""
    unseen: set[str]
    """Connections never sampled (new): to be sampled with all of their job's."""


@dataclass
class _Connection:
    job: str
    acked_when_idle: int
    acked_last: int
    primed: bool
    """Seen idle at least once: the next push is measured from its start."""
    idle_at: float
    primed_at: float = math.inf
    """When first seen idle (-inf: it had never pushed then)."""
    segs_last: int = 0
    busy_at: float | None = None
    pushed: bool = False
    """Has completed a push: not one of the job's control connections (a TCPStore's, a
    launcher's), which stay idle while the pushes go out on the others."""
    first_done: float | None = None
    """When its first measured push completed."""
    recv_mark: int = 0
    """bytes_received from which an answer is counted (reset while a push is seen going on:
    what arrives during a push is chatter)."""
    last_done: float | None = None
    """When its latest push completed."""
    answers: deque[float] = field(default_factory=lambda: deque(maxlen=ANSWERS_KEPT))
    seen_in_part: Completion | None = None
    """The push it was first seen in, whose start is unknown, with every byte it had carried
    by then: its first push if its next one is about as long (FIRST_PUSH_SLACK)."""
    tail: tuple[float, int] | None = None
    """(last ACK's time, bytes acked) at the latest busy sample with no more than TAIL_BYTES
    in one segment outstanding and nothing left to send: the push done but for a small
    message after it (gloo's PS tells a worker it is ready for its gradient), whose ACK the
    worker may hold back for a round trip or until it answers."""
    """When its latest answers arrived."""

    def answered(self, after: float, until: float) -> bool:
        for at in reversed(self.answers):  # in order: the newest at or before `until` decides
            if at <= until:
                return at > after
        return False


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
    answering: bool | None = None
    """Its workers answer on the push connections (pushes are grouped by the answers), or
    not (by quiet rounds); None until known: nothing is reported before."""
    by_answers: bool = False
    deciding: bool = False
    """It answers, but not yet on every connection that pushes: what closes is held."""
    """Its pushes are grouped by the answers now (every connection that pushes answers)."""
    held: list[Iteration] = field(default_factory=list)
    """Closed while `answering` was unknown, by quiet rounds: reported if that was right."""
    undecided: deque[tuple[Completion, bool]] = field(
        default_factory=lambda: deque(maxlen=UNDECIDED_KEPT)
    )
    """While the grouping is undecided (`answering` unknown, or `deciding`): the completions
    since, each with whether the job was warming up then, to regroup them by the answers."""
    undecided_anchor: float | None = None
    """The last iteration's end before them, where it is known (the period's anchor)."""
    whole_unanchored: bool = True
    """While `last_done` is None: the next iteration to close is grouped whole (not begun at
    part of a push) and is reported, without a period, if every connection was watched from
    before it began; otherwise it only anchors the next one's period."""
    first_done: float | None = None
    """Its first push's completion (a job with no answer ONE_WAY_AFTER_S later has none)."""
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=GAPS_KEPT))
    """Recent times from a push's completion to its answer: the workers' compute."""
    idles: deque[float] = field(default_factory=lambda: deque(maxlen=IDLES_KEPT))
    """Recent idle_before_s of its iterations (see `_step_window`)."""


class StragglerTracker:
    def __init__(self, min_push_bytes: int = DEFAULT_MIN_PUSH_BYTES) -> None:
        self.min_push_bytes = min_push_bytes
        self._connections: dict[str, _Connection] = {}
        self._jobs: dict[str, _Job] = {}
        self.sent_bytes: dict[str, int] = {}
        """Bytes acknowledged per job since tracking began (for byte counters)."""
        self.sent_packets: dict[str, int] = {}
        """Data segments sent per job since tracking began."""
        self.first_push_began: dict[str, float] = {}
        """Jobs that have sent `min_push_bytes` since tracking began: when the push that
        carried them began (on the connection whose bytes made up the count), not when its
        bytes were acknowledged: a push held below the green job from its start is
        acknowledged seconds later."""
        self.met_mid_run: set[str] = set()
        """Jobs with a connection first seen having acknowledged a push's worth before
        their first push was dated: the agent met them running, their count of iterations
        misses the first ones. Cleared once the next push shows that what each such
        connection had carried was its first push (the module doc): its count is whole
        then. Kept for good, a job that pushes as soon as it connects, met at its start
        (m3's first job on most hosts), left its siblings no run length (SiblingRuns)."""
        self.collective: frozenset[str] = frozenset()
        """Jobs of ranks (all-reduce rings): their steps are joined (see the module doc)."""

    def busy_jobs(self) -> set[str]:
        return self.watch_state().busy

    def sending_jobs(self) -> set[str]:
        return self.watch_state().sending

    def pushing_connections(self) -> set[str]:
        return self.watch_state().pushing

    def watch_state(self, keys: Iterable[str] | None = None) -> WatchState:
        """busy_jobs, sending_jobs and pushing_connections at once, of the connections `keys`
        only if given: the sampler asks about the jobs due in a round, in one pass (asking
        about all would cost every round as much as there are connections)."""
        busy: set[str] = set()
        sending: set[str] = set()
        pushing: set[str] = set()
        unseen: set[str] = set()
        connections = self._connections
        for key in connections if keys is None else keys:
            conn = connections.get(key)
            if conn is None:
                unseen.add(key)
                continue
            if conn.busy_at is not None:
                busy.add(conn.job)
                if conn.primed:
                    sending.add(conn.job)
            elif not conn.primed:
                busy.add(conn.job)
            if conn.pushed:
                pushing.add(key)
        return WatchState(busy, sending, pushing, unseen)

    def answer_gaps(self, job: str) -> list[float]:
        """The job's recent times from a push's end to its worker's answer (empty: none seen,
        or a job whose workers do not answer on the push connections)."""
        state = self._jobs.get(job)
        return list(state.gaps) if state is not None else []

    def idle_gaps(self, job: str) -> list[float]:
        """The job's recent idle times before its iterations' pushes (idle_before_s): its
        workers' compute where they do not answer on the push connections (empty: none
        measured yet, or a collective job, whose idle times are its steps' as well)."""
        state = self._jobs.get(job)
        if state is None or job in self.collective:
            return []
        return list(state.idles)

    def last_push_end(self, connection: str) -> float | None:
        """When the connection's latest push ended (None: none seen end)."""
        conn = self._connections.get(connection)
        return conn.last_done if conn is not None else None

    def observe(
        self,
        now: float,
        samples: Iterable[tuple[str, str, TcpInfo]],
        present: Mapping[str, set[str]] | None = None,
        same_present: bool = False,
    ) -> list[Iteration]:
        """One sampling round: (job, connection key, tcp_info) for the connections sampled
        now; `present`: every connection that exists, by job (default: those sampled).
        Returns the iterations that closed. Connections and jobs no longer present are
        forgotten (their process or socket is gone); `same_present`: `present` is the
        previous round's, so there is nothing to forget (not looked for: a round at 5 ms
        would otherwise go over every connection of every job)."""
        samples = list(samples)
        if present is None:
            present = {}
            for job, key, _ in samples:
                present.setdefault(job, set()).add(key)
        completions: dict[str, list[Completion]] = {}
        for job, key, info in samples:
            completion, gap = self._observe_connection(now, job, key, info)
            if completion is not None:
                completions.setdefault(job, []).append(completion)
            if gap is not None:
                answering = self._jobs.setdefault(job, _Job())
                if not answering.answering:
                    # Grouped by the answers once every connection that pushes has answered:
                    # what was grouped before by quiet rounds is regrouped then (`_regroup`).
                    answering.answering = True
                if gap >= self._step_window(job, answering):  # not a peer's ring step
                    answering.gaps.append(gap)
        closed: list[Iteration] = []
        if not same_present:
            closed.extend(self._forget_absent(present))
        for job, finished in completions.items():
            state = self._jobs.setdefault(job, _Job())
            self._update_membership(state, present.get(job, set()))
            for completion in sorted(finished, key=lambda c: c.at):
                earlier = state.open.get(completion.connection)
                if earlier is not None and _began(
                    completion.start_after, completion.start_by
                ) - earlier.at < self._step_window(job, state):
                    # The same all-reduce's next step.
                    state.open[completion.connection] = _joined(earlier, completion)
                    state.undecided.clear()  # holds its first part only: not regrouped
                    state.undecided_anchor = None
                    continue
                if state.first_done is None:
                    state.first_done = completion.at
                elif state.answering is None and completion.at - state.first_done > ONE_WAY_AFTER_S:
                    state.answering = False
                    closed.extend(state.held)
                    state.held.clear()
                    state.undecided.clear()
                unanswered = self._unanswered_since(state) if state.answering else None
                by_answers = unanswered is None and bool(state.answering)
                # Until every connection that pushes has answered (or one has pushed for
                # ONE_WAY_AFTER_S without: then quiet rounds group them), hold what closes.
                state.deciding = (
                    unanswered is not None and completion.at - unanswered <= ONE_WAY_AFTER_S
                )
                if state.answering and not state.deciding and not by_answers and state.held:
                    closed.extend(state.held)
                    state.held.clear()
                if by_answers != state.by_answers:
                    closed.extend(self._regroup(job, state, by_answers))
                if by_answers:
                    closed.extend(self._place_by_answers(job, state, completion))
                    continue
                if state.answering is None or state.deciding:
                    if not state.undecided:  # from the open iteration on
                        state.undecided.extend((c, state.warming_up) for c in state.open.values())
                    state.undecided.append((completion, state.warming_up))
                else:
                    state.undecided.clear()
                    state.undecided_anchor = None
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
        sampled = {job for job, _, _ in samples}
        for job, state in self._jobs.items():
            keys = present.get(job, set())
            if job in sampled and not any(
                (conn := self._connections.get(key)) is not None and conn.busy_at is not None
                for key in keys
            ):
                state.quiet.append(now)
            if not state.open:
                continue
            self._update_membership(state, keys)
            if now - state.window[1] > MAX_OPEN_ITERATION_S:  # since its first push began
                # Stalled, or a collective job's steps joined past its iterations (pauses
                # made half of its idle times long): its idle times are learnt again.
                closed.extend(self._close(job, state))
                state.idles.clear()
            elif not self._step_may_follow(job, state, now) and (
                self._answered_in_full(state) if state.by_answers else self._pushed_in_full(state)
            ):
                closed.extend(self._close(job, state))
        return closed

    def _forget_absent(self, present: Mapping[str, set[str]]) -> list[Iteration]:
        """Forgets the connections and jobs not in `present`; the ended jobs' last
        iterations, closed."""
        for key in self._connections.keys() - set().union(*present.values()):
            del self._connections[key]
        closed: list[Iteration] = []
        for job in self._jobs.keys() - present.keys():
            state = self._jobs.pop(job)  # the job ended: its last iteration is complete
            if state.open:
                closed.extend(self._close(job, state))
            closed.extend(state.held)  # it never answered
        # Also of a job that never completed a push (no state in _jobs).
        for per_job in (self.sent_bytes, self.sent_packets, self.first_push_began):
            for job in per_job.keys() - present.keys():
                del per_job[job]
        self.met_mid_run &= present.keys()
        return closed

    def _regroup(self, job: str, state: _Job, by_answers: bool) -> list[Iteration]:
        """The job's pushes grouped the other way from now on. To the answers: the
        completions since the grouping was undecided are regrouped by them, and the
        iterations they make are reported now (what quiet rounds grouped meanwhile was held,
        and is dropped). Away from them (a connection that has not answered joined): the
        open iteration is the first of those to regroup, and what closes is held."""
        state.by_answers = by_answers
        state.held.clear()
        if not by_answers:
            # Quiet rounds may end an iteration at a part of a push: no period anchor for them.
            state.undecided_anchor, state.last_done = state.last_done, None
            state.whole_unanchored = False
            state.undecided.clear()
            state.undecided.extend((c, state.warming_up) for c in state.open.values())
            return []
        undecided = list(state.undecided)
        anchor = state.undecided_anchor
        state.undecided.clear()
        state.undecided_anchor = None
        if not undecided:
            if state.open or state.last_done is not None:
                # Grouped by quiet rounds: its pushes may be parts. It anchors only.
                state.last_done, state.whole_unanchored = None, False
            return []
        # Answers are kept ANSWERS_KEPT per connection: regroup only where all are known.
        horizon = max(
            (
                conn.answers[0]
                for key in state.known
                if (conn := self._connections.get(key)) is not None
                and len(conn.answers) == ANSWERS_KEPT
            ),
            default=-math.inf,
        )
        kept = [(c, warming) for c, warming in undecided if c.at > horizon]
        # Kept whole from an iteration's start, or else the first regrouped one may lack
        # pushes: it only anchors.
        state.whole_unanchored = len(kept) == len(undecided) < UNDECIDED_KEPT
        if not state.whole_unanchored:
            anchor = None
        warming_now = state.warming_up
        state.open, state.window, state.last_done = {}, (-math.inf, math.inf), anchor
        closed: list[Iteration] = []
        for completion, warming in kept:
            state.warming_up = warming
            closed.extend(self._place_by_answers(job, state, completion))
        state.warming_up = warming_now
        return closed

    def _place_by_answers(self, job: str, state: _Job, completion: Completion) -> list[Iteration]:
        """Puts a completion of an answering job in the open iteration or the next (see the
        module doc); returns the iteration that closed to make room, if any."""
        conn = self._connections[completion.connection]
        earlier = state.open.get(completion.connection)
        if earlier is not None and not conn.answered(earlier.at, completion.at):
            # The same push, written in parts: its worker has not answered in between.
            state.open[completion.connection] = _joined(earlier, completion)
            return []
        closed: list[Iteration] = []
        if state.open and (earlier is not None or self._all_answered(state, completion.start_by)):
            closed = self._close(job, state)
        state.open[completion.connection] = completion
        if completion.start_by < state.window[1]:  # the first push so far
            state.window = (completion.start_after, completion.start_by)
        return closed

    def _step_window(self, job: str, state: _Job) -> float:
        """How soon after a push's end the next push on its connection is the same
        all-reduce's next step: half the shortest of the job's recent idle times that are
        not a step's, under their upper median / STEP_CUT (0: not a collective job, or not
        measured yet). The open iteration's own idle time counts: of a ring whose every
        all-reduce is seen in two pieces, the idle times kept alternate, a step's after a
        compute, and when its first piece is to be closed or joined the kept ones end with
        a step's; without its own compute, nine of them hold five steps' and the median is
        a step's, so the pieces were never joined (a sampler in lockstep with the steps)."""
        if job not in self.collective:
            return 0.0
        idles = list(state.idles)
        if state.open and (idle := _idle_before(state.window, state.last_done)) is not None:
            idles.append(idle)
        if len(idles) < IDLES_TO_JOIN:
            return 0.0
        cut = statistics.median_high(idles) / STEP_CUT
        return min(idle for idle in idles if idle >= cut) / 2

    def _step_may_follow(self, job: str, state: _Job, now: float) -> bool:
        """A collective job's open iteration may still get its all-reduce's next step: a
        connection's push ended less than the step window ago, or the next began within it
        (the middle of its start window, as the join reads it) and is in flight."""
        window = self._step_window(job, state)
        if not window:
            return False
        for key, done in state.open.items():
            conn = self._connections.get(key)
            began = now  # the next step, if any, is still to begin
            if conn is not None and conn.busy_at is not None:
                began = _began(conn.idle_at, conn.busy_at)
            if began - done.at < window:
                return True
        return False

    def _unanswered_since(self, state: _Job) -> float | None:
        """The first push of the longest-pushing connection of the job that has never
        answered (None: each has). Where one does not answer (the TensorFlow PS job answers on
        some of its pushing connections only), answers cannot group the pushes."""
        since = (
            conn.first_done if conn.first_done is not None else conn.busy_at  # its first push
            for key in state.known
            if not (conn := self._connections[key]).answers
        )
        return min((at for at in since if at is not None), default=None)

    def _all_answered(self, state: _Job, by: float) -> bool:
        """Whether every push of the open iteration had been answered by `by`: a push that
        started then belongs to the next iteration (a synchronous PS pushes again only once
        every worker has answered; gloo's next worker in line is pushed to before)."""
        return all(
            (conn := self._connections.get(key)) is not None and conn.answered(done.at, by)
            for key, done in state.open.items()
        )

    def _pushing(self, state: _Job) -> set[str]:
        """The job's connections that push: have pushed before, or are pushing now."""
        return {
            key
            for key in state.known
            if (conn := self._connections[key]).pushed or conn.busy_at is not None
        }

    def _pushed_in_full(self, state: _Job) -> bool:
        """Every connection that pushes (or is pushing now) has completed in the open
        iteration -- once an iteration has closed, so that which push is known; before, every
        connection (one that has not pushed yet may be next in line). A connection that never
        pushes (TensorFlow's workers' others, a store's) would keep it open until the next
        began, the job's last one until the job ended."""
        if state.last_done is None:
            return state.known <= state.open.keys()
        return self._pushing(state) <= state.open.keys()

    def _answered_in_full(self, state: _Job) -> bool:
        """Every connection that pushes (or is pushing now: one that has not pushed before
        may be next in line) has completed in the open iteration and answered."""
        return self._pushing(state) <= state.open.keys() and all(
            self._connections[key].answered(done.at, math.inf)
            for key, done in state.open.items()
            if key in self._connections
        )

    def _watched_since(self, state: _Job, at: float) -> bool:
        """Every connection of the job was seen idle by `at`: whatever any pushed since was
        measured from its start."""
        return all(
            (conn := self._connections.get(key)) is not None and conn.primed_at <= at
            for key in state.known
        )

    def _update_membership(self, state: _Job, keys: set[str]) -> None:
        """Every measurable connection of the job: an iteration is complete when each has
        finished its push (one that never pushes delays the close by one iteration)."""
        state.known = {
            key for key in keys if (conn := self._connections.get(key)) is not None and conn.primed
        }
        state.warming_up = len(state.known) < len(keys)

    def _observe_connection(
        self, now: float, job: str, key: str, info: TcpInfo
    ) -> tuple[Completion | None, float | None]:
        """The push this sample shows completed, if any, and the gap from a push's end to the
        worker's answer, if this sample shows an answer."""
        state = self._connections.get(key)
        idle = info.unacked == 0 and info.notsent_bytes == 0
        if state is None:
            if info.bytes_acked >= self.min_push_bytes and job not in self.first_push_began:
                self.met_mid_run.add(job)
            primed_at = now if idle else math.inf
            if idle and info.bytes_acked < self.min_push_bytes:
                primed_at = -math.inf  # has never pushed: none of its pushes was missed
            self._connections[key] = _Connection(
                job, info.bytes_acked, info.bytes_acked, idle, idle_at=now,
                primed_at=primed_at, segs_last=info.data_segs_out, recv_mark=info.bytes_received,
            )  # fmt: skip
            return None, None
        if info.bytes_acked > state.acked_last:
            sent = self.sent_bytes[job] = (
                self.sent_bytes.get(job, 0) + info.bytes_acked - state.acked_last
            )
            if sent >= self.min_push_bytes and job not in self.first_push_began:
                busy_by = state.busy_at if state.busy_at is not None else now
                self.first_push_began[job] = _began(state.idle_at, busy_by)
        state.acked_last = info.bytes_acked
        if info.data_segs_out > state.segs_last:
            self.sent_packets[job] = (
                self.sent_packets.get(job, 0) + info.data_segs_out - state.segs_last
            )
        state.segs_last = info.data_segs_out
        if not idle and tail_only(info):
            # Only a small message after the push unacknowledged, its ACK held back (gRPC's
            # trailers wait 40 ms, or for the worker's next request): idle once seen so in a
            # second round (a push written in parts pauses so for an instant at most), and
            # while it lasts; else the next push would follow with no idle gap seen.
            idle = (state.tail is not None and state.tail[1] == info.bytes_acked) or (
                state.busy_at is None and info.bytes_acked == state.acked_when_idle
            )
        answered_before = state.last_done
        answer_at = None
        if info.bytes_received - state.recv_mark >= ANSWER_MIN_BYTES:
            answer_at = now - info.last_data_recv_ms / 1000.0
        if answer_at is not None or not idle:
            # What arrives while a push is going on is chatter, not an answer.
            state.recv_mark = info.bytes_received
        completion = None
        if idle:
            completion = self._idle(key, state, now, info)
        else:
            if state.busy_at is None:
                state.busy_at = now
            if tail_only(info):
                state.tail = (now - info.last_ack_recv_ms / 1000.0, info.bytes_acked)
        if answer_at is None:
            return completion, None
        if completion is not None and answer_at > completion.at + ANSWER_AFTER_S:
            answered_before = completion.at  # the answer to the push that just ended
        if answered_before is None or answer_at <= answered_before + ANSWER_AFTER_S:
            return completion, None
        if state.answers:  # kept in order (`answered`): the kernel's times are to the ms
            answer_at = max(answer_at, state.answers[-1])
        state.answers.append(answer_at)
        # Only a connection that pushes makes its job one whose workers answer: a framework
        # may answer elsewhere (TensorFlow's coordinator), its pushes then grouped as before.
        return completion, answer_at - answered_before if state.pushed else None

    def _idle(self, key: str, state: _Connection, now: float, info: TcpInfo) -> Completion | None:
        """The connection seen idle: the push that ended since, if any."""
        grown = info.bytes_acked - state.acked_when_idle
        idle_before, busy_at, tail = state.idle_at, state.busy_at, state.tail
        state.acked_when_idle, state.idle_at, state.busy_at = info.bytes_acked, now, None
        state.tail = None
        at = _delivered_at(now, info)
        if tail is not None and info.bytes_acked - tail[1] < TAIL_BYTES:
            at = min(at, tail[0])  # a small message after the push, acked later
        if not state.primed:  # first seen mid-push: that push's start is unknown
            state.primed, state.primed_at = True, now
            state.last_done = at  # but its answer is one
            state.pushed = grown >= self.min_push_bytes
            if info.bytes_acked >= self.min_push_bytes:
                state.seen_in_part = Completion(
                    connection=key,
                    at=at,
                    pushed_bytes=info.bytes_acked,  # all its life: one push, or more
                    started_at=at - _push_seconds(info.bytes_acked, info),
                    start_after=-math.inf,
                    start_by=idle_before,  # when first seen
                )
            return None
        if grown < self.min_push_bytes:
            return None
        state.pushed = True
        if state.first_done is None:
            state.first_done = at
        state.last_done = at
        first_push, state.seen_in_part = state.seen_in_part, None
        if first_push is not None and first_push.pushed_bytes > FIRST_PUSH_SLACK * grown:
            first_push = None  # it had carried more than one push when first seen
        return Completion(
            connection=key,
            at=at,
            pushed_bytes=grown,
            started_at=at - _push_seconds(grown, info),
            start_after=idle_before,
            start_by=min(busy_at if busy_at is not None else at, at),
            first_push=first_push,
        )

    def _close(self, job: str, state: _Job) -> list[Iteration]:
        """The open iteration, closed; [] while the job is warming up (then it only marks
        where the next period starts)."""
        done = list(state.open.values())
        started_after, started_by = state.window
        state.open = {}
        state.window = (float("-inf"), float("inf"))
        if state.warming_up:
            # Connections primed during it may have had their push there unmeasured.
            state.last_done, state.whole_unanchored = None, True
            return []
        last = max(c.at for c in done)
        before = state.last_done
        first_iteration = None
        if before is None:
            if not (state.whole_unanchored and self._watched_since(state, started_after)):
                state.last_done = last  # it only marks where the next period starts
                return []
            first_iteration = _first_seen_in_part(job, done, started_after)
            if first_iteration is not None:
                before = first_iteration.last_done
                # Met during its first push, not after it: counted from its start after all.
                self.met_mid_run.discard(job)
        idle = _idle_before((started_after, started_by), before)
        if idle is not None:
            state.idles.append(idle)
        iteration = _iteration(job, done, before, idle)
        state.last_done = last
        iterations = [iteration] if first_iteration is None else [first_iteration, iteration]
        if state.answering is None or state.deciding:  # held until the grouping is known
            state.held.extend(iterations)
            return []
        return iterations


def _began(after: float, by: float) -> float:
    """When a push began, read from its start window (after the last sample that saw its
    connection idle, by the first that saw it busy): the window's middle."""
    return (after + by) / 2


def _idle_before(window: tuple[float, float], before: float | None) -> float | None:
    """From `before` (the previous iteration's last completion) to when the push whose start
    `window` is began; None where either is unknown."""
    after, by = window
    if before is None or not (math.isfinite(after) and math.isfinite(by)):
        return None
    return max(0.0, _began(after, by) - before)


def _joined(first: Completion, rest: Completion) -> Completion:
    """One push seen as two completions: its start is the first part's, its end the last's."""
    return Completion(
        connection=first.connection,
        at=rest.at,
        pushed_bytes=first.pushed_bytes + rest.pushed_bytes,
        started_at=first.started_at,
        start_after=first.start_after,
        start_by=first.start_by,
        first_push=first.first_push,
    )


def _first_seen_in_part(job: str, second: list[Completion], began_after: float) -> Iteration | None:
    """The job's first iteration, from the first pushes its connections were first seen in
    (their starts unknown), given the completions of the first iteration watched whole,
    which began after `began_after`; None unless each connection's push before was its
    first and ended before then."""
    pushes = [c.first_push for c in second if c.first_push is not None]
    if len(pushes) < len(second) or max(f.at for f in pushes) > began_after:
        return None
    return _iteration(job, pushes, None, None)


def _iteration(
    job: str, done: list[Completion], before: float | None, idle: float | None
) -> Iteration:
    """The iteration of these completions, `before` the previous one's last (None: none
    measured), `idle` the time between."""
    last = max(c.at for c in done)
    return Iteration(
        job=job,
        first_done=min(c.at for c in done),
        last_done=last,
        connections=len(done),
        push_seconds=last - min(c.started_at for c in done),
        period=last - before if before is not None else None,
        pushed_bytes=sum(c.pushed_bytes for c in done),
        idle_before_s=idle,
    )


def _push_seconds(pushed_bytes: int, info: TcpInfo) -> float:
    """How long that many bytes took at the connection's delivery rate (an estimate)."""
    return pushed_bytes / info.delivery_rate if info.delivery_rate > 0 else 0.0


def tail_only(info: TcpInfo) -> bool:
    """Nothing left to send and at most TAIL_BYTES in one segment unacknowledged: the push
    done but for a small message after it (the sampler's too)."""
    return info.unacked <= 1 and info.notsent_bytes == 0 and info.outstanding <= TAIL_BYTES


def _delivered_at(now: float, info: TcpInfo) -> float:
    """When the worker had the last byte of the push: when the last ACK arrived -- unless the
    last ACK came with data from the worker (a worker that answers soon turns its connection
    interactive, and Linux then holds a final ACK back to ride on the answer; and an answer's
    segments carry ACKs too): then a smoothed round trip after the last data left, if that
    is earlier."""
    acked = now - info.last_ack_recv_ms / 1000.0
    if info.last_data_recv_ms > info.last_ack_recv_ms:
        return acked
    sent = now - info.last_data_sent_ms / 1000.0
    return min(acked, sent + info.rtt_us / 1e6)
