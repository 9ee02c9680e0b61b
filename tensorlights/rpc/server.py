"""The controller's gRPC services (asyncio): wire bytes in, checked model objects to the
controller, wire messages out.

Handlers take raw bytes and parse them here (convert.py) rather than letting gRPC do it, so
that a message that does not parse is INVALID_ARGUMENT like any other bad input, and no
state changes. With mTLS, an agent may speak only for the host its certificate names.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, NoReturn, TypeAlias

import grpc

from tensorlights.controller.core import Controller, HostRotations, NotLeader
from tensorlights.controller.registry import HostRecord, JobView, StaleMessage, UnknownSession
from tensorlights.rpc import convert
from tensorlights.rpc.convert import LEADER_METADATA, InvalidMessage
from tensorlights.rpc.tls import peer_common_name, peer_roles
from tensorlights.rpc.v1 import agent_link_pb2 as link_pb
from tensorlights.rpc.v1 import operator_pb2 as op_pb
from tensorlights.tls_files import ROLE_URI, Role

Context: TypeAlias = "grpc.aio.ServicerContext[bytes, Any]"

AGENT_LINK = "tensorlights.rpc.v1.AgentLink"
OPERATOR = "tensorlights.rpc.v1.Operator"
MIN_WATCH_INTERVAL_S = 0.1


def _ns(seconds: float | None) -> int:
    return 0 if seconds is None else round(seconds * 1e9)


class _Handlers:
    def __init__(
        self, controller: Controller, check_identity: bool, role: Role | None = None
    ) -> None:
        self.controller = controller
        self.check_identity = check_identity
        self.role = role
        """The role a client certificate must carry (None: the local socket, no TLS)."""

    async def reject(self, context: Context, code: grpc.StatusCode, details: str) -> NoReturn:
        self.controller.metrics.rejected.labels(code.name).inc()
        await context.abort(code, details)
        raise AssertionError("abort returns only by raising")

    async def leading(self, context: Context) -> None:
        """Only the leader serves agents and operators: a follower names it (the `tl-leader`
        trailing metadata, which clients follow) and refuses."""
        if not self.controller.leading:
            await self.not_leader(context, NotLeader(self.controller.leader))

    async def not_leader(self, context: Context, exc: NotLeader) -> NoReturn:
        if exc.leader:
            context.set_trailing_metadata(((LEADER_METADATA, exc.leader),))
        await self.reject(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))

    async def checked(self, context: Context, parse: Callable[[bytes], Any], data: bytes) -> Any:
        try:
            return parse(data)
        except InvalidMessage as exc:
            await self.reject(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))

    async def authorized(self, context: Context) -> None:
        """The client certificate carries this service's role: an operator's certificate
        cannot speak for a host, an agent's cannot read the cluster."""
        if self.role is not None and self.role not in peer_roles(context):
            await self.reject(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the client certificate does not carry the {self.role} role "
                f"(SAN URI {ROLE_URI}{self.role})",
            )

    async def identity(self, context: Context, host: str) -> None:
        if not self.check_identity:
            return
        await self.authorized(context)
        name = peer_common_name(context)
        if name != host:
            await self.reject(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"the client certificate is for {name!r}, not for host {host!r}",
            )

    async def session(self, context: Context, session: str) -> HostRecord:
        try:
            record = self.controller.registry.session(session)
        except UnknownSession as exc:
            await self.reject(context, grpc.StatusCode.NOT_FOUND, str(exc))
        await self.identity(context, record.host)
        return record

    # AgentLink ----------------------------------------------------------------------------

    async def register(self, data: bytes, context: Context) -> link_pb.RegisterReply:
        registration = await self.checked(context, convert.registration, data)
        await self.identity(context, registration.host)
        try:
            record = self.controller.register(registration)
        except NotLeader as exc:
            await self.not_leader(context, exc)
        except StaleMessage as exc:
            await self.reject(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return link_pb.RegisterReply(
            session=record.session,
            controller_incarnation=self.controller.planner.incarnation,
            report_interval_ms=round(self.controller.report_interval_s * 1000),
            heartbeat_interval_ms=round(self.controller.heartbeat_interval_s * 1000),
        )

    async def report(self, data: bytes, context: Context) -> link_pb.ReportReply:
        started = time.perf_counter()
        report = await self.checked(context, convert.report, data)
        await self.session(context, report.session)
        try:
            record = self.controller.report(report)
        except StaleMessage as exc:
            await self.reject(context, grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except UnknownSession as exc:
            await self.reject(context, grpc.StatusCode.NOT_FOUND, str(exc))
        reply = convert.report_reply(
            report.seq,
            self.controller.vouchers_for(record.host),
            self.controller.renewing(record.host),
        )
        self.controller.metrics.report_seconds.observe(time.perf_counter() - started)
        return reply

    async def watch_plan(self, data: bytes, context: Context) -> AsyncIterator[link_pb.HostPlan]:
        session = await self.checked(context, convert.watch_plan_session, data)
        record = await self.session(context, session)
        controller = self.controller
        changed = controller.stream_opened(record)
        why = "changed"
        try:
            while controller.current(record):
                plan = controller.plan_for(record.host)
                yield convert.plan_message(plan)
                controller.plan_sent(record.host, plan)
                controller.metrics.plans_sent.labels(why).inc()
                # The next plan, or this one again when no report's reply renewed its lease.
                why = "lease"
                while not changed.is_set():
                    wait_s = controller.resend_at(record.host) - time.monotonic()
                    if wait_s <= 0:
                        break
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), wait_s)
                if changed.is_set():
                    why = "changed"
                changed.clear()
        finally:
            controller.stream_closed(record)

    # Operator -----------------------------------------------------------------------------

    async def list_jobs(self, data: bytes, context: Context) -> op_pb.ListJobsReply:
        await self.authorized(context)
        await self.leading(context)
        await self.checked(context, lambda d: convert.parse(op_pb.ListJobsRequest, d), data)
        return op_pb.ListJobsReply(jobs=self._jobs())

    async def list_hosts(self, data: bytes, context: Context) -> op_pb.ListHostsReply:
        await self.authorized(context)
        await self.leading(context)
        await self.checked(context, lambda d: convert.parse(op_pb.ListHostsRequest, d), data)
        return op_pb.ListHostsReply(hosts=self._hosts())

    async def get_rotations(self, data: bytes, context: Context) -> op_pb.GetRotationsReply:
        await self.authorized(context)
        await self.leading(context)
        request = await self.checked(
            context, lambda d: convert.parse(op_pb.GetRotationsRequest, d), data
        )
        if request.upcoming > 100:
            await self.reject(context, grpc.StatusCode.INVALID_ARGUMENT, "upcoming: at most 100")
        if request.host and request.host not in self.controller.registry.hosts:
            await self.reject(
                context, grpc.StatusCode.NOT_FOUND, f"no agent of host {request.host!r} is known"
            )
        return op_pb.GetRotationsReply(
            at_unix_ns=_ns(self.controller.now()),
            hosts=self._rotations(request.host, request.upcoming or 3),
        )

    async def watch(self, data: bytes, context: Context) -> AsyncIterator[op_pb.ClusterView]:
        await self.authorized(context)
        await self.leading(context)
        request = await self.checked(context, lambda d: convert.parse(op_pb.WatchRequest, d), data)
        interval_s = max(MIN_WATCH_INTERVAL_S, (request.interval_ms or 1000) / 1000)
        while True:
            yield op_pb.ClusterView(
                at_unix_ns=_ns(self.controller.now()),
                generation=self.controller.planner.generation,
                jobs=self._jobs(),
                hosts=self._hosts(),
                rotations=self._rotations("", 3),
            )
            await asyncio.sleep(interval_s)

    def _jobs(self) -> list[op_pb.Job]:
        return [_job_message(view, share) for view, share in self.controller.jobs()]

    def _hosts(self) -> list[op_pb.Host]:
        planner = self.controller.planner
        return [
            op_pb.Host(
                host=r.host,
                connected=r.connected,
                mode=r.mode,
                last_report_unix_ns=_ns(r.last_report_at),
                interfaces=[
                    link_pb.Interface(name=n, link_rate_bps=rate)
                    for n, rate in r.registration.interfaces
                ],
                jobs=sorted(r.jobs),
                agent_version=r.registration.agent_version,
                health=r.health,
                plan_generation=planner.plan_for(r.host).generation,
            )
            for r in self.controller.hosts()
        ]

    def _rotations(self, host: str, upcoming: int) -> list[op_pb.HostRotation]:
        return [_rotation_message(r) for r in self.controller.rotations(host, upcoming)]


