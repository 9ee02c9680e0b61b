"""Coordinated rotation across hosts (pure; time comes in as an argument).

The controller side: `build_schedule` turns job -> PS hosts into a repeating cycle of slots in
which every job is green on all of its PS hosts at once and no host has two green jobs. That
is a colouring of the conflict graph (two jobs conflict when they share a PS host); greedy
colouring, largest jobs first (Welsh-Powell), with each host's set of taken slots kept as an
int bitmask so a job's first free slot is one OR and one bit trick. A host-local job can
then fill the slots its host would otherwise leave without a green job, least-served first,
so a host idles its top band only when every candidate is blocked elsewhere.

`host_orders` turns the cycle into one host's per-slot job order: the slot's green job first,
then the host's other jobs by how soon they are green next (who is next gets band 1).

The agent side: `HostSchedule` is a received plan with its times on the agent's monotonic
clock; `PlanFollower` follows it while its lease runs and falls back to the local policy when
it has lapsed, handing the reconciler the same `BandPlan` either way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from tensorlights.model import PlanSlots
from tensorlights.policy.bands import BandPlan, BandPolicy, fold_bands, moved_up
from tensorlights.policy.packing import JobLoad, ordering_demands


@dataclass(frozen=True)
class Schedule:
    slots: tuple[frozenset[str], ...]
    """The green jobs of each slot of the cycle (empty when there are no jobs)."""
    green_slots: Mapping[str, tuple[int, ...]]
    """Job -> the slots in which it is green (every job has at least one)."""

    _waits: dict[str, tuple[int, ...]] = field(default_factory=dict, compare=False, repr=False)

    def waits(self, job: str) -> tuple[int, ...]:
        """For each slot, how many slots until `job` is green (0: green in it); cached."""
        cached = self._waits.get(job)
        if cached is None:
            count, greens = len(self.slots), self.green_slots[job]
            cached = tuple(min((g - slot) % count for g in greens) for slot in range(count))
            self._waits[job] = cached
        return cached

    def share(self, job: str) -> float:
        """Share of the cycle the job is green."""
        return len(self.green_slots.get(job, ())) / len(self.slots) if self.slots else 0.0


def _lowest_clear_bit(mask: int) -> int:
    return (~mask & (mask + 1)).bit_length() - 1


def build_schedule(ps_hosts: Mapping[str, Iterable[str]]) -> Schedule:
    """A cycle in which each job is green on all of its PS hosts at once (see module doc)."""
    hosts_of = {job: tuple(sorted(set(hosts))) for job, hosts in ps_hosts.items() if hosts}
    taken: dict[str, int] = {}
    colour: dict[str, int] = {}
    for job in sorted(hosts_of, key=lambda j: (-len(hosts_of[j]), j)):
        mask = 0
        for host in hosts_of[job]:
            mask |= taken.get(host, 0)
        slot = _lowest_clear_bit(mask)
        colour[job] = slot
        bit = 1 << slot
        for host in hosts_of[job]:
            taken[host] = taken.get(host, 0) | bit
    count = max(colour.values(), default=-1) + 1
    greens: dict[str, list[int]] = {job: [slot] for job, slot in colour.items()}
    full = (1 << count) - 1
    # Fill: only jobs whose hosts all have a free slot compete; in each such slot the job
    # with the fewest green slots so far (then the name) takes it.
    candidates: dict[str, int] = {}
    for job, hosts in hosts_of.items():
        mask = 0
        for host in hosts:
            mask |= taken[host]
        if mask != full:
            candidates[job] = full & ~mask
    for slot in range(count):
        bit = 1 << slot
        for job in sorted(
            (j for j, free in candidates.items() if free & bit),
            key=lambda j: (len(greens[j]), j),
        ):
            hosts = hosts_of[job]
            if all(not taken[host] & bit for host in hosts):
                greens[job].append(slot)
                for host in hosts:
                    taken[host] |= bit
    slots: list[set[str]] = [set() for _ in range(count)]
    for job, job_slots in greens.items():
        for slot in job_slots:
            slots[slot].add(job)
    return Schedule(
        slots=tuple(frozenset(s) for s in slots),
        green_slots={job: tuple(sorted(s)) for job, s in greens.items()},
    )


def host_orders(schedule: Schedule, host_jobs: Iterable[str]) -> tuple[tuple[str, ...], ...]:
    """One host's job order in each slot: the green one first, then by how soon each is
    green next. A cycle whose slots all give the same order collapses to one slot."""
    jobs = sorted(job for job in host_jobs if job in schedule.green_slots)
    count = len(schedule.slots)
    if not jobs or count == 0:
        return ()
    if len(jobs) == 1:
        return ((jobs[0],),)
    waits = {job: schedule.waits(job) for job in jobs}
    orders = [tuple(sorted(jobs, key=lambda j: waits[j][slot])) for slot in range(count)]
    if all(order == orders[0] for order in orders):
        return (orders[0],)
    return tuple(orders)


# Agent side --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostSchedule:
    """A plan from the controller, its times on this agent's monotonic clock."""

    incarnation: int
    generation: int
    epoch: float
    """Start of slot 0 (monotonic seconds; may lie in the past or the future)."""
    slot_s: float
    slots: tuple[tuple[str, ...], ...]
    lease_until: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.slot_s) and self.slot_s > 0):
            raise ValueError("slot length must be positive")

    @classmethod
    def from_plan(cls, plan: PlanSlots, now: float, wall: float) -> HostSchedule:
        """A plan as it arrives at `now` (monotonic seconds; `wall`: Unix seconds at the
        same instant): its slot epoch moved to the monotonic clock, its lease from now."""
        return cls(
            incarnation=plan.incarnation,
            generation=plan.generation,
            epoch=plan.epoch - (wall - now),
            slot_s=plan.slot_s,
            slots=plan.slots,
            lease_until=now + plan.lease_s,
        )

    @property
    def version(self) -> tuple[int, int]:
        return self.incarnation, self.generation

    def slot_index(self, now: float) -> int:
        return math.floor((now - self.epoch) / self.slot_s)

    def order_at(self, index: int, jobs: frozenset[str] | set[str]) -> tuple[str, ...]:
        """The order of slot `index` for the jobs present here; jobs the plan does not name
        (new since the plan) go last, by name."""
        planned = self.slots[index % len(self.slots)] if self.slots else ()
        named = [job for job in planned if job in jobs]
        return tuple(named) + tuple(sorted(jobs - set(named)))

    def evaluate(
        self, now: float, jobs: frozenset[str] | set[str], ps_bands: int, previous: str | None
    ) -> BandPlan:
        index = self.slot_index(now)
        order = self.order_at(index, jobs)
        green = order[0] if order else None
        bands = dict(zip(order, fold_bands(len(order), ps_bands), strict=True))
        since = next_change = None
        if green is not None:
            cycle = max(1, len(self.slots))
            back = 0
            while back < cycle and self._green_at(index - back - 1, jobs) == green:
                back += 1
            since = self.epoch + (index - back) * self.slot_s
            ahead = 1
            while ahead <= cycle and self._green_at(index + ahead, jobs) == green:
                ahead += 1
            if ahead <= cycle:
                next_change = self.epoch + (index + ahead) * self.slot_s
        return BandPlan(
            bands=bands,
            order=order,
            green=green,
            green_since=since,
            next_change_at=next_change,
            rotated=green != previous,
            generation=self.generation,
        )

    def _green_at(self, index: int, jobs: frozenset[str] | set[str]) -> str | None:
        order = self.order_at(index, jobs)
        return order[0] if order else None


