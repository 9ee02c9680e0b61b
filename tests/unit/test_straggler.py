"""Push and iteration detection from tcp_info samples (pure), on synthetic connections that
behave like a PS pushing to workers that compute in between."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.model import TcpInfo
from tensorlights.telemetry.straggler import MAX_OPEN_ITERATION_S, Iteration, StragglerTracker

MODEL = 1_000_000
GRADIENT = 4096


@dataclass
class FakeConnection:
    """What the kernel would report for one PS->worker connection over time."""

    pushes: list[tuple[float, float]]  # (start, done) of each push
    answers: list[float] = field(default_factory=list)
    """When the worker's answers (gradients) arrived; none: a PS that only pushes."""
    chatter_until: float = 0.0
    """Its answers until then are a few bytes each (not seen as answers)."""

    def info(self, now: float) -> TcpInfo:
        done = [p for p in self.pushes if p[1] <= now]
        busy = any(start <= now < end for start, end in self.pushes)
        acked = MODEL * len(done)
        if busy:
            start, end = next(p for p in self.pushes if p[0] <= now < p[1])
            acked += int(MODEL * (now - start) / (end - start))
        last_ack = max((p[1] for p in done), default=0.0)
        answered = [at for at in self.answers if at <= now]
        if busy:
            last_ack = now
        return TcpInfo(
            unacked=10 if busy else 0,
            last_data_sent_ms=0,
            last_data_recv_ms=round((now - max(answered, default=0.0)) * 1000),
            last_ack_recv_ms=round((now - last_ack) * 1000),
            rtt_us=100,
            bytes_acked=acked,
            bytes_received=sum(GRADIENT if at > self.chatter_until else 64 for at in answered),
            segs_out=0,
            notsent_bytes=0,
            data_segs_out=len(done),
            delivery_rate=MODEL * 10,
            bytes_sent=acked,
        )


def job_pushes(
    iterations: int, lags: list[list[float]], compute: float = 0.3, push: float = 0.1
) -> list[FakeConnection]:
    """All pushes of an iteration start together; worker w's finishes lags[k][w] late."""
    starts = []
    t = 1.0
    for k in range(iterations):
        starts.append(t)
        t += push + max(lags[k]) + compute
    workers = len(lags[0])
    return [
        FakeConnection([(starts[k], starts[k] + push + lags[k][w]) for k in range(iterations)])
        for w in range(workers)
    ]


def serial_pushes(
    iterations: int, workers: int, compute: float, push: float
) -> list[FakeConnection]:
    """As gloo's PS pushes: one worker after the other (worker w's push starts when w-1's
    ends), the next iteration a compute time after the last."""
    pushes: list[list[tuple[float, float]]] = [[] for _ in range(workers)]
    t = 1.0
    for _ in range(iterations):
        for w in range(workers):
            pushes[w].append((t, t + push))
            t += push
        t += compute
    return [FakeConnection(p) for p in pushes]


def run(
    connections: list[FakeConnection], until: float, every: float = 0.1, collective: bool = False
) -> list[Iteration]:
    tracker = StragglerTracker(min_push_bytes=1000)
    tracker.collective = frozenset({"job"} if collective else ())
    closed = []
    now = 0.0
    while now < until:
        samples = [("job", str(i), c.info(now)) for i, c in enumerate(connections)]
        closed += tracker.observe(now, samples)
        now = round(now + every, 6)
    closed += tracker.observe(now, [])  # the job ended
    return closed


