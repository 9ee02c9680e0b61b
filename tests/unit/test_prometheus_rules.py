"""The shipped Prometheus files: the scrape config and the alerting rules are valid to the
distribution's own `promtool`, the rules' unit tests pass, and every metric they use is one the
agent or the controller exports."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry

from tensorlights.agent.metrics import JOB_LABEL
from tensorlights.controller.metrics import ControllerMetrics
from tensorlights.testbed.prometheus import ALERT_RULES, DEPLOY, SCRAPE_CONFIG

from .test_dashboard import exported_names

RULE_TESTS = DEPLOY / "tensorlights-alerts.test.yml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    assert binary is not None, "promtool is missing: scripts/setup.sh test installs prometheus"
    return subprocess.run([binary, *args], capture_output=True, text=True, cwd=DEPLOY, timeout=60)


@pytest.mark.parametrize(
    "args",
    [
        ("check", "rules", ALERT_RULES.name),
        ("check", "config", SCRAPE_CONFIG.name),  # its rule_files too
        ("test", "rules", RULE_TESTS.name),
    ],
)
def test_promtool_accepts_the_shipped_files(args: tuple[str, ...]) -> None:
    result = promtool(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_the_rules_use_only_exported_metrics_and_labels() -> None:
    registry = CollectorRegistry()
    ControllerMetrics(registry)
    exported = exported_names() | {family.name for family in registry.collect()}
    rules = ALERT_RULES.read_text()
    used = set(re.findall(r"\b(tensorlights_[a-z_]+)", rules))
    assert used and used <= exported, used - exported
    assert f"$labels.{JOB_LABEL}" in rules