@dataclass
class PlanFollower:
    """Follows the controller's plan while its lease runs; the local policy otherwise."""

    local: BandPolicy
    plan: HostSchedule | None = None
    stale_plans: int = 0
    _green: str | None = field(default=None, init=False)

    def offer(self, plan: HostSchedule) -> bool:
        """Take a plan unless it is older than the one held (a replay); the same version
        again renews the lease."""
        if self.plan is not None and plan.version < self.plan.version:
            self.stale_plans += 1
            return False
        self.plan = plan
        return True

    def renew(self, version: tuple[int, int], lease_until: float) -> bool:
        """Extend the lease of the plan held if it is `version` (the controller renews the
        plan it last sent; another is on its way with its own lease)."""
        if self.plan is None or self.plan.version != version:
            return False
        if lease_until > self.plan.lease_until:
            self.plan = replace(self.plan, lease_until=lease_until)
        return True

    def following(self, now: float) -> bool:
        return self.plan is not None and now < self.plan.lease_until

    def evaluate(
        self,
        now: float,
        jobs: set[str] | frozenset[str],
        loads: Mapping[str, JobLoad] | None = None,
        started: Mapping[str, float] | None = None,
        spanning: frozenset[str] = frozenset(),
        declared: Mapping[str, int] | None = None,
    ) -> BandPlan:
        if self.plan is not None and now < self.plan.lease_until:
            # The local policy is not evaluated meanwhile: the plan's light is counted here,
            # and the starvation guard watches (its promotions go to the controller).
            loads = loads or {}
            self.local.on_top.update(self._green, loads)
            self.local.watch(now, jobs, loads, started, declared, self._green, spanning)
            result = self.plan.evaluate(now, jobs, self.local.ps_bands, self._green)
            ordered = self.trusted_demands(loads)
            # A job this host's own pack would move up is not placed yet either: its report
            # reaches the controller, whose plan moves it a replan later. Taken for placed,
            # r5's short trial sent below both trials for 1 s between (traced).
            desired = self.local.desired_order(now, result.order, loads, ordered)
            placed = frozenset(ordered) - moved_up(result.order, desired)
            bands = self.local.measuring_bands(now, result.order, result.bands, loads, placed)
            result = replace(result, bands=bands)
            lease_end = self.plan.lease_until
            if result.next_change_at is None or lease_end < result.next_change_at:
                result = replace(result, next_change_at=lease_end)
        else:
            result = self.local.evaluate(now, jobs, loads, started, spanning, declared)
            result = replace(result, rotated=result.green != self._green)
        self._green = result.green
        return result

    def starving(self) -> dict[str, float]:
        """Jobs the starvation guard would promote here, with their lag (seconds): reported
        to the controller, whose cluster-wide order has no clock of its own on the jobs'
        progress (without them, a job at the bottom of a host's order waited for days
        behind long jobs: the simulator's cluster day, slowdowns up to 200x)."""
        return self.local.promoted

    def waits_for_siblings(self) -> frozenset[str]:
        """Of those, the jobs that wait in time for their siblings here
        (StarvationGuard.waits_for_siblings): reported with their lag, for the controller to
        keep them waiting where every host they run on says so."""
        return self.local.waits_for_siblings & self.local.promoted.keys()

    def remaining(self) -> dict[str, float]:
        """The jobs that declared their iterations, with their remaining standalone time here
        (BandPolicy.remaining_s): reported to the controller, which orders equal jobs the
        least first, as this host's pack does (without them, a sweep's short trial waited for
        the long one under the controller: the simulator's r5, 16.28 s against 15.09 s)."""
        return self.local.remaining_s

    def trusted_demands(self, loads: Mapping[str, JobLoad]) -> dict[str, float]:
        """The demands pack orders by on this host (packing.ordering_demands), whoever holds
        the light: what is reported to the controller, so its cluster-wide order does not
        take a waiting job's low reading (its idle inflated by the wait) for a small demand
        and put it ahead of the job on top (seen: the light moved 7 times in 20 s among three
        equal DDP jobs). Not the green job's own until it has been measured on top: its
        readings until then were taken waiting, and trusting them the moment it turned green
        made the light flicker between two jobs every 50-100 ms (each host's report moved
        the job's demand as the light reached it, and back as it left). A waiting job that
        declared its length and pushes the green job's bytes has the green job's demand, as
        in this host's own pack: the remaining work then orders them (remaining)."""
        counts = self.local.on_top.counts
        declared = self.local.declared
        return ordering_demands(loads, counts, self._green, trust_top=False, declared=declared)
