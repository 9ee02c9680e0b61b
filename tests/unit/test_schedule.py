"""Coordinated schedule (controller side) and plan following (agent side), pure."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.policy.bands import BandPolicy, PolicyName
from tensorlights.policy.packing import MEASURED_AFTER, JobLoad
from tensorlights.policy.schedule import (
    HostSchedule,
    PlanFollower,
    build_schedule,
    host_orders,
)

membership = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.frozensets(st.sampled_from([f"h{i}" for i in range(8)]), min_size=1, max_size=4),
    max_size=25,
)


@settings(max_examples=300, deadline=None)
@given(membership)
def test_every_job_is_green_on_all_its_hosts_at_once_and_no_host_has_two(
    ps_hosts: dict[str, frozenset[str]],
) -> None:
    schedule = build_schedule(ps_hosts)
    assert set(schedule.green_slots) == set(ps_hosts)
    for job, slots in schedule.green_slots.items():
        assert slots, f"{job} is never green"
        for index in slots:
            assert job in schedule.slots[index]
    for green in schedule.slots:
        seen: set[str] = set()
        for job in green:
            assert not seen & ps_hosts[job], "two green jobs on one host"
            seen |= ps_hosts[job]
    # No more slots than the busiest host needs plus what colouring can cost (Brooks' bound).
    every_host = {host for hosts in ps_hosts.values() for host in hosts}
    busiest = max((sum(h in hosts for hosts in ps_hosts.values()) for h in every_host), default=0)
    degree = max(
        (sum(bool(a & b) for k, b in ps_hosts.items() if k != j) for j, a in ps_hosts.items()),
        default=0,
    )
    assert busiest <= len(schedule.slots) <= degree + 1


@settings(max_examples=200, deadline=None)
@given(membership)
def test_each_host_order_starts_with_the_slots_green_job(
    ps_hosts: dict[str, frozenset[str]],
) -> None:
    schedule = build_schedule(ps_hosts)
    for host in {h for hosts in ps_hosts.values() for h in hosts}:
        jobs = {job for job, hosts in ps_hosts.items() if host in hosts}
        orders = host_orders(schedule, jobs)
        assert orders
        for slot, green in enumerate(schedule.slots):
            order = orders[slot % len(orders)]
            assert sorted(order) == sorted(jobs)
            here = green & jobs
            if here:
                assert order[0] in here


def test_a_multi_host_job_shares_slots_with_jobs_elsewhere() -> None:
    schedule = build_schedule({"big": {"a", "b"}, "a1": {"a"}, "b1": {"b"}, "b2": {"b"}})
    # b has three jobs: three slots; "big" green in one of them on both hosts at once.
    assert len(schedule.slots) == 3
    assert len(schedule.green_slots["big"]) == 1
    # Host a has only two jobs, so a1 fills the third slot too: a is never without green.
    assert schedule.share("a1") == 2 / 3
    assert schedule.share("b1") == schedule.share("b2") == 1 / 3


def test_host_orders_put_who_is_next_second() -> None:
    schedule = build_schedule({"x": {"h"}, "y": {"h"}, "z": {"h"}})
    orders = host_orders(schedule, {"x", "y", "z"})
    assert [order[0] for order in orders] == ["x", "y", "z"]
    assert orders[0] == ("x", "y", "z") and orders[2] == ("z", "x", "y")
    assert host_orders(schedule, {"x"}) == (("x",),)  # one job: the cycle collapses


def plan(epoch: float = 100.0, lease: float = 1000.0, generation: int = 1) -> HostSchedule:
    return HostSchedule(
        incarnation=1,
        generation=generation,
        epoch=epoch,
        slot_s=2.0,
        slots=(("a", "b"), ("b", "a")),
        lease_until=lease,
    )


def test_plan_slots_follow_the_epoch_and_give_exact_boundaries() -> None:
    p = plan()
    result = p.evaluate(101.0, {"a", "b"}, 6, None)
    assert result.green == "a" and result.bands == {"a": 0, "b": 1}
    assert result.green_since == 100.0 and result.next_change_at == 102.0
    later = p.evaluate(103.5, {"a", "b"}, 6, "a")
    assert later.green == "b" and later.rotated and later.green_since == 102.0
    # A slot before the epoch is part of the same cycle.
    assert p.evaluate(99.0, {"a", "b"}, 6, None).green == "b"


def test_jobs_missing_here_are_skipped_and_new_ones_go_last() -> None:
    result = plan().evaluate(101.0, {"b", "new"}, 6, None)
    assert result.order == ("b", "new")
    # With only b present it stays green across slots: no boundary to wake for.
    assert result.next_change_at is None


def test_follower_rejects_older_plans_and_falls_back_when_the_lease_lapses() -> None:
    follower = PlanFollower(BandPolicy(PolicyName.STATIC))
    assert follower.offer(plan(generation=5, lease=150.0))
    assert not follower.offer(plan(generation=4, lease=500.0))
    assert follower.stale_plans == 1
    assert follower.offer(plan(generation=5, lease=160.0))  # same version: a renewal
    during = follower.evaluate(103.0, {"a", "b"})
    assert during.generation == 5 and during.green == "b"
    # The wake-up is capped by the lease end.
    near_end = follower.evaluate(159.5, {"a", "b"})
    assert near_end.next_change_at == 160.0
    after = follower.evaluate(161.0, {"a", "b"})
    assert after.generation == 0 and after.green == "a"  # static: arrival order
    assert after.rotated == (near_end.green != "a")


def test_a_renewal_extends_only_the_plan_it_names() -> None:
    """A report's reply renews the plan the controller last sent: the one held here, or a
    newer one still on its way (then nothing is renewed: it brings its own lease)."""
    follower = PlanFollower(BandPolicy(PolicyName.STATIC))
    assert not follower.renew((1, 5), 200.0)  # no plan yet
    follower.offer(plan(generation=5, lease=150.0))
    assert not follower.renew((1, 6), 200.0)
    assert follower.evaluate(151.0, {"a", "b"}).generation == 0  # lapsed
    assert follower.renew((1, 5), 200.0)  # back: the same plan, renewed
    assert follower.evaluate(160.0, {"a", "b"}).generation == 5
    assert follower.renew((1, 5), 180.0)  # an older reply never shortens the lease
    assert follower.plan is not None and follower.plan.lease_until == 200.0


def test_only_demands_measured_in_the_light_are_reported_while_following_a_plan() -> None:
    """A job waiting in a lower band reads a low demand (its idle before a push inflated by
    the wait): reported to the controller, it put the waiting job ahead of the green one.
    So what is reported is what pack orders by: the green job's, and a job's measured
    MEASURED_AFTER iterations on top -- under the plan as under the local policy."""
    follower = PlanFollower(BandPolicy(PolicyName.PACK))
    follower.offer(HostSchedule(1, 1, 0.0, 1000.0, (("a", "b"),), lease_until=1000.0))
    equal = 0.05  # link seconds per iteration: neither is clearly smaller

    def loads(done_a: int, done_b: int) -> dict[str, JobLoad]:
        return {
            "a": JobLoad(equal, 0.15, done_a, busy=False),
            "b": JobLoad(equal, 0.40, done_b, busy=False),  # b's idle: inflated, waiting
        }

    for n in range(MEASURED_AFTER + 2):
        follower.evaluate(float(n), {"a", "b"}, loads(n, n))
    assert follower.trusted_demands(loads(7, 7)) == {"a": pytest.approx(0.25)}
    # The plan moves the light to b: once measured on top for long enough, b's counts.
    follower.offer(HostSchedule(1, 2, 0.0, 1000.0, (("b", "a"),), lease_until=1000.0))
    follower.evaluate(7.0, {"a", "b"}, loads(7, 7))
    # Green now, but measured waiting so far: not reported until measured on top.
    assert set(follower.trusted_demands(loads(7, 7))) == {"a"}
    for n in range(8, 8 + MEASURED_AFTER + 1):
        follower.evaluate(float(n), {"a", "b"}, loads(7, n))
    assert set(follower.trusted_demands(loads(7, 14))) == {"a", "b"}
    # A job pushing clearly fewer bytes than the green one is smaller whatever its compute.
    small = loads(7, 14) | {"c": JobLoad(equal / 2, 0.9, 6, busy=False)}
    assert "c" in follower.trusted_demands(small)


def test_a_follower_reports_the_jobs_its_starvation_guard_would_promote() -> None:
    """Under a plan the local policy does not order, but its guard keeps the clock: b, at
    the bottom and barely iterating, passes the threshold and is reported starving (the
    controller then puts it first); once it keeps pace again it is not."""
    follower = PlanFollower(BandPolicy(PolicyName.PACK, max_slowdown=2.0, starvation_window_s=30))
    follower.offer(HostSchedule(1, 1, 0.0, 1000.0, (("a", "b"),), lease_until=1000.0))
    for second in range(0, 41):  # a standalone period of 0.5 s each
        loads = {
            "a": JobLoad(0.3, 0.2, 2 * second, busy=False),
            "b": JobLoad(0.3, 0.2, second // 10, busy=False),  # one iteration per 10 s
        }
        follower.evaluate(float(second), {"a", "b"}, loads)
    starving = follower.starving()
    assert set(starving) == {"b"} and starving["b"] > 0.8 * 0.5 * 30
    # b keeps pace again (the controller put it first): its lag stays until its life or
    # the horizon (4 windows) holds so much that 38 s is under RELEASE_AT of the allowance.
    for second in range(41, 170):
        loads = {
            "a": JobLoad(0.3, 0.2, 2 * second, busy=False),
            "b": JobLoad(0.3, 0.2, 4 + 2 * (second - 40), busy=False),
        }
        follower.evaluate(float(second), {"a", "b"}, loads)
    assert follower.starving() == {}


def test_a_follower_reports_the_remaining_work_of_the_jobs_that_declared_their_lengths() -> None:
    """Under a plan, the work left of the jobs that declared their iterations is reported
    (for the controller to order equal jobs the least first, as the local pack does), and a
    waiting trial of the green job's model has the green job's demand."""
    follower = PlanFollower(BandPolicy(PolicyName.PACK))
    follower.offer(HostSchedule(1, 1, 0.0, 1000.0, (("a", "b"),), lease_until=1000.0))
    declared = {"a": 50, "b": 25}
    for n in range(MEASURED_AFTER + 2):
        waiting = {"a": JobLoad(0.2, 0.2, n, busy=False), "b": JobLoad(0.2, 0.6, 2, busy=False)}
        follower.evaluate(float(n), {"a", "b"}, waiting, declared=declared)
    done = MEASURED_AFTER + 1
    # Each at the shortest period of the model's trials (a's, 0.4 s): b waits, its own reads
    # long.
    assert follower.remaining() == {
        "a": pytest.approx((50 - done) * 0.4),
        "b": pytest.approx(23 * 0.4),
    }
    demands = follower.trusted_demands(waiting)
    assert demands == {"a": pytest.approx(0.5), "b": pytest.approx(0.5)}
    # Nothing declared, nothing reported.
    follower.evaluate(float(done + 1), {"a", "b"}, waiting)
    assert follower.remaining() == {}


def test_a_follower_sends_a_short_trial_not_measured_yet_beside_the_measured_job_ahead() -> None:
    """Under a plan too, a young trial not measured yet that declared fewer iterations than
    the green job has left sends in the band of the last measured job ahead of it (the
    green one aside), keeping its place in the plan's order (packing.measured_beside)."""
    follower = PlanFollower(BandPolicy(PolicyName.PACK))
    follower.offer(HostSchedule(1, 1, 0.0, 1000.0, (("a", "b", "c"),), lease_until=1000.0))
    trials = {"a", "b", "c"}
    started = {"a": 0.0, "b": 0.0, "c": 1.0}
    loads = {"a": JobLoad(0.2, 0.25, 3, busy=False), "b": JobLoad(0.2, 0.25, 2, busy=False)}
    plan = follower.evaluate(2.0, trials, loads, started, declared={"a": 25, "b": 50, "c": 10})
    assert plan.order == ("a", "b", "c") and plan.bands == {"a": 0, "b": 1, "c": 1}
    # Measured, but not yet reported with a demand the controller orders by (a's own is not
    # trusted before MEASURED_AFTER iterations on top here): it stays beside, not starved
    # again while the plan that puts it first is on its way.
    loads["c"] = JobLoad(0.2, 0.6, 2, busy=False)
    assert "c" not in follower.trusted_demands(loads)
    told = {"a": 25, "b": 50, "c": 10}
    plan = follower.evaluate(2.5, trials, loads, started, declared=told)
    assert plan.bands == {"a": 0, "b": 1, "c": 1}
    del loads["c"]
    plan = follower.evaluate(2.6, trials, loads, started, declared={"a": 25, "b": 50, "c": 25})
    assert plan.bands == {"a": 0, "b": 1, "c": 2}
    loads["c"] = JobLoad(0.2, 0.6, 2, busy=False)
    # Trusted and reported, it still waits for the controller's plan that moves it up (a
    # replan later): meanwhile it stays beside, not below both (r5's short trial, 1 s).
    for step in range(1, MEASURED_AFTER + 2):
        loads["a"] = JobLoad(0.2, 0.25, 3 + step, busy=False)
        plan = follower.evaluate(2.6 + step / 10, trials, loads, started, declared=told)
    assert "c" in follower.trusted_demands(loads)
    assert plan.order == ("a", "b", "c") and plan.bands == {"a": 0, "b": 1, "c": 1}
    follower.offer(HostSchedule(1, 2, 0.0, 1000.0, (("c", "a", "b"),), lease_until=1000.0))
    plan = follower.evaluate(3.5, trials, loads, started, declared=told)
    assert plan.order == ("c", "a", "b") and plan.bands == {"c": 0, "a": 1, "b": 2}
