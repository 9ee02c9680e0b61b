"""The kernel's process events (the netlink process connector): which processes were forked,
exec()ed or exited, so that discovery inspects those instead of listing /proc every scan.

The connector lives only in the initial network namespace: an agent in another one (an emulated
host) makes its socket there, through the namespace of kthreadd (PID 2: kernel threads live in
the initial namespaces; PID 1 may refuse to be inspected) or of init. Events carry PIDs of the
initial PID namespace, and the kernel takes a subscription only from it: `ProcEvents.open`
proves both by watching for the fork event of a thread it starts, and raises
`EventsUnavailable` (with why) when that event never comes, so the caller polls /proc instead.
Events lost to a full receive buffer (ENOBUFS) are reported as such: only a listing of /proc
says what happened meanwhile. Needs CAP_NET_ADMIN.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import IntEnum

from tensorlights.errors import PermanentError
from tensorlights.netlink_io import NLMSG_HDR, call_in_netns
from tensorlights.threads import daemon_thread

NETLINK_CONNECTOR = 11
CN_IDX_PROC = 1
CN_VAL_PROC = 1
PROC_CN_MCAST_LISTEN = 1
PROC_CN_MCAST_IGNORE = 2
NLMSG_DONE = 3
# struct cn_msg: id (idx, val), seq, ack, len, flags.
_CN_MSG = struct.Struct("=IIIIHH")
# struct proc_event: what, cpu, timestamp_ns; then the event's own fields.
_EVENT_HEAD = struct.Struct("=IIQ")
_TWO_PIDS = struct.Struct("=II")
_FOUR_PIDS = struct.Struct("=IIII")
RCVBUF_BYTES = 4 * 1024 * 1024
SELF_TEST_S = 1.0
INIT_NETNS = ("/proc/2/ns/net", "/proc/1/ns/net")


class EventKind(IntEnum):
    FORK = 0x1
    EXEC = 0x2
    EXIT = 0x80000000


@dataclass(frozen=True, slots=True)
class ProcEvent:
    kind: EventKind
    pid: int
    """The thread (a process's main thread has pid == tgid)."""
    tgid: int
    """The process."""
    parent_tgid: int = 0
    """FORK only: the parent (of a new thread: its process's parent)."""


class EventsUnavailable(Exception):
    """The process connector cannot be used here (why is the message)."""


class EventsLost(Exception):
    """The receive buffer overflowed: events were dropped."""


def subscribe_message(op: int = PROC_CN_MCAST_LISTEN) -> bytes:
    body = struct.pack("=I", op)
    cn = _CN_MSG.pack(CN_IDX_PROC, CN_VAL_PROC, 0, 0, len(body), 0) + body
    return NLMSG_HDR.pack(NLMSG_HDR.size + len(cn), NLMSG_DONE, 0, 0, os.getpid()) + cn


def parse_events(data: bytes) -> Iterator[ProcEvent]:
    """The fork, exec and exit events in one datagram (other kinds, truncated or foreign
    messages are skipped)."""
    offset = 0
    while offset + NLMSG_HDR.size <= len(data):
        length = NLMSG_HDR.unpack_from(data, offset)[0]
        if length < NLMSG_HDR.size or offset + length > len(data):
            return
        body = offset + NLMSG_HDR.size
        offset += (length + 3) & ~3
        if body + _CN_MSG.size + _EVENT_HEAD.size > len(data):
            continue
        idx, val, _, _, size, _ = _CN_MSG.unpack_from(data, body)
        event = body + _CN_MSG.size
        if (idx, val) != (CN_IDX_PROC, CN_VAL_PROC) or event + size > len(data):
            continue
        what = _EVENT_HEAD.unpack_from(data, event)[0]
        fields = event + _EVENT_HEAD.size
        end = event + size
        if what == EventKind.FORK and fields + _FOUR_PIDS.size <= end:
            _, parent_tgid, pid, tgid = _FOUR_PIDS.unpack_from(data, fields)
            yield ProcEvent(EventKind.FORK, pid, tgid, parent_tgid)
        elif what in (EventKind.EXEC, EventKind.EXIT) and fields + _TWO_PIDS.size <= end:
            pid, tgid = _TWO_PIDS.unpack_from(data, fields)
            yield ProcEvent(EventKind(what), pid, tgid)


@dataclass
class ProcessChanges:
    """What the events said since they were last taken."""

    started: set[int] = field(default_factory=set)
    """Processes forked or exec()ed: to inspect (again)."""
    exited: set[int] = field(default_factory=set)
    lost: bool = False
    """Events were dropped: list /proc and re-check every process."""

    def __bool__(self) -> bool:
        return bool(self.started or self.exited or self.lost)

    def add(self, event: ProcEvent) -> bool:
        """Take in one event; False for a thread's (a process's threads share its file table
        and image: nothing discovery knows changes)."""
        if event.pid != event.tgid:
            return False
        if event.kind is EventKind.EXIT:
            self.started.discard(event.tgid)
            self.exited.add(event.tgid)
        else:
            self.exited.discard(event.tgid)
            self.started.add(event.tgid)
        return True


def _open_socket(rcvbuf_bytes: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_CONNECTOR)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
        sock.bind((0, CN_IDX_PROC))
        sock.send(subscribe_message())
    except BaseException:
        sock.close()
        raise
    return sock


class ProcEvents:
    """A subscribed process-connector socket."""

    def __init__(self, sock: socket.socket, where: str) -> None:
        self._sock = sock
        self.where = where
        """Which network namespace's connector it listens to (for the status)."""

    @classmethod
    def open(cls, rcvbuf_bytes: int = RCVBUF_BYTES) -> ProcEvents:
        """Subscribe in this network namespace, else in the initial one; prove that events
        for this process arrive. Raises EventsUnavailable."""
        reasons = []
        for netns in (None, *INIT_NETNS):
            make = functools.partial(_open_socket, rcvbuf_bytes)
            try:
                sock = make() if netns is None else call_in_netns(netns, make)
            except PermanentError as exc:  # no such process here (another PID namespace)
                reasons.append(str(exc))
                continue
            except OSError as exc:
                where = netns or "this network namespace"
                if exc.errno == errno.ECONNREFUSED:  # no connector outside the initial netns
                    reasons.append(f"{where}: no process connector")
                else:
                    reasons.append(f"{where}: {exc.strerror or exc}")
                continue
            events = cls(sock, "own network namespace" if netns is None else netns)
            try:
                events._self_test()
            except EventsUnavailable as exc:
                events.close()
                reasons.append(str(exc))
                continue
            return events
        raise EventsUnavailable("; ".join(reasons))

    def _self_test(self) -> None:
        thread = threading.Thread(target=lambda: None, name="proc-events-self-test")
        thread.start()
        thread.join()
        me = os.getpid()
        deadline = time.monotonic() + SELF_TEST_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                events = self.read(left)
            except EventsLost:
                continue
            # A new thread's event names its process as tgid (its parent is the process's).
            if any(e.kind is EventKind.FORK and e.tgid == me != e.pid for e in events):
                return
        raise EventsUnavailable(
            f"no event for this process within {SELF_TEST_S:.0f} s (the agent must run in "
            "the host's PID namespace, with CAP_NET_ADMIN)"
        )

    def read(self, timeout_s: float | None) -> list[ProcEvent]:
        """The events of every datagram queued now, waiting up to `timeout_s` for the first
        ([] on timeout). Raises EventsLost when the kernel dropped some."""
        ready, _, _ = select.select([self._sock], [], [], timeout_s)
        events: list[ProcEvent] = []
        while ready:
            try:
                data = self._sock.recv(65536, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.ENOBUFS:
                    raise EventsLost() from exc
                raise
            events.extend(parse_events(data))
        return events

    def close(self) -> None:
        with contextlib.suppress(OSError):  # closed already
            self._sock.send(subscribe_message(PROC_CN_MCAST_IGNORE))
        self._sock.close()


class ProcessWatcher:
    """Reads process events on its own thread and gathers them for the scanner (`take`);
    `on_change` (the loop's wake-up) is called for process changes, at most once per
    `min_gap_s`, later ones held until then."""

    def __init__(
        self,
        events: ProcEvents,
        on_change: Callable[[], None],
        min_gap_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.events = events
        self._on_change = on_change
        self._min_gap_s = min_gap_s
        self._clock = clock
        self._lock = threading.Lock()
        self._changes = ProcessChanges()
        self.lost_total = 0
        """Times the kernel dropped events (each made the next scan list /proc)."""
        self.error = ""
        """Why the watcher stopped reading (then the scanner lists /proc, as without it)."""
        self._last_wake = float("-inf")
        self._held = False
        """A change arrived within min_gap_s of the last wake-up: wake when the gap is over."""
        self._stop = threading.Event()
        self._thread = daemon_thread(self._run, "proc-events")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=5)
        self.events.close()

    @property
    def working(self) -> bool:
        return not self.error

    def pending(self) -> bool:
        with self._lock:
            return bool(self._changes)

    def take(self) -> ProcessChanges:
        """What happened since the last take."""
        with self._lock:
            changes, self._changes = self._changes, ProcessChanges()
        return changes

    def _run(self) -> None:
        while not self._stop.is_set() and not self.error:
            self.pump()

    def pump(self) -> None:
        """Read what is queued (waiting at most 0.5 s, or until a held wake-up is due), gather
        it, and wake the loop if due (the thread's body; tests call it directly)."""
        timeout = 0.5
        if self._held:
            timeout = max(0.0, self._last_wake + self._min_gap_s - self._clock())
        relevant = False
        try:
            events = self.events.read(timeout)
            with self._lock:
                for event in events:
                    relevant |= self._changes.add(event)
        except EventsLost:
            with self._lock:
                self._changes.lost = True
            self.lost_total += 1
            relevant = True
        except OSError as exc:
            self.error = f"process events stopped: {exc}"
            self._on_change()
            return
        self._held |= relevant
        if self._held and self._clock() - self._last_wake >= self._min_gap_s:
            self._last_wake, self._held = self._clock(), False
            self._on_change()
