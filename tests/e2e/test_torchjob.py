"""A real PyTorch PS job (gloo, ephemeral data ports) across two emulated hosts: the agent
finds its PS by TF_CONFIG alone, shapes and measures its real pushes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tensorlights.testbed import netns
from tensorlights.testbed.psjob import tf_job_id, tf_launcher_env
from tensorlights.testbed.socket_holder import clean_env
from tensorlights.testbed.torchjob import model_bytes

from .agentproc import AgentProcess

pytest.importorskip(
    "torch", reason="the torch extra is not installed (scripts/test.sh installs it)"
)
pytestmark = pytest.mark.root

WORKERS, HIDDEN, ITERATIONS = 2, 512, 12
MASTER_PORT = 29500


def tx_bytes(ns: str, ifname: str) -> int:
    path = f"/sys/class/net/{ifname}/statistics/tx_bytes"
    return int(netns.run(netns.in_ns(ns, "cat", path)).stdout)


def test_the_agent_finds_shapes_and_measures_a_real_pytorch_ps(
    pair: netns.HostPair, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    agent = AgentProcess(pair, tmp_path, "--policy", "pack")
    agents.append(agent)
    agent.wait_status(lambda d: bool(d.get("healthy")))
    job = tf_job_id("torch", WORKERS)
    common = ["--master", f"{pair.a.ipv4}:{MASTER_PORT}", "--workers", str(WORKERS),
              "--hidden", str(HIDDEN), "--iterations", str(ITERATIONS)]  # fmt: skip
    module = [sys.executable, "-m", "tensorlights.testbed.torchjob"]
    sent_before = tx_bytes(pair.a.ns, "veth-a")
    ps = subprocess.Popen(
        pair.a.exec_args(*module, "ps", *common, "--ifname", "veth-a"),
        stdout=subprocess.PIPE, text=True, env=clean_env(tf_launcher_env("torch", WORKERS)),
    )  # fmt: skip
    workers = [
        subprocess.Popen(
            pair.b.exec_args(*module, "worker", *common, "--rank", str(rank), "--ifname", "veth-b"),
            stdout=subprocess.PIPE,
            text=True,
            env=clean_env(),
        )
        for rank in range(1, WORKERS + 1)
    ]
    try:
        # The PS's data ports are gloo's ephemeral ones: found by process, not configured.
        document = agent.wait_status(
            lambda d: any(p != MASTER_PORT for p in d["discovery"]["job_ports"].get(job, [])),
            deadline_s=60,
        )
        assert job in document["bands"]
        received = [json.loads(w.communicate(timeout=180)[0])["received"] for w in workers]
        summary = json.loads(ps.communicate(timeout=60)[0].strip().splitlines()[-1])
    finally:
        for proc in (ps, *workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert all(len(times) == ITERATIONS for times in received)
    assert summary["model_bytes"] == model_bytes(HIDDEN)
    # Real pushes crossed the shaped link: the model to every worker, every iteration.
    pushed = model_bytes(HIDDEN) * WORKERS * ITERATIONS
    assert tx_bytes(pair.a.ns, "veth-a") - sent_before >= pushed
    # The agent's telemetry saw the iterations of the real job (bar its warm-up).
    deadline = time.monotonic() + 10
    seen: list[object] = []
    while time.monotonic() < deadline and len(seen) < ITERATIONS - 4:
        seen = (agent.status() or {}).get("telemetry", {}).get(job, [])
        time.sleep(0.2)
    # Said in full when it fails: when worker 1 got each push and when the agent saw each
    # iteration end (both monotonic).
    seen_at = [item["last_done_monotonic"] for item in seen if isinstance(item, dict)]
    assert len(seen) >= ITERATIONS - 4, (
        f"saw {len(seen)} of {ITERATIONS}; worker 1 received at {received[0]}; the agent saw "
        f"iterations end at {seen_at}; agent log: {agent.log_text()[-1500:]}"
    )
