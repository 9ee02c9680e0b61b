"""The agent's link to the controller: register, report every report interval, follow the
plan stream -- in two daemon threads, handing plans (and the vouchers and plan renewals each
report's reply carries) to the agent through callbacks. News is reported at once, and
otherwise a heartbeat every heartbeat interval (the controller's setting). Each reply renews
the plan's lease; where heartbeats are further apart than that needs, the controller's plan
stream renews it instead, resending the plan (controller/core.RESEND_SHARE): a plan sent on
an open stream costs the controller a tenth of what a report does, so no report is sent
only to renew a lease.

The agent dials out; it listens on no TCP port. Any failure (controller down, stream cut,
NOT_FOUND after a controller restart) drops the session: the link backs off (0.5 s doubling
to 3 s) and registers again. The agent keeps following the last plan it had until that
plan's lease ends, then its local policy decides (see policy/schedule.PlanFollower).

With several controller replicas (addresses separated by commas), the link dials one; a
follower refuses it naming the leader (the `tl-leader` trailing metadata), and the link goes
there at once if that address is one of its own; an unreachable replica sends it to the next
address, and it backs off only after a whole round failed.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import grpc

from tensorlights.configfile import split_addresses
from tensorlights.model import (
    AppliedRotation,
    HostReport,
    LinkState,
    LinkStatus,
    Mode,
    PlanRenewal,
    PlanSlots,
    Registration,
    ReportedJob,
    Voucher,
    jobs_moved,
    visible,
)
from tensorlights.rpc import convert
from tensorlights.rpc.convert import InvalidMessage
from tensorlights.rpc.tls import channel_credentials, channel_options, diagnose
from tensorlights.rpc.v1 import agent_link_pb2 as pb
from tensorlights.rpc.v1 import agent_link_pb2_grpc as pb_grpc
from tensorlights.threads import daemon_thread
from tensorlights.tls_files import TlsFiles

log = logging.getLogger("tensorlights.agent.link")

RPC_TIMEOUT_S = 5.0
BACKOFF_FIRST_S = 0.5
REDIRECT_PAUSE_S = 0.1
"""Between a follower's refusal and dialling the leader it named (no tight loop should two
replicas name each other while an election settles)."""
BACKOFF_MAX_S = 3.0
"""Retries of an unreachable controller double up to this, each wait shortened by a random
jitter of up to half (many agents do not retry in step). Short enough that an agent is back
within seconds of a restarted controller, inside its plan's lease (15 s by default): with
10 s, agents whose controller was back after 8 s fell back to their own policy 2.7 s later
and followed it again only 8.3 s after it was back (benchmark m2, controller restarted).
A refused connection costs the controller almost nothing."""
MAX_PENDING_ROTATIONS = 256


class ControllerLink:
    def __init__(
        self,
        address: str,
        tls: TlsFiles,
        server_name: str | None,
        registration: Registration,
        on_plan: Callable[[PlanSlots], None],
        on_state: Callable[[LinkState], None] = lambda state: None,
        on_vouchers: Callable[[tuple[Voucher, ...]], None] = lambda vouchers: None,
        on_renewal: Callable[[PlanRenewal], None] = lambda renewal: None,
    ) -> None:
        self.addresses = split_addresses(address)
        if not self.addresses:
            raise ValueError("no controller address")
        self.address = self.addresses[0]
        """The replica dialled now."""
        self.tls = tls
        self.server_name = server_name
        self.registration = registration
        self._on_plan = on_plan
        self._on_state = on_state
        self._on_vouchers = on_vouchers
        self._on_renewal = on_renewal
        self._credentials = channel_credentials(tls)
        self._lock = threading.Lock()
        self._jobs: tuple[ReportedJob, ...] = ()
        self._mode = Mode.LOCAL
        self._health = ""
        self._rotations: list[AppliedRotation] = []
        self._stop = threading.Event()
        self._report_now = threading.Event()
        self._thread = daemon_thread(self._run, "controller-link")
        self.state = LinkState(since=time.time())

    # Called by the agent's loop ----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._report_now.set()
        self._thread.join(timeout=RPC_TIMEOUT_S + 1)

    def update(self, jobs: tuple[ReportedJob, ...], mode: Mode, health: str) -> None:
        """What the next report says; a change of jobs is reported at once."""
        with self._lock:
            changed = {j.job: j.ports for j in jobs} != {j.job: j.ports for j in self._jobs}
            self._jobs, self._mode, self._health = jobs, mode, health
        if changed:
            self._report_now.set()

    def applied(self, rotation: AppliedRotation) -> None:
        with self._lock:
            self._rotations.append(rotation)
            del self._rotations[:-MAX_PENDING_ROTATIONS]
        self._report_now.set()

    # The link thread ----------------------------------------------------------------------

    def _count(self, **changes: Any) -> None:
        """Counters and session facts that do not change the link's state."""
        with self._lock:
            self.state = replace(self.state, **changes)

    def _set_state(self, state: LinkStatus, detail: str = "", **values: Any) -> None:
        with self._lock:
            changed = state != self.state.state or detail != self.state.detail
            if changed:
                values.update(state=state, detail=detail, since=time.time())
            self.state = replace(self.state, **values)
        if changed:
            if state is LinkStatus.CONNECTED:
                log.info("connected to the controller at %s", self.address)
            else:
                log.warning("controller link %s: %s", state, detail)
            self._on_state(self.state)

    def _run(self) -> None:
        backoff = round_backoff = 0.0
        while not self._stop.is_set():
            if backoff:
                self._stop.wait(backoff * random.uniform(0.5, 1.0))
            try:
                with grpc.secure_channel(
                    self.address, self._credentials, channel_options(self.server_name)
                ) as channel:
                    self._session(pb_grpc.AgentLinkStub(channel))  # type: ignore[no-untyped-call]
                backoff = BACKOFF_FIRST_S  # the controller ended the stream: register again
                round_backoff = 0.0
            except grpc.RpcError as exc:
                leader = self._leader_named(exc)
                if leader is not None:
                    self._set_state(LinkStatus.CONNECTING, f"sent to the leader at {leader}")
                    self.address, backoff = leader, REDIRECT_PAUSE_S
                    continue
                self._failed(exc)
                if self._next_address() and self.address != self.addresses[0]:
                    backoff = 0.0  # the next replica at once; the backoff is per round
                    continue
                round_backoff = min(BACKOFF_MAX_S, max(BACKOFF_FIRST_S, round_backoff * 2))
                backoff = round_backoff
            except InvalidMessage as exc:
                self._set_state(LinkStatus.REFUSED, f"the controller sent something invalid: {exc}")
                backoff = BACKOFF_MAX_S

    def _leader_named(self, exc: grpc.RpcError) -> str | None:
        """The leader a follower replica named, if it is one of ours and not this one."""
        named = convert.leader_named(exc)
        return named if named in self.addresses and named != self.address else None

    def _next_address(self) -> bool:
        """On to the next replica after a failure; False with one address (or none left to
        try before a round's backoff)."""
        if len(self.addresses) == 1:
            return False
        index = self.addresses.index(self.address) if self.address in self.addresses else -1
        self.address = self.addresses[(index + 1) % len(self.addresses)]
        return True

    def _failed(self, exc: grpc.RpcError) -> None:
        code = exc.code() if isinstance(exc, grpc.Call) else grpc.StatusCode.UNKNOWN
        details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            reason = diagnose(self.address, self.tls, self.server_name)
            if reason:
                self._set_state(
                    LinkStatus.UNAUTHENTICATED, f"UNAUTHENTICATED: {reason}", session=""
                )
            else:
                self._set_state(LinkStatus.UNREACHABLE, f"{code.name}: {details}", session="")
        elif code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            self._set_state(LinkStatus.UNAUTHENTICATED, f"{code.name}: {details}", session="")
        elif code is grpc.StatusCode.NOT_FOUND:
            self._set_state(
                LinkStatus.CONNECTING, "the controller lost our session: registering again"
            )
        else:
            self._set_state(LinkStatus.REFUSED, f"{code.name}: {details}", session="")

    def _session(self, stub: pb_grpc.AgentLinkStub) -> None:
        reply = stub.Register(
            convert.registration_message(self.registration), timeout=RPC_TIMEOUT_S
        )
        self._set_state(
            LinkStatus.CONNECTED,
            session=reply.session,
            controller_incarnation=reply.controller_incarnation,
        )
        interval_s = max(0.05, reply.report_interval_ms / 1000 or 1.0)
        heartbeat_s = max(interval_s, reply.heartbeat_interval_ms / 1000)
        plans = stub.WatchPlan(pb.WatchPlanRequest(session=reply.session))
        stream_error: list[Exception] = []
        watcher = daemon_thread(self._watch, "controller-plans", (plans, stream_error))
        watcher.start()
        seq = 0
        sent: HostReport | None = None
        sent_at = 0.0
        try:
            while not self._stop.is_set() and watcher.is_alive():
                report = self._next_report(reply.session, seq + 1)
                # News at once, otherwise a heartbeat: 10x fewer reports than every second
                # with the defaults (each reply renews the plan's lease; past 0.8 of a lease
                # without one, the plan stream does).
                due_s = heartbeat_s
                if sent is None or _news(sent, report) or time.monotonic() - sent_at >= due_s:
                    seq += 1
                    self._report(stub, report)
                    sent, sent_at = report, time.monotonic()
                else:
                    self._count(reports_skipped=self.state.reports_skipped + 1)
                # The heartbeat on time, not at the next interval's check: a lease's margin.
                self._report_now.wait(min(interval_s, max(0.0, sent_at + due_s - time.monotonic())))
                self._report_now.clear()
        finally:
            plans.cancel()
            watcher.join(timeout=RPC_TIMEOUT_S)
        if stream_error and not self._stop.is_set():
            raise stream_error[0]

    def _next_report(self, session: str, seq: int) -> HostReport:
        """What a report would say now (the rotations applied since the last one sent)."""
        with self._lock:
            return HostReport(
                session, seq, self._jobs, tuple(self._rotations), self._mode,
                visible(self._health)[:1000],
            )  # fmt: skip

    def _report(self, stub: pb_grpc.AgentLinkStub, report: HostReport) -> None:
        rotations = report.rotations
        with self._lock:  # those in this report (more may have been applied since)
            sent = set(rotations)
            self._rotations = [r for r in self._rotations if r not in sent]
        try:
            reply = stub.Report(convert.report_message(report), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            with self._lock:  # not lost: sent with the next session's first report
                self._rotations[:0] = rotations
            raise
        self._count(reports=self.state.reports + 1)
        self._on_vouchers(convert.vouchers(reply))
        renewal = convert.renewal(reply)
        if renewal is not None:
            self._count(renewals=self.state.renewals + 1)
            self._on_renewal(renewal)

    def _watch(self, plans: Any, errors: list[Exception]) -> None:
        try:
            for message in plans:
                plan = convert.plan_slots(message)
                self._count(plans=self.state.plans + 1, last_plan_generation=plan.generation)
                self._on_plan(plan)
        except grpc.RpcError as exc:
            if exc.code() is not grpc.StatusCode.CANCELLED:
                errors.append(exc)
        except InvalidMessage as exc:
            errors.append(exc)


def _news(sent: HostReport, now: HostReport) -> bool:
    """Whether `now` tells the controller something `sent` did not (model.jobs_moved: jobs,
    ports, a demand beyond noise), or carries rotations, or a new mode or health."""
    return (
        bool(now.rotations)
        or now.mode != sent.mode
        or now.health != sent.health
        or jobs_moved(sent.jobs, now.jobs)
    )