def test_spread_and_period_match_the_pushes_to_the_millisecond() -> None:
    lags = [[0.0, 0.02, 0.05], [0.0, 0.0, 0.0], [0.1, 0.0, 0.03], [0.0, 0.07, 0.0]] * 3
    connections = job_pushes(len(lags), lags)
    iterations = run(connections, until=20)
    truth_last = [max(c.pushes[k][1] for c in connections) for k in range(len(lags))]
    # Every one, the first without a period (none measured before it).
    assert len(iterations) == len(lags)
    assert iterations[0].period is None and iterations[0].idle_before_s is None
    for k, iteration in enumerate(iterations):
        assert iteration.spread == pytest.approx(max(lags[k]) - min(lags[k]), abs=0.0015)
        assert iteration.last_done == pytest.approx(truth_last[k], abs=0.0015)
        assert iteration.connections == 3
        if k:
            period = truth_last[k] - truth_last[k - 1]
            assert iteration.period == pytest.approx(period, abs=0.002)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.lists(st.floats(0.0, 0.2), min_size=4, max_size=4), min_size=3, max_size=8),
    st.floats(0.21, 0.6),
)
def test_any_stragglers_with_compute_over_twice_the_sampling_are_measured(
    lags: list[list[float]], compute: float
) -> None:
    connections = job_pushes(len(lags), lags, compute=compute)
    iterations = run(connections, until=30)
    assert len(iterations) == len(lags)
    for k, iteration in enumerate(iterations):
        assert iteration.spread == pytest.approx(max(lags[k]) - min(lags[k]), abs=0.0015)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 4),
    st.floats(0.21, 0.6),
    st.floats(0.002, 0.08),
    st.floats(0.0, 0.099),
)
def test_pushes_sent_one_worker_after_the_other_are_one_iteration(
    workers: int, compute: float, push: float, phase: float
) -> None:
    """Pushes of one iteration need not start together: the job stays busy from the first
    push's start to the last one's end, and only the workers' compute separates iterations
    (sampled at any phase against the pushes)."""
    connections = serial_pushes(8, workers, compute, push)
    for c in connections:
        c.pushes = [(start + phase, end + phase) for start, end in c.pushes]
    iterations = run(connections, until=20)
    assert len(iterations) == 8, [(it.first_done, it.connections) for it in iterations]
    assert all(it.connections == workers for it in iterations)
    for k, iteration in enumerate(iterations):
        last = max(c.pushes[k][1] for c in connections)
        first = min(c.pushes[k][1] for c in connections)
        assert iteration.last_done == pytest.approx(last, abs=0.0015)
        assert iteration.spread == pytest.approx(last - first, abs=0.0015)


def test_small_messages_are_not_pushes_and_bytes_are_counted() -> None:
    tracker = StragglerTracker(min_push_bytes=16 * 1024)
    base = TcpInfo(0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 10**6, 0)
    tracker.observe(0.0, [("job", "c", base)])
    assert tracker.observe(0.1, [("job", "c", base._replace(bytes_acked=500))]) == []
    assert tracker.sent_bytes["job"] == 500
    busy = base._replace(bytes_acked=600, unacked=3)
    assert tracker.observe(0.2, [("job", "c", busy)]) == []
    assert tracker.busy_jobs() == {"job"}
    assert tracker.sent_bytes["job"] == 600


def sampled(
    tracker: StragglerTracker, connections: list[FakeConnection], start: float, until: float
) -> tuple[list[Iteration], float]:
    """Job "j"'s connections shown to `tracker` every 100 ms from `start` while before
    `until`: the iterations it reported, and when the next sample would be."""
    closed: list[Iteration] = []
    now = start
    while now < until:
        closed += tracker.observe(
            now, [("j", str(i), c.info(now)) for i, c in enumerate(connections)]
        )
        now = round(now + 0.1, 6)
    return closed, now


def watched_from(connections: list[FakeConnection], start: float) -> list[Iteration]:
    """A tracker that first sees the connections at `start`, sampling every 100 ms."""
    tracker = StragglerTracker(min_push_bytes=1000)
    closed, now = sampled(tracker, connections, start, 10)
    return closed + tracker.observe(now, [])  # ended (within a second of its first push)


def test_connections_first_seen_in_their_first_push_report_the_first_iteration() -> None:
    """Frameworks open their data connections at the first push (TensorFlow's workers at
    their first read): seen mid-push, its end is measured, and the next push shows that what
    the connection carried until then was one push."""
    lags = [[0.0, 0.05]] * 4
    connections = job_pushes(4, lags)
    closed = watched_from(connections, connections[0].pushes[0][0] + 0.05)
    assert [round(it.spread, 3) for it in closed] == [0.05] * 4
    assert [it.last_done for it in closed] == pytest.approx(
        [max(c.pushes[k][1] for c in connections) for k in range(4)], abs=0.0015
    )
    # Iteration 0 without a period (its start unknown), and 1 with one.
    assert closed[0].period is None and None not in [it.period for it in closed[1:]]
    assert closed[0].pushed_bytes == 2 * MODEL


