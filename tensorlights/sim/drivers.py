"""Who sets the bands in a simulation: the real policy objects, fed the simulation's clock and
its hosts' measurements.

  NoBands       FIFO (the link's discipline decides: priority without bands, or fair)
  HostPolicies  each host's own BandPolicy (our agents alone: static = TL-One, rotate, pack;
                the prototype's TL-RR per host: rotate every 20 s, hosts' phases apart)
  Coordinated   every host's PlanFollower following the controller's plans: the real
                Registry (reports, demands summed over a job's hosts) and Planner
  PrototypeRR   the original TL-RR per host, as the benchmark runs it (bench/legacy_tc.py):
                every job placed on the host in the tree from the start, the first on top,
                the next one on top every period, each host's first turn its phase late
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Collection, Mapping

from tensorlights.agent.config import AgentConfig
from tensorlights.bench.legacy_tc import original_prios
from tensorlights.controller.config import ControllerConfig
from tensorlights.controller.core import plan_update
from tensorlights.controller.planner import ClusterPolicy, Planner
from tensorlights.controller.registry import Registry
from tensorlights.model import HostReport, Mode, Registration, ReportedJob, jobs_moved
from tensorlights.policy.bands import BandPolicy, PolicyName
from tensorlights.policy.schedule import HostSchedule, PlanFollower
from tensorlights.sim.engine import Simulation


def _defaults(config: type) -> dict[str, object]:
    """A config dataclass's defaults: the daemons' settings, defined once, there."""
    return {f.name: f.default for f in dataclasses.fields(config)}


AGENT_DEFAULTS = _defaults(AgentConfig)
CONTROLLER_DEFAULTS = _defaults(ControllerConfig)


def _default_s(defaults: Mapping[str, object], name: str) -> float:
    value = defaults[name]
    assert isinstance(value, float)
    return value


SCAN_S = _default_s(AGENT_DEFAULTS, "scan_interval_s")
"""The agent evaluates its policy at least this often (its loop's scan) while a host has
jobs to order; more often when the light's next move is sooner, and after every push."""


ROUNDING_S = 1e-6


def agent_policy(
    name: PolicyName | str,
    interval_s: float | None = None,
    starvation_window_s: float | None = None,
) -> Callable[[], BandPolicy]:
    """A fresh host policy as the agent configures it (agent/reconcile.local_policy), with
    the agent's defaults where not given."""
    interval = interval_s if interval_s is not None else AGENT_DEFAULTS["interval_s"]
    window = (
        starvation_window_s
        if starvation_window_s is not None
        else AGENT_DEFAULTS["starvation_window_s"]
    )
    slowdown = AGENT_DEFAULTS["max_slowdown"]
    assert isinstance(interval, float) and isinstance(window, float)
    assert isinstance(slowdown, float)
    return lambda: BandPolicy(
        PolicyName(name), interval, max_slowdown=slowdown, starvation_window_s=window
    )


class DriverBase:
    """What every driver shares: the simulation it is attached to, and pushes never held
    (all but the time-shifting baseline)."""

    _sim: Simulation | None = None

    def attach(self, sim: Simulation) -> None:
        self._sim = sim

    @property
    def sim(self) -> Simulation:
        assert self._sim is not None, "attach() first"
        return self._sim

    def release(self, job: str, now: float) -> float:
        return now


class NoBands(DriverBase):
    def evaluate(self, now: float, hosts: Collection[str]) -> None:
        pass


class HostPolicies(DriverBase):
    """Every host its own policy, each starting at its phase (before it: no bands); with
    `reach`, only those hosts run an agent (the others stay FIFO)."""

    def __init__(
        self,
        make: Callable[[], BandPolicy],
        phases: Mapping[str, float] | None = None,
        reach: Collection[str] | None = None,
    ) -> None:
        self.make = make
        self.phases = dict(phases or {})
        self.reach = None if reach is None else frozenset(reach)
        self.policies: dict[str, BandPolicy] = {}

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        hosts = sim.links if self.reach is None else self.reach
        self.policies = {host: self.make() for host in hosts}

    def evaluate(self, now: float, hosts: Collection[str]) -> None:
        sim = self.sim
        for host in hosts:
            policy = self.policies.get(host)
            if policy is None:
                continue
            phase = self.phases.get(host, 0.0)
            if now < phase:
                sim.wake(host, phase)
                continue
            jobs = sim.host_jobs(host)
            if policy.name is PolicyName.PACK:  # the one that reads telemetry
                plan = policy.evaluate(now, jobs, *sim.observed(host))
            else:
                plan = policy.evaluate(now, jobs)
            sim.set_bands(host, plan.bands)
            scan = policy.name is PolicyName.PACK
            wake_agent(sim, host, now, plan.next_change_at, len(jobs), scan)


def wake_agent(
    sim: Simulation,
    host: str,
    now: float,
    next_change_at: float | None,
    jobs: int,
    scan: bool,
) -> None:
    """When the agent on `host` evaluates next, pushes and arrivals aside, while two jobs or
    more share the link: the light's next move (a slot's end, a plan's lease), and with
    `scan` (a policy that watches the clock: pack's starvation guard) its next scan,
    whichever comes first. With one job, or none, no order matters until a job comes, and a
    coming job is news (waking every host at its plan's lease end kept 1,000 idle hosts
    renewing plans for nothing: 60% of a cluster run's evaluations); TL-One and a plan
    being followed change only with news or at their next move (scanning them every second
    was most of a cluster run's cost)."""
    if jobs < 2:
        return
    when = next_change_at if next_change_at is not None else math.inf
    if scan:
        # On a grid: a scan's phase set by the host's evaluations would differ with how often
        # it is evaluated (a job skipping its iterations is evaluated only where its
        # measurements change), and so would what the guard sees.
        when = min(when, (math.floor(now / SCAN_S + ROUNDING_S) + 1) * SCAN_S)
    if when < math.inf:
        # A move due now that this evaluation did not make is a rounding short of its slot
        # boundary (green_since + interval == now, elapsed a hair under interval).
        sim.wake(host, max(when, now + ROUNDING_S))


class Coordinated(DriverBase):
    """Agents following the controller, as they do since reports carry news: a host reports
    at once when its jobs change, and when a demand moved beyond noise (model.jobs_moved),
    looked for at most every `report_interval_s`; the controller replans on each report
    (the real Registry and Planner) and sends a plan to each host whose plan changed, and
    renews every plan in force each third of its lease. With `reach`, only those hosts run
    an agent: the others stay FIFO and the controller does not know them."""

    def __init__(
        self,
        policy: ClusterPolicy | str,
        local: Callable[[], BandPolicy],
        slot_s: float | None = None,
        reach: Collection[str] | None = None,
    ) -> None:
        self.policy = ClusterPolicy(policy)
        self.local = local
        self.slot_s = slot_s if slot_s is not None else _default_s(CONTROLLER_DEFAULTS, "slot_s")
        self.lease_s = _default_s(CONTROLLER_DEFAULTS, "lease_s")
        self.report_interval_s = _default_s(CONTROLLER_DEFAULTS, "report_interval_s")
        self.reach = None if reach is None else frozenset(reach)
        self.registry = Registry()
        self.planner = Planner(self.slot_s, self.lease_s, incarnation=1, policy=self.policy)
        self.followers: dict[str, PlanFollower] = {}
        self.replan_s: list[float] = []
        """Wall seconds of each planner update (its real cost, for the report)."""
        self._sessions: dict[str, str] = {}
        self._seq: dict[str, int] = {}
        self._reported: dict[str, tuple[ReportedJob, ...]] = {}
        self._next_look: dict[str, float] = {}
        self._look_wake: dict[str, float] = {}
        """Per host, the look a wake-up is set for (news pending)."""
        self._renew_at: dict[str, float] = {}

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        for host in sim.links if self.reach is None else sorted(self.reach):
            rate = int(sim.links[host].rate_bps)
            registration = Registration(host, 0, "sim", (("eth0", rate),), "pack")
            self._sessions[host] = self.registry.register(registration, now=0.0).session
            self._seq[host] = 0
            self._reported[host] = ()
            self.followers[host] = PlanFollower(self.local())

    def evaluate(self, now: float, hosts: Collection[str]) -> None:
        sim = self.sim
        mine = {host for host in hosts if host in self.followers}
        reported = False
        for host in sorted(mine):  # (in name order: reports, and bands set, whatever the hash)
            jobs = sim.host_jobs(host)
            came_or_went = jobs != {job.job for job in self._reported[host]}
            # The agent's link looks for news every report interval, on its own clock: on
            # a grid (a phase set by this host's evaluations would differ with how often
            # it is evaluated, and a job skipping its iterations is evaluated only where its
            # measurements change).
            look = self._next_look.get(host, 0.0)
            if came_or_went or now >= look - ROUNDING_S:
                grid = self.report_interval_s
                self._next_look[host] = (math.floor(now / grid + ROUNDING_S) + 1) * grid
                news = self._news(sim, host, came_or_went)
                if news is not None:
                    self._report(host, now, news)
                    reported = True
            elif self._look_wake.get(host) != look and self._news(sim, host, False) is not None:
                # News the next look sends, whatever happens until then.
                self._look_wake[host] = look
                sim.wake(host, look)
        offered = self._replan(now) if reported else set()
        for host in sorted(mine | offered):
            if host not in offered and self._renew_at.get(host, math.inf) <= now:
                self._offer(host, now)
            follower = self.followers[host]
            jobs = sim.host_jobs(host)
            plan = follower.evaluate(now, jobs, *sim.observed(host))
            sim.set_bands(host, plan.bands)
            # Scanned as the agent is: its starvation guard watches the clock, under a plan
            # too (its promotions are reported).
            wake_agent(sim, host, now, plan.next_change_at, len(jobs), scan=True)
            renew = self._renew_at.get(host)
            if renew is not None and len(jobs) >= 2:
                sim.wake(host, renew)

    def _news(
        self, sim: Simulation, host: str, came_or_went: bool
    ) -> tuple[ReportedJob, ...] | None:
        """What `host` would report now, if it is news."""
        follower = self.followers[host]
        demands = follower.trusted_demands(sim.loads(host))
        starving, waiting = follower.starving(), follower.waits_for_siblings()
        remaining = follower.remaining()
        jobs = []
        for name in sorted(sim.host_jobs(host)):
            periods = [m.period_s for m in sim.measured[host][name].recent]
            jobs.append(
                ReportedJob(
                    name, frozenset(), 1, sim.jobs[name].workers,
                    period_s=statistics.median(periods) if periods else None,
                    demand=demands.get(name), lag_s=starving.get(name),
                    waits_for_siblings=name in waiting, remaining_s=remaining.get(name),
                )
            )  # fmt: skip
        if not came_or_went and not jobs_moved(self._reported[host], jobs):
            return None
        return tuple(jobs)

    def _report(self, host: str, now: float, jobs: tuple[ReportedJob, ...]) -> None:
        self._seq[host] += 1
        mode = Mode.PLAN if self.followers[host].following(now) else Mode.LOCAL
        report = HostReport(self._sessions[host], self._seq[host], jobs, (), mode, "")
        self.registry.report(report, now)
        self._reported[host] = jobs

    def _replan(self, now: float) -> set[str]:
        """Replan; offer the hosts whose plan changed, and return them."""
        began = time.perf_counter()
        changed = plan_update(self.registry, self.planner, now)
        self.replan_s.append(time.perf_counter() - began)
        for host in changed:
            self._offer(host, now)
        return changed

    def _offer(self, host: str, now: float) -> None:
        # The simulated clock is the controller's wall clock and every agent's monotonic one.
        schedule = HostSchedule.from_plan(self.planner.plan_for(host), now, now)
        self.followers[host].offer(schedule)
        self._renew_at[host] = now + self.lease_s / 3


class PrototypeRR(DriverBase):
    def __init__(
        self,
        members: Mapping[str, list[str]] | None,
        period_s: float,
        phases: Mapping[str, float] | None = None,
    ) -> None:
        """`members`: per host, the jobs placed there in arrival order (finished ones keep
        their turn: the prototype's tree is built from its launcher's job list, as the
        benchmark runs it); None: the jobs present on each host, in arrival order (a
        launcher that lists the jobs running when it rebuilds: a cluster's day of jobs)."""
        self.members = None if members is None else {h: list(j) for h, j in members.items()}
        self.period_s = period_s
        self.phases = dict(phases or {})
        self._green: dict[str, int] = {}
        self._rebuilt: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        """Per host, the jobs its light moved among at its last evaluation."""

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        for host in self.members or ():
            sim.wake(host, 0.0)

    def evaluate(self, now: float, hosts: Collection[str]) -> None:
        sim = self.sim
        for host in hosts:
            if self.members is None:
                jobs = sorted(sim.host_jobs(host), key=lambda j: (sim.jobs[j].arrival_s, j))
            else:
                jobs = self.members.get(host, [])
            if not jobs:
                continue
            rebuilt = self._rebuilt.get(host, self.phases.get(host, 0.0))
            # (A rebuild due now counts even a rounding short of it: woken at rebuilt +
            # period, now - rebuilt can come out a hair under period, and it woke again.)
            turns = max(0, math.floor((now - rebuilt) / self.period_s + 1e-9))
            self._rebuilt[host] = rebuilt = rebuilt + turns * self.period_s
            # Each rebuild moves the light among the jobs present then: those before now
            # among the jobs of the last evaluation (membership changes are evaluated at
            # once), one due now among today's. Taken mod today's count instead, a host
            # left unevaluated while one job ran alone (fast-forward) lit another job than
            # one evaluated at every push.
            at_now = turns > 0 and now - rebuilt < 1e-9 * self.period_s
            before = turns - at_now
            green = (self._green.get(host, 0) + before) % self._counts.get(host, len(jobs))
            self._green[host] = (green + at_now) % len(jobs)
            self._counts[host] = len(jobs)
            prios = original_prios(len(jobs), self._green[host])
            sim.set_bands(host, dict(zip(jobs, prios, strict=True)))
            if self.members is not None or len(jobs) >= 2:
                sim.wake(host, rebuilt + self.period_s)
