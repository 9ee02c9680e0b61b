"""Wire messages <-> model, with every incoming field validated.

Parsing and validation happen here, before anything reaches the registry, so a bad message
changes nothing: bytes that do not parse, out-of-range ports, bad names, NaN or negative
numbers and oversized lists all raise `InvalidMessage` (the servers answer INVALID_ARGUMENT).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from tensorlights.model import (
    MAX_PORT,
    AppliedRotation,
    HostReport,
    JobKind,
    Mode,
    PlanRenewal,
    PlanSlots,
    Registration,
    ReportedJob,
    Voucher,
    VoucherSource,
    host_name_problem,
    interface_name_problem,
    job_id_problem,
    visible,
)
from tensorlights.policy.bands import PolicyName
from tensorlights.rpc.v1 import agent_link_pb2 as pb

M = TypeVar("M", bound=Message)

MAX_MESSAGE_BYTES = 16 * 1024 * 1024
"""gRPC's own receive limit; larger messages are refused by gRPC (RESOURCE_EXHAUSTED)."""
MAX_JOBS_PER_HOST = 4096
MAX_PORTS_PER_JOB = 65535
MAX_ROTATIONS_PER_REPORT = 1024
MAX_INTERFACES = 64
MAX_TEXT = 1024
MAX_PODS_PER_JOB = 1024
LEADER_METADATA = "tl-leader"
"""Trailing metadata of a follower replica's refusal: the leader's HOST:PORT, where clients
go instead (a client goes only to an address it was configured with)."""


def leader_named(exc: grpc.RpcError) -> str | None:
    """The leader a follower replica's refusal names, if it is one."""
    if not isinstance(exc, grpc.Call) or exc.code() is not grpc.StatusCode.FAILED_PRECONDITION:
        return None
    named = dict(exc.trailing_metadata() or ()).get(LEADER_METADATA)
    return named if isinstance(named, str) and named else None


class InvalidMessage(ValueError):
    """An incoming message that must be refused whole (INVALID_ARGUMENT)."""


def parse(message_type: type[M], data: bytes) -> M:
    message = message_type()
    try:
        message.ParseFromString(data)
    except (DecodeError, RuntimeError) as exc:  # RuntimeError: recursion limit
        raise InvalidMessage(f"not a {message_type.__name__}: {exc}") from exc
    return message


def check_host(host: str) -> str:
    if problem := host_name_problem(host):
        raise InvalidMessage(problem)
    return host


def check_job(job: str) -> str:
    if problem := job_id_problem(job):
        raise InvalidMessage(problem)
    return job


def _check_count(what: str, items: Sequence[object], limit: int) -> None:
    if len(items) > limit:
        raise InvalidMessage(f"{len(items)} {what} (at most {limit})")


def _check_text(what: str, text: str) -> str:
    """Free text an agent sends (shown to operators): bounded and printable."""
    if len(text) > MAX_TEXT:
        raise InvalidMessage(f"{what} is longer than {MAX_TEXT} characters")
    if not text.isprintable():
        raise InvalidMessage(f"{what} has unprintable characters: {visible(text)[:80]!r}")
    return text


def _optional_number(
    message: pb.PsJob, name: str, valid: Callable[[float], bool], rule: str
) -> float | None:
    """An optional field of a job: None when unset; refused unless finite and `valid`."""
    if not message.HasField(name):
        return None
    value = float(getattr(message, name))
    if not (math.isfinite(value) and valid(value)):
        raise InvalidMessage(f"job {message.job}: {name} {value} must be {rule}")
    return value


def _optional_seconds(message: pb.PsJob, name: str) -> float | None:
    return _optional_number(message, name, lambda v: v >= 0, "finite and >= 0")


def _job_kind(message: pb.PsJob) -> JobKind:
    if not message.kind:
        return JobKind.PS  # an agent that predates kinds reports PS jobs only
    if message.kind not in set(JobKind):
        raise InvalidMessage(f"job {message.job}: kind must be one of {', '.join(JobKind)}")
    return JobKind(message.kind)


