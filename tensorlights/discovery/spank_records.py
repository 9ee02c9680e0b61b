"""What the TensorLights SPANK plugin (deploy/slurm) recorded about a Slurm job step.

`srun --tensorlights-ps-tasks=0,4` (or the same sbatch option) makes slurmstepd, as root,
write `<dir>/job_N/step_S` before the step's tasks start, and remove it when the step ends:

    {"job": 12, "step": "0", "uid": 1000, "ntasks": 8, "ps_tasks": [0, 4]}

A record counts only if root owns it, its directory and the base directory and none of
them is writable by anyone else: then the job's user cannot have written it, and the roles
in it are the resource manager's word, not the user's environment.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SpankRecord:
    job_id: int
    step: str
    uid: int
    ntasks: int
    ps_tasks: frozenset[int]


class SpankRecordError(Exception):
    """A record exists but is not one to believe (wrong owner, mode or content)."""


class SpankRecords:
    """Reads the records under `root` (the plugin's `dir=`)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def step(self, job_id: int, step: str) -> SpankRecord | None:
        """The record of step `step` of job `job_id`; None where the plugin wrote none (the
        option was not given, or the plugin is not installed)."""
        job_dir = self.root / f"job_{job_id}"
        path = job_dir / f"step_{step}"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise SpankRecordError(f"{path}: {exc.strerror}") from exc
        try:
            for checked, info in ((path, os.fstat(fd)), (job_dir, None), (self.root, None)):
                _check_root_only(checked, info)
            with os.fdopen(fd, "rb", closefd=False) as handle:
                text = handle.read(1 << 20)
        except OSError as exc:
            raise SpankRecordError(f"{path}: {exc.strerror}") from exc
        finally:
            os.close(fd)
        return _parse(path, text, job_id, step)


def _check_root_only(path: Path, info: os.stat_result | None) -> None:
    if info is None:
        info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise SpankRecordError(f"{path} is not believed: it is a symbolic link")
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise SpankRecordError(
            f"{path} is not believed: it must be owned by root and writable by root alone "
            f"(owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)})"
        )


def _parse(path: Path, text: bytes, job_id: int, step: str) -> SpankRecord:
    try:
        data = json.loads(text)
        record = SpankRecord(
            job_id=_natural(data["job"]),
            step=str(data["step"]),
            uid=_natural(data["uid"]),
            ntasks=_natural(data["ntasks"]),
            ps_tasks=frozenset(_natural(task) for task in data["ps_tasks"]),
        )
    except (ValueError, TypeError, KeyError) as exc:
        raise SpankRecordError(f"{path} is malformed ({exc.__class__.__name__}: {exc})") from exc
    if (record.job_id, record.step) != (job_id, step):
        raise SpankRecordError(f"{path} describes job {record.job_id} step {record.step}")
    return record


def _natural(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r} is not a non-negative integer")
    return value