def met_during(iteration: int, pushes: int) -> tuple[set[str], set[str]]:
    """A job of two connections first seen 50 ms into their push of `iteration`, sampled
    every 100 ms until its last push ended: met_mid_run after its first sample and after
    its last."""
    connections = job_pushes(pushes, [[0.0, 0.05]] * pushes)
    tracker = StragglerTracker(min_push_bytes=1000)
    first_seen = connections[0].pushes[iteration][0] + 0.05
    _, now = sampled(tracker, connections, first_seen, first_seen + 0.05)  # one sample
    met_first = set(tracker.met_mid_run)
    sampled(tracker, connections, now, max(c.pushes[-1][1] for c in connections) + 0.5)
    return met_first, set(tracker.met_mid_run)


def test_a_job_met_in_its_first_push_is_counted_from_its_start() -> None:
    # The agent met m3's first job on each host with a push's worth acknowledged: until the
    # next push shows that was its first push (the test above), its count may miss
    # iterations; after, it has them all and, ended, leaves its length to its siblings
    # (SiblingRuns).
    assert met_during(0, pushes=4) == ({"j"}, set())


def test_a_job_met_after_its_first_push_stays_met_mid_run() -> None:
    assert met_during(1, pushes=5) == ({"j"}, {"j"})


def test_connections_first_seen_after_earlier_pushes_are_not_measured_for_that_push() -> None:
    """First seen mid-push with two pushes' bytes behind it (an agent started while the job
    trains): that push may be any iteration's, and only anchors the next one's period."""
    lags = [[0.0, 0.05]] * 5
    connections = job_pushes(5, lags)
    closed = watched_from(connections, connections[0].pushes[1][0] + 0.05)  # in iteration 1
    # 1: its start unknown, and not the first push; 2, watched whole, has no period; 3 and 4.
    assert [round(it.last_done, 3) for it in closed] == [
        round(max(c.pushes[k][1] for c in connections), 3) for k in (2, 3, 4)
    ]
    assert closed[0].period is None and None not in [it.period for it in closed[1:]]


def test_gone_job_closes_its_open_iteration_and_forgets_its_bytes() -> None:
    lags = [[0.0, 0.0, 0.2]] * 3
    connections = job_pushes(3, lags)
    tracker = StragglerTracker(min_push_bytes=1000)
    now, closed = 0.0, []
    while now < 4.0:
        samples = [("j", str(i), c.info(now)) for i, c in enumerate(connections)]
        closed += tracker.observe(now, samples)
        now = round(now + 0.1, 6)
    assert tracker.sent_bytes["j"] == 3 * 3 * MODEL
    tracker.observe(now, [])
    assert "j" not in tracker.sent_bytes and tracker.busy_jobs() == set()


def test_idle_time_before_each_push_is_the_compute_however_long_the_push_queues() -> None:
    # 0.3 s of compute, then pushes that take 0.1 s -- or 0.6 s when they wait in a queue.
    for push in (0.1, 0.6):
        lags = [[0.0, 0.0]] * 8
        iterations = run(job_pushes(len(lags), lags, compute=0.3, push=push), until=20)
        idles = [it.idle_before_s for it in iterations]
        assert idles[0] is None  # no iteration before the first
        idles = idles[1:]
        assert idles and all(idle is not None for idle in idles)
        # The push start is known to within a sample (0.1 s): its middle is within 0.05 s.
        assert all(abs(idle - 0.3) <= 0.051 for idle in idles if idle is not None), idles
        assert all(it.pushed_bytes == 2 * MODEL for it in iterations)


def test_connections_that_never_push_are_not_the_ones_watched_for_a_push() -> None:
    # Two data connections and a framework's control connection (a TCPStore's): idle
    # throughout, it must not be the one the sampler watches between iterations.
    connections = job_pushes(3, [[0.0, 0.0]] * 3)
    tracker = StragglerTracker(min_push_bytes=1000)
    control = TcpInfo(0, 0, 0, 900, 100, 576, 0, 0, 0, 0, 10**6, 576)
    now = 0.0
    while now < 3.0:
        samples = [("j", str(i), c.info(now)) for i, c in enumerate(connections)]
        tracker.observe(now, [*samples, ("j", "store", control)])
        now = round(now + 0.1, 6)
    assert tracker.pushing_connections() == {"0", "1"}


