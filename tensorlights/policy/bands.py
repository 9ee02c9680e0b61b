"""Which job gets which band, now (pure: time comes in as an argument, monotonic seconds).

Policies:
  fifo    observe only: no bands, nothing programmed.
  static  the original TL-One: a fixed order (arrival order); the oldest job is green for as
          long as it runs, the next one takes over when it finishes.
  rotate  the original TL-RR: the green light moves to the next job every `interval`.
  pack    (the default) uses what the host measures (policy/packing.py): jobs ordered by
          link demand measured on top, smallest first, so those that fit on the link together
          run at their standalone speed; a starvation bound promotes any job slowed down more than
          `max_slowdown` over its life so far (at least `starvation_window`, looking back at
          most HORIZON_WINDOWS of them); the order changes only between the green
          job's pushes (at an iteration boundary), never mid-push.

Folding N jobs into the K PS bands (0 .. K-1; the unmanaged class has its own band after
them): band 0 belongs to the green job alone; the others keep their order and are spread
evenly over bands 1 .. K-1, so with more jobs than bands neighbours share a band and nobody
spills into the unmanaged band. (The prototype's integer division overflowed into the
default class with many models.)

Jobs arriving or finishing are handled at every evaluation: a new job joins the order at its
end (under `pack`, jobs spanning hosts that appear within ARRIVAL_TIE_S of each other are
ordered by name); a finished job leaves it; the green light stays where it is until its slot
ends, unless its job finished, in which case the next job in the order takes it at once.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tensorlights.errors import ConfigError
from tensorlights.model import GREEN_BAND, NUM_BANDS
from tensorlights.policy.packing import (
    MEASURE_GRACE_S,
    JobLoad,
    OnTop,
    SiblingRuns,
    StarvationGuard,
    link_work_left,
    measured_beside,
    ordering_demands,
    pack_order,
)

MAX_DEFER_S = 2.0
"""`pack` waits at most this long for the green job's push to end before reordering."""

ARRIVAL_TIE_S = 2.0
"""Jobs spanning hosts that appear within this long of each other are ordered by name (under
`pack`), not by which one was seen first. Jobs launched together show up on different hosts
a discovery pass apart, in either order; hosts deciding alone then disagreed on which job is
green, and a collective job's ring was green on some hosts and waiting on others (c1 on the
H100 host: the whole gain of the order, or none, on a coin toss). Short enough that jobs
launched seconds apart keep their arrival order. Not applied to jobs on one host: there the
arrival order costs no agreement, and the launch order a user chose is kept."""


class PolicyName(StrEnum):
    FIFO = "fifo"
    STATIC = "static"
    ROTATE = "rotate"
    PACK = "pack"


@dataclass(frozen=True)
class BandPlan:
    bands: dict[str, int]
    """job -> band (0 = green); empty under fifo."""
    order: tuple[str, ...]
    """Every job, the green one first, then who is next and after."""
    green: str | None
    green_since: float | None
    """When the current green job got the light (monotonic seconds)."""
    next_change_at: float | None
    """When the light moves next if nothing else changes (None: it does not move by time)."""
    rotated: bool
    """The green job differs from the previous evaluation's."""
    generation: int = 0
    """The controller plan this follows; 0 under the host's own policy."""


def moved_up(current: Sequence[str], desired: Sequence[str]) -> frozenset[str]:
    """The jobs `desired` puts ahead of where they are in `current` (the same jobs)."""
    place = {job: i for i, job in enumerate(current)}
    return frozenset(job for i, job in enumerate(desired) if i < place[job])


