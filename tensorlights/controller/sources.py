"""Membership sources other than the agents: Slurm, a static jobs file, Kubernetes.

Each has `name` and a blocking `jobs()` that returns `SourceJob`s or raises TransientError
(the controller keeps the last good answer and retries) or PermanentError.

Kubernetes: reads Kubeflow training pods (label `training.kubeflow.org/job-name`) from the API
server's pod list. There is no API server installable on our build machines, so this source
is tested against an emulator that serves the same JSON (tensorlights.testbed.kube_emulator);
it has not run against a real cluster.
"""

from __future__ import annotations

import json
import ssl
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tensorlights.controller.registry import PodPlacement, SourceJob
from tensorlights.controller.slurm import SlurmSource
from tensorlights.discovery.rules import launcher_job
from tensorlights.errors import ConfigError, TransientError
from tensorlights.model import host_name_problem, job_id_problem

KUBEFLOW_JOB = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA = "training.kubeflow.org/replica-type"
PS_REPLICA_TYPES = frozenset({"ps"})


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


def parse_pod_list(document: Mapping[str, Any]) -> list[SourceJob]:
    """Kubeflow training jobs from a v1 PodList: running pods with a node, grouped by
    namespace and job name; PS pods' nodes are the PS hosts. The job id is the one agents
    give the processes (from the pod's TF_CONFIG, DMLC or torch environment) when there is
    one, else k8s/<namespace>/<job name>."""
    if document.get("kind") not in (None, "PodList") or not isinstance(document.get("items"), list):
        raise TransientError("the API server's answer is not a PodList")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for pod in document["items"]:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        job_name = labels.get(KUBEFLOW_JOB)
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not job_name or not node or phase != "Running":
            continue
        group = groups.setdefault(
            (str(meta.get("namespace", "default")), str(job_name)),
            {"nodes": set(), "ps": set(), "ids": set(), "pods": []},
        )
        group["nodes"].add(str(node))
        if isinstance(meta.get("uid"), str) and meta["uid"]:
            group["pods"].append(PodPlacement(meta["uid"], str(node), _run_as_user(pod)))
        replica = str(labels.get(KUBEFLOW_REPLICA, "")).lower()
        if replica in PS_REPLICA_TYPES:
            group["ps"].add(str(node))
        for container in (pod.get("spec") or {}).get("containers") or []:
            env = {
                str(item["name"]): str(item["value"])
                for item in container.get("env") or []
                if "name" in item and isinstance(item.get("value"), str)
            }
            found = launcher_job(env)
            if found is not None:
                group["ids"].add(found[0])
    jobs = []
    for (namespace, job_name), group in sorted(groups.items()):
        ids = sorted(group["ids"])
        job = ids[0] if len(ids) == 1 else f"k8s/{namespace}/{job_name}"
        jobs.append(
            SourceJob(
                job=job,
                source="kubernetes",
                name=f"{namespace}/{job_name}",
                ps_hosts=frozenset(group["ps"]),
                nodes=tuple(sorted(group["nodes"])),
                state="RUNNING",
                pods=tuple(sorted(group["pods"], key=lambda pod: pod.uid)),
            )
        )
    return jobs


def _run_as_user(pod: Mapping[str, Any]) -> int | None:
    """The uid every container of the pod runs as (a container's securityContext.runAsUser,
    else the pod's), or None when the pod does not fix one for all of them."""
    spec = pod.get("spec") or {}
    default = _uid((spec.get("securityContext") or {}).get("runAsUser"))
    uids = set()
    for container in spec.get("containers") or []:
        own = _uid((container.get("securityContext") or {}).get("runAsUser"))
        uids.add(default if own is None else own)
    return uids.pop() if len(uids) == 1 else None


def _uid(value: Any) -> int | None:
    is_uid = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32
    return value if is_uid else None


class KubernetesPods:
    """GET <api>/api/v1/pods?labelSelector=training.kubeflow.org/job-name (one namespace
    with `namespace`), with a bearer token and CA bundle (a service account's, typically)."""

    name = "kubernetes"

    def __init__(
        self,
        api_url: str,
        namespace: str = "",
        token_file: Path | None = None,
        ca_file: Path | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        base = api_url.rstrip("/")
        path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
        self.url = f"{base}{path}?" + urllib.parse.urlencode({"labelSelector": KUBEFLOW_JOB})
        self.token_file = token_file
        self.context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None
        self.timeout_s = timeout_s

    def jobs(self) -> list[SourceJob]:
        request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
        if self.token_file is not None:
            token = self.token_file.read_text().strip()
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self.context
            ) as response:
                document = json.load(response)
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise TransientError(f"Kubernetes API {self.url}: {exc}") from exc
        if not isinstance(document, dict):
            raise TransientError("the API server's answer is not a PodList")
        return parse_pod_list(document)
