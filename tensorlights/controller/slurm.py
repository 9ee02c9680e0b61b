"""Job membership from Slurm: which jobs run and on which nodes (`squeue --json`).

A Slurm job is `slurm/<job id>` here, the same name the agents' discovery gives the processes
that carry its SLURM_JOB_ID (or sit in its cgroup), so the two meet in one job registry.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensorlights.errors import PermanentError, TransientError

ACTIVE_STATES = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"})


@dataclass(frozen=True)
class SlurmJob:
    job: str
    """Our job id: slurm/<id>."""
    slurm_id: int
    name: str
    state: str
    user: str
    nodes: tuple[str, ...]
    end_time: float | None = None
    """When its time limit runs out (Unix seconds); None without a limit."""


def _number(value: Any) -> int | None:
    """A squeue number: plain (22.05) or {"set", "infinite", "number"} (23.02 and later)."""
    if isinstance(value, dict):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _end_time(raw: dict[str, Any]) -> float | None:
    limit = _number(raw.get("time_limit"))  # minutes
    end = _number(raw.get("end_time"))
    start = _number(raw.get("start_time"))
    # Unlimited jobs carry a huge or missing limit and an end time a year or more away.
    if limit is None or not 0 < limit < 366 * 24 * 60 or not end or not start or end <= start:
        return None
    return float(end)


def parse_squeue(text: str) -> list[SlurmJob]:
    """Active jobs from `squeue --json` (Slurm 22.05 layout); pending ones have no nodes."""
    try:
        document: Any = json.loads(text)
        raw_jobs = document["jobs"]
    except (ValueError, KeyError, TypeError) as exc:
        raise TransientError(f"squeue --json printed something else: {exc}") from exc
    jobs = []
    for raw in raw_jobs:
        state = str(raw.get("job_state", ""))
        if state not in ACTIVE_STATES:
            continue
        allocated = (raw.get("job_resources") or {}).get("allocated_nodes") or []
        nodes = tuple(sorted({str(node["nodename"]) for node in allocated if "nodename" in node}))
        jobs.append(
            SlurmJob(
                job=f"slurm/{raw['job_id']}",
                slurm_id=int(raw["job_id"]),
                name=str(raw.get("name", "")),
                state=state,
                user=str(raw.get("user_name", "")),
                nodes=nodes,
                end_time=_end_time(raw),
            )
        )
    return sorted(jobs, key=lambda job: job.slurm_id)


class SlurmSource:
    """Reads the running jobs from Slurm's own `squeue` (the cluster's configuration and
    authentication are squeue's: SLURM_CONF and munge, as for any Slurm client)."""

    def __init__(
        self,
        command: Sequence[str] = ("squeue", "--json"),
        env: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.command = list(command)
        self.env = dict(env) if env is not None else dict(os.environ)
        self.timeout_s = timeout_s

    def jobs(self) -> list[SlurmJob]:
        try:
            result = subprocess.run(
                self.command, capture_output=True, text=True, env=self.env, timeout=self.timeout_s
            )
        except FileNotFoundError as exc:
            raise PermanentError(
                f"{self.command[0]} not found: install slurm-client, or disable the Slurm source"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise TransientError(f"{' '.join(self.command)} took over {self.timeout_s} s") from exc
        if result.returncode != 0:
            raise TransientError(
                f"{' '.join(self.command)} failed ({result.returncode}): {result.stderr.strip()}"
            )
        return parse_squeue(result.stdout)
