"""Whose word a job identity rests on, and whether this host believes it (pure).

Any process can put TENSORLIGHTS_ROLE=ps, TF_CONFIG or torchrun's variables in its own
environment, so on a host shared by several users an identity read from the environment is
only a claim. Under `trust = "resource-manager"` (the default) a claim counts only where
something the user cannot forge vouches for it:

- **a Slurm job cgroup**: slurmd (root) puts every task of job N in a cgroup named
  `.../job_N/step_S` and a task cannot leave it; the claim must be job `slurm/N` itself, and
  where the path names the job's owner (`uid_U`, cgroup v1) the process must run as U;
- **`trusted_users`**: processes whose real uid the operator listed (a service account that
  launches every job on the host, say).

Anything else identified is *not trusted*: it gets no band of its own (its traffic stays in
the unmanaged class), is not reported to the controller as a member, and the agent lists it
as a problem saying why. `trust = "any"` believes every claim (single-tenant hosts).

Kubernetes pods and the controller's static jobs file do not vouch yet: matching a pod's
cgroup to a pod the controller knows needs the controller to send pod UIDs to agents, which
it does not do (see docs/design.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

SLURM_TASK_CGROUP = re.compile(
    r"(?:/uid_(?P<uid>\d+))?/job_(?P<job>\d+)/step_[^/\n]+(?:/user)?(?:/task_\d+)?$",
    re.MULTILINE,
)
"""A task of a Slurm job step in /proc/PID/cgroup: `.../uid_U/job_N/step_S` (cgroup v1
proctrack), `.../step_S/task_T` (v1 task/cgroup) or `.../step_S/user/task_T` (v2). slurmstepd
itself sits in `job_N` (v1) or `step_S/slurm` (v2) and matches none."""


class TrustMode(StrEnum):
    RESOURCE_MANAGER = "resource-manager"
    """Only identities a resource manager (or the operator's trusted_users) vouches for."""
    ANY = "any"
    """Every identity a launcher's variables give (single-tenant hosts)."""


@dataclass(frozen=True)
class Trust:
    mode: TrustMode = TrustMode.RESOURCE_MANAGER
    trusted_uids: frozenset[int] = field(default_factory=frozenset)


TRUST_ANY = Trust(TrustMode.ANY)


@dataclass(frozen=True)
class SlurmTask:
    """What a process's cgroup says about it: a task of Slurm job `job_id`, owned by `uid`
    where the path names the owner."""

    job_id: int
    uid: int | None


def slurm_task(cgroup: str) -> SlurmTask | None:
    match = SLURM_TASK_CGROUP.search(cgroup)
    if match is None:
        return None
    uid = match.group("uid")
    return SlurmTask(int(match.group("job")), None if uid is None else int(uid))


def distrust(job: str, source: str, uid: int, cgroup: str, trust: Trust) -> str | None:
    """Why the claim that this process (real `uid`, `cgroup`) belongs to `job` is not
    believed; None when it is."""
    if trust.mode is TrustMode.ANY or uid in trust.trusted_uids:
        return None
    task = slurm_task(cgroup)
    if task is not None:
        if job != f"slurm/{task.job_id}":
            return (
                f"not trusted: claims job {job} ({source}) but runs in Slurm job "
                f"{task.job_id}'s cgroup; its traffic stays unmanaged"
            )
        if task.uid is not None and task.uid != uid:
            return (
                f"not trusted: runs as uid {uid} in the cgroup of uid {task.uid}'s Slurm job "
                f"{task.job_id}; its traffic stays unmanaged"
            )
        return None
    return (
        f"not trusted: job {job} ({source}, uid {uid}) is self-declared, and no resource "
        'manager vouches for it (trust = "resource-manager"); its traffic stays unmanaged. '
        'Run it as a Slurm job, list its user in trusted_users, or set trust = "any" on a '
        "single-tenant host"
    )
