"""A stand-in for the Kubernetes API server's pod list, for testing the controller's
Kubernetes source: no real API server can be installed on our build machines.

It serves GET /api/v1/pods and /api/v1/namespaces/NS/pods as a v1 PodList, honours
`labelSelector` existence and equality terms (`key`, `key=value`, comma-separated), and
answers 401 without the configured bearer token. Pods are given as dicts in the API's own
JSON shape; `kubeflow_pod` builds the ones a Kubeflow TFJob creates.

As a process (in a test's network namespace, where a controller under test can reach it):

    python -m tensorlights.testbed.kube_emulator --listen 10.0.0.2:0 --pods pods.json

serves the pods the JSON file lists (re-read on every request) and prints its URL when ready.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tensorlights.controller.sources import KUBEFLOW_JOB, KUBEFLOW_REPLICA


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


class KubeEmulator:
    def __init__(self, token: str = "", listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.pods: list[dict[str, Any]] = []
        self.requests = 0
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
                selector = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
                items = [
                    pod
                    for pod in emulator.current_pods()
                    if (namespace is None or pod["metadata"]["namespace"] == namespace)
                    and _selected(pod, selector)
                ]
                self._reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})

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
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def current_pods(self) -> list[dict[str, Any]]:
        return self.pods

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> KubeEmulator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class FilePods(KubeEmulator):
    """Serves the pods a JSON file lists, re-read on every request (a test edits the file)."""

    def __init__(self, pods_file: Path, listen: tuple[str, int]) -> None:
        super().__init__(listen=listen)
        self.pods_file = pods_file

    def current_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = json.loads(self.pods_file.read_text())
        return pods


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
