"""A ring's iterations counted by its bytes: all-reduces cut into pieces or merged by the
tracker still count once each (tensorlights/telemetry/ring_count.py)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.telemetry.ring_count import MIN_MARKED, RingCounter
from tensorlights.telemetry.sampler import TelemetrySampler
from tensorlights.telemetry.straggler import Iteration

B = 12_002_240
"""A rank's bytes per all-reduce: an 8 MB model on four ranks, as c2's traces read it."""
CHUNK = B // 24
"""gloo's pieces of it: the sizes c2's split all-reduces came in."""


def _piece(at: float, pushed: int, idle: float | None = 0.3) -> Iteration:
    return Iteration("job", at, at, 1, 0.05, None, pushed, idle)


def _pieces(
    rng: random.Random, iterations: int, startup: int, split: float, merge: float
) -> list[int]:
    """The pieces' bytes the tracker reports for `iterations` all-reduces after `startup`
    bytes (DDP's first broadcast): each all-reduce split at chunks with chance `split`,
    a piece merged with the next with chance `merge`, ~100 bytes of control messages apart."""
    sizes: list[int] = []
    for index in range(iterations):
        whole = B + rng.randint(-100, 100) + (startup if index == 0 else 0)
        while whole > CHUNK and rng.random() < split:
            cut = rng.randint(1, max(1, whole // CHUNK - 1)) * CHUNK
            sizes.append(cut)
            whole -= cut
        if whole < 2**14 and sizes:  # under the tracker's smallest push: part of the last
            sizes[-1] += whole
        else:
            sizes.append(whole)
    merged: list[int] = []
    for size in sizes:
        if merged and rng.random() < merge:
            merged[-1] += size
        else:
            merged.append(size)
    return merged


def _count(sizes: list[int]) -> tuple[int, list[Iteration]]:
    """The counter's total at the end, and its reports."""
    counter = RingCounter()
    reported = [it for i, size in enumerate(sizes) for it in counter.add(_piece(i, size))]
    return counter.total, reported


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    iterations=st.integers(15, 40),
    startup=st.sampled_from([0, 8_000_000, 16_000_000]),
    split=st.floats(0.0, 0.4),
    merge=st.floats(0.0, 0.1),
)
def test_split_and_merged_all_reduces_count_once_each(
    seed: int, iterations: int, startup: int, split: float, merge: float
) -> None:
    """Near the truth where the tracker counted up to several per all-reduce: the first
    report counts one whatever its bytes (the start-up's cannot be told from an
    iteration's, module doc), one off, more where it holds merged all-reduces too (up to
    three at this merge rate, far above c2's); the
    last reports are whole all-reduces (earlier ones may have been cut at a B learnt wrong
    at the start, which the total puts right)."""
    sizes = _pieces(random.Random(seed), iterations, startup, split, merge)
    counted, reported = _count(sizes)
    assert abs(counted - iterations) <= 3, (counted, iterations, sizes)
    assert all(abs(it.pushed_bytes - it.count * B) <= 0.01 * B for it in reported[-3:])


def test_c2s_pieces_from_a_host_count_25() -> None:
    """One host's pieces of one ring in c2 under pack (status trace, 2026-12-02): the
    tracker reported 42 iterations for the workers' 25."""
    sizes = [4000416, 1000092, 1000140, 3000276, 3000180, 8504240, 502568, 2995384, 1005160]
    sizes += [4498504, 497648, 6001120, 12002048, 12002240, 12002240, 1005160, 10001880]
    sizes += [995200, 12002240, 12002240, 12002240, 12002240, 12002240, 12002240, 2000416]
    sizes += [10001824, 2000416, 10001824, 12002240, 11001080, 1001160, 2000416, 9501400]
    sizes += [500840, 12002240, 12002240, 12002240, 12002240, 2000416, 10001824, 12002240]
    sizes += [12002240]
    assert len(sizes) == 42
    counted, reported = _count(sizes)
    assert counted == 25
    assert reported[-1].pushed_bytes == 12002240


