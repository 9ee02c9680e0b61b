"""tlctl's client of the controller's Operator API: over the local Unix socket (default) or
mutual TLS, answers as plain JSON-ready dicts (times in Unix seconds).

Any replica will do: a follower refuses naming the leader (the `tl-leader` trailing
metadata), and over TLS the client asks the leader instead, with the same certificate; over
the local socket it says where the leader is."""

from __future__ import annotations

import errno
import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from tensorlights.errors import PermanentError, TransientError
from tensorlights.rpc.convert import leader_named
from tensorlights.rpc.tls import channel_credentials, channel_options, diagnose
from tensorlights.rpc.v1 import operator_pb2 as pb
from tensorlights.rpc.v1 import operator_pb2_grpc as pb_grpc
from tensorlights.tls_files import TlsFiles


class ControllerUnavailable(TransientError):
    """The controller cannot be reached (or refused us); the message says what to do."""


def to_dict(message: Message) -> dict[str, Any]:
    """Every field (defaults included, unset optionals as None); `x_unix_ns` becomes `x`
    in Unix seconds (None when unset)."""
    result: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        name = field.name
        if field.is_repeated:
            value = [to_dict(v) if isinstance(v, Message) else v for v in value]
        elif isinstance(value, Message):
            value = to_dict(value)
        elif field.has_presence and not message.HasField(field.name):
            value = None
        if name.endswith("_unix_ns"):
            name = name.removesuffix("_unix_ns")
            name = name if name == "at" or name.endswith(("_at", "_since")) else f"{name}_at"
            value = value / 1e9 if value else None
        result[name] = value
    return result


def check_socket(path: Path) -> None:
    """Connect once by hand to tell the operator exactly why we cannot (gRPC says only
    UNAVAILABLE): no such socket, permission denied (EACCES), nobody listening."""
    try:
        mode = path.stat().st_mode
    except PermissionError as exc:
        raise PermanentError(
            f"permission denied on {path} (EACCES): run tlctl as root or as a member of the "
            "controller's socket_group"
        ) from exc
    except FileNotFoundError:
        raise ControllerUnavailable(
            f"no controller socket at {path}: is tensorlights-controller running on this "
            "host? (systemctl status tensorlights-controller; or use --controller HOST:PORT)"
        ) from None
    if not stat.S_ISSOCK(mode):
        raise PermanentError(f"{path} is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except PermissionError as exc:
        raise PermanentError(
            f"permission denied on {path} (EACCES, mode {stat.S_IMODE(mode):04o}): run tlctl as "
            "root or as a member of the controller's socket_group"
        ) from exc
    except OSError as exc:
        if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
            raise ControllerUnavailable(
                f"nothing listens on {path}: the controller is not running (a stale socket)"
            ) from exc
        raise ControllerUnavailable(f"{path}: {os.strerror(exc.errno or 0)}") from exc
    finally:
        probe.close()


class OperatorClient:
    def __init__(
        self,
        socket_path: Path | None = None,
        address: str | None = None,
        tls: TlsFiles | None = None,
        server_name: str | None = None,
        timeout_s: float = 5.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._tls = tls
        self._server_name = server_name
        if address is not None:
            if tls is None:
                raise PermanentError("--controller needs --ca, --cert and --key (mutual TLS)")
            self._dial(address, tls)
        else:
            assert socket_path is not None
            check_socket(socket_path)
            self.target = f"unix:{socket_path}"
            self._channel = grpc.insecure_channel(self.target)
        self._stub = pb_grpc.OperatorStub(self._channel)  # type: ignore[no-untyped-call]

    def _dial(self, address: str, tls: TlsFiles) -> None:
        self.target = address
        self._channel = grpc.secure_channel(
            address, channel_credentials(tls, "tlctl"), channel_options(self._server_name)
        )
        self._stub = pb_grpc.OperatorStub(self._channel)  # type: ignore[no-untyped-call]

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request: Message) -> Any:
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            if not self._to_leader(exc):
                raise self._explain(exc) from None
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self._explain(exc) from None

    def _to_leader(self, exc: grpc.RpcError) -> bool:
        """A follower named the leader: dial it instead (over TLS; once)."""
        leader = leader_named(exc)
        if leader is None or self._tls is None or leader == self.target:
            return False
        self._channel.close()
        self._dial(leader, self._tls)
        return True

    def _explain(self, exc: grpc.RpcError) -> Exception:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            if self._tls is not None:
                reason = diagnose(self.target, self._tls, self._server_name)
                if reason:
                    return PermanentError(f"UNAUTHENTICATED: {reason}")
            return ControllerUnavailable(
                f"the controller at {self.target} does not answer ({code.name}): is "
                "tensorlights-controller running?"
            )
        return PermanentError(f"the controller refused: {code.name}: {details}")

    def jobs(self) -> list[dict[str, Any]]:
        return [to_dict(j) for j in self._call("ListJobs", pb.ListJobsRequest()).jobs]

    def hosts(self) -> list[dict[str, Any]]:
        return [to_dict(h) for h in self._call("ListHosts", pb.ListHostsRequest()).hosts]

    def rotations(self, host: str = "", upcoming: int = 3) -> dict[str, Any]:
        reply = self._call("GetRotations", pb.GetRotationsRequest(host=host, upcoming=upcoming))
        return to_dict(reply)

    def watch(self, interval_s: float) -> Iterator[dict[str, Any]]:
        request = pb.WatchRequest(interval_ms=round(interval_s * 1000))
        for attempt in range(2):
            stream = self._stub.Watch(request)
            try:
                for view in stream:
                    yield to_dict(view)
                return
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.CANCELLED:
                    return
                if attempt == 0 and self._to_leader(exc):
                    continue
                raise self._explain(exc) from None
            finally:
                stream.cancel()
