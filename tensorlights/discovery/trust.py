"""Whose word a job identity rests on, and whether this host believes it (pure).

Any process can put TENSORLIGHTS_ROLE=ps, TF_CONFIG or torchrun's variables in its own
environment, so on a host shared by several users an identity read from the environment is
only a claim. Under `trust = "resource-manager"` (the default) a claim counts only where
something the user cannot forge vouches for it:

- **a Slurm job cgroup**: slurmd (root) puts every task of job N in a cgroup named
  `.../job_N/step_S` and a task cannot leave it. The claim must be job `slurm/N` itself; where
  the path names the job's owner (`uid_U`, cgroup v1) the process must run as U, and where the
  controller's Slurm source names the job's user, as that user;
- **a Kubernetes pod the controller knows**: the kubelet names a pod's cgroup after its UID;
  the controller's Kubernetes source says which job's pod that is (and the uid its
  containers run as, where the pod fixes one). The claim must be that job;
- **the controller's jobs file**: an entry with a `user` vouches for that user's processes
  claiming the job on its PS hosts;
- **`trusted_users`**: processes whose real uid the operator listed.

The controller's word (`JobVoucher`s) comes with every report's reply; a standalone agent has
only the cgroups and trusted_users. Anything else identified is *not trusted*: it gets no band
of its own (its traffic stays in the unmanaged class), is not reported to the controller, and
the agent lists it as a problem saying why. `trust = "any"` believes every claim
(single-tenant hosts).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from enum import StrEnum

from tensorlights.model import VoucherSource

SLURM_TASK_CGROUP = re.compile(
    r"(?:/uid_(?P<uid>\d+))?/job_(?P<job>\d+)/step_(?P<step>[^/\n]+)(?:/user)?(?:/task_\d+)?$",
    re.MULTILINE,
)
"""A task of a Slurm job step in /proc/PID/cgroup: `.../uid_U/job_N/step_S` (cgroup v1
proctrack), `.../step_S/task_T` (v1 task/cgroup) or `.../step_S/user/task_T` (v2). slurmstepd
itself sits in `job_N` (v1) or `step_S/slurm` (v2) and matches none."""


POD_CGROUP = re.compile(
    r"kubepods\b[^\n]*?[/-]pod(?P<uid>[0-9a-f]{8}(?:[-_][0-9a-f]{4}){3}[-_][0-9a-f]{12})"
    r"(?:\.slice)?/"
)
"""A container of a pod in /proc/PID/cgroup: `/kubepods/burstable/pod<uid>/<container>`
(cgroupfs driver) or `.../kubepods-burstable-pod<uid with _>.slice/cri-...scope` (systemd
driver), v1 or v2."""

NO_SUCH_USER = -1
"""The uid of a user the controller names but this host does not know: nobody runs as it."""


class TrustMode(StrEnum):
    RESOURCE_MANAGER = "resource-manager"
    """Only identities a resource manager (or the operator's trusted_users) vouches for."""
    ANY = "any"
    """Every identity a launcher's variables give (single-tenant hosts)."""


@dataclass(frozen=True)
class JobVoucher:
    """The controller's word on a job on this host (model.Voucher with its user resolved)."""

    job: str
    source: VoucherSource
    user: str = ""
    uid: int | None = None
    """`user`'s uid here; None where the source names no user, NO_SUCH_USER where this host
    does not know the name."""
    pods: tuple[tuple[str, int | None], ...] = ()
    """(pod UID, the uid its containers run as or None)."""


@dataclass(frozen=True)
class Trust:
    mode: TrustMode = TrustMode.RESOURCE_MANAGER
    trusted_uids: frozenset[int] = field(default_factory=frozenset)
    vouchers: tuple[JobVoucher, ...] = ()
    """What the controller's sources vouch for on this host (none when standalone)."""


TRUST_ANY = Trust(TrustMode.ANY)


@dataclass(frozen=True)
class SlurmTask:
    """What a process's cgroup says about it: a task of step `step` (a number, `batch` or
    `extern`) of Slurm job `job_id`, owned by `uid` where the path names the owner."""

    job_id: int
    uid: int | None
    step: str


def slurm_task(cgroup: str) -> SlurmTask | None:
    match = SLURM_TASK_CGROUP.search(cgroup)
    if match is None:
        return None
    uid = match.group("uid")
    return SlurmTask(int(match.group("job")), None if uid is None else int(uid), match["step"])


def pod_uid(cgroup: str) -> str | None:
    """The UID of the pod whose container the process runs in, as the API writes it."""
    match = POD_CGROUP.search(cgroup)
    return None if match is None else match.group("uid").replace("_", "-")


_UNMANAGED = "its traffic stays unmanaged"


def distrust(job: str, source: str, uid: int, cgroup: str, trust: Trust) -> str | None:
    """Why the claim that this process (real `uid`, `cgroup`) belongs to `job` is not
    believed; None when it is."""
    if trust.mode is TrustMode.ANY or uid in trust.trusted_uids:
        return None
    claim = f"job {job} ({source}, uid {uid})"
    task = slurm_task(cgroup)
    if task is not None:
        return _slurm_distrust(job, claim, uid, task, trust.vouchers)
    pod = pod_uid(cgroup)
    if pod is not None:
        return _pod_distrust(job, claim, uid, pod, trust.vouchers)
    static = [v for v in trust.vouchers if v.job == job and v.source is VoucherSource.STATIC]
    if any(v.uid == uid for v in static if v.uid is not None):
        return None
    users = " or ".join(sorted({v.user for v in static if v.user}))
    if users:
        return f"not trusted: {claim}: the jobs file gives the job to {users}; {_UNMANAGED}"
    return (
        f"not trusted: {claim} is self-declared, and no resource manager vouches for it "
        f'(trust = "resource-manager"); {_UNMANAGED}. Run it as a Slurm job or a Kubernetes '
        'pod the controller knows, list its user in trusted_users, or set trust = "any" on a '
        "single-tenant host"
    )


def _slurm_distrust(
    job: str, claim: str, uid: int, task: SlurmTask, vouchers: tuple[JobVoucher, ...]
) -> str | None:
    if job != f"slurm/{task.job_id}":
        return f"not trusted: {claim} runs in Slurm job {task.job_id}'s cgroup; {_UNMANAGED}"
    if task.uid is not None and task.uid != uid:
        return (
            f"not trusted: {claim} runs in the cgroup of uid {task.uid}'s Slurm job "
            f"{task.job_id}; {_UNMANAGED}"
        )
    for voucher in vouchers:
        if voucher.job == job and voucher.uid is not None and voucher.uid != uid:
            return f"not trusted: {claim}: Slurm runs the job as {voucher.user}; {_UNMANAGED}"
    return None


def _pod_distrust(
    job: str, claim: str, uid: int, pod: str, vouchers: tuple[JobVoucher, ...]
) -> str | None:
    for voucher in vouchers:
        for pod_uid_, run_as in voucher.pods:
            if pod_uid_ != pod:
                continue
            if voucher.job != job:
                return f"not trusted: {claim} runs in pod {pod} of job {voucher.job}; {_UNMANAGED}"
            if run_as is not None and run_as != uid:
                return f"not trusted: {claim}: pod {pod} runs as uid {run_as}; {_UNMANAGED}"
            return None
    return (
        f"not trusted: {claim} runs in pod {pod}, which is not a pod of any job the "
        f"controller knows on this host; {_UNMANAGED}"
    )