def test_a_recurring_fraction_of_the_all_reduce_is_not_taken_for_it() -> None:
    """Pieces of a quarter recur at the start (c2: 3.0 MB pieces of 12): not B."""
    sizes = [B // 3, B // 12, B // 12, B // 4, B // 4, B // 2 + B // 4, B // 4] + [B] * 10
    counter = RingCounter()
    for i, size in enumerate(sizes):
        counter.add(_piece(i, size))
    assert counter.bytes_per_iteration is not None
    assert abs(counter.bytes_per_iteration - B) < 0.01 * B


def test_a_split_piece_marking_enough_ends_first_waits_for_the_all_reduce() -> None:
    """A two-rank ring's first two all-reduces split in halves, then whole (the DDP test in
    CI, 2026-12-06): the halves mark every end, so they reached MIN_MARKED a piece before
    the whole all-reduce did, and 1 MB was taken for B: four whole all-reduces were reported
    as two each, at half the period. B scores higher; it is waited for."""
    half = B // 2
    sizes = [B, half, half, half, half] + [B] * 12
    counter = RingCounter()
    reported = [it for i, size in enumerate(sizes) for it in counter.add(_piece(i, size))]
    assert counter.bytes_per_iteration == B
    assert [it.count for it in reported] == [1] * len(reported)
    assert sum(it.pushed_bytes for it in reported[1:]) == B * (len(reported) - 1)


def test_merged_all_reduces_report_their_count_and_mean_period() -> None:
    counter = RingCounter()
    reported = []
    for i, size in enumerate([B] * 6 + [2 * B] + [B] * 2):
        reported += counter.add(_piece(float(i), size))
    merged = [it for it in reported if it.count == 2]
    assert len(merged) == 1
    assert merged[0].period == 0.5  # two all-reduces in the second between its pieces' ends
    assert sum(it.count for it in reported) == 10


def test_traffic_that_is_not_iterative_reports_nothing() -> None:
    """Bulk copies and chatter of random sizes: no bytes per iteration, no iterations."""
    rng = random.Random(7)
    counter = RingCounter()
    reported = [it for i in range(200) for it in counter.add(_piece(i, rng.randint(2**14, 2**24)))]
    assert reported == []
    assert counter.bytes_per_iteration is None


def test_a_wrong_start_is_put_right_in_the_total() -> None:
    """c1 under pack, one host (2026-12-02, night): the waiting ring's steps trickled in 1 MB
    pieces before it ever ran whole, so 1 MB was learnt first and 12 MB pieces reported 12
    each (79 of 25 in the reports); once B is learnt anew the total is the truth's."""
    mb = B // 12
    sizes = [2 * mb, mb, mb, mb, mb, 5 * mb, mb] + [B] * 24
    counter = RingCounter()
    reports = [it for i, size in enumerate(sizes) for it in counter.add(_piece(i, size))]
    assert counter.bytes_per_iteration is not None
    assert abs(counter.bytes_per_iteration - B) < 0.01 * B
    assert abs(counter.total - 25) <= 1
    assert sum(it.count for it in reports) > counter.total  # the early reports stay as made


def test_a_ring_not_counted_yet_is_measured_from_its_pieces() -> None:
    """Until its counter has learnt its bytes per all-reduce, a ring's load counts its pieces
    (each one an iteration): without one, the green ring was judged not iterative and the
    waiting ones' start-up counted as their lag (c2, docs/benchmarks.md, 2026-12-04)."""
    sampler = TelemetrySampler()
    sampler.tracker.collective = frozenset({"job"})
    sampler._present = {"job": {"conn"}}
    pieces = [_piece(0.5 * i, 12_000_000, idle=0.1) for i in range(MIN_MARKED - 3)]
    pieces = [replace(p, period=0.5) for p in pieces[1:]]  # the first: no period measured
    assert not sampler._counted(pieces)  # nothing reported yet
    load = sampler.loads(300e6)["job"]
    assert load.iterations == len(pieces)
    assert not load.bytes_hold_waiting
    assert load.compute_s == pytest.approx(0.1)
    sampler._present = {}
    assert "job" not in sampler.loads(300e6)
