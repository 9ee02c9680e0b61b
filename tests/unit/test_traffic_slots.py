"""The testbed sink's link counter per slot (testbed/traffic.py): a counter sampled at uneven
times, with gaps where the sampler stalled, still gives each slot the bytes counted in it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tensorlights.testbed.traffic import slot_bytes

RATE = 12_500_000  # bytes/s: a 100 Mbit link, busy throughout


@given(
    st.lists(st.floats(min_value=0.0005, max_value=0.2), min_size=1, max_size=400),
    st.integers(min_value=0, max_value=10**12),
)
def test_a_steady_counter_gives_every_slot_the_same_bytes_however_it_was_sampled(
    gaps: list[float], base: int
) -> None:
    times = [0.0]
    for gap in gaps:
        times.append(times[-1] + gap)
    interval = 0.5
    slots = int(times[-1] / interval)
    samples = [(t, base + round(RATE * t)) for t in times]
    per_slot = slot_bytes(samples, slots, interval)
    assert len(per_slot) == slots
    assert all(abs(got - RATE * interval) <= 2 for got in per_slot), per_slot


def test_bytes_counted_in_a_stall_stay_in_the_slots_they_were_counted_in() -> None:
    # Samples every 5 ms, then none for 60 ms across the 0.5 s boundary: the sampler (the sink)
    # stalled while the link went on delivering at its rate.
    times = [i * 0.005 for i in range(97)] + [0.54 + i * 0.005 for i in range(93)]
    per_slot = slot_bytes([(t, round(RATE * t)) for t in times], 2, 0.5)
    assert per_slot == [RATE // 2, RATE // 2]


def test_a_link_that_idles_shows_in_its_slot() -> None:
    # Busy, then idle from 0.6 s to 0.8 s, then busy again: the second slot carried 60%.
    samples = [(0.0, 0), (0.5, RATE // 2), (0.6, RATE * 6 // 10), (0.8, RATE * 6 // 10)]
    samples.append((1.0, RATE * 8 // 10))
    assert slot_bytes(samples, 2, 0.5) == [RATE // 2, RATE * 3 // 10]
