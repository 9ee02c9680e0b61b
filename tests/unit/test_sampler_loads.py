"""A PS job's load as the sampler reads it from the tracker's iterations."""

from __future__ import annotations

from collections import deque

import pytest

from tensorlights.policy.packing import JobLoad
from tensorlights.telemetry.sampler import TelemetrySampler
from tensorlights.telemetry.straggler import Iteration

PUSH = 4_000_000  # to each of two workers
LINK_BPS = 300e6


def _iteration(at: float, connections: int, idle: float | None) -> Iteration:
    period = None if idle is None else 0.45
    return Iteration("job", at, at, connections, 0.25, period, PUSH * connections, idle)


def _reading(iterations: list[Iteration]) -> JobLoad:
    sampler = TelemetrySampler()
    sampler._present = {"job": {"a", "b"}}
    sampler._recent["job"] = deque(iterations)
    sampler._iterations["job"] = len(iterations)
    return sampler.loads(LINK_BPS)["job"]


def _load_of(iterations: list[Iteration]) -> float:
    return _reading(iterations).link_s


def test_a_first_push_closed_in_parts_does_not_read_as_a_smaller_job() -> None:
    """r2 (three equal gloo jobs, 2026-12-05): the waiting job's pushes to its two workers,
    one after the other, closed as two iterations of one connection each, the second with
    no idle before it; read with them, its bytes came out 25% under the green job's, and
    the smaller-job rule gave it the light."""
    parts = [_iteration(0.0, 1, None), _iteration(0.2, 1, 0.0)]
    whole = [_iteration(0.7 + 0.45 * k, 2, 0.2) for k in range(3)]
    assert _load_of(parts + whole) == pytest.approx(_load_of(whole))
    assert _load_of(parts + whole[:1]) == pytest.approx(_load_of(whole))
    # Its reading rests on the whole ones only (packing.SMALLER_AFTER counts them).
    assert _reading(parts + whole).pushes_read == 3
    assert _reading(parts + whole).iterations == 5


def test_the_first_iteration_measured_whole_counts_its_bytes_but_not_its_compute() -> None:
    """Reported without a period (none measured before it), as the simulator reads a job's
    first push: its bytes are a push's like the others'."""
    first = _iteration(0.0, 2, None)
    load = _reading([first, _iteration(0.45, 2, 0.2), _iteration(0.9, 2, 0.3)])
    assert load.pushes_read == 3
    assert load.compute_s == pytest.approx(0.3)  # the second shortest of 0.2 and 0.3


def test_a_worker_that_leaves_is_not_waited_for_by_the_reading() -> None:
    """Iterations that reach fewer connections from some iteration on (a worker gone) are
    read as they come: only a part followed by more connections is left out."""
    before = [_iteration(0.45 * k, 2, 0.2) for k in range(1, 10)]
    after = [_iteration(5 + 0.45 * k, 1, 0.2) for k in range(5)]
    assert _load_of(before + after) == pytest.approx(_load_of(after))
    assert _load_of(before + after[:2]) == pytest.approx(_load_of(before[-3:] + after[:2]))