def answering_job(
    iterations: int,
    workers: int,
    compute: float,
    push: float,
    serial: bool = False,
    parts: int = 1,
    stall: float = 0.0,
) -> tuple[list[FakeConnection], list[list[float]]]:
    """A synchronous PS whose workers answer on the push connection: each worker's gradient
    arrives `compute` after it has its parameters, and the next pushes start 1 ms after the
    last gradient. `serial`: one worker after the other (gloo). Each push is written in
    `parts` pieces with `stall` of idle between them (a framework's framing, several tensors,
    flow-control stalls). Returns the connections and, per iteration, when each worker had
    its parameters."""
    connections = [FakeConnection([]) for _ in range(workers)]
    truth: list[list[float]] = []
    t = 1.0
    for _ in range(iterations):
        done = []
        for conn in connections:
            start = t
            for _ in range(parts):
                conn.pushes.append((t, t + push / parts))
                t += push / parts + stall
            t -= stall
            done.append(t)
            if not serial:
                t = start
        truth.append(done)
        for conn, had in zip(connections, done, strict=True):
            conn.answers.append(had + compute)
        t = max(done) + compute + 0.001
    return connections, truth


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 4),
    st.floats(0.02, 0.5),
    st.floats(0.004, 0.1),
    st.booleans(),
    st.integers(1, 3),
    st.floats(0.0005, 0.008),
    st.floats(0.0, 1.0),
)
def test_answered_pushes_sampled_fast_are_grouped_into_whole_iterations(
    workers: int, compute: float, push: float, serial: bool, parts: int, stall: float, phase: float
) -> None:
    """Sampled faster than the compute (a third of it), as the sampler adapts to: neither the
    instants between gloo's one-after-the-other pushes nor those inside a push written in
    parts split an iteration, and each worker's end is where it had its parameters."""
    connections, truth = answering_job(8, workers, compute, push, serial, parts, stall)
    every = min(compute / 3, 0.1)
    for conn in connections:
        conn.pushes = [(a + phase * every, b + phase * every) for a, b in conn.pushes]
        conn.answers = [at + phase * every for at in conn.answers]
    iterations = run(connections, until=truth[-1][-1] + 2, every=every)
    # Every one, those grouped before the job was known to answer regrouped by the answers.
    assert len(iterations) == 8, [(it.first_done, it.connections) for it in iterations]
    for k, iteration in enumerate(iterations):
        had = [at + phase * every for at in truth[k]]
        assert iteration.connections == workers
        assert iteration.last_done == pytest.approx(max(had), abs=0.0015)
        assert iteration.spread == pytest.approx(max(had) - min(had), abs=0.0015)
        assert iteration.pushed_bytes == workers * parts * MODEL


@pytest.mark.parametrize("late", [1, 3, 5])
def test_iterations_before_the_last_worker_is_seen_answering_are_regrouped_not_lost(
    late: int,
) -> None:
    """Until every connection that pushes has answered, quiet rounds group the pushes -- at
    gloo's one-after-the-other pushes sampled fast, wrongly. One worker's first answers go
    unseen (on a loaded host they come late): once it is seen, its job's iterations so far
    are regrouped by the answers, and none is lost."""
    compute = 0.05
    connections, truth = answering_job(8, 3, compute, 0.02, serial=True)
    connections[2].chatter_until = truth[late - 1][2] + compute
    iterations = run(connections, until=truth[-1][-1] + 2, every=compute / 3)
    assert len(iterations) == 8, [(it.first_done, it.connections) for it in iterations]
    assert iterations[0].period is None
    for k, iteration in enumerate(iterations):
        assert iteration.connections == 3
        assert iteration.last_done == pytest.approx(max(truth[k]), abs=0.0015)
        assert iteration.spread == pytest.approx(max(truth[k]) - min(truth[k]), abs=0.0015)
        if k:
            period = max(truth[k]) - max(truth[k - 1])
            assert iteration.period == pytest.approx(period, abs=0.002)


def sample(**fields: int) -> TcpInfo:
    base = dict.fromkeys(TcpInfo._fields, 0) | {"rtt_us": 1000, "delivery_rate": 10**7}
    return TcpInfo(**(base | fields))


