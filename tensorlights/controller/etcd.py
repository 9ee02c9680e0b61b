"""A minimal etcd v3 client over etcd's JSON gateway (`/v3/...`, HTTP), for what the
controller's leader election needs: leases, a transaction, a read. Blocking: the controller
calls it in a thread.

Why not a client library: the Python etcd3 package is built on protobuf 3 stubs that do not
load beside ours (protobuf 7), and the gateway is part of every etcd >= 3.4 server. Keys and
values travel base64-encoded; 64-bit numbers as strings.

Every request goes to one endpoint with a timeout; an endpoint that fails (refused, timed
out: a member cut off from the quorum does not answer linearizable requests) is left for the
next one, and the one that answered is tried first next time. Only when none answers is
EtcdUnavailable raised.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tensorlights.errors import TensorLightsError

REQUEST_TIMEOUT_S = 1.0


class EtcdError(TensorLightsError):
    """etcd refused a request (an answer, not an outage)."""


class EtcdUnavailable(EtcdError):
    """No endpoint answered."""


@dataclass(frozen=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    lease: int


@dataclass(frozen=True)
class Compare:
    """A transaction guard: `target` (CREATE, MOD, VALUE) of `key` EQUAL to `value`."""

    key: bytes
    target: str
    value: int | bytes

    def to_json(self) -> dict[str, Any]:
        field = {"CREATE": "create_revision", "MOD": "mod_revision", "VALUE": "value"}[self.target]
        value = _b64(self.value) if isinstance(self.value, bytes) else str(self.value)
        return {"key": _b64(self.key), "result": "EQUAL", "target": self.target, field: value}


def put(key: bytes, value: bytes, lease: int = 0) -> dict[str, Any]:
    request: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        request["lease"] = str(lease)
    return {"request_put": request}


def get(key: bytes) -> dict[str, Any]:
    return {"request_range": {"key": _b64(key)}}


def delete(key: bytes) -> dict[str, Any]:
    return {"request_delete_range": {"key": _b64(key)}}


class EtcdClient:
    def __init__(self, endpoints: Sequence[str], timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if not endpoints:
            raise ValueError("at least one etcd endpoint")
        self.endpoints = [endpoint.rstrip("/") for endpoint in endpoints]
        self.timeout_s = timeout_s
        self._first = 0

    def grant(self, ttl_s: int) -> int:
        return int(self._post("/v3/lease/grant", {"TTL": str(ttl_s)})["ID"])

    def keepalive(self, lease: int) -> int:
        """The lease's TTL as renewed now; 0 when it has expired (or never existed)."""
        result = self._post("/v3/lease/keepalive", {"ID": str(lease)}).get("result", {})
        return int(result.get("TTL", 0))

    def revoke(self, lease: int) -> None:
        self._post("/v3/lease/revoke", {"ID": str(lease)})

    def get(self, key: bytes) -> KeyValue | None:
        kvs = self._post("/v3/kv/range", {"key": _b64(key)}).get("kvs", [])
        return _key_value(kvs[0]) if kvs else None

    def txn(
        self,
        compare: Sequence[Compare],
        success: Sequence[dict[str, Any]],
        failure: Sequence[dict[str, Any]] = (),
    ) -> tuple[bool, list[dict[str, Any]]]:
        """(whether every guard held, the responses of the branch taken)."""
        reply = self._post(
            "/v3/kv/txn",
            {
                "compare": [c.to_json() for c in compare],
                "success": list(success),
                "failure": list(failure),
            },
        )
        return bool(reply.get("succeeded", False)), list(reply.get("responses", []))

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(body).encode()
        errors = []
        count = len(self.endpoints)
        for step in range(count):
            index = (self._first + step) % count
            endpoint = self.endpoints[index]
            request = urllib.request.Request(
                endpoint + path, data=data, headers={"Content-Type": "application/json"}
            )
            try:
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                    reply: dict[str, Any] = json.loads(response.read())
            except urllib.error.HTTPError as exc:
                if exc.code < 500:  # the request itself was refused: no other member helps
                    raise EtcdError(f"etcd {path}: {_message(exc)}") from None
                errors.append(f"{endpoint}: {_message(exc)}")
                continue
            except (TimeoutError, urllib.error.URLError, OSError, ValueError) as exc:
                errors.append(f"{endpoint}: {_reason(exc)}")
                continue
            if "error" in reply:  # a streaming call's failure comes as 200 {"error": ...}
                error = reply["error"]
                message = error.get("message", error) if isinstance(error, dict) else error
                errors.append(f"{endpoint}: {message}")
                continue
            self._first = index
            return reply
        raise EtcdUnavailable(f"etcd {path}: no endpoint answered ({'; '.join(errors)})")


def range_value(responses: Sequence[dict[str, Any]]) -> KeyValue | None:
    """The key a transaction's range request read, if it exists."""
    for response in responses:
        kvs = response.get("response_range", {}).get("kvs", [])
        if kvs:
            return _key_value(kvs[0])
    return None


def _key_value(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=base64.b64decode(raw["key"]),
        value=base64.b64decode(raw.get("value", "")),
        create_revision=int(raw.get("create_revision", 0)),
        mod_revision=int(raw.get("mod_revision", 0)),
        lease=int(raw.get("lease", 0)),
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _message(exc: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(exc.read())
    except (OSError, ValueError):
        return f"HTTP {exc.code}"
    return f"HTTP {exc.code}: {body.get('message') or body.get('error') or body}"


def _reason(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc) or type(exc).__name__
