"""Band policies: fifo, static (TL-One), rotate (TL-RR); folding N jobs into K bands."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlights.errors import ConfigError
from tensorlights.model import NUM_BANDS
from tensorlights.policy.bands import ARRIVAL_TIE_S, BandPolicy, PolicyName, fold_bands
from tensorlights.policy.packing import JobLoad


@given(st.integers(0, 300), st.integers(1, NUM_BANDS - 1))
def test_folding_keeps_order_gives_green_to_one_and_never_leaves_the_ps_bands(
    jobs: int, bands: int
) -> None:
    folded = fold_bands(jobs, bands)
    assert len(folded) == jobs
    assert folded == sorted(folded)
    assert all(0 <= band < bands for band in folded)
    if jobs:
        assert folded[0] == 0
    if jobs > 1 and bands > 1:
        assert folded.count(0) == 1
        assert set(folded) == set(range(min(jobs, bands)))  # every band used when possible
        counts = [folded[1:].count(b) for b in range(1, bands) if b in folded]
        assert max(counts) - min(counts) <= 1  # spread evenly


def test_fifo_programs_nothing() -> None:
    policy = BandPolicy(PolicyName.FIFO)
    plan = policy.evaluate(0.0, {"a", "b"})
    assert plan.bands == {} and plan.green is None and plan.order == ("a", "b")


def test_static_keeps_the_oldest_job_green_until_it_finishes() -> None:
    policy = BandPolicy(PolicyName.STATIC, interval_s=1.0)
    assert policy.evaluate(0.0, {"b"}).green == "b"
    plan = policy.evaluate(100.0, {"a", "b", "c"})  # arrivals join after the oldest
    assert plan.green == "b" and plan.order == ("b", "a", "c") and not plan.rotated
    assert plan.next_change_at is None
    plan = policy.evaluate(200.0, {"a", "c"})
    assert plan.green == "a" and plan.rotated and plan.bands == {"a": 0, "c": 1}


def test_rotate_moves_the_light_every_interval_in_order() -> None:
    policy = BandPolicy(PolicyName.ROTATE, interval_s=2.0)
    greens = []
    for tick in range(12):
        plan = policy.evaluate(tick * 0.5, {"a", "b", "c"})
        greens.append(plan.green)
        assert plan.bands[plan.green] == 0  # type: ignore[index]
        assert sorted(plan.bands.values()) == [0, 1, 2]
    assert greens == ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    assert policy.evaluate(6.0, {"a", "b", "c"}).green == "a"


def test_rotate_cadence_is_kept_when_evaluations_are_late() -> None:
    policy = BandPolicy(PolicyName.ROTATE, interval_s=1.0)
    policy.evaluate(0.0, {"a", "b", "c"})
    plan = policy.evaluate(2.5, {"a", "b", "c"})  # two whole slots passed
    assert plan.green == "c" and plan.green_since == 2.0 and plan.next_change_at == 3.0


def test_rotate_moves_when_woken_at_its_own_next_change() -> None:
    """0.7 + 0.1 - 0.7 comes out under 0.1: judged by the elapsed time, the light stayed
    put at the instant it said it would move, and moved a wake-up later."""
    policy = BandPolicy(PolicyName.ROTATE, interval_s=0.1)
    first = policy.evaluate(0.7, {"a", "b"})
    assert first.next_change_at is not None and first.next_change_at - 0.7 < 0.1
    moved = policy.evaluate(first.next_change_at, {"a", "b"})
    assert moved.green == "b" and moved.green_since == first.next_change_at


def test_new_job_joins_between_slots_and_finished_green_hands_over_at_once() -> None:
    policy = BandPolicy(PolicyName.ROTATE, interval_s=10.0)
    assert policy.evaluate(0.0, {"a", "b"}).green == "a"
    plan = policy.evaluate(1.0, {"a", "b", "c"})
    assert plan.green == "a" and plan.order == ("a", "b", "c") and not plan.rotated
    plan = policy.evaluate(2.0, {"b", "c"})  # the green job finished mid-slot
    assert plan.green == "b" and plan.rotated and plan.green_since == 2.0
    assert plan.next_change_at == 12.0


def test_more_jobs_than_bands_fold_without_touching_the_unmanaged_band() -> None:
    jobs = {f"job-{i:02d}" for i in range(20)}
    plan = BandPolicy(PolicyName.ROTATE, interval_s=1.0).evaluate(0.0, jobs)
    assert max(plan.bands.values()) == NUM_BANDS - 2
    assert list(plan.bands.values()).count(0) == 1


@given(st.lists(st.frozensets(st.sampled_from("abcdef"), max_size=6), min_size=1, max_size=40))
def test_any_membership_sequence_gives_a_consistent_plan(steps: list[frozenset[str]]) -> None:
    policy = BandPolicy(PolicyName.ROTATE, interval_s=1.0)
    for tick, jobs in enumerate(steps):
        plan = policy.evaluate(tick * 0.7, jobs)
        assert set(plan.bands) == set(jobs) == set(plan.order)
        assert (plan.green is None) == (not jobs)
        if jobs:
            assert plan.order[0] == plan.green and plan.bands[plan.green] == 0


def test_pack_orders_spanning_jobs_appearing_together_by_name_apart_by_arrival() -> None:
    spanning = frozenset({"job0", "job1", "job2"})
    policy = BandPolicy(PolicyName.PACK)
    policy.evaluate(0.0, {"job2"}, {}, None, spanning)
    assert policy.evaluate(0.6, {"job1", "job2"}, {}, None, spanning).order == ("job1", "job2")
    plan = policy.evaluate(0.6 + ARRIVAL_TIE_S, {"job0", "job1", "job2"}, {}, None, spanning)
    assert plan.order == ("job1", "job2", "job0") and plan.green == "job1"
    one_host = BandPolicy(PolicyName.PACK)  # no agreement needed: arrival order
    one_host.evaluate(0.0, {"job2"}, {})
    assert one_host.evaluate(0.6, {"job1", "job2"}, {}).order == ("job2", "job1")
    static = BandPolicy(PolicyName.STATIC)  # the prototype's: arrival order
    static.evaluate(0.0, {"job2"})
    assert static.evaluate(0.6, {"job1", "job2"}).order == ("job2", "job1")


@given(
    st.lists(st.sets(st.sampled_from("abcdefgh"), min_size=1), min_size=1, max_size=4),
    st.randoms(use_true_random=False),
)
def test_hosts_deciding_alone_under_pack_agree_on_jobs_launched_together(
    launches: list[set[str]], rng: random.Random
) -> None:
    """Jobs launched in groups 3 tie windows apart, each host seeing each job up to half a
    window late (so in its own order): every host ends with the same order."""
    seen: set[str] = set()
    groups = []
    for group in launches:
        groups.append(sorted(group - seen))
        seen |= group
    orders = set()
    for _host in range(3):
        appear = sorted(
            (3 * ARRIVAL_TIE_S * index + rng.uniform(0, ARRIVAL_TIE_S / 2), job)
            for index, group in enumerate(groups)
            for job in group
        )
        policy = BandPolicy(PolicyName.PACK)
        jobs: set[str] = set()
        for when, job in appear:
            jobs.add(job)
            # Iterating alike (pack keeps jobs of equal demand in the order in force).
            loads = {seen: JobLoad(0.1, 0.3, 1, False) for seen in jobs}
            plan = policy.evaluate(when, jobs, loads, None, frozenset(jobs))
        orders.add(plan.order)
    assert orders == {tuple(job for group in groups for job in group)}


@pytest.mark.parametrize("kwargs", [{"interval_s": 0.0}, {"interval_s": -1.0}, {"ps_bands": 0}])
def test_bad_policy_settings_are_config_errors(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        BandPolicy(PolicyName.ROTATE, **kwargs)  # type: ignore[arg-type]