def test_a_final_ack_held_back_for_the_answer_dates_the_push_a_round_trip_after_it_left() -> None:
    # The worker's stack, its connection interactive, sent the last ACK only with its answer
    # 20 ms after it had the push; the push's last data left 2 ms (one round trip) before that.
    tracker = StragglerTracker(min_push_bytes=1000)
    tracker.observe(0.0, [("j", "c", sample())])
    tracker.observe(0.1, [("j", "c", sample(unacked=5, bytes_acked=50_000))])
    held = sample(
        bytes_acked=MODEL, bytes_received=GRADIENT,
        last_data_sent_ms=28, last_ack_recv_ms=6, last_data_recv_ms=6, rtt_us=2000,
    )  # fmt: skip
    tracker.observe(0.2, [("j", "c", held)])
    assert tracker.last_push_end("c") == pytest.approx(0.2 - 0.028 + 0.002)
    # An ACK that came on its own is when the push ended, however long after the data left.
    tracker.observe(0.3, [("j", "c", sample(unacked=5, bytes_acked=MODEL + 50_000))])
    prompt = sample(
        bytes_acked=2 * MODEL, bytes_received=GRADIENT,
        last_data_sent_ms=60, last_ack_recv_ms=20, last_data_recv_ms=150, rtt_us=2000,
    )  # fmt: skip
    tracker.observe(0.4, [("j", "c", prompt)])
    assert tracker.last_push_end("c") == pytest.approx(0.4 - 0.020)


def test_a_small_message_after_the_push_does_not_move_its_end() -> None:
    # gloo's PS tells the worker it is ready for its gradient once the push is out: a sample
    # saw the push acknowledged but for that message, whose ACK came 30 ms later.
    tracker = StragglerTracker(min_push_bytes=1000)
    tracker.observe(0.0, [("j", "c", sample())])
    tracker.observe(0.1, [("j", "c", sample(unacked=5, bytes_acked=50_000))])
    notice = sample(unacked=1, bytes_acked=MODEL, bytes_sent=MODEL + 16, last_ack_recv_ms=4)
    tracker.observe(0.2, [("j", "c", notice)])
    tracker.observe(0.3, [("j", "c", sample(bytes_acked=MODEL + 16, last_ack_recv_ms=66))])
    assert tracker.last_push_end("c") == pytest.approx(0.2 - 0.004)


def test_answers_on_a_connection_that_never_pushes_do_not_change_the_grouping() -> None:
    # TensorFlow: the pushes' connections never answer; the coordinator's connection receives
    # requests. The pushes are grouped by the quiet rounds, as for a PS that only pushes.
    lags = [[0.0, 0.02, 0.05], [0.0, 0.0, 0.0], [0.1, 0.0, 0.03], [0.0, 0.07, 0.0]] * 3
    connections = job_pushes(len(lags), lags)
    coordinator = FakeConnection([], answers=[1.2 + 0.5 * k for k in range(40)])
    iterations = run([*connections, coordinator], until=20)
    assert len(iterations) == len(lags)
    for k, iteration in enumerate(iterations):
        assert iteration.spread == pytest.approx(max(lags[k]) - min(lags[k]), abs=0.0015)
        assert iteration.connections == 3


def test_a_job_is_sending_from_its_first_push_not_from_its_first_connection() -> None:
    # A framework connects at its rendezvous, seconds before it pushes: the sampler's fast
    # start must be timed from the push (sampler.py), so connections alone are not sending.
    connections = job_pushes(2, [[0.0, 0.0]] * 2)  # the first push starts at 1.0 s
    tracker = StragglerTracker(min_push_bytes=1000)
    tracker.observe(0.0, [("j", str(i), c.info(0.0)) for i, c in enumerate(connections)])
    assert tracker.sending_jobs() == set()
    sending_from = None
    now = 0.05
    while now < 2.0 and sending_from is None:
        tracker.observe(now, [("j", str(i), c.info(now)) for i, c in enumerate(connections)])
        if tracker.sending_jobs():
            sending_from = now
        now = round(now + 0.05, 6)
    assert sending_from == 1.0


