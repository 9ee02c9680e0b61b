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
import statistics
import time
from collections.abc import Callable, Mapping

from tensorlights.agent.config import AgentConfig
from tensorlights.bench.legacy_tc import original_prios
from tensorlights.controller.config import ControllerConfig
from tensorlights.controller.planner import ClusterPolicy, Planner
from tensorlights.controller.registry import Registry
from tensorlights.model import HostReport, Mode, Registration, ReportedJob
from tensorlights.policy.bands import BandPolicy, PolicyName
from tensorlights.policy.schedule import HostSchedule, PlanFollower
from tensorlights.sim.engine import Simulation

TICK_S = 0.1
"""How often a host's agent evaluates its policy between arrivals and departures (the real
agent wakes on its telemetry's iterations and discovery's events: well under this)."""


def _defaults(config: type) -> dict[str, object]:
    """A config dataclass's defaults: the daemons' settings, defined once, there."""
    return {f.name: f.default for f in dataclasses.fields(config)}


AGENT_DEFAULTS = _defaults(AgentConfig)
CONTROLLER_DEFAULTS = _defaults(ControllerConfig)


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
    """What every driver shares: the simulation it is attached to, no ticks unless it sets
    them, and pushes never held (all but the time-shifting baseline)."""

    tick_s: float | None = None
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
    def evaluate(self, now: float) -> None:
        pass


class HostPolicies(DriverBase):
    """Every host its own policy, each starting at its phase (before it: no bands)."""

    def __init__(
        self,
        make: Callable[[], BandPolicy],
        phases: Mapping[str, float] | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        self.make = make
        self.phases = dict(phases or {})
        self.tick_s = tick_s
        self.policies: dict[str, BandPolicy] = {}

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        self.policies = {host: self.make() for host in sim.links}

    def evaluate(self, now: float) -> None:
        sim = self.sim
        for host, policy in self.policies.items():
            if now < self.phases.get(host, 0.0):
                continue
            plan = policy.evaluate(now, sim.host_jobs(host), sim.loads(host), sim.started(host))
            sim.set_bands(host, plan.bands)


class Coordinated(DriverBase):
    """Agents following the controller: each reports every `report_interval_s` (and at once
    when its jobs change, as the agent does), the controller replans on each round and
    every host is sent its plan (renewing its lease)."""

    def __init__(
        self,
        policy: ClusterPolicy | str,
        local: Callable[[], BandPolicy],
        slot_s: float | None = None,
        tick_s: float = TICK_S,
    ) -> None:
        self.policy = ClusterPolicy(policy)
        self.local = local
        slot = slot_s if slot_s is not None else CONTROLLER_DEFAULTS["slot_s"]
        lease = CONTROLLER_DEFAULTS["lease_s"]
        report = CONTROLLER_DEFAULTS["report_interval_s"]
        assert isinstance(slot, float) and isinstance(lease, float)
        assert isinstance(report, float)
        self.slot_s, self.lease_s, self.report_interval_s = slot, lease, report
        self.tick_s = tick_s
        self.registry = Registry()
        self.planner = Planner(self.slot_s, self.lease_s, incarnation=1, policy=self.policy)
        self.followers: dict[str, PlanFollower] = {}
        self.replan_s: list[float] = []
        """Wall seconds of each planner update (its real cost, for the report)."""
        self._sessions: dict[str, str] = {}
        self._seq: dict[str, int] = {}
        self._reported: dict[str, set[str]] = {}
        self._next_report = 0.0

    def attach(self, sim: Simulation) -> None:
        super().attach(sim)
        for host, link in sim.links.items():
            registration = Registration(host, 0, "sim", (("eth0", int(link.rate_bps)),), "pack")
            self._sessions[host] = self.registry.register(registration, now=0.0).session
            self._seq[host] = 0
            self.followers[host] = PlanFollower(self.local())

    def evaluate(self, now: float) -> None:
        sim = self.sim
        changed = any(sim.host_jobs(h) != self._reported.get(h) for h in self.followers)
        if now >= self._next_report or changed:
            self._round(sim, now)
            self._next_report = now + self.report_interval_s
        for host, follower in self.followers.items():
            plan = follower.evaluate(now, sim.host_jobs(host), sim.loads(host), sim.started(host))
            sim.set_bands(host, plan.bands)

    def _round(self, sim: Simulation, now: float) -> None:
        for host, follower in self.followers.items():
            loads = sim.loads(host)
            demands = follower.trusted_demands(loads)
            jobs = []
            for name in sorted(sim.host_jobs(host)):
                periods = [m.period_s for m in sim.measured[host][name].recent]
                jobs.append(
                    ReportedJob(
                        name, frozenset(), 1, sim.jobs[name].workers,
                        period_s=statistics.median(periods) if periods else None,
                        demand=demands.get(name),
                    )
                )  # fmt: skip
            self._seq[host] += 1
            mode = Mode.PLAN if follower.following(now) else Mode.LOCAL
            report = HostReport(self._sessions[host], self._seq[host], tuple(jobs), (), mode, "")
            self.registry.report(report, now)
            self._reported[host] = sim.host_jobs(host)
        began = time.perf_counter()
        self.planner.update(
            self.registry.membership(), set(self.registry.hosts), self.registry.demands(),
            self.registry.arrival_order(), self.registry.end_times(), self.registry.iterative(),
        )  # fmt: skip
        self.replan_s.append(time.perf_counter() - began)
        for host, follower in self.followers.items():
            # The simulated clock is the controller's wall clock and every agent's monotonic
            # one alike.
            follower.offer(HostSchedule.from_plan(self.planner.plan_for(host), now, now))


class PrototypeRR(DriverBase):
    def __init__(
        self,
        members: Mapping[str, list[str]],
        period_s: float,
        phases: Mapping[str, float] | None = None,
    ) -> None:
        """`members`: per host, the jobs placed there in arrival order (finished ones keep
        their turn: the prototype's tree is built from its launcher's job list)."""
        self.members = {host: list(jobs) for host, jobs in members.items()}
        self.period_s = period_s
        self.phases = dict(phases or {})
        self.tick_s = TICK_S
        self._green = {host: 0 for host in self.members}
        self._rebuilt = {host: self.phases.get(host, 0.0) for host in self.members}

    def evaluate(self, now: float) -> None:
        sim = self.sim
        for host, jobs in self.members.items():
            if not jobs:
                continue
            while now - self._rebuilt[host] >= self.period_s:
                self._green[host] = (self._green[host] + 1) % len(jobs)
                self._rebuilt[host] += self.period_s
            prios = original_prios(len(jobs), self._green[host])
            sim.set_bands(host, dict(zip(jobs, prios, strict=True)))
