"""A real Prometheus (the distribution's package, as a plain process) scrapes a running agent
and controller with the shipped scrape settings and rules: the series arrive with the labels
the docs and the dashboard use, no label of ours collides with Prometheus's own, and the
alerting rules load and evaluate against the live series."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from tensorlights.testbed import netns
from tensorlights.testbed.prometheus import prometheus_server
from tensorlights.testbed.socket_holder import start_holder

from .agentproc import METRICS, AgentProcess
from .controllerproc import ControllerProcess, make_pki

pytestmark = [
    pytest.mark.root,
    pytest.mark.skipif(shutil.which("prometheus") is None, reason="scripts/setup.sh test"),
]


def test_prometheus_scrapes_the_documented_series(pair: netns.HostPair, tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", [pair.b.ipv4], [])
    (tmp_path / "ctl").mkdir()
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "agent.toml").write_text('policy = "pack"\n')
    controller = ControllerProcess(pair.b, tmp_path / "ctl", pki, listen=f"{pair.b.ipv4}:9740")
    agent = AgentProcess(pair, tmp_path / "agent")
    holder = start_holder(
        {"TENSORLIGHTS_JOB": "j1", "TENSORLIGHTS_ROLE": "ps"}, "--host", pair.a.ipv4,
        prefix=pair.a.exec_args(),
    )  # fmt: skip
    targets = {
        "tensorlights-agent": [METRICS],
        "tensorlights-controller": [f"{pair.b.ipv4}:9741"],
    }
    try:
        agent.wait_status(lambda d: "j1" in d.get("bands", {}))
        with prometheus_server(tmp_path / "prom", targets, prefix=pair.a.exec_args()) as prom:
            up = prom.wait_for("up", lambda r: len(r) == 2 and all(s["value"][1] == "1" for s in r))
            assert {s["metric"]["job"] for s in up} == set(targets)

            def agent_series(expr: str) -> list[dict[str, str]]:
                result = prom.wait_for(expr, bool)
                return [sample["metric"] for sample in result]

            for name in (
                "tensorlights_job_band",
                "tensorlights_green_seconds_total",
                "tensorlights_job_lag_seconds",
                "tensorlights_job_lag_allowed_seconds",
            ):
                (labels,) = agent_series(f'{name}{{training_job="j1"}}')
                assert labels["job"] == "tensorlights-agent" and labels["instance"] == METRICS
            assert agent_series("tensorlights_job_lag_allowed_seconds > 0")
            assert agent_series("tensorlights_controller_configured == 0")  # standalone
            assert agent_series('tensorlights_controller_jobs{job="tensorlights-controller"}')
            # No label of ours was renamed for colliding with one of Prometheus's.
            assert prom.query('{__name__=~"tensorlights_.+", exported_job!=""}') == []
            assert prom.query('{__name__=~"tensorlights_.+", exported_instance!=""}') == []

            # The rules load and, once evaluated (every second), evaluate without error.
            end = time.monotonic() + 20
            while True:
                groups = prom.api("rules")["groups"]
                (group,) = [g for g in groups if g["name"] == "tensorlights"]
                health = {rule["name"]: rule["health"] for rule in group["rules"]}
                if set(health.values()) == {"ok"} or time.monotonic() > end:
                    break
                time.sleep(0.5)
            assert len(health) == 6 and set(health.values()) == {"ok"}, group["rules"]
    finally:
        holder.stop()
        agent.stop()
        controller.stop()
