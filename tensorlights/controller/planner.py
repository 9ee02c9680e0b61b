"""From membership to each host's plan, and the rotations view (pure; time is an argument).

Slots are aligned to the Unix epoch (slot k starts at k * slot_s), so every agent -- and a
restarted controller -- computes the same boundaries from its NTP-synchronised wall clock.
A host's plan carries the generation at which it last changed; the generation only grows
(with the controller's incarnation, which grows across restarts, it orders all plans).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from tensorlights.model import PlanSlots
from tensorlights.policy.packing import free_first, pack_order
from tensorlights.policy.schedule import HostSchedule, Schedule, build_schedule, host_orders

EPOCH = 0.0


class ClusterPolicy(StrEnum):
    """How the controller plans the cluster (the agents' own policies are PolicyName)."""

    ROTATE = "rotate"
    """A coordinated cycle of green slots (build_schedule)."""
    PACK = "pack"
    """Every host gets one slot, its jobs in one cluster-wide order by reported demand
    (policy/packing.py), so any two jobs have the same relative priority on every host."""


@dataclass(frozen=True)
class HostRotationView:
    host: str
    green: str | None
    green_since: float | None
    next: str | None
    next_at: float | None
    upcoming: tuple[tuple[str, float], ...]
    """(job, Unix seconds) of the next changes."""


def _fewest_hosts_first(
    order: Sequence[str], membership: Mapping[str, frozenset[str]], seen: Collection[str]
) -> list[str]:
    """`order` with the jobs not placed yet (not in `seen`: no trusted demand, and not
    iterating in a place this planner gave it) reordered among their own places by how
    many hosts they span, fewest first (stable). Before measurements, that is all that tells
    what a job takes: the cluster-wide order ranks by demand summed over a job's hosts
    (Registry.demands), and a job sharded over two PS hosts takes two links where a
    single-host job beside it takes one; put first by arrival, it held both single-host jobs
    back until it ended (m2). Once a job iterates in its place, it keeps it until its
    demand is trusted. A restarted controller places every job anew: by arrival (the order
    its agents' reports came in) it put the sharded job back ahead of the two. Then, as
    among measured jobs of equal demand, those that share no host with one put before them
    first (free_first): a run's start would otherwise give the light to a job held back
    elsewhere and move it once the jobs are measured (m3)."""
    fresh = [job for job in order if job not in seen]
    fewest = sorted(fresh, key=lambda job: len(membership[job]))
    ranked = iter(free_first(fewest, membership, set()))
    return [next(ranked) if job not in seen else job for job in order]


class Planner:
    def __init__(
        self,
        slot_s: float,
        lease_s: float,
        incarnation: int,
        policy: ClusterPolicy = ClusterPolicy.ROTATE,
    ) -> None:
        self.policy = ClusterPolicy(policy)
        self.slot_s = slot_s
        self.lease_s = lease_s
        self.incarnation = incarnation
        self.generation = 0
        self.schedule = Schedule((), {})
        self._membership: dict[str, frozenset[str]] = {}
        self._ranking: tuple[str, ...] = ()
        self._orders: dict[str, tuple[tuple[str, ...], ...]] = {}
        self._generation_of: dict[str, int] = {}
        self._hosts: set[str] = set()
        self._jobs_on: dict[str, set[str]] = {}
        """Host -> the jobs of the membership there (as of the last update)."""
        self._green: set[str] = set()
        """pack: the jobs first on every host they run on (as of the last update)."""
        self._promoted: tuple[str, ...] = ()
        """pack: the starving jobs put first at the last update, in their turns (_turns)."""

    def _turns(self, starving: Mapping[str, float]) -> dict[str, float]:
        """The starving jobs in their turns, as an agent's guard keeps them
        (StarvationGuard.promoted): those promoted before keep their order, the others
        follow, the most behind first. Re-sorted by lag, two that fit together would trade
        the light as their lags cross."""
        kept = [job for job in self._promoted if job in starving]
        fresh = sorted(starving.keys() - set(kept), key=lambda job: (-starving[job], job))
        return {job: starving[job] for job in kept + fresh}

    def update(
        self,
        membership: Mapping[str, frozenset[str]],
        hosts: set[str],
        demands: Mapping[str, float] | None = None,
        arrival: Sequence[str] = (),
        end_times: Mapping[str, float] | None = None,
        iterative: Collection[str] = (),
        young: Collection[str] = (),
        starving: Mapping[str, float] | None = None,
        remaining: Mapping[str, float] | None = None,
    ) -> set[str]:
        """Recompute for a new membership (and, under pack, the jobs' demands, arrival order,
        which jobs are measured iterating, young, or starving, and the remaining work of
        those that declared their lengths: Registry.iterative, .young, .starving,
        .remaining); the hosts whose plan changed."""
        ranking: tuple[str, ...] = ()
        if self.policy is ClusterPolicy.PACK:
            # The order in force, then newcomers in arrival order. An iterating or young job
            # whose demand is not trusted yet (agents report only what pack would order by)
            # keeps its place, as on an agent: put behind, it would come back once measured,
            # and the light would move twice.
            demands = demands or {}
            # "Its place": one this planner gave it. A restarted controller places every
            # job anew (holding them at their arrival in its registry put a sharded job back
            # ahead of the two single-host jobs beside it).
            placed = set(self._ranking) & set(iterative)
            # Young jobs hold too (Registry.young): reports come one host at a time, and a
            # job not yet reported iterating went behind the ones that were.
            holding = frozenset((placed | set(young)) & membership.keys() - demands.keys())
            known = [job for job in self._ranking if job in membership]
            seen = set(known)  # (a list's `in` made this quadratic: 22% of a controller's CPU)
            fresh = [job for job in arrival if job in membership and job not in seen]
            fresh += sorted(membership.keys() - seen - set(fresh))
            # A newcomer already measured (only a restarted controller meets one: its
            # agents report jobs measured under the old plan, one host at a time) joins
            # ahead of the jobs holding their place: holding keeps an unmeasured job from
            # moving twice, not ahead of a measured one (appended behind a sharded job placed
            # on the first host's report, a single-host job waited 8 s on the second, m2).
            cut = next((i for i, job in enumerate(known) if job in holding), len(known))
            measured = [job for job in fresh if job in demands]
            known[cut:cut] = measured
            known += [job for job in fresh if job not in demands]
            known = _fewest_hosts_first(known, membership, demands.keys() | placed)
            starving = {job: lag for job, lag in (starving or {}).items() if job in membership}
            promoted = self._turns(starving)
            self._promoted = tuple(promoted)
            ranking = tuple(
                pack_order(known, demands, promoted, end_times, holding, membership, remaining)
            )
        if membership == self._membership and hosts == self._hosts and ranking == self._ranking:
            return set()
        # Only the hosts a job came to or left, and those of jobs whose place in the ranking
        # moved, can have a new order (a host's order is its jobs in ranking order): at
        # 10,000 hosts, building every host's order at every replan was most of its cost.
        moved = {
            job
            for job in membership.keys() | self._membership.keys()
            if membership.get(job) != self._membership.get(job)
        }
        touched = set(hosts ^ self._hosts)
        for job in moved:
            was, now = self._membership.get(job, frozenset()), membership.get(job, frozenset())
            for where in (was, now):
                touched |= where
                for host in where:
                    self._jobs_on.setdefault(host, set()).discard(job)
            for host in membership.get(job, ()):
                self._jobs_on[host].add(job)
        if self.policy is ClusterPolicy.PACK:
            reordered = _reordered(self._ranking, ranking, membership.keys() - moved)
            for job in reordered:
                touched |= membership[job]
            touched &= hosts | self._orders.keys()
            orders = self._ranked_orders(ranking, membership, hosts, touched)
        else:
            # The cycle's slots follow from the whole membership: every host anew.
            self.schedule = build_schedule(membership)
            touched = hosts | self._orders.keys()
            jobs_of: dict[str, list[str]] = {host: [] for host in hosts}
            for job, job_hosts in membership.items():
                for host in job_hosts:
                    if host in jobs_of:
                        jobs_of[host].append(job)
            orders = {host: host_orders(self.schedule, jobs) for host, jobs in jobs_of.items()}
        self._membership = dict(membership)
        self._ranking = ranking
        self._hosts = set(hosts)
        changed = {
            host for host in touched if host in orders and self._orders.get(host) != orders[host]
        }
        if changed:
            self.generation += 1
            for host in changed:
                self._generation_of[host] = self.generation
        for host in touched - orders.keys():
            self._generation_of.pop(host, None)
        self._orders = orders
        return changed

    def _ranked_orders(
        self,
        ranking: Sequence[str],
        membership: Mapping[str, frozenset[str]],
        hosts: set[str],
        touched: set[str],
    ) -> dict[str, tuple[tuple[str, ...], ...]]:
        """pack's plan: one slot per host, its jobs in the cluster-wide `ranking`; green are
        the jobs first on every host they run on (no rotation). Recomputed on the `touched`
        hosts only (the others' orders stand)."""
        rank = {job: i for i, job in enumerate(ranking)}
        orders = {host: order for host, order in self._orders.items() if host in hosts}
        # Jobs whose green may have changed: every job, before or now, on a touched host (a
        # host leaving the plan can leave a job on top of all the others it runs on).
        judge: set[str] = set()
        for host in touched:
            orders.pop(host, None)
            old = self._orders.get(host, ())
            judge.update(*old)
            if host not in hosts:
                continue
            jobs = self._jobs_on.get(host)
            orders[host] = (tuple(sorted(jobs, key=rank.__getitem__)),) if jobs else ()
            judge.update(jobs or ())
        for job in judge:
            planned = [orders[h] for h in membership.get(job, ()) if h in orders]
            on_top = bool(planned) and all(order and order[0][0] == job for order in planned)
            if on_top:
                self._green.add(job)
            else:
                self._green.discard(job)
        self._green &= membership.keys()
        self.schedule = Schedule(
            (frozenset(self._green),) if membership else (),
            {job: (0,) if job in self._green else () for job in membership},
        )
        return orders

    @property
    def ranking(self) -> tuple[str, ...]:
        """pack: the cluster-wide order in force, green first (empty under rotate)."""
        return self._ranking

    def plan_for(self, host: str) -> PlanSlots:
        return PlanSlots(
            incarnation=self.incarnation,
            generation=self._generation_of.get(host, self.generation),
            lease_s=self.lease_s,
            epoch=EPOCH,
            slot_s=self.slot_s,
            slots=self._orders.get(host, ()),
        )

    def rotation(self, host: str, now: float, upcoming: int = 3) -> HostRotationView:
        """Who is green on `host` at Unix time `now`, since when, and the next changes."""
        orders = self._orders.get(host, ())
        jobs = frozenset(job for order in orders[:1] for job in order)
        schedule = HostSchedule(
            self.incarnation, 0, EPOCH, self.slot_s, orders, lease_until=math.inf
        )
        now_plan = schedule.evaluate(now, jobs, 1, None)
        changes: list[tuple[str, float]] = []
        at = now_plan.next_change_at
        while at is not None and len(changes) < upcoming:
            later = schedule.evaluate(at, jobs, 1, None)
            assert later.green is not None
            changes.append((later.green, at))
            at = later.next_change_at
        return HostRotationView(
            host=host,
            green=now_plan.green,
            green_since=now_plan.green_since,
            next=changes[0][0] if changes else None,
            next_at=changes[0][1] if changes else None,
            upcoming=tuple(changes),
        )


def _reordered(old: Sequence[str], new: Sequence[str], kept: Collection[str]) -> set[str]:
    """Of the `kept` jobs (in both rankings), the fewest whose moving explains `new`: the
    others, a longest run in the same relative order in both, keep their order among
    themselves."""
    position = {job: i for i, job in enumerate(old) if job in kept}
    sequence = [job for job in new if job in position]
    if [job for job in old if job in position] == sequence:
        return set()
    # Longest increasing subsequence of the old positions in the new order (patience).
    tails: list[int] = []
    tail_at: list[int] = []
    parent = [-1] * len(sequence)
    for i, job in enumerate(sequence):
        k = bisect.bisect_left(tails, position[job])
        if k == len(tails):
            tails.append(position[job])
            tail_at.append(i)
        else:
            tails[k] = position[job]
            tail_at[k] = i
        parent[i] = tail_at[k - 1] if k > 0 else -1
    stay = set()
    i = tail_at[-1]
    while i >= 0:
        stay.add(sequence[i])
        i = parent[i]
    return set(sequence) - stay
