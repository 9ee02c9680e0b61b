"""One reconcile pass: discovery -> policy -> desired datapath -> minimal kernel change.

Level-triggered: the desired state is rebuilt from scratch every pass. Between full resyncs a
pass that changes only bands goes through the datapath's rotation fast path (one batch); a
pass that changes nothing touches nothing; every `resync_interval` (and after any error) the
kernel state is read back and diffed, which repairs out-of-band changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from tensorlights.agent.config import AgentConfig
from tensorlights.datapath.dscp import DscpMarker
from tensorlights.datapath.htb import HtbDatapath, PlannedChange
from tensorlights.discovery.scanner import Scanner
from tensorlights.model import DatapathSpec, DiscoverySnapshot, JobShaping
from tensorlights.policy.bands import BandPlan, BandPolicy, PolicyName
from tensorlights.policy.dscp_plan import desired_dscp
from tensorlights.policy.packing import JobLoad
from tensorlights.policy.schedule import PlanFollower


@dataclass(frozen=True)
class PassResult:
    at: float
    """Monotonic time at the start of the pass."""
    snapshot: DiscoverySnapshot
    plan: BandPlan
    spec: DatapathSpec | None
    """None under fifo (nothing programmed)."""
    kernel_ops: int
    full_resync: bool
    scan_s: float
    duration_s: float
    loads: Mapping[str, JobLoad] = field(default_factory=dict)
    """What telemetry measured per job at this pass (pack's input, the reported demand)."""


def desired_spec(
    config: AgentConfig, snapshot: DiscoverySnapshot, plan: BandPlan
) -> DatapathSpec | None:
    """The datapath for this plan (pure); None when the policy programs nothing (fifo).
    With no jobs it is the qdisc alone, so that the last job's filters go when it does."""
    if config.policy is PolicyName.FIFO and plan.generation == 0:
        return None  # fifo and no controller plan to follow
    ports = snapshot.job_ports()
    assert config.link_rate_bps is not None
    return DatapathSpec(
        interface=config.interface,
        link_rate_bps=config.link_rate_bps,
        jobs=tuple(JobShaping(job, plan.bands[job], ports[job]) for job in plan.order),
        unmanaged_share=config.unmanaged_share,
    )


def shaped_jobs(snapshot: DiscoverySnapshot) -> set[str]:
    """Jobs with at least one port the interface's filters can match."""
    return {job for job, ports in snapshot.job_ports().items() if ports}


def _policy_settings(config: AgentConfig) -> tuple[object, ...]:
    return (config.policy, config.interval_s, config.max_slowdown, config.starvation_window_s)


def local_policy(config: AgentConfig) -> BandPolicy:
    """The host's own policy, as configured (fresh state)."""
    return BandPolicy(
        config.policy,
        config.interval_s,
        max_slowdown=config.max_slowdown,
        starvation_window_s=config.starvation_window_s,
    )


class Reconciler:
    def __init__(
        self,
        config: AgentConfig,
        scanner: Scanner,
        datapath: HtbDatapath,
        clock: Callable[[], float] = time.monotonic,
        marker: DscpMarker | None = None,
    ) -> None:
        self.config = config
        self.scanner = scanner
        self.datapath = datapath
        self.marker = marker
        """DSCP marks in nftables, updated in the same pass as the tc bands (None: off)."""
        self.policy = PlanFollower(local_policy(config))
        """The controller's plan while its lease runs, else the configured local policy."""
        self._clock = clock
        self._written: DatapathSpec | None = None
        self._next_resync = float("-inf")
        self._fifo_cleared = False
        self._scanned: tuple[float, DiscoverySnapshot] | None = None
        self.loads: Callable[[], Mapping[str, JobLoad]] = dict
        """What telemetry measures per job now (the `pack` policy's input)."""

    def reconfigure(self, config: AgentConfig) -> None:
        """A reloaded config: keeps the arrival order when the policy stays the same."""
        if _policy_settings(config) != _policy_settings(self.config):
            self.policy.local = local_policy(config)
        if config.discovery != self.config.discovery:
            self.scanner.set_rules(config.discovery)
        if config.interface != self.config.interface:
            self.datapath.cleanup(self.config.interface)
        if self.marker is not None and not config.dscp_enabled:
            self.marker.cleanup()
            self.marker = None
        self.config = config
        self.force_resync()

    def force_resync(self) -> None:
        """Read the kernel back at the next pass (after errors, reloads, link changes)."""
        self._written = None
        self._scanned = None
        self._next_resync = float("-inf")

    def run_pass(self) -> PassResult:
        now = self._clock()
        # A pass woken early for the light's slot boundary reuses a fresh enough scan.
        if self._scanned is not None and now - self._scanned[0] < self.config.scan_interval_s / 2:
            snapshot = self._scanned[1]
        else:
            snapshot = self.scanner.scan()
            self._scanned = (now, snapshot)
        scanned = self._clock()
        loads = self.loads()
        plan = self.policy.evaluate(now, shaped_jobs(snapshot), loads)
        spec = desired_spec(self.config, snapshot, plan)
        ops, full = 0, False
        if spec is None:
            if not self._fifo_cleared:
                self.datapath.cleanup(self.config.interface)  # observe only: no shaping left
                if self.marker is not None:
                    self.marker.cleanup()
                self._fifo_cleared = True
            self._written = None
        else:
            self._fifo_cleared = False
            full = now >= self._next_resync or self._written is None
            if full:
                applied = self.datapath.apply(spec)
                ops = len(applied.ops)
                if self.marker is not None:
                    layout = desired_dscp(spec, applied.job_table, self.config.dscp_bands)
                    ops += self.marker.apply(layout)
                self._next_resync = now + self.config.resync_interval_s
            elif spec != self._written:
                # tc first, then the marks, back to back: a job's packets carry the DSCP of
                # another band than the one they queue in only between these two calls.
                rotated = self.datapath.rotate(spec)
                ops = len(rotated.ops)
                if self.marker is not None:
                    layout = desired_dscp(spec, rotated.job_table, self.config.dscp_bands)
                    ops += self.marker.rotate(layout)
            self._written = spec
        return PassResult(
            at=now,
            snapshot=snapshot,
            plan=plan,
            spec=spec,
            kernel_ops=ops,
            full_resync=full,
            scan_s=scanned - now,
            duration_s=self._clock() - now,
            loads=loads,
        )

    def dry_run(self) -> tuple[BandPlan, DatapathSpec | None, PlannedChange | None]:
        """What the next pass would program, touching nothing."""
        snapshot = self.scanner.scan()
        plan = self.policy.evaluate(self._clock(), shaped_jobs(snapshot), self.loads())
        spec = desired_spec(self.config, snapshot, plan)
        return plan, spec, (self.datapath.plan(spec) if spec is not None else None)

    def stop(self, restore: bool) -> str | None:
        if not restore:
            return None
        outcome = self.datapath.cleanup(self.config.interface)
        if self.marker is not None and self.marker.cleanup():
            outcome += "; removed nftables table inet tensorlights"
        return outcome
