"""Push and iteration detection from tcp_info samples (pure), on synthetic connections that
behave like a PS pushing to workers that compute in between."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.model import TcpInfo
from tensorlights.telemetry.straggler import StragglerTracker

MODEL = 1_000_000


@dataclass
class FakeConnection:
    """What the kernel would report for one PS->worker connection over time."""

    pushes: list[tuple[float, float]]  # (start, done) of each push

    def info(self, now: float) -> TcpInfo:
        done = [p for p in self.pushes if p[1] <= now]
        busy = any(start <= now < end for start, end in self.pushes)
        acked = MODEL * len(done)
        if busy:
            start, end = next(p for p in self.pushes if p[0] <= now < p[1])
            acked += int(MODEL * (now - start) / (end - start))
        last_ack = max((p[1] for p in done), default=0.0)
        if busy:
            last_ack = now
        return TcpInfo(
            unacked=10 if busy else 0,
            last_data_sent_ms=0,
            last_ack_recv_ms=round((now - last_ack) * 1000),
            rtt_us=100,
            bytes_acked=acked,
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


def run(connections: list[FakeConnection], until: float, every: float = 0.1) -> list:
    tracker = StragglerTracker(min_push_bytes=1000)
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
    # The first iteration anchors the period (it started before tracking was primed).
    assert len(iterations) == len(lags) - 1
    for k, iteration in enumerate(iterations, start=1):
        assert iteration.spread == pytest.approx(max(lags[k]) - min(lags[k]), abs=0.0015)
        assert iteration.last_done == pytest.approx(truth_last[k], abs=0.0015)
        assert iteration.period == pytest.approx(truth_last[k] - truth_last[k - 1], abs=0.002)
        assert iteration.connections == 3


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
    assert len(iterations) == len(lags) - 1
    for k, iteration in enumerate(iterations, start=1):
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
    assert len(iterations) == 7, [(it.first_done, it.connections) for it in iterations]
    assert all(it.connections == workers for it in iterations)
    for k, iteration in enumerate(iterations, start=1):
        last = max(c.pushes[k][1] for c in connections)
        first = min(c.pushes[k][1] for c in connections)
        assert iteration.last_done == pytest.approx(last, abs=0.0015)
        assert iteration.spread == pytest.approx(last - first, abs=0.0015)


def test_small_messages_are_not_pushes_and_bytes_are_counted() -> None:
    tracker = StragglerTracker(min_push_bytes=16 * 1024)
    base = TcpInfo(0, 0, 0, 100, 0, 0, 0, 0, 10**6, 0)
    tracker.observe(0.0, [("job", "c", base)])
    assert tracker.observe(0.1, [("job", "c", base._replace(bytes_acked=500))]) == []
    assert tracker.sent_bytes["job"] == 500
    busy = base._replace(bytes_acked=600, unacked=3)
    assert tracker.observe(0.2, [("job", "c", busy)]) == []
    assert tracker.busy_jobs() == {"job"}
    assert tracker.sent_bytes["job"] == 600


def test_connections_first_seen_mid_push_are_not_measured_for_that_push() -> None:
    lags = [[0.0, 0.05]] * 4
    connections = job_pushes(4, lags)
    tracker = StragglerTracker(min_push_bytes=1000)
    start = connections[0].pushes[0][0] + 0.05  # mid-push of iteration 0
    closed = []
    now = start
    while now < 10:
        closed += tracker.observe(
            now, [("j", str(i), c.info(now)) for i, c in enumerate(connections)]
        )
        now = round(now + 0.1, 6)
    # iteration 0: unknown start; iteration 1: anchors the period; then 2 and 3 are measured.
    assert [round(it.spread, 3) for it in closed] == [0.05, 0.05]


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
        assert idles and all(idle is not None for idle in idles)
        # The push start is known to within a sample (0.1 s): its middle is within 0.05 s.
        assert all(abs(idle - 0.3) <= 0.051 for idle in idles if idle is not None), idles
        assert all(it.pushed_bytes == 2 * MODEL for it in iterations)


def test_connections_that_never_push_are_not_the_ones_watched_for_a_push() -> None:
    # Two data connections and a framework's control connection (a TCPStore's): idle
    # throughout, it must not be the one the sampler watches between iterations.
    connections = job_pushes(3, [[0.0, 0.0]] * 3)
    tracker = StragglerTracker(min_push_bytes=1000)
    control = TcpInfo(0, 0, 900, 100, 576, 0, 0, 0, 10**6, 576)
    now = 0.0
    while now < 3.0:
        samples = [("j", str(i), c.info(now)) for i, c in enumerate(connections)]
        tracker.observe(now, [*samples, ("j", "store", control)])
        now = round(now + 0.1, 6)
    assert tracker.pushing_connections() == {"0", "1"}
