"""A real Slurm (munged, slurmctld, two slurmd) runs a multi-task job: the Slurm source reports
it with its nodes, and discovery names its tasks with the same job id."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator

import pytest

from tensorlights.controller.slurm import SlurmSource, parse_squeue
from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.errors import TransientError
from tensorlights.testbed.slurm import SlurmCluster, slurm_cluster

from .holders import scan_until
from .slurmtasks import LISTENING_TASK, SLURM_TESTS

pytestmark = SLURM_TESTS


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    with slurm_cluster(["n1", "n2"]) as cluster:
        yield cluster


def test_slurm_source_and_discovery_agree_on_a_multi_task_job(slurm: SlurmCluster) -> None:
    script = f'srun {sys.executable} -c "{LISTENING_TASK}"'
    submitted = time.time()
    out = slurm.command("sbatch", "-N2", "-n4", "-J", "ps-job", "-t", "10", "--wrap", script).stdout
    slurm_id = int(out.split()[-1])
    source = SlurmSource(env=slurm.env)
    try:
        running = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            running = [j for j in source.jobs() if j.slurm_id == slurm_id and j.state == "RUNNING"]
            if running:
                break
            time.sleep(0.1)
        assert running, slurm.command("squeue", "-a", check=False).stdout
        (job,) = running
        assert job.job == f"slurm/{slurm_id}" and job.name == "ps-job"
        assert job.nodes == ("n1", "n2")
        # Its 10-minute limit: when it ends at the latest (the pack ranking's remaining time).
        assert job.end_time is not None
        assert submitted + 590 <= job.end_time <= time.time() + 610

        # Task 0 is the PS by rule; all four tasks are members of the same job.
        rules = DiscoveryRules(slurm_ps_procids=frozenset({0}))
        with Scanner(rules) as scanner:

            def found(snapshot):  # type: ignore[no-untyped-def]
                members = {(j, r): n for j, r, n in snapshot.members}
                return members.get((job.job, "ps")) == 1 and any(
                    t.job == job.job and t.listen_ports for t in snapshot.tasks
                )

            snapshot = scan_until(scanner, found, deadline_s=20)
            members = {(j, r): n for j, r, n in snapshot.members}
            assert members.get((job.job, "ps")) == 1
            assert members.get((job.job, "task"), 0) >= 3
    finally:
        slurm.command("scancel", str(slurm_id), check=False)


def test_malformed_squeue_output_is_a_transient_error() -> None:
    with pytest.raises(TransientError):
        parse_squeue("not json")
    assert parse_squeue('{"jobs": [{"job_id": 3, "job_state": "PENDING"}]}') == []


def test_squeue_time_limits_in_both_layouts() -> None:
    def job(**fields: object) -> str:
        raw = {"job_id": 5, "job_state": "RUNNING", "start_time": 1000, **fields}
        return json.dumps({"jobs": [raw]})

    (plain,) = parse_squeue(job(time_limit=10, end_time=1600))
    assert plain.end_time == 1600.0
    number = {"set": True, "infinite": False, "number": 10}
    (newer,) = parse_squeue(job(time_limit=number, end_time={**number, "number": 1600}))
    assert newer.end_time == 1600.0
    infinite = {"set": True, "infinite": True, "number": 0}
    (unlimited,) = parse_squeue(job(time_limit=infinite, end_time=1600))
    assert unlimited.end_time is None
    assert parse_squeue(job(time_limit=4294967294, end_time=1600))[0].end_time is None
