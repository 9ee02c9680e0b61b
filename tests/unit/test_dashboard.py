"""The Grafana dashboard is valid dashboard JSON and queries only metrics the agent exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from tensorlights.agent.metrics import AgentMetrics, KernelCounters

DASHBOARD = Path(__file__).parents[2] / "dashboards" / "tensorlights-host.json"


def exported_names() -> set[str]:
    registry = CollectorRegistry()
    AgentMetrics(registry)
    registry.register(KernelCounters(lambda: {0x10: (1, 1, 0)}, lambda: {"job": (1, 1)}))
    names = set()
    for family in registry.collect():
        for sample in family.samples:
            names.add(sample.name)
        names.add(family.name)
    # Histograms export _bucket/_count/_sum once observed; counters _total.
    for family in registry.collect():
        if family.type == "histogram":
            names |= {f"{family.name}_bucket", f"{family.name}_count", f"{family.name}_sum"}
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def test_dashboard_is_grafana_json_with_unique_panels_and_targets() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    panels = dashboard["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels) >= 5
    for panel in panels:
        assert {"type", "title", "gridPos", "targets"} <= panel.keys()
        assert panel["targets"] and all(target["expr"] for target in panel["targets"])
    variables = {item["name"] for item in dashboard["templating"]["list"]}
    assert {"datasource", "instance"} <= variables


def test_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    used = set()
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            used |= set(re.findall(r"\b(tensorlights_[a-z_]+)", target["expr"]))
    for item in dashboard["templating"]["list"]:
        used |= set(re.findall(r"\b(tensorlights_[a-z_]+)", str(item.get("query", ""))))
    assert used and used <= exported, used - exported
