"""Membership sources other than the agents: Slurm, a static jobs file (here) and Kubernetes
(controller/kubernetes.py).

Each has `name` and a blocking `jobs()` that returns `SourceJob`s or raises TransientError
(the controller keeps the last good answer and retries) or PermanentError.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from tensorlights.controller.registry import SourceJob
from tensorlights.controller.slurm import SlurmSource
from tensorlights.errors import ConfigError, TransientError
from tensorlights.model import host_name_problem, job_id_problem


class SlurmMembership:
    name = "slurm"

    def __init__(self, source: SlurmSource) -> None:
        self.source = source

    def jobs(self) -> list[SourceJob]:
        return [
            SourceJob(
                job=job.job,
                source=self.name,
                name=job.name,
                nodes=job.nodes,
                state=job.state,
                user=job.user,
                end_time=job.end_time,
            )
            for job in self.source.jobs()
        ]


def parse_jobs_file(text: str, origin: str = "jobs file") -> list[SourceJob]:
    """[[job]] tables with id, ps_hosts and optional name, user; every entry checked."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{origin}: {exc}") from exc
    unknown = set(document) - {"job"}
    if unknown:
        raise ConfigError(f"{origin}: unknown keys {sorted(unknown)} (expected [[job]] tables)")
    jobs: dict[str, SourceJob] = {}
    for index, entry in enumerate(document.get("job", [])):
        where = f"{origin}: job #{index + 1}"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a table")
        extra = set(entry) - {"id", "ps_hosts", "name", "user"}
        if extra:
            raise ConfigError(f"{where}: unknown keys {sorted(extra)}")
        hosts = entry.get("ps_hosts")
        if not isinstance(hosts, list) or not hosts or not all(isinstance(h, str) for h in hosts):
            raise ConfigError(f"{where}: ps_hosts must be a non-empty list of host names")
        job = str(entry.get("id", ""))
        problem = job_id_problem(job) or next(filter(None, map(host_name_problem, hosts)), None)
        if problem:
            raise ConfigError(f"{where}: {problem}")
        ps_hosts = frozenset(hosts)
        if job in jobs:
            raise ConfigError(f"{where}: job {job} is listed twice")
        jobs[job] = SourceJob(
            job=job,
            source="static",
            name=str(entry.get("name", "")),
            ps_hosts=ps_hosts,
            nodes=tuple(sorted(ps_hosts)),
            user=str(entry.get("user", "")),
        )
    return list(jobs.values())


class StaticJobsFile:
    """A TOML jobs file, re-read when it changes. A file that becomes invalid keeps the last
    good jobs (the error is reported); one that disappears is an error too."""

    name = "static"

    def __init__(self, path: Path) -> None:
        self.path = path
        self._seen: tuple[float, int] | None = None
        self._jobs: list[SourceJob] = []
        parse_jobs_file(self._read(), str(path))  # refuse to start on a bad file

    def _read(self) -> str:
        try:
            return self.path.read_text()
        except OSError as exc:
            raise ConfigError(f"jobs file {self.path}: {exc.strerror}") from exc

    def jobs(self) -> list[SourceJob]:
        try:
            stat = self.path.stat()
        except OSError as exc:
            raise TransientError(f"jobs file {self.path}: {exc.strerror}") from exc
        seen = (stat.st_mtime, stat.st_size)
        if seen != self._seen:
            try:
                self._jobs = parse_jobs_file(self._read(), str(self.path))
            except ConfigError as exc:
                raise TransientError(f"{exc} (keeping the previous jobs)") from exc
            self._seen = seen
        return self._jobs
