"""A stand-in for the Kubernetes API server's pods endpoint, for testing the controller's
Kubernetes source: no real API server can be installed on our build machines.

It serves GET /api/v1/pods and /api/v1/namespaces/NS/pods as the API server does: a v1
PodList with `metadata.resourceVersion`, or with `watch=true` a stream of watch events
(ADDED/MODIFIED/DELETED, one JSON object a line) from `resourceVersion` on (without one:
ADDED for every current pod first), ended after `timeoutSeconds`; a version older than the
retained history (`restart()` forgets it) gets the API server's 410 Expired ERROR event. It honours
`labelSelector` existence and equality terms (`key`, `key=value`, comma-separated) and
answers 401 without the configured bearer token. Pods are given as dicts in the API's own
JSON shape; `kubeflow_pod` builds the ones a Kubeflow TFJob creates. Every change of `pods`
is an event with the next resource version.

As a process (in a test's network namespace, where a controller under test can reach it):

    python -m tensorlights.testbed.kube_emulator --listen 10.0.0.2:0 --pods pods.json

serves the pods the JSON file lists (watched for changes) and prints its URL when ready.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import socket
import sys
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tensorlights.controller.kubernetes import KUBEFLOW_JOB, KUBEFLOW_REPLICA


def kubeflow_pod(
    namespace: str,
    job: str,
    replica_type: str,
    index: int,
    node: str,
    env: dict[str, str] | None = None,
    phase: str = "Running",
    run_as_user: int | None = None,
) -> dict[str, Any]:
    """A pod as the API server lists it; its uid is derived from its name, as stable as a
    real pod's for the life of the test."""
    name = f"{job}-{replica_type}-{index}"
    security = {} if run_as_user is None else {"securityContext": {"runAsUser": run_as_user}}
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"k8s:{namespace}/{name}")),
            "labels": {
                KUBEFLOW_JOB: job,
                KUBEFLOW_REPLICA: replica_type,
                "training.kubeflow.org/replica-index": str(index),
            },
        },
        "spec": {
            **security,
            "nodeName": node,
            "containers": [
                {
                    "name": "tensorflow",
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
                }
            ],
        },
        "status": {"phase": phase},
    }


def _selected(pod: dict[str, Any], selector: str) -> bool:
    labels = pod.get("metadata", {}).get("labels", {})
    for term in filter(None, selector.split(",")):
        key, sep, value = term.partition("=")
        if key not in labels or (sep and labels[key] != value):
            return False
    return True


@dataclass(frozen=True)
class _Event:
    version: int
    kind: str
    pod: dict[str, Any]


