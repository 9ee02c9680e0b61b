"""The controller's replan looks again only at what changed (a 10,000-host cluster): the
registry's per-job views kept up to date report by report, and the planner's orders rebuilt
on the hosts a change can reach. Both must equal what a full recomputation gives."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.controller.planner import ClusterPolicy, Planner
from tensorlights.controller.registry import Registry
from tensorlights.model import HostReport, Mode, Registration, ReportedJob

HOSTS = ("h0", "h1", "h2", "h3", "h4")
JOBS = ("j0", "j1", "j2", "j3", "j4", "j5")

Step = tuple[str, str, list[tuple[str, float | None, float | None, bool, float | None]]]

# One host's report: each job there with a demand, a lag, a period and its remaining work,
# or None.
job_state = st.tuples(
    st.sampled_from(JOBS),
    st.one_of(st.none(), st.sampled_from((0.1, 0.3, 0.5, 0.8))),
    st.one_of(st.none(), st.sampled_from((2.0, 9.0))),
    st.booleans(),
    st.one_of(st.none(), st.sampled_from((4.0, 20.0))),
)
step: st.SearchStrategy[Step] = st.one_of(
    st.tuples(st.just("report"), st.sampled_from(HOSTS), st.lists(job_state, max_size=4)),
    st.tuples(st.just("register"), st.sampled_from(HOSTS), st.just([])),
    st.tuples(st.just("disconnect"), st.sampled_from(HOSTS), st.just([])),
    st.tuples(st.just("expire"), st.just(""), st.just([])),
    st.tuples(st.just("drop"), st.just(""), st.just([])),
)


Views = tuple[
    dict[str, frozenset[str]], dict[str, float], dict[str, float], set[str], dict[str, float]
]


def _naive_views(registry: Registry) -> Views:
    """Membership, demands, starving, the jobs with a period now and the remaining work,
    walked host by host (as the registry computed them before it kept them by job)."""
    hosts: dict[str, set[str]] = {}
    demands: dict[str, list[float]] = {}
    lags: dict[str, float] = {}
    calm: set[str] = set()
    periodic: set[str] = set()
    remaining: dict[str, float] = {}
    for host, record in registry.hosts.items():
        for job, state in record.jobs.items():
            hosts.setdefault(job, set()).add(host)
            if state.demand is not None:
                demands.setdefault(job, []).append(state.demand)
            if state.lag_s is None:
                calm.add(job)
            else:
                lags[job] = min(lags.get(job, math.inf), state.lag_s)
            if state.period_s is not None:
                periodic.add(job)
            if state.remaining_s is not None:
                remaining[job] = max(remaining.get(job, 0.0), state.remaining_s)
    return (
        {job: frozenset(on) for job, on in hosts.items()},
        {job: statistics.fmean(values) * len(hosts[job]) for job, values in demands.items()},
        {job: lag for job, lag in lags.items() if job not in calm},
        periodic,
        remaining,
    )


def _reported(
    job: str, demand: float | None, lag: float | None, periodic: bool, left: float | None
) -> ReportedJob:
    period = 1.0 if periodic else None
    return ReportedJob(
        job, frozenset(), 1, 1, period_s=period, demand=demand, lag_s=lag, remaining_s=left
    )


@settings(max_examples=150, deadline=None)
@given(st.lists(step, max_size=30))
def test_the_registrys_views_kept_by_job_equal_a_walk_over_every_host(steps: list[Step]) -> None:
    registry = Registry(host_timeout_s=0.0)
    sessions: dict[str, str] = {}
    seqs: dict[str, int] = {}
    now = 0.0
    for what, host, jobs in steps:
        now += 1.0
        if what == "register" or (what == "report" and host not in sessions):
            sessions[host] = registry.register(Registration(host, 1, "t", (), "pack"), now).session
            registry.set_connected(sessions[host], True, now)
            seqs[host] = 0
        if what == "report":
            seqs[host] += 1
            reported = {job: _reported(job, d, lag, p, r) for job, d, lag, p, r in jobs}
            report = HostReport(
                sessions[host], seqs[host], tuple(reported.values()), (), Mode.PLAN, ""
            )
            registry.report(report, now)
        elif what == "disconnect" and host in sessions:
            registry.set_connected(sessions[host], False, now)
        elif what == "expire":
            for gone in registry.expire(now + 1.0):
                sessions.pop(gone, None)
        elif what == "drop":
            registry.drop_hosts()
            sessions.clear()
        membership, demands, starving, periodic, remaining = _naive_views(registry)
        assert registry.membership() == membership
        assert registry.demands() == demands
        assert registry.starving() == starving
        assert periodic <= registry.iterative()
        assert registry.remaining() == remaining


memberships = st.dictionaries(
    st.sampled_from(JOBS), st.frozensets(st.sampled_from(HOSTS), min_size=1, max_size=3)
)
demand_maps = st.dictionaries(st.sampled_from(JOBS), st.sampled_from((0.1, 0.2, 0.5, 0.9)))
remaining_maps = st.dictionaries(st.sampled_from(JOBS), st.sampled_from((1.0, 5.0, 20.0)))


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            memberships,
            demand_maps,
            st.frozensets(st.sampled_from(HOSTS), min_size=1),
            remaining_maps,
        ),
        min_size=1,
        max_size=12,
    )
)
def test_the_planners_orders_rebuilt_where_changes_reach_equal_every_host_rebuilt(
    updates: list[
        tuple[
            Mapping[str, frozenset[str]], Mapping[str, float], frozenset[str], Mapping[str, float]
        ]
    ],
) -> None:
    planner = Planner(3.0, 15.0, 1, ClusterPolicy.PACK)
    before: Mapping[str, tuple[tuple[str, ...], ...]] = {}
    for membership, demands, hosts, remaining in updates:
        arrival = sorted(membership)
        changed = planner.update(
            membership, set(hosts), demands, arrival, None, set(membership), remaining=remaining
        )
        rank = {job: i for i, job in enumerate(planner.ranking)}
        assert set(rank) == set(membership)
        orders: dict[str, tuple[tuple[str, ...], ...]] = {}
        for host in hosts:
            there = sorted(
                (job for job, on in membership.items() if host in on), key=rank.__getitem__
            )
            orders[host] = (tuple(there),) if there else ()
            assert planner.plan_for(host).slots == orders[host]
        assert changed == {host for host in hosts if before.get(host) != orders[host]}
        tops = {order[0][0] for order in orders.values() if order}
        green = {
            job
            for job in tops
            if all(orders[h] and orders[h][0][0] == job for h in membership[job] if h in orders)
        }
        assert planner.schedule.slots == ((frozenset(green),) if membership else ())
        assert planner.schedule.green_slots == {
            job: (0,) if job in green else () for job in membership
        }
        before = orders