def _job_message(view: JobView, share: float) -> op_pb.Job:
    message = op_pb.Job(
        job=view.job,
        name=view.name,
        sources=list(view.sources),
        ps_hosts=list(view.ps_hosts),
        nodes=list(view.nodes),
        state=view.state,
        user=view.user,
        green_share=share,
        kind=view.kind,
    )
    if view.spread_s is not None:
        message.spread_s = view.spread_s
    if view.period_s is not None:
        message.period_s = view.period_s
    if view.demand is not None:
        message.demand = view.demand
    if view.remaining_s is not None:
        message.remaining_s = view.remaining_s
    return message


def _rotation_message(rotations: HostRotations) -> op_pb.HostRotation:
    view = rotations.view
    return op_pb.HostRotation(
        host=view.host,
        green=view.green or "",
        green_since_unix_ns=_ns(view.green_since),
        next=view.next or "",
        next_at_unix_ns=_ns(view.next_at),
        upcoming=[op_pb.Upcoming(green=job, at_unix_ns=_ns(at)) for job, at in view.upcoming],
        recent=[
            link_pb.Rotation(green=g, applied_unix_ns=_ns(at), plan_generation=gen)
            for g, at, gen in rotations.recent
        ],
    )


def _unary(
    behaviour: Callable[[bytes, Context], Awaitable[Any]], reply: type[Any]
) -> grpc.RpcMethodHandler[bytes, Any]:
    return grpc.unary_unary_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=reply.SerializeToString
    )