class _PodStore:
    """The pods by uid, each change an event with the next resource version."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.version = 1
        self.pods: dict[str, dict[str, Any]] = {}
        self.events: list[_Event] = []
        self.oldest = 1
        """Watching from a version older than this is 410 Expired (history compacted)."""

    def replace(self, pods: list[dict[str, Any]]) -> None:
        with self.changed:
            new = {pod["metadata"]["uid"]: pod for pod in pods}
            for uid in list(self.pods):
                if uid not in new:
                    self._record("DELETED", self.pods.pop(uid))
            for uid, pod in new.items():
                before = self.pods.get(uid)
                if before is not None and _unversioned(before) == pod:
                    continue
                self.pods[uid] = self._record("MODIFIED" if before else "ADDED", pod)
            self.changed.notify_all()

    def _record(self, kind: str, pod: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        versioned = copy.deepcopy(pod)
        versioned["metadata"]["resourceVersion"] = str(self.version)
        self.events.append(_Event(self.version, kind, versioned))
        return versioned

    def compact(self) -> None:
        with self.changed:
            self.events.clear()
            self.oldest = self.version + 1


def _unversioned(pod: dict[str, Any]) -> dict[str, Any]:
    bare = copy.deepcopy(pod)
    bare["metadata"].pop("resourceVersion", None)
    return bare


class KubeEmulator:
    def __init__(self, token: str = "", listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.store = _PodStore()
        self.requests = 0
        self.watches = 0
        """Watch requests served so far."""
        self.expired = 0
        """Watches refused with 410 Expired."""
        self._watchers: set[socket.socket] = set()
        self._closing = threading.Event()
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                emulator.requests += 1
                if token and self.headers.get("Authorization") != f"Bearer {token}":
                    self._reply(401, {"kind": "Status", "code": 401, "reason": "Unauthorized"})
                    return
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if parts == ["api", "v1", "pods"]:
                    namespace = None
                elif len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"]:
                    namespace = parts[3]
                else:
                    self._reply(404, {"kind": "Status", "code": 404})
                    return
                query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
                selector = query.get("labelSelector", "")

                def wanted(pod: dict[str, Any]) -> bool:
                    in_namespace = namespace is None or pod["metadata"]["namespace"] == namespace
                    return in_namespace and _selected(pod, selector)

                emulator.refresh()
                if query.get("watch") in ("true", "1"):
                    emulator.watches += 1
                    emulator._watchers.add(self.connection)
                    try:
                        self._watch(wanted, query)
                    finally:
                        emulator._watchers.discard(self.connection)
                    return
                with emulator.store.changed:
                    items = [pod for pod in emulator.store.pods.values() if wanted(pod)]
                    version = emulator.store.version
                self._reply(
                    200,
                    {
                        "kind": "PodList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": str(version)},
                        "items": items,
                    },
                )

            def _watch(
                self, wanted: Callable[[dict[str, Any]], bool], query: dict[str, str]
            ) -> None:
                store = emulator.store
                timeout = float(query.get("timeoutSeconds", "300"))
                end = time.monotonic() + timeout
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                since = query.get("resourceVersion", "")
                with store.changed:
                    if self.connection not in emulator._watchers:
                        # restart() cut it before it read the store: that server is gone.
                        # (Answered 410 on the cut connection, the client retried and
                        # got a second 410: `expired` counted 2 for one resumed watch.)
                        return
                    if since in ("", "0"):
                        backlog = [_Event(store.version, "ADDED", p) for p in store.pods.values()]
                        sent = store.version
                    elif int(since) + 1 < store.oldest:
                        gone = {"kind": "Status", "code": 410, "reason": "Expired",
                                "message": f"too old resource version: {since}"}  # fmt: skip
                        emulator.expired += 1
                        self._send([_Event(store.version, "ERROR", gone)])
                        return
                    else:
                        backlog, sent = [], int(since)
                try:
                    self._send([e for e in backlog if wanted(e.pod)])
                    while (
                        not emulator._closing.is_set()
                        and self.connection in emulator._watchers
                        and time.monotonic() < end
                    ):
                        with store.changed:
                            if store.version <= sent:  # else it changed while we were sending
                                left = max(0.0, end - time.monotonic())
                                store.changed.wait(timeout=min(0.2, left))
                            news = [e for e in store.events if e.version > sent]
                            sent = store.version  # every event up to now is in `news`
                        self._send([e for e in news if wanted(e.pod)])
                except OSError:
                    pass  # the client went away, or drop_watches() cut it

            def _send(self, events: list[_Event]) -> None:
                if events:
                    lines = (json.dumps({"type": e.kind, "object": e.pod}) + "\n" for e in events)
                    self.wfile.write("".join(lines).encode())
                    self.wfile.flush()

            def _reply(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(listen, Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def pods(self) -> list[dict[str, Any]]:
        with self.store.changed:
            return [_unversioned(pod) for pod in self.store.pods.values()]

    @pods.setter
    def pods(self, pods: list[dict[str, Any]]) -> None:
        self.store.replace(pods)

    def refresh(self) -> None:
        """Before each request: pods kept elsewhere (a file) are read again."""

    def restart(self, pods: list[dict[str, Any]]) -> None:
        """As an API server restart after these changes: every open watch is cut before it
        sees them, and the history is gone, so a client resuming from the version it last
        saw gets 410 Expired and must list again."""
        with self.store.changed:
            self.store.replace(pods)
            self.store.compact()
            for connection in list(self._watchers):
                self._watchers.discard(connection)
                with contextlib.suppress(OSError):
                    connection.shutdown(socket.SHUT_RDWR)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> KubeEmulator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()


class FilePods(KubeEmulator):
    """Serves the pods a JSON file lists: read again before every request and, while a
    watch is open, every 50 ms (a test edits the file)."""

    def __init__(self, pods_file: Path, listen: tuple[str, int]) -> None:
        super().__init__(listen=listen)
        self.pods_file = pods_file
        self._poller = threading.Thread(target=self._poll, daemon=True)

    def refresh(self) -> None:
        with contextlib.suppress(ValueError):  # caught mid-write: the next read gets it
            self.pods = json.loads(self.pods_file.read_text())

    def _poll(self) -> None:
        while not self._closing.wait(0.05):
            self.refresh()

    def __enter__(self) -> FilePods:
        super().__enter__()
        self.refresh()
        self._poller.start()
        return self


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", required=True, help="HOST:PORT (port 0: any free one)")
    parser.add_argument("--pods", required=True, type=Path, help="a JSON list of pods")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    with FilePods(args.pods, (host, int(port))) as emulator:
        print(emulator.url, flush=True)
        sys.stdin.read()  # until the test closes our stdin (or kills us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
