"""The controller's Prometheus metrics (on a registry passed in; no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.hosts = Gauge(
            "tensorlights_controller_hosts_connected",
            "Hosts whose agent holds a plan stream now",
            registry=registry,
        )
        self.jobs = Gauge(
            "tensorlights_controller_jobs", "Jobs with PS hosts in the schedule", registry=registry
        )
        self.slots = Gauge(
            "tensorlights_controller_cycle_slots", "Slots in the rotation cycle", registry=registry
        )
        self.generation = Gauge(
            "tensorlights_controller_plan_generation", "Current plan generation", registry=registry
        )
        self.plan_seconds = Histogram(
            "tensorlights_controller_plan_seconds",
            "Time to recompute the schedule and every host's plan",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
            registry=registry,
        )
        self.registrations = Counter(
            "tensorlights_controller_registrations", "Agent registrations", registry=registry
        )
        self.reports = Counter(
            "tensorlights_controller_reports", "Agent reports accepted", registry=registry
        )
        self.report_seconds = Histogram(
            "tensorlights_controller_report_seconds",
            "Time a report takes in its handler (parse, checks, registry, the reply)",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
            registry=registry,
        )
        self.plans_sent = Counter(
            "tensorlights_controller_plans_sent",
            "Plans sent on agents' plan streams: 'changed' (new or first), 'lease' (the same "
            "plan again: no report's reply renewed its lease)",
            ["why"],
            registry=registry,
        )
        self.rejected = Counter(
            "tensorlights_controller_rejected_requests",
            "Requests refused, by gRPC status",
            ["code"],
            registry=registry,
        )
        self.source_errors = Counter(
            "tensorlights_controller_source_errors",
            "Failed polls of a membership source",
            ["source"],
            registry=registry,
        )
        self.leader = Gauge(
            "tensorlights_controller_leader",
            "1 while this replica leads (plans, serves agents); 0 while it follows",
            registry=registry,
        )
        self.leader.set(1)
        self.terms = Counter(
            "tensorlights_controller_leader_terms",
            "Times this replica became leader (with etcd)",
            registry=registry,
        )
        self.source_success = Gauge(
            "tensorlights_controller_source_last_success_timestamp_seconds",
            "When a membership source last answered",
            ["source"],
            registry=registry,
        )
