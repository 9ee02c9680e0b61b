"""The TensorLights SPANK plugin (deploy/slurm), built against the distribution's Slurm
headers and loaded by a real slurmctld/slurmd: `srun`/`sbatch --tensorlights-ps-tasks` makes
the job's PS tasks known to discovery with no agent configuration, under the default trust."""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.spank_records import SpankRecordError, SpankRecords
from tensorlights.model import DiscoverySnapshot
from tensorlights.testbed.slurm import SlurmCluster, build_spank_plugin, slurm_cluster
from tensorlights.testbed.socket_holder import start_holder

from .holders import new_scanner, scan_until
from .slurmtasks import LISTENING_TASK, SLURM_TESTS

pytestmark = SLURM_TESTS


@pytest.fixture(scope="module")
def records() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tl-spank-") as work:
        os.chmod(work, 0o755)
        yield Path(work)


@pytest.fixture(scope="module")
def slurm(records: Path) -> Iterator[SlurmCluster]:
    plugin = build_spank_plugin(records)
    # The records go one level down: the plugin creates that directory itself, root-only.
    with slurm_cluster(["n1", "n2"], spank=[f"required {plugin} dir={records}/steps"]) as cluster:
        yield cluster


def _members(snapshot: DiscoverySnapshot) -> dict[tuple[str, str], int]:
    return {(job, role): n for job, role, n in snapshot.members}


def _wait_until_gone(slurm: SlurmCluster, job_id: int) -> None:
    deadline = time.monotonic() + 20
    while slurm.command("squeue", "-h", "-j", str(job_id), check=False).stdout.strip():
        assert time.monotonic() < deadline, f"job {job_id} did not end"
        time.sleep(0.1)


def test_the_option_is_offered_by_srun_and_sbatch(slurm: SlurmCluster) -> None:
    for command in ("srun", "sbatch"):
        usage = slurm.command(command, "--help").stdout
        assert "--tensorlights-ps-tasks=LIST" in usage, command


def test_a_job_submitted_with_the_option_is_found_with_its_roles(
    slurm: SlurmCluster, records: Path
) -> None:
    script = f'srun {sys.executable} -c "{LISTENING_TASK}"'
    out = slurm.command(
        "sbatch", "-N2", "-n4", "--tensorlights-ps-tasks=0,3", "-t", "5", "--wrap", script
    ).stdout
    job_id = int(out.split()[-1])
    job = f"slurm/{job_id}"
    try:
        # Default trust (resource manager) and no role configuration: only the plugin's record
        # and the job's cgroups say anything.
        rules = DiscoveryRules(slurm_spank_dir=str(records / "steps"))
        assert rules.slurm_ps_procids == frozenset()
        with Scanner(rules) as scanner:

            def found(snapshot: DiscoverySnapshot) -> bool:
                members = _members(snapshot)
                listening = [t for t in snapshot.tasks if t.job == job and t.listen_ports]
                return len(listening) == 2 and members.get((job, "task"), 0) >= 2

            snapshot = scan_until(scanner, found, deadline_s=30)
            assert _members(snapshot).get((job, "ps")) == 2, snapshot
            # The others, the batch script and srun included, are plain tasks of the job.
            assert _members(snapshot).get((job, "task"), 0) >= 2, snapshot
            ps = [task for task in snapshot.tasks if task.job == job]
            assert len(ps) == 2 and all(task.listen_ports for task in ps)
            assert {t.source for t in ps} == {"slurm_spank"}
            assert not snapshot.untrusted, snapshot.problems

        # What slurmstepd wrote, as root, where the job's user cannot.
        record = records / "steps" / f"job_{job_id}" / "step_0"
        assert json.loads(record.read_text()) == {
            "job": job_id, "step": "0", "uid": 0, "ntasks": 4, "ps_tasks": [0, 3],
        }  # fmt: skip
        for path in (record, record.parent, record.parent.parent):
            info = path.lstat()
            assert info.st_uid == 0 and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH), path
        # A record its step could not remove (as if its slurmstepd were killed): the job's
        # epilog removes it, so a later job reusing the id inherits nothing.
        (record.parent / "step_9").write_text(record.read_text())
    finally:
        slurm.command("scancel", str(job_id), check=False)
    _wait_until_gone(slurm, job_id)
    # The step's end removed its record (and the job's directory with it).
    deadline = time.monotonic() + 10
    while (records / "steps" / f"job_{job_id}").exists():
        assert time.monotonic() < deadline, "the record outlived its step"
        time.sleep(0.1)


def test_srun_refuses_a_bad_list_on_the_users_terminal(slurm: SlurmCluster) -> None:
    malformed = slurm.command("srun", "-n2", "--tensorlights-ps-tasks=0,x", "true", check=False)
    assert malformed.returncode != 0
    assert "expected task ids such as 0 or 0,3 or 0-3,8" in malformed.stderr
    too_far = slurm.command("srun", "-n2", "--tensorlights-ps-tasks=1-2", "true", check=False)
    assert too_far.returncode != 0
    assert "names task 2, but the step has 2 tasks (0-1)" in too_far.stderr


def test_a_record_is_believed_only_if_root_alone_could_have_written_it(tmp_path: Path) -> None:
    root = tmp_path / "steps"
    (root / "job_7").mkdir(parents=True)
    for directory in (tmp_path, root, root / "job_7"):
        directory.chmod(0o755)
    record = root / "job_7" / "step_1"
    body = {"job": 7, "step": "1", "uid": 1000, "ntasks": 4, "ps_tasks": [0]}
    record.write_text(json.dumps(body))
    records = SpankRecords(root)
    found = records.step(7, "1")
    assert found is not None and found.ps_tasks == frozenset({0}) and found.uid == 1000
    assert records.step(7, "2") is None and records.step(8, "1") is None

    record.chmod(0o666)
    with pytest.raises(SpankRecordError, match="writable by root alone"):
        records.step(7, "1")
    record.chmod(0o644)
    os.chown(root / "job_7", 65534, 65534)  # the job's user owns the job directory
    with pytest.raises(SpankRecordError, match="owned by root"):
        records.step(7, "1")
    os.chown(root / "job_7", 0, 0)

    elsewhere = tmp_path / "forged"
    elsewhere.write_text(json.dumps(body))
    record.unlink()
    record.symlink_to(elsewhere)
    with pytest.raises(SpankRecordError):
        records.step(7, "1")
    record.unlink()

    for text, message in (
        ("{", "malformed"),
        (json.dumps({**body, "ps_tasks": [-1]}), "malformed"),
        (json.dumps({**body, "job": 9}), "describes job 9 step 1"),
    ):
        record.write_text(text)
        with pytest.raises(SpankRecordError, match=message):
            records.step(7, "1")


def test_an_unbelieved_record_is_a_discovery_problem(tmp_path: Path) -> None:
    """A record the job's user could have written gives no role, and the agent says so."""
    root = tmp_path / "steps"
    (root / "job_7").mkdir(parents=True)
    record = root / "job_7" / "step_0"
    record.write_text(json.dumps({"job": 7, "step": "0", "uid": 0, "ntasks": 1, "ps_tasks": [0]}))
    record.chmod(0o666)
    env = {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
    holder = start_holder(env)
    try:
        rules = DiscoveryRules(slurm_spank_dir=str(root))
        with new_scanner(rules) as scanner:
            snapshot = scan_until(
                scanner, lambda s: any("not believed" in p for p in s.problems), deadline_s=10
            )
        assert any(f"{record} is not believed" in p for p in snapshot.problems), snapshot
        assert not [task for task in snapshot.tasks if task.job == "slurm/7"]
    finally:
        holder.stop()
