"""The agent's Prometheus metrics, on a registry the composition root passes in.

Labels are bounded: `job` only for jobs present now (a finished job's series are removed),
no pid or port labels, no command lines.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from tensorlights.agent.reconcile import PassResult
from tensorlights.model import DiscoverySnapshot
from tensorlights.policy.bands import PackView
from tensorlights.policy.packing import HORIZON_WINDOWS
from tensorlights.policy.tc_plan import FIRST_BAND_MINOR, UNMANAGED_MINOR
from tensorlights.telemetry.straggler import Iteration

JOB_LABEL = "training_job"
"""The label naming a training job. Not `job`: Prometheus sets `job` to the scrape job and
renames a scraped `job` label to `exported_job` (seen with a real Prometheus)."""

_FAST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class AgentMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.reconcile_duration = Histogram(
            "tensorlights_reconcile_duration_seconds",
            "Time of one reconcile pass: discovery scan, policy, datapath diff and apply.",
            buckets=_FAST_BUCKETS,
            registry=registry,
        )
        self.scan_duration = Histogram(
            "tensorlights_discovery_scan_duration_seconds",
            "Time of one discovery scan.",
            buckets=_FAST_BUCKETS,
            registry=registry,
        )
        self.last_success = Gauge(
            "tensorlights_last_successful_reconcile_timestamp_seconds",
            "Unix time of the last reconcile pass that succeeded.",
            registry=registry,
        )
        self.errors = Counter(
            "tensorlights_reconcile_errors_total",
            "Reconcile passes that failed, by error type.",
            ["kind"],
            registry=registry,
        )
        self.rotations = Counter(
            "tensorlights_rotations_total",
            "Times the green light moved to another job.",
            registry=registry,
        )
        self.kernel_ops = Counter(
            "tensorlights_datapath_operations_total",
            "tc objects created, changed or deleted.",
            registry=registry,
        )
        self.jobs = Gauge(
            "tensorlights_jobs", "PS jobs shaped on this host now.", registry=registry
        )
        self.ps_processes = Gauge(
            "tensorlights_ps_processes",
            "PSes and ranks of collective jobs found on this host now.",
            registry=registry,
        )
        self.job_kind = Gauge(
            "tensorlights_job_kind",
            "1 per job found on this host, labelled with its kind: ps (parameter servers push "
            "to workers) or collective (all-reduce among ranks).",
            [JOB_LABEL, "kind"],
            registry=registry,
        )
        self.job_unshapeable = Gauge(
            "tensorlights_job_unshapeable",
            "1 per job found on this host whose packets bypass the kernel (NCCL over "
            "InfiniBand/RoCE): it has no band; status and discover say why.",
            [JOB_LABEL],
            registry=registry,
        )
        self.problems = Gauge(
            "tensorlights_discovery_problems",
            "Processes that look like training jobs but could not be identified.",
            registry=registry,
        )
        self.untrusted = Gauge(
            "tensorlights_untrusted_processes",
            "Processes claiming a job that the trust setting does not believe (kept unmanaged).",
            registry=registry,
        )
        self.green_seconds = Counter(
            "tensorlights_green_seconds_total",
            "Time each job held the green light on this host.",
            [JOB_LABEL],
            registry=registry,
        )
        self.job_band = Gauge(
            "tensorlights_job_band",
            "Band of each job now (0 = green).",
            [JOB_LABEL],
            registry=registry,
        )
        self.controller_connected = Gauge(
            "tensorlights_controller_connected",
            "1 while connected to the controller; 0 standalone or disconnected.",
            registry=registry,
        )
        self.controller_configured = Gauge(
            "tensorlights_controller_configured",
            "1 when the agent follows a controller (standalone = false); 0 standalone.",
            registry=registry,
        )
        self.job_lag = Gauge(
            "tensorlights_job_lag_seconds",
            "Policy pack: time each job lost to waiting over its life so far (at least the "
            f"starvation window, at most {HORIZON_WINDOWS} of them).",
            [JOB_LABEL],
            registry=registry,
        )
        self.job_lag_allowed = Gauge(
            "tensorlights_job_lag_allowed_seconds",
            "Policy pack: the lag past which the job is slowed more than max_slowdown over "
            "that span.",
            [JOB_LABEL],
            registry=registry,
        )
        self.process_events = Gauge(
            "tensorlights_discovery_process_events",
            "1 when new processes are learned from the kernel's process events; 0 when "
            "discovery lists /proc (the status says why).",
            registry=registry,
        )
        self.events_lost = Counter(
            "tensorlights_discovery_events_lost",
            "Times the kernel dropped process events (each made discovery list /proc).",
            registry=registry,
        )
        self.hw_tc_offload = Gauge(
            "tensorlights_interface_hw_tc_offload",
            "The interface's hw-tc-offload feature: 0 not offered (or no answer), 1 offered "
            "and off, 2 on.",
            registry=registry,
        )
        self.datapath_offloaded = Gauge(
            "tensorlights_datapath_offloaded",
            "1 when the HTB tree runs on the NIC; 0 in the kernel's software HTB (always, "
            "today: docs/design.md says why).",
            registry=registry,
        )
        self.datapath_offloaded.set(0)
        self.dscp_enabled = Gauge(
            "tensorlights_dscp_marking_enabled",
            "1 when PS packets are DSCP-marked with their band; 0 when marking is off.",
            registry=registry,
        )
        self.spread = Histogram(
            "tensorlights_straggler_spread_seconds",
            "Per iteration: last worker's parameters fully acknowledged - first worker's.",
            [JOB_LABEL],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=registry,
        )
        self.iteration = Histogram(
            "tensorlights_iteration_seconds",
            "Time between the ends of consecutive parameter pushes of a job.",
            [JOB_LABEL],
            buckets=(0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
            registry=registry,
        )
        self.push = Histogram(
            "tensorlights_push_seconds",
            "Estimated communication time of one parameter push to all workers.",
            [JOB_LABEL],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=registry,
        )
        self._jobs_with_series: set[str] = set()
        self._job_kinds: dict[str, str] = {}
        self._unshapeable: set[str] = set()
        self._jobs_with_lag: set[str] = set()
        self._telemetry_jobs: set[str] = set()
        self._telemetry_lock = threading.Lock()  # the telemetry thread observes, the loop prunes

    def forget_jobs_except(self, present: set[str]) -> None:
        """Drop the telemetry series of jobs that are gone (bounded labels)."""
        with self._telemetry_lock:
            for job in self._telemetry_jobs - present:
                for per_job in (self.spread, self.iteration, self.push):
                    with contextlib.suppress(KeyError):
                        per_job.remove(job)
            self._telemetry_jobs &= present

    def observe_iteration(self, iteration: Iteration) -> None:
        with self._telemetry_lock:
            self._telemetry_jobs.add(iteration.job)
            if iteration.connections > 1:
                self.spread.labels(iteration.job).observe(iteration.spread)
            if iteration.period is not None:  # the first measured has none
                self.iteration.labels(iteration.job).observe(iteration.period)
            self.push.labels(iteration.job).observe(iteration.push_seconds)

    def observe_pass(
        self, previous: PassResult | None, result: PassResult, wall_now: float
    ) -> None:
        """A successful pass: its cost, what it found, the bands and who was green since the
        previous pass."""
        self.last_success.set(wall_now)
        self.scan_duration.observe(result.scan_s)
        self.kernel_ops.inc(result.kernel_ops)
        self.ps_processes.set(len(result.snapshot.tasks))
        self.problems.set(len(result.snapshot.problems))
        self.untrusted.set(len(result.snapshot.untrusted))
        self.process_events.set(1 if result.snapshot.process_events else 0)
        offload = result.offload
        self.hw_tc_offload.set(
            0 if offload is None else 2 if offload.enabled else int(offload.offered)
        )
        lost_before = previous.snapshot.events_lost if previous is not None else 0
        self.events_lost.inc(max(0, result.snapshot.events_lost - lost_before))
        green_before, green_for = None, 0.0
        if previous is not None and previous.plan.green is not None:
            green_before, green_for = previous.plan.green, result.at - previous.at
        self.observe_bands(result.plan.bands, green_before, green_for)
        if result.plan.rotated and result.plan.green is not None:
            self.rotations.inc()
        self.forget_jobs_except(set(result.snapshot.jobs()))
        self.observe_kinds(result.snapshot)
        self.observe_lags(result.pack)

    def observe_kinds(self, snapshot: DiscoverySnapshot) -> None:
        kinds = {job: kind.value for job, kind in snapshot.job_kinds().items()}
        for job, kind in self._job_kinds.items():
            if kinds.get(job) != kind:
                self.job_kind.remove(job, kind)
        for job, kind in kinds.items():
            self.job_kind.labels(job, kind).set(1)
        self._job_kinds = kinds
        unshapeable = set(snapshot.unshapeable)
        for job in self._unshapeable - unshapeable:
            self.job_unshapeable.remove(job)
        for job in unshapeable:
            self.job_unshapeable.labels(job).set(1)
        self._unshapeable = unshapeable

    def observe_lags(self, pack: PackView | None) -> None:
        """pack's guard: every job's lag and its allowance (no series under other policies)."""
        lags = pack.lag_s if pack is not None else {}
        allowed = pack.lag_allowed_s if pack is not None else {}
        for job in self._jobs_with_lag - lags.keys():
            self.job_lag.remove(job)
            self.job_lag_allowed.remove(job)
        for job, lag in lags.items():
            self.job_lag.labels(job).set(lag)
            self.job_lag_allowed.labels(job).set(allowed[job])
        self._jobs_with_lag = set(lags)

    def observe_failure(self, kind: str) -> None:
        self.errors.labels(kind).inc()

    def observe_bands(self, bands: dict[str, int], green: str | None, green_for_s: float) -> None:
        for job in self._jobs_with_series - bands.keys():
            self.green_seconds.remove(job)
            self.job_band.remove(job)
        for job, band in bands.items():
            self.job_band.labels(job).set(band)
            self.green_seconds.labels(job)  # the series exists from the job's first pass
        # A job that ended while green has no series left to count into (bounded labels).
        if green is not None and green_for_s > 0 and green in bands:
            self.green_seconds.labels(green).inc(green_for_s)
        self._jobs_with_series = set(bands)
        self.jobs.set(len(bands))


class KernelCounters(Collector):
    """Counters the kernel keeps, read at scrape time: tc class bytes/packets/drops per band,
    and what each job's PS connections sent (tcp_info): jobs share band classes, so per-job
    counters come from their sockets."""

    def __init__(
        self,
        class_counters: Callable[[], dict[int, tuple[int, int, int]]],
        job_counters: Callable[[], dict[str, tuple[int, int]]],
    ) -> None:
        self._class_counters = class_counters
        self._job_counters = job_counters

    def collect(self) -> Iterator[CounterMetricFamily]:
        names = ("bytes", "packets", "drops")
        families = [
            CounterMetricFamily(
                f"tensorlights_band_{name}",
                f"{name.capitalize()} through each band's HTB class (band 0 = green).",
                labels=["band"],
            )
            for name in names
        ]
        try:
            counters = self._class_counters()
        except Exception:  # interface gone or being recreated: omit, the scrape still works
            counters = {}
        for minor, values in sorted(counters.items()):
            if minor == UNMANAGED_MINOR:
                band = "unmanaged"
            elif FIRST_BAND_MINOR <= minor < FIRST_BAND_MINOR + 7:
                band = str(minor - FIRST_BAND_MINOR)
            else:
                continue
            for family, value in zip(families, values, strict=True):
                family.add_metric([band], value)
        yield from families
        sent = CounterMetricFamily(
            "tensorlights_job_sent_bytes",
            "Bytes the job's PS connections on this host had acknowledged (tcp_info).",
            labels=[JOB_LABEL],
        )
        packets = CounterMetricFamily(
            "tensorlights_job_sent_packets",
            "Data segments the job's PS connections on this host sent (tcp_info).",
            labels=[JOB_LABEL],
        )
        for job, (sent_bytes, sent_packets) in sorted(self._job_counters().items()):
            sent.add_metric([job], sent_bytes)
            packets.add_metric([job], sent_packets)
        yield sent
        yield packets
