"""A real PyTorch DDP job (gloo all-reduce among its ranks, launched with torchrun's variables,
or with horovodrun's) across two emulated hosts: the agent finds its rank with no
configuration at all, shapes the rank's traffic in the job's band, calls the job collective,
and measures its iterations."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tensorlights.agent.status import AgentStatus
from tensorlights.telemetry.accuracy import compare
from tensorlights.testbed import netns
from tensorlights.testbed.psjob import collect_iterations
from tensorlights.testbed.workloads import JobShape, Workload, start_workload

from .agentproc import AgentProcess, metric

pytest.importorskip(
    "torch", reason="the torch extra is not installed (scripts/test.sh installs it)"
)
pytestmark = pytest.mark.root

ITERATIONS = 20
MODEL_BYTES = 2_000_000


@pytest.mark.parametrize("workload", [Workload.TORCH_DDP, Workload.HOROVOD_DDP])
def test_a_ddp_job_is_found_shaped_and_measured_with_no_configuration(
    pair: netns.HostPair, tmp_path: Path, agents: list[AgentProcess], workload: Workload
) -> None:
    (tmp_path / "agent.toml").write_text("")  # nothing about the job: defaults throughout
    agent = AgentProcess(pair, tmp_path, "--policy", "static", "--interval", "1s")
    agents.append(agent)
    agent.wait_status(lambda d: bool(d.get("healthy")))
    shape = JobShape(workers=1, model_bytes=MODEL_BYTES, iterations=ITERATIONS, compute_s=0.1)
    start_at = time.monotonic() + workload.start_up_s
    job = start_workload(workload, "ddp-e2e", pair.a, [pair.b], shape, start_at)
    # The id every host gives the job: torchrun's run id, or horovodrun's rendezvous.
    assert job.job.startswith("torch/" if workload is Workload.TORCH_DDP else "horovod/")
    scraped = ""
    try:
        # Rank 0 on this host: its gloo pairs' ephemeral ports are the job's, found by process.
        document = agent.wait_status(
            lambda d: (
                d["discovery"]["job_kinds"].get(job.job) == "collective"
                and len(d["discovery"]["job_ports"].get(job.job, [])) > 1
            ),
            deadline_s=60,
        )
        band = document["bands"][job.job]
        # Both ranks are members (the other one's host is another namespace of this kernel).
        members = document["discovery"]["members"]
        assert {"job": job.job, "role": "rank", "processes": 2} in members

        def status() -> AgentStatus | None:
            nonlocal scraped
            found = agent.status()
            if found and job.job in found.get("bands", {}):
                scraped = agent.http("/metrics")[1]  # while the job runs
            return AgentStatus.from_json(found) if found and "version" in found else None

        truths, measured = collect_iterations(status, {job.job: job})
    finally:
        job.kill()
    received = truths[job.job]
    assert [len(times) for times in received] == [ITERATIONS, ITERATIONS]
    # Each iteration rank 0 sends about the model (ring all-reduce of two ranks): it went
    # through the job's band, not the unmanaged class.
    sent = metric(scraped, "tensorlights_band_bytes_total", f'band="{band}"')
    assert sent >= MODEL_BYTES * ITERATIONS // 2, scraped
    assert metric(scraped, "tensorlights_job_kind", f'kind="collective",training_job="{job.job}"')
    # Telemetry from the rank's own connections: each all-reduce's end and the iteration
    # period as the ranks log them from gloo's completion (12 runs of each: every end within
    # 5 ms; stamped after backward instead, the ranks' CPU made up to 4 of 19 periods miss).
    # A sample between the ring's two steps sees the peer's step arrive as an answer; the
    # steps are joined once the job's compute is known (3 iterations): 6 quiet runs of each
    # had 0-1 all-reduce measured in two parts, the first, and 18-19 of 19 periods right;
    # before the joining, 0-1 a run anywhere, 3 in one of 24, 2-3 under CPU load
    # (docs/design.md). In CI on 2026-12-06, 13 of 19, the last five right: as when the
    # first all-reduces are seen in halves and the ring counter takes a half for the
    # all-reduce's bytes (replayed, the same 6 misses: whole ones reported as two each at
    # half the period); ring_count.py waits for the best candidate now.
    # Not the spread: this host sees its own rank's sends only, so what it measures is not
    # how far apart the ranks finished.
    agreement = compare(received, measured[job.job])
    # Whole on failure (pytest cuts a long repr in the middle, where the periods are).
    errors = " ".join(f"{error * 1000:+.0f}" for error in agreement.period_errors)
    told = f"matched {agreement.matched}, period errors (ms): {errors}"
    assert agreement.matched >= ITERATIONS - 3, told
    assert agreement.period_ok >= agreement.period_checked - 2, told