def test_a_jobs_first_push_is_dated_from_when_it_began_not_when_it_was_acknowledged() -> None:
    # Held below the green job from its start, a push has nothing acknowledged for 1.5 s:
    # the job has pushed since it was first seen busy (between 0.0 and 0.1 s), which the
    # starvation guard counts its waiting and its deadline from.
    tracker = StragglerTracker(min_push_bytes=16 * 1024)
    idle = TcpInfo(0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 10**6, 0)
    tracker.observe(0.0, [("job", "c", idle)])
    for k in range(1, 16):
        tracker.observe(k / 10, [("job", "c", idle._replace(unacked=10, bytes_acked=500))])
        assert "job" not in tracker.first_push_began  # 500 bytes: no push's worth yet
    tracker.observe(1.6, [("job", "c", idle._replace(unacked=10, bytes_acked=40_000))])
    assert tracker.first_push_began == {"job": pytest.approx(0.05)}
    tracker.observe(1.7, [("job", "c", idle._replace(bytes_acked=10**6))])
    assert tracker.first_push_began == {"job": pytest.approx(0.05)}  # the first one's only
    tracker.observe(1.8, [])
    assert tracker.first_push_began == {}  # gone with the job


def test_a_job_met_running_is_marked_so_its_count_misses_its_first_iterations() -> None:
    # "old" had acknowledged 5 MB when first seen (the agent started while it ran): its
    # count of iterations misses the first ones, so it leaves no run length (SiblingRuns).
    # "new" was first seen with nothing sent, and a later connection of it carrying bytes
    # does not change that.
    tracker = StragglerTracker(min_push_bytes=16 * 1024)
    idle = TcpInfo(0, 0, 0, 0, 100, 0, 0, 0, 0, 0, 10**6, 0)
    old = ("old", "a", idle._replace(bytes_acked=5_000_000))
    tracker.observe(0.0, [old, ("new", "b", idle)])
    assert tracker.met_mid_run == {"old"}
    tracker.observe(0.1, [old, ("new", "b", idle._replace(unacked=10, bytes_acked=40_000))])
    tracker.observe(0.2, [old, ("new", "b", idle._replace(bytes_acked=50_000)),
                          ("new", "c", idle._replace(bytes_acked=60_000))])  # fmt: skip
    assert tracker.met_mid_run == {"old"}
    tracker.observe(0.3, [("new", "b", idle._replace(bytes_acked=50_000))])
    assert tracker.met_mid_run == set()  # gone with the job


def shifted(conn: FakeConnection, ends: list[float], by: float) -> list[float]:
    """`conn`'s pushes and answers moved `by` seconds later; returns `ends` moved alike."""
    conn.pushes = [(a + by, b + by) for a, b in conn.pushes]
    conn.answers = [at + by for at in conn.answers]
    return [end + by for end in ends]


def ring_rank(
    iterations: int,
    compute: float,
    step: float,
    between: float,
    ranks: int = 2,
    jitter: random.Random | None = None,
) -> tuple[FakeConnection, list[float]]:
    """Rank 0 of a ring all-reduce, as its connection to the next rank shows it: each
    iteration 2 x (ranks - 1) steps (reduce-scatter, then all-gather) `between` apart;
    `compute` after the last (0.8-1.2 times that, drawn from `jitter`), the next
    all-reduce. Of two ranks, the next is the previous too: its steps arrive on this
    connection, 5 ms after each of ours. Returns the connection and when each all-reduce
    ended."""
    conn = FakeConnection([])
    ends = []
    t = 1.0
    for _ in range(iterations):
        for _ in range(2 * (ranks - 1)):
            conn.pushes.append((t, t + step))
            if ranks == 2:
                conn.answers.append(t + step + 0.005)
            t += step + between
        ends.append(t - between)
        t += compute * (jitter.uniform(0.8, 1.2) if jitter else 1) - between
    return conn, ends


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([2, 4]),
    st.floats(0.1, 0.5),
    st.floats(0.01, 0.05),
    st.floats(0, 1),
    st.integers(0, 2**32),
)
def test_a_rings_steps_seen_apart_are_one_iteration_of_a_collective_job(
    ranks: int, compute: float, step: float, phase: float, seed: int
) -> None:
    """Samples fall between a ring's steps. Of two ranks, every third of the compute (as the
    sampler goes where the peers' steps arrive as answers), the next step starting once the
    peer's has arrived (8 ms after its own); of four, every 50 ms, the steps 2 ms
    apart (as quiet rounds group a job that does not answer). The compute varies by up to
    20%. A collective job's steps are joined once its idle time is known: each iteration is
    one all-reduce. (In lockstep with the sampling, more than half of the all-reduces could
    be seen apart, and then they are not joined: the module doc.)"""
    if ranks == 2:
        between, every = 0.008, compute / 3
    else:  # sampled under half the compute, as quiet rounds need
        between, every, compute = 0.002, 0.05, max(compute, 0.2)
    conn, ends = ring_rank(20, compute, step, between, ranks, random.Random(seed))
    ends = shifted(conn, ends, phase * every)
    joined = run([conn], ends[-1] + 2, every, collective=True)
    # Until IDLES_TO_JOIN idle times are known (and while more than half of them are of a
    # step measured apart), steps may be iterations of their own.
    settled = [it for it in joined if it.last_done > ends[11] + 0.001]
    assert len(settled) == 20 - 12
    for iteration, end, before in zip(settled, ends[12:], ends[11:-1], strict=True):
        assert iteration.last_done == pytest.approx(end, abs=0.0015)
        assert iteration.period == pytest.approx(end - before, abs=0.003)
        assert iteration.pushed_bytes == 2 * (ranks - 1) * MODEL


