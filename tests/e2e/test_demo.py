"""The README's main command runs end to end (short settings) and leaves nothing behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tensorlights.testbed import netns

pytestmark = pytest.mark.root


def test_demo_runs_both_phases_and_cleans_up() -> None:
    before = set(netns.run(["ip", "netns", "list"]).stdout.split())
    result = subprocess.run(
        [sys.executable, "-m", "tensorlights.demo", "--iterations", "4", "--model-bytes",
         "1000000", "--interval", "1s"],
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "green light -> job" in result.stdout
    assert "average JCT with TensorLights" in result.stdout
    after = set(netns.run(["ip", "netns", "list"]).stdout.split())
    assert after <= before