def registration(data: bytes) -> Registration:
    message = parse(pb.RegisterRequest, data)
    _check_count("interfaces", message.interfaces, MAX_INTERFACES)
    interfaces = []
    for interface in message.interfaces:
        if problem := interface_name_problem(interface.name):
            raise InvalidMessage(problem)
        interfaces.append((interface.name, int(interface.link_rate_bps)))
    if message.fallback_policy not in set(PolicyName):
        allowed = ", ".join(PolicyName)
        raise InvalidMessage(f"fallback_policy must be one of {allowed}")
    if message.agent_incarnation == 0:
        raise InvalidMessage("agent_incarnation must be set")
    return Registration(
        host=check_host(message.host),
        incarnation=int(message.agent_incarnation),
        agent_version=_check_text("agent_version", message.agent_version),
        interfaces=tuple(interfaces),
        fallback_policy=message.fallback_policy,
    )


def report(data: bytes) -> HostReport:
    message = parse(pb.AgentReport, data)
    _check_count("jobs", message.jobs, MAX_JOBS_PER_HOST)
    _check_count("rotations", message.rotations, MAX_ROTATIONS_PER_REPORT)
    jobs: dict[str, ReportedJob] = {}
    owners: dict[int, str] = {}  # port -> job: agents give a port two jobs share to neither
    for job in message.jobs:
        name = check_job(job.job)
        if name in jobs:
            raise InvalidMessage(f"job {name} is listed twice")
        _check_count(f"ports for job {name}", job.ports, MAX_PORTS_PER_JOB)
        bad = [port for port in job.ports if not 1 <= port <= MAX_PORT]
        if bad:
            raise InvalidMessage(f"job {name}: ports {bad[:5]} are outside 1..{MAX_PORT}")
        if claimed := owners.keys() & set(job.ports):
            port = min(claimed)
            raise InvalidMessage(f"port {port} is claimed by jobs {owners[port]} and {name}")
        owners.update(dict.fromkeys(job.ports, name))
        jobs[name] = ReportedJob(
            job=name,
            ports=frozenset(job.ports),
            processes=job.processes,
            connections=job.connections,
            spread_s=_optional_seconds(job, "spread_s"),
            period_s=_optional_seconds(job, "period_s"),
            demand=_optional_number(job, "demand", lambda v: 0 < v <= 1, "in (0, 1]"),
            kind=_job_kind(job),
            lag_s=_optional_seconds(job, "lag_s"),
            waits_for_siblings=job.waits_for_siblings,
            remaining_s=_optional_seconds(job, "remaining_s"),
        )
    rotations = []
    for rotation in message.rotations:
        # A rotation may name a job absent from this report's jobs: it can end right after
        # its turn. Its time cannot lie before the Unix epoch.
        if rotation.applied_unix_ns <= 0:
            raise InvalidMessage(f"rotation to {rotation.green[:80]!r}: applied_unix_ns <= 0")
        rotations.append(
            AppliedRotation(
                green=check_job(rotation.green),
                applied_at=rotation.applied_unix_ns / 1e9,
                generation=int(rotation.plan_generation),
            )
        )
    if message.mode not in set(Mode):
        raise InvalidMessage(f"mode must be one of {', '.join(Mode)}")
    if not message.session:
        raise InvalidMessage("session must be set (register first)")
    return HostReport(
        session=_check_text("session", message.session),
        seq=int(message.seq),
        jobs=tuple(jobs.values()),
        rotations=tuple(rotations),
        mode=Mode(message.mode),
        health=_check_text("health", message.health),
    )


def watch_plan_session(data: bytes) -> str:
    session = parse(pb.WatchPlanRequest, data).session
    if not session:
        raise InvalidMessage("session must be set (register first)")
    return _check_text("session", session)


# Outgoing (controller -> agent) and the agent's side of them --------------------------------


def plan_message(plan: PlanSlots) -> pb.HostPlan:
    return pb.HostPlan(
        controller_incarnation=plan.incarnation,
        generation=plan.generation,
        lease_ms=round(plan.lease_s * 1000),
        epoch_unix_ns=round(plan.epoch * 1e9),
        slot_ms=round(plan.slot_s * 1000),
        slots=[pb.SlotOrder(order=list(order)) for order in plan.slots],
    )


