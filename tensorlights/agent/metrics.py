"""The agent's Prometheus metrics, on a registry the composition root passes in.

Labels are bounded: `job` only for jobs present now (a finished job's series are removed),
no pid or port labels, no command lines.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
            "tensorlights_ps_processes", "PS processes found on this host now.", registry=registry
        )
        self.problems = Gauge(
            "tensorlights_discovery_problems",
            "Processes that look like training jobs but could not be identified.",
            registry=registry,
        )
        self.green_seconds = Counter(
            "tensorlights_green_seconds_total",
            "Time each job held the green light on this host.",
            ["job"],
            registry=registry,
        )
        self.job_band = Gauge(
            "tensorlights_job_band", "Band of each job now (0 = green).", ["job"], registry=registry
        )
        self.controller_connected = Gauge(
            "tensorlights_controller_connected",
            "1 while connected to the controller; 0 standalone or disconnected.",
            registry=registry,
        )
        self.dscp_enabled = Gauge(
            "tensorlights_dscp_marking_enabled",
            "1 when PS packets are DSCP-marked with their band; 0 when marking is off.",
            registry=registry,
        )
        self._jobs_with_series: set[str] = set()

    def observe_bands(self, bands: dict[str, int], green: str | None, green_for_s: float) -> None:
        for job in self._jobs_with_series - bands.keys():
            self.green_seconds.remove(job)
            self.job_band.remove(job)
        for job, band in bands.items():
            self.job_band.labels(job).set(band)
            self.green_seconds.labels(job)  # the series exists from the job's first pass
        if green is not None and green_for_s > 0:
            self.green_seconds.labels(green).inc(green_for_s)
        self._jobs_with_series = set(bands)
        self.jobs.set(len(bands))