def fold_bands(jobs_in_order: int, bands: int) -> list[int]:
    """Band of each job by position (0 = green) when `jobs_in_order` jobs share `bands`."""
    if bands < 1:
        raise ConfigError("at least one band is needed for PS jobs")
    if jobs_in_order == 0:
        return []
    if bands == 1:
        return [GREEN_BAND] * jobs_in_order
    folded = [GREEN_BAND]
    others = jobs_in_order - 1
    for rank in range(others):
        folded.append(1 + rank * (bands - 1) // others if others > bands - 1 else 1 + rank)
    return folded


@dataclass(frozen=True)
class PackView:
    """pack's starvation guard as status shows it."""

    max_slowdown: float
    window_s: float
    bound_aimed_for: float
    """The slowdown the guard aims for: max_slowdown, or more where no order can keep it."""
    promoted_lag_s: Mapping[str, float]
    """Jobs promoted for the bound, with their lag (seconds)."""
    lag_s: Mapping[str, float] = field(default_factory=dict)
    """Every job's time lost to waiting over the span judged (seconds): its life so far, at
    least the window, at most HORIZON_WINDOWS of them (packing.StarvationGuard)."""
    lag_allowed_s: Mapping[str, float] = field(default_factory=dict)
    """Every job's lag past which its slowdown over that span exceeds max_slowdown."""
    slack_s: Mapping[str, float] = field(default_factory=dict)
    """Jobs judged by their declared iterations: how long each can still wait and end
    within the bound (seconds; promoted before it reaches 0)."""
    deadline_period_s: Mapping[str, float] = field(default_factory=dict)
    """Jobs judged by their declared iterations: the standalone period (seconds) their
    deadline and slack are reckoned at, the shortest their model read
    (packing.StarvationGuard)."""
    remaining_s: Mapping[str, float] = field(default_factory=dict)
    """Jobs that declared their iterations: their remaining standalone time (seconds), by
    which equal jobs are ordered, the least first (packing.StarvationGuard.remaining_work)."""
    iterations_inferred: Mapping[str, int] = field(default_factory=dict)
    """Jobs that declared nothing, each with the length of the latest sibling that ended
    here (packing.SiblingRuns): judged by that deadline."""
    not_iterative: frozenset[str] = frozenset()
    """Jobs green long enough to be measured that completed no iteration (bulk traffic):
    never promoted for their lag (packing.StarvationGuard.not_iterative)."""
    waits_for_siblings: frozenset[str] = frozenset()
    """Jobs past their lag's allowance kept waiting: all the jobs here are their siblings,
    ending in time for them (packing.StarvationGuard.waits_in_time)."""
    idle: frozenset[str] = frozenset()
    """Measured jobs that stopped pushing and iterating (their run over while their
    processes stay, or paused): never promoted (packing.StarvationGuard.idle)."""
    measured_beside: frozenset[str] = frozenset()
    """Young jobs not measured yet sent in the band of the last measured job ahead of them:
    they declared fewer iterations than the green job has left (packing.measured_beside)."""


@dataclass
class BandPolicy:
    """One host's policy state: the arrival order and where the green light is."""

    name: PolicyName
    interval_s: float = 3.0
    ps_bands: int = NUM_BANDS - 1
    max_slowdown: float = 2.0
    starvation_window_s: float = 120.0
    _order: list[str] = field(default_factory=list, init=False)
    _arrived: dict[str, float] = field(default_factory=dict, init=False)
    """When each job in the order first appeared (monotonic seconds)."""
    _green: str | None = field(default=None, init=False)
    _green_since: float | None = field(default=None, init=False)
    _packed: list[str] = field(default_factory=list, init=False)
    _reorder_wanted_since: float | None = field(default=None, init=False)
    _remaining: dict[str, float] = field(default_factory=dict, init=False)
    """As of the last evaluation (or watch): PackView.remaining_s."""
    _beside: frozenset[str] = field(default=frozenset(), init=False)
    """As of the last bands set: PackView.measured_beside."""
    declared: dict[str, int] = field(default_factory=dict, init=False)
    """The jobs' declared iterations as of the last evaluation (or watch), pack only."""
    _guard: StarvationGuard = field(init=False)
    on_top: OnTop = field(default_factory=OnTop, init=False)
    """Iterations each job completed green here: under the controller's plan too
    (PlanFollower), so the demands reported to it are those pack would order by."""
    siblings: SiblingRuns = field(default_factory=SiblingRuns, init=False)
    """The lengths of the jobs that ended here, given to their siblings (pack only)."""

    def __post_init__(self) -> None:
        if not self.max_slowdown > 1:
            raise ConfigError(f"max_slowdown must be above 1, got {self.max_slowdown}")
        if not self.starvation_window_s > 0:
            raise ConfigError(f"starvation_window must be positive, got {self.starvation_window_s}")
        self._guard = StarvationGuard(self.max_slowdown, self.starvation_window_s)
        if not self.interval_s > 0:
            raise ConfigError(f"interval must be positive, got {self.interval_s}")
        if not 1 <= self.ps_bands <= NUM_BANDS - 1:
            raise ConfigError(f"ps_bands must be 1..{NUM_BANDS - 1}, got {self.ps_bands}")

    def evaluate(
        self,
        now: float,
        jobs: set[str] | frozenset[str],
        loads: Mapping[str, JobLoad] | None = None,
        started: Mapping[str, float] | None = None,
        spanning: frozenset[str] = frozenset(),
        declared: Mapping[str, int] | None = None,
    ) -> BandPlan:
        """`loads`: what telemetry measured per job; `started`: the jobs telemetry has seen
        push, each with when its first push began (None: not known, all count as started
        when first evaluated); `spanning`: jobs whose traffic spans hosts (collective ones),
        ordered by name when they appear together; `declared`: the total iterations of the
        jobs that declared them (StarvationGuard). Used by `pack` only."""
        previous_green = self._green
        self._track(jobs, now)
        if self.name is PolicyName.FIFO or not self._order:
            self._green = self._green_since = None
            return BandPlan({}, tuple(self._order), None, None, None, previous_green is not None)
        if self.name is PolicyName.PACK:
            return self._pack(now, loads or {}, started, spanning, declared, previous_green)
        if self.name is PolicyName.STATIC:
            self._set_green(self._order[0], now)
            next_change = None
        else:
            self._rotate(now)
            assert self._green_since is not None
            next_change = self._green_since + self.interval_s if len(self._order) > 1 else None
        assert self._green is not None
        start = self._order.index(self._green)
        order = tuple(self._order[start:] + self._order[:start])
        bands = dict(zip(order, fold_bands(len(order), self.ps_bands), strict=True))
        return BandPlan(
            bands=bands,
            order=order,
            green=self._green,
            green_since=self._green_since,
            next_change_at=next_change,
            rotated=self._green != previous_green,
        )

    def _pack(
        self,
        now: float,
        loads: Mapping[str, JobLoad],
        started: Mapping[str, float] | None,
        spanning: frozenset[str],
        declared: Mapping[str, int] | None,
        previous_green: str | None,
    ) -> BandPlan:
        present = set(self._order)
        self._judge(now, present, loads, started, declared, previous_green, spanning)
        self.on_top.update(previous_green, loads)
        # Arrivals and departures take effect at once (an arrival joins at the end; when the
        # green job left, the next one is green) ...
        current = [job for job in self._packed if job in present]
        for job in self._order:
            if job not in current:
                self._join(current, job, spanning)
        demands = ordering_demands(loads, self.on_top.counts, current[0], declared=self.declared)
        self._remaining = self._guard.remaining_work(loads, self.declared)
        desired = self.desired_order(now, current, loads, demands)
        # ... a reorder waits for the green job's push to end (its iteration boundary), but
        # for a job promoted by its deadline: every second of its slack counts (r2: promoted
        # with 0.6-1.2 s of slack, the green job's pushes held it 1 s more, it ended late).
        if desired != current:
            if self._reorder_wanted_since is None:
                self._reorder_wanted_since = now
            top = loads.get(current[0])
            due = desired[0] != current[0] and self._guard.by_deadline(desired[0])
            if (
                top is None
                or not top.busy
                or due
                or now - self._reorder_wanted_since >= MAX_DEFER_S
            ):
                current = desired
        if desired == current:
            self._reorder_wanted_since = None
        # A job the order waiting for that boundary moves up is not placed yet: a young one
        # keeps sending beside the measured job ahead (measured_beside) meanwhile. Taken for
        # placed, g's short trial, ordered first by its length, sent below both other
        # trials for the 2 s the reorder waited (traced).
        placed = frozenset(demands) - moved_up(current, desired)
        self._packed = current
        self._set_green(current[0], now)
        bands = dict(zip(current, fold_bands(len(current), self.ps_bands), strict=True))
        return BandPlan(
            bands=self.measuring_bands(now, current, bands, loads, placed),
            order=tuple(current),
            green=self._green,
            green_since=self._green_since,
            next_change_at=None,
            rotated=self._green != previous_green,
        )

    def desired_order(
        self,
        now: float,
        current: Sequence[str],
        loads: Mapping[str, JobLoad],
        demands: Mapping[str, float],
    ) -> list[str]:
        """The order pack wants of `current` (the order in force, the green job first) by
        `demands` (those that order jobs: ordering_demands), the guard's promotions and the
        remaining work, as of the last evaluation or watch. Kept in place: jobs still being
        measured or not pushing yet (young), and measured ones whose demand does not order
        them yet; a job with no load past the grace (not iterative) goes behind."""
        young = self._guard.young(now, MEASURE_GRACE_S, set(current))
        holding = (young | frozenset(loads)) - frozenset(demands)
        return pack_order(
            current,
            demands,
            self._guard.promoted,
            holding=holding,
            remaining=self._remaining,
            held_work=link_work_left(loads, self.declared),
        )

    def watch(
        self,
        now: float,
        jobs: set[str] | frozenset[str],
        loads: Mapping[str, JobLoad],
        started: Mapping[str, float] | None,
        declared: Mapping[str, int] | None = None,
        green: str | None = None,
        spanning: frozenset[str] = frozenset(),
    ) -> None:
        """The starvation guard's view while the controller orders the jobs (PlanFollower):
        its promotions and the remaining work of the jobs that declared their lengths are
        reported, for the cluster-wide order to keep the bound and order equal jobs as this
        host would. `green`: the job green here since the previous evaluation; `spanning`: as
        in evaluate."""
        self._judge(now, set(jobs), loads, started, declared, green, spanning, alone=False)
        self._remaining = self._guard.remaining_work(loads, self.declared)

    def _judge(
        self,
        now: float,
        jobs: set[str],
        loads: Mapping[str, JobLoad],
        started: Mapping[str, float] | None,
        declared: Mapping[str, int] | None,
        green: str | None,
        spanning: frozenset[str],
        alone: bool = True,
    ) -> None:
        """The starvation guard's update, the jobs' declared lengths with their siblings'.
        `alone`: this host orders its jobs itself (not a controller); `spanning`: the rings
        (StarvationGuard.update)."""
        self.declared = dict(declared or {})
        lengths = self.siblings.update(now, jobs, loads, self.declared)
        self._guard.update(now, loads, jobs, started, lengths, green, alone, spanning)

    def measuring_bands(
        self,
        now: float,
        order: Sequence[str],
        bands: Mapping[str, int],
        loads: Mapping[str, JobLoad],
        ordered: Collection[str],
    ) -> dict[str, int]:
        """`bands` (of `order`, the green job first) with the young jobs not ordered yet
        (`ordered`: the jobs whose demands order them) that declared a short run beside the
        last measured job ahead (measured_beside), as of the last evaluation or watch."""
        young = self._guard.young(now, MEASURE_GRACE_S, set(order))
        shared = measured_beside(order, bands, loads, ordered, young, self.declared)
        self._beside = frozenset(job for job, band in shared.items() if band != bands[job])
        return shared

    @property
    def waits_for_siblings(self) -> frozenset[str]:
        """Jobs past their lag's limit that wait in time for their siblings here."""
        return self._guard.waits_for_siblings

    @property
    def remaining_s(self) -> dict[str, float]:
        """Jobs that declared their iterations: their remaining standalone time (seconds) as
        of the last evaluation or watch (StarvationGuard.remaining_work)."""
        return dict(self._remaining)

    @property
    def promoted(self) -> dict[str, float]:
        """Jobs `pack` promoted for the starvation bound, with their lag (seconds)."""
        return dict(self._guard.promoted)

    def pack_view(self) -> PackView:
        """The starvation guard's state, for status."""
        return PackView(
            max_slowdown=self.max_slowdown,
            window_s=self.starvation_window_s,
            bound_aimed_for=self._guard.effective_bound,
            promoted_lag_s=self.promoted,
            lag_s=dict(self._guard.lags),
            lag_allowed_s={
                job: self._guard.allowed(self.max_slowdown, span)
                for job, span in self._guard.spans.items()
            },
            slack_s=dict(self._guard.slack),
            deadline_period_s=dict(self._guard.deadline_periods),
            remaining_s=self.remaining_s,
            not_iterative=self._guard.not_iterative,
            waits_for_siblings=self._guard.waits_for_siblings,
            idle=self._guard.idle,
            iterations_inferred=dict(self.siblings.inferred),
            measured_beside=self._beside,
        )

    def _track(self, jobs: set[str] | frozenset[str], now: float) -> None:
        """Keep the arrival order; when the green job left, its successor inherits the light."""
        if self._green is not None and self._green not in jobs:
            position = self._order.index(self._green)
            after = self._order[position:] + self._order[:position]
            successor = next((job for job in after if job in jobs), None)
            self._green = successor
            self._green_since = None  # a fresh slot for the successor
        self._order = [job for job in self._order if job in jobs]
        self._arrived = {job: self._arrived[job] for job in self._order}
        self._order += sorted(jobs - set(self._order))
        for job in jobs - set(self._arrived):
            self._arrived[job] = now

    def _join(self, order: list[str], job: str, spanning: frozenset[str]) -> None:
        """Add an arrival to `order` at its end; a job spanning hosts goes ahead of the
        spanning jobs at the end that appeared less than ARRIVAL_TIE_S before it and sort
        after it by name (`pack` only: static and rotate are the prototype's, in arrival
        order; a job on one host keeps its arrival, which costs no agreement)."""
        arrived = self._arrived[job]
        position = len(order)
        while job in spanning and position > 0:
            before = order[position - 1]
            tied = before in spanning and arrived - self._arrived[before] < ARRIVAL_TIE_S
            if not tied or before < job:
                break
            position -= 1
        order.insert(position, job)

    def _set_green(self, job: str, now: float) -> None:
        if job != self._green or self._green_since is None:
            self._green, self._green_since = job, now

    def _rotate(self, now: float) -> None:
        if self._green is None or self._green_since is None:
            self._set_green(self._green or self._order[0], now)
            return
        # Compared as next_change_at is computed (green_since + interval): woken at that
        # instant, `now - green_since` can come out a hair under the interval.
        if now < self._green_since + self.interval_s or len(self._order) == 1:
            return
        # Slots keep their cadence on the monotonic clock: a late evaluation moves the light
        # by the number of whole slots that passed, and the slot starts on its boundary.
        slots = max(1, int((now - self._green_since) // self.interval_s))
        while self._green_since + (slots + 1) * self.interval_s <= now:
            slots += 1
        while slots > 1 and self._green_since + slots * self.interval_s > now:
            slots -= 1
        position = self._order.index(self._green)
        self._green = self._order[(position + slots) % len(self._order)]
        self._green_since += slots * self.interval_s
