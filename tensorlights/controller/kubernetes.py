"""The Kubernetes membership source: Kubeflow training pods (label
`training.kubeflow.org/job-name`) from the API server, through the `lightkube` client.

It lists the pods once, then watches them from the list's resource version, so a pod that
starts, moves or ends changes the controller's membership as soon as the API server says so
(it wakes the controller's source loop); `jobs()` answers from that cache. Any break in the
watch (the connection, a 410 Expired history, a 401 after the service-account token rotated)
makes `jobs()` fail until a fresh list (token read again) succeeds: the controller keeps the
last good answer meanwhile, and the watcher retries with backoff (0.5 s to 30 s).

There is no API server installable on our build machines: this source is tested against an
emulator that speaks the same list and watch protocol (tensorlights.testbed.kube_emulator); it
has not run against a real cluster.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx2
from lightkube import ALL_NS, ApiError, Client, KubeConfig
from lightkube.config.models import Cluster, User
from lightkube.core.exceptions import ConfigError as LightkubeConfigError
from lightkube.core.exceptions import LoadResourceError
from lightkube.operators import Operator, exists
from lightkube.resources.core_v1 import Pod

from tensorlights.controller.registry import PodPlacement, SourceJob
from tensorlights.discovery.rules import launcher_job
from tensorlights.errors import TransientError
from tensorlights.threads import daemon_thread

KUBEFLOW_JOB = "training.kubeflow.org/job-name"
KUBEFLOW_REPLICA = "training.kubeflow.org/replica-type"
PS_REPLICA_TYPES = frozenset({"ps"})

WATCH_SERVER_TIMEOUT_S = 300
"""The API server ends each watch request after this; lightkube resumes it from the last
event's version (no relist)."""
BACKOFF_S = (0.5, 30.0)


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
    """Kubeflow pods of all namespaces (or `namespace`), with a bearer token and CA bundle
    (a service account's, typically). The watch starts at the first `jobs()` or
    `subscribe()`; `close()` ends it."""

    name = "kubernetes"

    def __init__(
        self,
        api_url: str,
        namespace: str = "",
        token_file: Path | None = None,
        ca_file: Path | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.api_url = api_url.rstrip("/")
        self.namespace = namespace
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}
        self._synced = threading.Event()
        """Set while the cache reflects a list and an unbroken watch since."""
        self._error: str | None = None
        self._settled = threading.Event()
        """Set once the first list has succeeded or failed."""
        self._wake: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.relists = 0
        """Lists done (the first and one after every break of the watch)."""

    def subscribe(self, wake: Callable[[], None]) -> None:
        """`wake()` is called (from the watcher's thread) whenever the pods may have changed."""
        self._wake.append(wake)
        self._start()

    def jobs(self) -> list[SourceJob]:
        self._start()
        self._settled.wait(self.timeout_s)
        with self._lock:
            if not self._synced.is_set():
                why = self._error or f"no answer within {self.timeout_s:g} s"
                raise TransientError(f"Kubernetes API {self.api_url}: {why}")
            pods = list(self._pods.values())
        return parse_pod_list({"kind": "PodList", "items": pods})

    @property
    def synced(self) -> bool:
        """The cache reflects a list and an unbroken watch since."""
        return self._synced.is_set()

    def close(self) -> None:
        """Stops the watcher: it wakes no one any more, and its (daemon) thread ends at the
        stream's next line or end, whichever comes first; a read blocked on the socket
        cannot be interrupted from here."""
        self._stop.set()
        self._wake.clear()

    # The watcher's thread ------------------------------------------------------------

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = daemon_thread(self._run, "kubernetes-watch")
                self._thread.start()

    def _run(self) -> None:
        backoff = BACKOFF_S[0]
        while not self._stop.is_set():
            try:
                self._list_and_watch()
            except (ApiError, httpx2.HTTPError, httpx2.StreamError, LightkubeConfigError,
                    LoadResourceError, OSError, ValueError) as exc:  # fmt: skip
                if self._stop.is_set():
                    return
                self._broken(_describe(exc))
            else:
                if self._stop.is_set():
                    return
                self._broken("the watch ended")
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, BACKOFF_S[1])
            if self._synced.is_set():
                backoff = BACKOFF_S[0]

    def _list_and_watch(self) -> None:
        client = Client(
            self._config(), timeout=httpx2.Timeout(self.timeout_s, read=None), trust_env=False
        )
        namespace = self.namespace or ALL_NS
        selector: dict[str, str | Operator[Any] | Iterable[Any] | None] = {KUBEFLOW_JOB: exists()}
        listing = client.list(Pod, namespace=namespace, labels=selector)
        pods = {_uid_of(pod): pod.to_dict() for pod in listing}
        version = listing.resourceVersion
        self.relists += 1
        with self._lock:
            self._pods, self._error = pods, None
            self._synced.set()
        self._settled.set()
        self._notify()
        for kind, pod in client.watch(
            Pod,
            namespace=namespace,
            labels=selector,
            resource_version=version,
            server_timeout=WATCH_SERVER_TIMEOUT_S,
        ):
            if self._stop.is_set():
                return
            with self._lock:
                if kind == "DELETED":
                    self._pods.pop(_uid_of(pod), None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._pods[_uid_of(pod)] = pod.to_dict()
                else:
                    continue  # BOOKMARK: nothing changed
            self._notify()

    def _broken(self, why: str) -> None:
        with self._lock:
            self._synced.clear()
            self._error = f"{why} (listing again)"
        self._settled.set()
        self._notify()

    def _notify(self) -> None:
        for wake in list(self._wake):
            wake()

    def _config(self) -> KubeConfig:
        # The token is read again at every (re)list: service-account tokens rotate.
        token = self.token_file.read_text().strip() if self.token_file is not None else None
        cluster = Cluster(
            server=self.api_url,
            certificate_auth=str(self.ca_file) if self.ca_file is not None else None,
        )
        return KubeConfig.from_one(cluster=cluster, user=User(token=token))


def _uid_of(pod: Pod) -> str:
    meta = pod.metadata
    uid = meta.uid if meta is not None else None
    if not uid:
        raise ValueError("a pod without metadata.uid")
    return uid


def _describe(exc: Exception) -> str:
    if isinstance(exc, ApiError):
        status = exc.status
        return f"{status.code} {status.reason or ''}: {status.message or ''}".strip(" :")
    return f"{exc.__class__.__name__}: {exc}"
