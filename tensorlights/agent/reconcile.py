"""One reconcile pass: discovery -> policy -> desired datapath -> minimal kernel change.

Level-triggered: the desired state is rebuilt from scratch every pass. Between full resyncs a
pass that changes only bands goes through the dataplane's rotation fast path (one batch); a
pass that changes nothing touches nothing; every `resync_interval` (and after any error) the
kernel state is read back and diffed, which repairs out-of-band changes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from tensorlights.agent.config import AgentConfig
from tensorlights.datapath.dataplane import Dataplane
from tensorlights.datapath.htb import PlannedChange
from tensorlights.datapath.offload import HwTcOffload
from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.trust import JobVoucher
from tensorlights.model import DatapathSpec, DiscoverySnapshot, JobShaping
from tensorlights.policy.bands import BandPlan, BandPolicy, PackView, PolicyName
from tensorlights.policy.packing import JobLoad
from tensorlights.policy.schedule import HostSchedule, PlanFollower

Loads = Callable[[], Mapping[str, JobLoad]]
"""What telemetry measures per job now (the `pack` policy's input)."""
Started = Callable[[], Mapping[str, float] | None]
"""The jobs telemetry has seen push, each with when its first push began (the clock's
time); None: not known (telemetry off)."""


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
    """What telemetry measured per job at this pass (pack's input)."""
    demands: Mapping[str, float] = field(default_factory=dict)
    """The demands pack may order by (PlanFollower.trusted_demands): reported to the
    controller."""
    starving: Mapping[str, float] = field(default_factory=dict)
    """The jobs the starvation guard would promote, with their lag (PlanFollower.starving):
    reported to the controller."""
    waits_for_siblings: frozenset[str] = frozenset()
    """Of those, the jobs waiting in time for their siblings (PlanFollower.waits_for_siblings):
    reported to the controller."""
    pack: PackView | None = None
    """pack's starvation guard after this pass (None under other policies)."""
    vouchers: tuple[JobVoucher, ...] = ()
    """What the controller vouched for on this host when the pass ran."""
    pods: bool = False
    """Pod shaping was on: PS tasks in other network namespaces are this host's pods."""
    offload: HwTcOffload | None = None
    """The interface's hw-tc-offload feature, as read at the last full resync."""
    repaired: int = 0
    """Kernel writes that restored what the previous pass had written (run_pass(repair=True)):
    someone else's change undone. Part of kernel_ops."""
    written_at: float = 0.0
    """Monotonic time the pass's kernel writes were done: when a rotation took effect."""
    deferred: bool = False
    """The pass moved the light at its slot boundary before the scan or full resync that was
    due (run_pass): the loop runs the next pass at once to do them."""


def desired_spec(
    config: AgentConfig, snapshot: DiscoverySnapshot, plan: BandPlan
) -> DatapathSpec | None:
    """The datapath for this plan (pure); None when the policy programs nothing (fifo).
    With no jobs it is the qdisc alone, so that the last job's filters go when it does."""
    if config.policy is PolicyName.FIFO and plan.generation == 0:
        return None  # fifo and no controller plan to follow
    ports = snapshot.job_ports()
    pods = snapshot.job_pod_endpoints() if config.pod_shaping else {}
    assert config.link_rate_bps is not None
    return DatapathSpec(
        interface=config.interface,
        link_rate_bps=config.link_rate_bps,
        jobs=tuple(
            JobShaping(
                job,
                plan.bands[job],
                ports.get(job, frozenset()),
                pods.get(job, frozenset()),
            )
            for job in plan.order
        ),
        unmanaged_share=config.unmanaged_share,
        short_waiting_queues=config.pod_shaping,
    )


def shaped_jobs(snapshot: DiscoverySnapshot, pods: bool = False) -> set[str]:
    """Jobs with at least one port the interface's filters can match, or with `pods`, one
    pod endpoint this host forwards."""
    jobs = {job for job, ports in snapshot.job_ports().items() if ports}
    if pods:
        jobs |= {job for job, found in snapshot.job_pod_endpoints().items() if found}
    return jobs


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
        dataplane: Dataplane,
        clock: Callable[[], float] = time.monotonic,
        loads: Loads = dict,
        started: Started = lambda: None,
    ) -> None:
        self.config = config
        self._scanner = scanner
        self._dataplane = dataplane
        self._policy = PlanFollower(local_policy(config))
        """The controller's plan while its lease runs, else the configured local policy."""
        self._clock = clock
        self._loads = loads
        self._started = started
        self._written: DatapathSpec | None = None
        self._next_resync = float("-inf")
        self._fifo_cleared = False
        self._scanned: tuple[float, DiscoverySnapshot] | None = None
        self._light_due_at: float | None = None
        """The last plan's next slot boundary (monotonic), when the light moves."""
        self._deferred = False
        self._offload: HwTcOffload | None = None
        self._vouchers: tuple[JobVoucher, ...] = ()
        """The controller's word on the jobs here (discovery/trust.py); kept while it is away."""

    def rules(self, config: AgentConfig) -> DiscoveryRules:
        """What discovery works by: the config's rules and trust, with the vouchers."""
        rules = config.rules
        return replace(rules, trust=replace(rules.trust, vouchers=self._vouchers))

    def offer_vouchers(self, vouchers: tuple[JobVoucher, ...]) -> None:
        """New vouchers from the controller: every process is judged again at the next scan."""
        self._vouchers = vouchers
        self._scanner.set_rules(self.rules(self.config))
        self._scanned = None

    def offer_plan(self, plan: HostSchedule) -> bool:
        """A plan from the controller; False if it is older than the one followed (a replay)."""
        return self._policy.offer(plan)

    def renew_plan(self, version: tuple[int, int], lease_until: float) -> bool:
        """A report's reply renewed the plan of `version`; False if another is followed."""
        return self._policy.renew(version, lease_until)

    def reconfigure(self, config: AgentConfig) -> None:
        """A reloaded config: keeps the arrival order when the policy stays the same. Marking
        is the dataplane's (the app turns it on or off)."""
        if _policy_settings(config) != _policy_settings(self.config):
            self._policy.local = local_policy(config)
        if config.rules != self.config.rules:
            self._scanner.set_rules(self.rules(config))
        if config.interface != self.config.interface:
            self._dataplane.cleanup(self.config.interface)
        self.config = config
        self.force_resync()

    def discovery_polls(self) -> bool:
        """Whether the loop should ask `discovery_changed` every poll_interval between passes."""
        return self._scanner.polls()

    def discovery_changed(self) -> bool:
        """Cheap: discovery has news, so a pass now would scan (scanner.changed)."""
        return self._scanner.changed()

    def force_resync(self) -> None:
        """Read the kernel back at the next pass (after errors, reloads, link changes)."""
        self._written = None
        self._scanned = None
        self._next_resync = float("-inf")

    def run_pass(self, repair: bool = False) -> PassResult:
        """One pass. `repair`: the kernel told us something of ours changed; the datapath last
        written is read back and restored first, so that the writes this pass needs anyway
        (a job came or went, the light moved) are not taken for repairs, nor our own
        deletions' notifications for someone else's."""
        now = self._clock()
        # At the light's slot boundary the light moves first, on the last scan, unless
        # discovery has news: a scan (a socket dump, a sweep of /proc) or a full resync due
        # then would delay the switch on this host and skew it against the job's other hosts.
        # They follow in the next pass, at once; never two passes running.
        cached, half_scan_s = self._scanned, self.config.scan_interval_s / 2
        light_first = (
            not self._deferred
            and self._light_due_at is not None
            and now >= self._light_due_at
            and self._written is not None
        )
        # Otherwise a pass woken early for the boundary reuses a fresh enough scan.
        if (
            cached is not None
            and (light_first or now - cached[0] < half_scan_s)
            and not self._scanner.changed()
        ):
            snapshot = cached[1]
            deferred = now - cached[0] >= half_scan_s
        else:
            snapshot = self._scanner.scan()
            self._scanned = (now, snapshot)
            deferred = False
        scanned = self._clock()
        loads = self._loads()
        plan = self._policy.evaluate(
            now,
            shaped_jobs(snapshot, self.config.pod_shaping),
            loads,
            self._started(),
            snapshot.collective_jobs,
            snapshot.declared_iterations,
        )
        spec = desired_spec(self.config, snapshot, plan)
        ops, full, repaired, read_back = 0, False, 0, False
        if spec is None:
            if not self._fifo_cleared:
                self._dataplane.cleanup(self.config.interface)  # observe only: no shaping left
                self._fifo_cleared = True
            self._written = None
        else:
            self._fifo_cleared = False
            if repair and self._written is not None:
                read_back = True
                repaired = self._resync(self._written, now)
            switch_first = light_first and spec != self._written
            full = self._written is None or (now >= self._next_resync and not switch_first)
            deferred = deferred or (now >= self._next_resync and not full)
            if full:
                ops = self._resync(spec, now)
            elif spec != self._written:
                ops = self._dataplane.rotate(spec)
            self._written = spec
        written = self._clock()
        self._light_due_at = plan.next_change_at
        self._deferred = deferred
        return PassResult(
            at=now,
            snapshot=snapshot,
            plan=plan,
            spec=spec,
            kernel_ops=ops + repaired,
            full_resync=full or read_back,
            scan_s=scanned - now,
            duration_s=self._clock() - now,
            loads=loads,
            demands=self._policy.trusted_demands(loads),
            starving=self._policy.starving(),
            waits_for_siblings=self._policy.waits_for_siblings(),
            pack=self._policy.local.pack_view() if self.config.policy is PolicyName.PACK else None,
            vouchers=self._vouchers,
            pods=self.config.pod_shaping,
            offload=self._offload,
            repaired=repaired,
            written_at=written,
            deferred=deferred,
        )

    def _resync(self, spec: DatapathSpec, now: float) -> int:
        """Read the kernel back and make it `spec`; kernel writes made."""
        ops = self._dataplane.apply(spec)
        self._next_resync = now + self.config.resync_interval_s
        self._offload = self._dataplane.hw_offload(self.config.interface)
        return ops

    def dry_run(self) -> tuple[BandPlan, DatapathSpec | None, PlannedChange | None]:
        """What the next pass would program, touching nothing."""
        snapshot = self._scanner.scan()
        shaped = shaped_jobs(snapshot, self.config.pod_shaping)
        plan = self._policy.evaluate(
            self._clock(), shaped, self._loads(), self._started(), snapshot.collective_jobs,
            snapshot.declared_iterations,
        )  # fmt: skip
        spec = desired_spec(self.config, snapshot, plan)
        return plan, spec, (self._dataplane.plan(spec) if spec is not None else None)

    def stop(self, restore: bool) -> str | None:
        """Restore the interface (and remove our marks) or leave both for the next start."""
        return self._dataplane.cleanup(self.config.interface) if restore else None