@settings(max_examples=30, deadline=None)
@given(
    st.sampled_from([0.004, 0.008, 0.02]),
    st.sampled_from([0.005, 0.033]),
    st.floats(0, 1),
    st.integers(0, 2**32),
)
def test_a_ring_seen_apart_at_every_all_reduce_from_its_start_is_joined(
    between: float, every: float, phase: float, seed: int
) -> None:
    """Sampled faster than its steps' gap (5 ms: the pace the peer's steps set as answers
    before the job's idle time is known), a two-rank ring is seen in two pieces at every
    all-reduce from its start, its idle times alternating a step's and a compute's; and a
    step that waited 20 ms for its peer, sampled at 33 ms (the pace 100 ms of compute sets),
    reads up to 30 ms. Before, the median of nine such idle times was a step's and the
    ring stayed split for good. Joined within the first four all-reduces now."""
    conn, ends = ring_rank(20, 0.1, 0.02, between, jitter=random.Random(seed))
    ends = shifted(conn, ends, phase * every)
    joined = run([conn], ends[-1] + 2, every, collective=True)
    settled = [it for it in joined if it.last_done > ends[3] + 0.001]
    assert [round(it.last_done, 3) for it in settled] == [round(end, 3) for end in ends[4:]]
    for iteration, end, before in zip(settled, ends[4:], ends[3:-1], strict=True):
        assert iteration.period == pytest.approx(end - before, abs=0.003)
        assert iteration.pushed_bytes == 2 * MODEL


def test_a_collective_jobs_iterations_joined_past_pauses_are_learnt_again() -> None:
    """Five 5 s pauses (checkpoints) in nine iterations make a two-rank ring's idle time
    read 5 s: its iterations join for up to MAX_OPEN_ITERATION_S, then it is learnt again
    and each iteration is one all-reduce."""
    conn, ends = ring_rank(450, 0.1, 0.01, 0.008)
    for pause_after in (20, 22, 24, 26, 28):
        shift = ends[pause_after] + 0.05
        conn.pushes = [(a + 5 * (a > shift), b + 5 * (a > shift)) for a, b in conn.pushes]
        conn.answers = [at + 5 * (at > shift) for at in conn.answers]
        ends = [end + 5 * (end > shift) for end in ends]
    joined = run([conn], ends[-1] + 2, 0.033, collective=True)
    runaway = [it for it in joined if it.pushed_bytes > 2 * MODEL]
    assert len(runaway) == 1
    # Open from its first push's start (after a pause, here) for MAX_OPEN_ITERATION_S.
    idle = runaway[0].idle_before_s
    assert idle is not None
    assert runaway[0].period == pytest.approx(idle + MAX_OPEN_ITERATION_S, abs=0.2)
    tail = [it for it in joined if it.last_done > ends[-20] + 0.001]
    assert [round(it.last_done, 3) for it in tail] == [round(end, 3) for end in ends[-19:]]
