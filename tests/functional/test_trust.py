"""Trust against real processes (issue 19, item 5): an unprivileged user's process that names
itself a PS gets no job under the default trust; a Slurm-shaped job cgroup vouches only for its
own job and user; trusted_users and trust = "any" believe claims."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.trust import Trust, TrustMode
from tensorlights.model import DiscoverySnapshot
from tensorlights.testbed.socket_holder import Holder

from .holders import holders, in_cgroup, new_scanner, own_cgroup, scan_until, tf_config

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
PROJECT = str(Path(__file__).parents[2])
HOSTILE = {"TENSORLIGHTS_JOB": "grab", "TENSORLIGHTS_ROLE": "ps", "PYTHONPATH": PROJECT}


def as_user(uid: int, prefix: list[str] | None = None) -> dict[str, Any]:
    """start()'s arguments that run a holder as `uid` (our interpreter lives in root's home,
    out of other users' reach; the holder needs only the standard library)."""
    if shutil.which("setpriv") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"needs setpriv and {SYSTEM_PYTHON}")
    setpriv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    return {"prefix": [*(prefix or []), *setpriv], "python": SYSTEM_PYTHON}


def settled(holder: Holder):  # type: ignore[no-untyped-def]
    """The scan has looked at the holder: as a task, or as a process not believed."""

    def done(snapshot: DiscoverySnapshot) -> bool:
        return holder.pid in snapshot.untrusted or any(
            task.pid == holder.pid and holder.ports <= task.local_ports for task in snapshot.tasks
        )

    return done


@pytest.fixture
def strict() -> DiscoveryRules:
    return DiscoveryRules()


@pytest.mark.root
def test_an_unprivileged_self_declared_ps_is_not_believed(strict: DiscoveryRules) -> None:
    with holders() as start, new_scanner(strict) as scanner:
        hostile = start(HOSTILE, **as_user(NOBODY))
        snapshot = scan_until(scanner, settled(hostile))
        assert hostile.pid in snapshot.untrusted
        assert all(task.pid != hostile.pid for task in snapshot.tasks)
        assert all(job != "grab" for job, _, _ in snapshot.members)
        (problem,) = [p for p in snapshot.problems if p.startswith(f"pid {hostile.pid} ")]
        assert problem.startswith(f"pid {hostile.pid} (python3): not trusted: job grab (env, ")
        assert f"uid {NOBODY}) is self-declared" in problem


@pytest.mark.root
def test_trusted_users_and_trust_any_believe_the_claim() -> None:
    believers = (
        DiscoveryRules(trust=Trust(TrustMode.RESOURCE_MANAGER, frozenset({NOBODY}))),
        DiscoveryRules(trust=Trust(TrustMode.ANY)),
    )
    with holders() as start:
        hostile = start(HOSTILE, **as_user(NOBODY))
        for rules in believers:
            with new_scanner(rules) as scanner:
                snapshot = scan_until(scanner, settled(hostile))
                assert [task.job for task in snapshot.tasks if task.pid == hostile.pid] == ["grab"]
                assert hostile.pid not in snapshot.untrusted


@pytest.fixture
def slurm_v1_job() -> Iterator[Path]:
    """Where cgroup v1 proctrack puts a task of root's Slurm job 9137."""
    with own_cgroup("uid_0/job_9137/step_0") as leaf:
        yield leaf


@pytest.mark.root
def test_a_slurm_job_cgroup_vouches_for_its_own_job_and_user_only(
    strict: DiscoveryRules, slurm_v1_job: Path
) -> None:
    with holders() as start, new_scanner(strict) as scanner:
        # Root's task of job 9137, named by its framework: believed, as job slurm/9137.
        task = start({"TF_CONFIG": tf_config("ps", 0)}, prefix=in_cgroup(slurm_v1_job))
        # In the same cgroup: one claiming another job, one running as another user.
        other_job = start(HOSTILE, prefix=in_cgroup(slurm_v1_job))
        other_user = start(
            {"TF_CONFIG": tf_config("ps", 0), "PYTHONPATH": PROJECT},
            **as_user(NOBODY, prefix=in_cgroup(slurm_v1_job)),
        )
        snapshot = scan_until(
            scanner, lambda s: all(settled(h)(s) for h in (task, other_job, other_user))
        )
        ours = {task.pid, other_job.pid, other_user.pid}
        assert [(t.pid, t.job) for t in snapshot.tasks if t.pid in ours] == [
            (task.pid, "slurm/9137")
        ]
        assert set(snapshot.untrusted) & ours == {other_job.pid, other_user.pid}
        problems = "\n".join(snapshot.problems)
        assert "job grab (env, uid 0) runs in Slurm job 9137's cgroup" in problems
        assert f"uid {NOBODY}) runs in the cgroup of uid 0's Slurm job 9137" in problems
