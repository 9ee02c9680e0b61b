"""When the telemetry sampler looks at a job again while its pushes are in flight (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlights.telemetry.sampler import (
    END_MARGIN_S,
    GAP_SAMPLES,
    MIN_INTERVAL_S,
    STRETCH_MAX,
    next_interval,
)

MOST = 0.1
seconds = st.floats(min_value=MIN_INTERVAL_S, max_value=MOST)


def test_a_long_push_of_a_job_with_20_ms_gaps_is_sampled_half_as_often() -> None:
    gap = 0.020
    own = gap / GAP_SAMPLES
    cap = gap * STRETCH_MAX / GAP_SAMPLES
    assert next_interval(own, 0.120, cap, MOST) == pytest.approx(2 * own)
    assert next_interval(own, 0.020, cap, MOST) == pytest.approx(0.010)  # half the time left
    assert next_interval(own, 0.010, cap, MOST) == pytest.approx(own)  # under two intervals
    assert next_interval(own, 0.008, cap, MOST) == pytest.approx(own)
    assert next_interval(own, 0.002, cap, MOST) == pytest.approx(MIN_INTERVAL_S)  # the floor
    assert next_interval(own, 0.120, None, MOST) == pytest.approx(own)  # gaps unknown


def test_short_gaps_under_the_floor_keep_the_stretch_under_the_gap() -> None:
    """A job's own interval at the 5 ms floor is no measure of its gaps: the stretch is."""
    for gap, stretched in ((0.006, MIN_INTERVAL_S), (0.009, 0.006), (0.012, 0.008)):
        cap = gap * STRETCH_MAX / GAP_SAMPLES
        assert next_interval(MIN_INTERVAL_S, 0.2, cap, MOST) == pytest.approx(stretched)


@given(
    own=seconds,
    end=st.none() | st.floats(min_value=0.0, max_value=10.0),
    gap=st.none() | st.floats(min_value=0.001, max_value=5.0),
)
def test_the_stretch_never_samples_more_often_nor_past_the_gap_or_the_end(
    own: float, end: float | None, gap: float | None
) -> None:
    cap = None if gap is None else gap * STRETCH_MAX / GAP_SAMPLES
    plain = next_interval(own, end, None, MOST)
    got = next_interval(own, end, cap, MOST)
    assert got >= plain  # fewer rounds, never more
    if end is None:
        assert got == own
        return
    assert got <= max(end + END_MARGIN_S, MIN_INTERVAL_S)  # the sample at the push's end stays
    if cap is not None:
        assert got <= max(own, min(cap, MOST))  # still under the shortest gap, and the most
        if got > own:
            assert got <= end / 2  # only while the end is over two intervals away
