"""Soak (outside the default run: `scripts/soak.sh`, or pytest -m soak): 8 job slots on a PS
host whose PS processes come and go every few seconds, the agent restarted at a third of the
run and the controller at two thirds. Reports RSS, open descriptors and tc/nft object counts
first vs last, and fails on growth.

SOAK_SECONDS sets the length (default 300, at most 600)."""

from __future__ import annotations

import os
import random
import subprocess
import time
from pathlib import Path

import pytest

from tensorlights.testbed.cluster import cluster
from tensorlights.testbed.psjob import tf_launcher_env
from tensorlights.testbed.socket_holder import Holder, start_holder

from ..e2e.agentproc import AgentProcess
from ..e2e.controllerproc import ControllerProcess, agent_config, make_pki

pytestmark = [pytest.mark.root, pytest.mark.soak, pytest.mark.timeout(900)]

SLOTS = 8
CHURN_EVERY_S = 2.0


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_churn_and_restarts_leave_nothing_growing(tmp_path: Path) -> None:
    seconds = min(600.0, float(os.environ.get("SOAK_SECONDS", "300")))
    rng = random.Random(7)
    pki = make_pki(tmp_path / "pki", ["10.78.0.1"], ["ps1"])
    with cluster(["ctl", "ps1"]) as c:
        ps1 = c.hosts["ps1"]

        def in_ps1(*command: str) -> str:
            return subprocess.run(
                ["ip", "netns", "exec", ps1.ns, *command], capture_output=True, text=True
            ).stdout

        shown: list[str] = []

        def kernel_objects() -> tuple[int, int]:
            classes = in_ps1("tc", "class", "show", "dev", "eth0")
            filters = in_ps1("tc", "filter", "show", "dev", "eth0")
            shown.append(filters)
            tc = len(classes.splitlines()) + len(filters.splitlines())
            return tc, len(in_ps1("nft", "list", "table", "inet", "tensorlights").splitlines())

        def start_controller() -> ControllerProcess:
            (tmp_path / "ctl").mkdir(exist_ok=True)
            return ControllerProcess(c.hosts["ctl"], tmp_path / "ctl", pki, listen="10.78.0.1:9740")

        def start_agent() -> AgentProcess:
            (tmp_path / "ps1").mkdir(exist_ok=True)
            agent_config(tmp_path / "ps1" / "agent.toml", "10.78.0.1:9740", pki, "ps1")
            agent = AgentProcess(ps1, tmp_path / "ps1", standalone=False)
            agent.wait_status(lambda d: d.get("mode") == "plan", deadline_s=30)
            return agent

        controller = start_controller()
        agent = start_agent()
        jobs: dict[int, Holder] = {}
        samples: list[dict[str, float]] = []
        # The baseline: no jobs, after one has come and gone (the first u32 filter makes the
        # kernel's root hash table of each family, which then stays, empty, once per family).
        first = start_holder(
            tf_launcher_env("soak-warmup", 1), "--host", ps1.ipv4, prefix=ps1.exec_args()
        )
        agent.wait_status(lambda d: len(d.get("bands") or {}) == 1, deadline_s=30)
        first.stop()
        agent.wait_status(lambda d: not d.get("bands"), deadline_s=30)
        baseline = kernel_objects()
        started = time.monotonic()
        next_restart = ["agent", "controller"]
        try:
            while time.monotonic() - started < seconds:
                slot = rng.randrange(SLOTS)
                if slot in jobs:
                    jobs.pop(slot).stop()
                else:
                    env = tf_launcher_env(f"soak{slot}-{rng.randrange(10**6)}", 1)
                    jobs[slot] = start_holder(
                        env, "--host", ps1.ipv4, "--connections", "2", prefix=ps1.exec_args()
                    )
                elapsed = time.monotonic() - started
                if next_restart and elapsed > seconds * (3 - len(next_restart)) / 3:
                    what = next_restart.pop(0)
                    if what == "agent":
                        agent.stop()
                        agent = start_agent()
                    else:
                        controller.stop()
                        controller = start_controller()
                    samples.append({"at": elapsed, "restart": 1.0})
                samples.append(
                    {
                        "at": elapsed,
                        "jobs": float(len(jobs)),
                        "agent_rss": _rss_mib(agent.proc.pid),
                        "agent_fds": float(_fds(agent.proc.pid)),
                        "controller_rss": _rss_mib(controller.proc.pid),
                        "controller_fds": float(_fds(controller.proc.pid)),
                    }
                )
                time.sleep(CHURN_EVERY_S)
            for holder in jobs.values():
                holder.stop()
            jobs.clear()
            agent.wait_status(lambda d: not d.get("bands"), deadline_s=30)
            # A job table the kernel still held (EBUSY, deferred work) goes at the next full
            # resync (30 s): allow one, then anything left over is a leak.
            emptied = time.monotonic()
            while (final := kernel_objects()) != baseline and time.monotonic() - emptied < 40:
                time.sleep(0.5)
            settled_s = time.monotonic() - emptied
        finally:
            for holder in jobs.values():
                holder.stop()
            agent.stop()
            controller.stop()
    # After the last restart (the controller's), both processes ran the last third unbroken.
    last_third = [s for s in samples if "jobs" in s and s["at"] > seconds * 2 / 3 + 10]
    assert len(last_third) >= 5, "the run is too short to judge growth"
    earliest, latest = last_third[0], last_third[-1]
    print(f"\nsoak: {seconds:.0f} s, {len(samples)} samples; first vs last of the last third:")
    for key in ("agent_rss", "agent_fds", "controller_rss", "controller_fds"):
        print(f"  {key:15} {earliest[key]:8.1f} -> {latest[key]:8.1f}")
    print(f"  tc, nft objects with no jobs: {baseline} before, {final} after ({settled_s:.1f} s)")
    assert final == baseline, f"filters before:\n{shown[0]}\nafter:\n{shown[-1]}"
    assert latest["agent_fds"] <= earliest["agent_fds"] + 4
    assert latest["controller_fds"] <= earliest["controller_fds"] + 4
    assert latest["agent_rss"] <= earliest["agent_rss"] * 1.10 + 2
    assert latest["controller_rss"] <= earliest["controller_rss"] * 1.10 + 2
