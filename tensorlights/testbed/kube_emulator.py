"""A stand-in for the Kubernetes API server's pod list, for testing the controller's
Kubernetes source: no real API server can be installed on our build machines.

It serves GET /api/v1/pods and /api/v1/namespaces/NS/pods as a v1 PodList, honours
`labelSelector` existence and equality terms (`key`, `key=value`, comma-separated), and
answers 401 without the configured bearer token. Pods are given as dicts in the API's own
JSON shape; `kubeflow_pod` builds the ones a Kubeflow TFJob creates.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job}-{replica_type}-{index}",
            "namespace": namespace,
            "labels": {
                KUBEFLOW_JOB: job,
                KUBEFLOW_REPLICA: replica_type,
                "training.kubeflow.org/replica-index": str(index),
            },
        },
        "spec": {
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
    def __init__(self, token: str = "") -> None:
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
                    for pod in emulator.pods
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

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

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