def plan_slots(message: pb.HostPlan) -> PlanSlots:
    """A plan as the agent receives it, checked as strictly as the controller's input."""
    if message.slot_ms == 0 or message.lease_ms == 0:
        raise InvalidMessage("plan without slot length or lease")
    _check_count("slots", message.slots, 4096)
    slots = []
    for slot in message.slots:
        _check_count("jobs in a slot", slot.order, MAX_JOBS_PER_HOST)
        slots.append(tuple(check_job(job) for job in slot.order))
    return PlanSlots(
        incarnation=int(message.controller_incarnation),
        generation=int(message.generation),
        lease_s=message.lease_ms / 1000,
        epoch=message.epoch_unix_ns / 1e9,
        slot_s=message.slot_ms / 1000,
        slots=tuple(slots),
    )


def report_reply(
    seq: int, vouchers: Sequence[Voucher], renewing: PlanSlots | None = None
) -> pb.ReportReply:
    """`renewing`: the host's plan, whose lease the reply renews (None: none)."""
    message = pb.ReportReply(
        seq=seq,
        vouchers=[
            pb.Voucher(
                job=v.job,
                source=v.source,
                user=v.user,
                pods=[
                    pb.Pod(uid=uid) if run_as is None else pb.Pod(uid=uid, run_as_user=run_as)
                    for uid, run_as in v.pods
                ],
            )
            for v in vouchers
        ],
    )
    if renewing is not None:
        message.plan_incarnation = renewing.incarnation
        message.plan_generation = renewing.generation
        message.lease_ms = round(renewing.lease_s * 1000)
    return message


def renewal(message: pb.ReportReply) -> PlanRenewal | None:
    """The plan lease a report's reply renews, if any."""
    if message.lease_ms == 0:
        return None
    return PlanRenewal(
        int(message.plan_incarnation), int(message.plan_generation), message.lease_ms / 1000
    )


def vouchers(message: pb.ReportReply) -> tuple[Voucher, ...]:
    """The vouchers of a report's reply as the agent receives them, checked like the
    controller's input (an agent believes processes on their strength)."""
    _check_count("vouchers", message.vouchers, MAX_JOBS_PER_HOST)
    found = []
    for voucher in message.vouchers:
        job = check_job(voucher.job)
        if voucher.source not in set(VoucherSource):
            raise InvalidMessage(f"voucher for {job}: unknown source {voucher.source[:80]!r}")
        _check_count(f"pods of job {job}", voucher.pods, MAX_PODS_PER_JOB)
        pods = tuple(
            (
                _check_text("pod uid", pod.uid),
                int(pod.run_as_user) if pod.HasField("run_as_user") else None,
            )
            for pod in voucher.pods
        )
        found.append(
            Voucher(
                job=job,
                source=VoucherSource(voucher.source),
                user=_check_text("user", voucher.user),
                pods=pods,
            )
        )
    return tuple(found)


def registration_message(reg: Registration) -> pb.RegisterRequest:
    return pb.RegisterRequest(
        host=reg.host,
        agent_incarnation=reg.incarnation,
        agent_version=reg.agent_version,
        interfaces=[pb.Interface(name=n, link_rate_bps=r) for n, r in reg.interfaces],
        fallback_policy=reg.fallback_policy,
    )


def report_message(report: HostReport) -> pb.AgentReport:
    jobs = []
    for job in report.jobs:
        message = pb.PsJob(
            job=job.job,
            ports=sorted(job.ports),
            processes=job.processes,
            connections=job.connections,
            kind=job.kind.value,
        )
        if job.spread_s is not None:
            message.spread_s = job.spread_s
        if job.period_s is not None:
            message.period_s = job.period_s
        if job.demand is not None:
            message.demand = job.demand
        if job.lag_s is not None:
            message.lag_s = job.lag_s
        message.waits_for_siblings = job.waits_for_siblings
        if job.remaining_s is not None:
            message.remaining_s = job.remaining_s
        jobs.append(message)
    return pb.AgentReport(
        session=report.session,
        seq=report.seq,
        jobs=jobs,
        rotations=[
            pb.Rotation(
                green=r.green,
                applied_unix_ns=round(r.applied_at * 1e9),
                plan_generation=r.generation,
            )
            for r in report.rotations
        ],
        mode=report.mode,
        health=report.health,
    )