def _stream(
    behaviour: Callable[[bytes, Context], AsyncIterator[Any]], reply: type[Any]
) -> grpc.RpcMethodHandler[bytes, Any]:
    return grpc.unary_stream_rpc_method_handler(
        behaviour, request_deserializer=None, response_serializer=reply.SerializeToString
    )


def agent_link_service(controller: Controller, check_identity: bool) -> grpc.GenericRpcHandler:
    """With check_identity (mTLS): the certificate carries the agent role and names the host."""
    handlers = _Handlers(controller, check_identity, Role.AGENT if check_identity else None)
    return grpc.method_handlers_generic_handler(
        AGENT_LINK,
        {
            "Register": _unary(handlers.register, link_pb.RegisterReply),
            "Report": _unary(handlers.report, link_pb.ReportReply),
            "WatchPlan": _stream(handlers.watch_plan, link_pb.HostPlan),
        },
    )


def operator_service(controller: Controller, role: Role | None) -> grpc.GenericRpcHandler:
    """role: what a TLS client's certificate must carry (None on the local socket, whose file
    mode decides who may connect)."""
    handlers = _Handlers(controller, check_identity=False, role=role)
    return grpc.method_handlers_generic_handler(
        OPERATOR,
        {
            "ListJobs": _unary(handlers.list_jobs, op_pb.ListJobsReply),
            "ListHosts": _unary(handlers.list_hosts, op_pb.ListHostsReply),
            "GetRotations": _unary(handlers.get_rotations, op_pb.GetRotationsReply),
            "Watch": _stream(handlers.watch, op_pb.ClusterView),
        },
    )
