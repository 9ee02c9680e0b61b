"""The kernel's process events, for real: what they report, discovery driven by them, events
lost to a full buffer, and the refusal where the agent is not in the host's PID namespace."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tensorlights.discovery.proc_events import (
    EventKind,
    EventsLost,
    ProcessWatcher,
    ProcEvent,
    ProcEvents,
)
from tensorlights.discovery.procfs import ProcFs
from tensorlights.discovery.scanner import Scanner
from tensorlights.model import DiscoverySnapshot
from tensorlights.testbed import netns

from .holders import holders, new_scanner, scan_until

PS = {"TENSORLIGHTS_JOB": "evented", "TENSORLIGHTS_ROLE": "ps"}


class CountingProcFs(ProcFs):
    """The real /proc, counting the listings (to tell a scan that used events from one that
    listed /proc)."""

    listings = 0

    def pids(self) -> list[int]:
        self.listings += 1
        return super().pids()


@contextmanager
def watcher(rcvbuf_bytes: int | None = None) -> Iterator[ProcessWatcher]:
    """A subscribed watcher whose events the test pumps itself (no thread)."""
    events = ProcEvents.open(rcvbuf_bytes) if rcvbuf_bytes else ProcEvents.open()
    watching = ProcessWatcher(events, lambda: None)
    try:
        yield watching
    finally:
        watching.stop()


def events_until(
    events: ProcEvents, done: list[ProcEvent], want: set[tuple[EventKind, int]], deadline_s: float
) -> None:
    end = time.monotonic() + deadline_s
    while want - {(e.kind, e.tgid) for e in done} and time.monotonic() < end:
        done.extend(e for e in events.read(0.1) if e.pid == e.tgid)


def test_a_process_is_reported_forked_execed_and_exited() -> None:
    events = ProcEvents.open()
    try:
        child = subprocess.Popen(["/bin/sleep", "0.05"])
        child.wait()
        seen: list[ProcEvent] = []
        want = {(EventKind.FORK, child.pid), (EventKind.EXEC, child.pid)}
        want.add((EventKind.EXIT, child.pid))
        events_until(events, seen, want, deadline_s=5)
        kinds = [e.kind for e in seen if e.tgid == child.pid]
        assert kinds[:3] == [EventKind.FORK, EventKind.EXEC, EventKind.EXIT], seen
    finally:
        events.close()


def test_the_agent_in_another_network_namespace_subscribes_in_the_initial_one(
    pair: netns.HostPair,
) -> None:
    code = (
        "from tensorlights.discovery.proc_events import ProcEvents\n"
        "events = ProcEvents.open(); print(events.where); events.close()\n"
    )
    out = subprocess.run(
        pair.a.exec_args(sys.executable, "-c", code),
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "/proc/2/ns/net"


def test_in_its_own_pid_namespace_it_refuses_with_the_reason() -> None:
    code = (
        "from tensorlights.discovery.proc_events import ProcEvents, EventsUnavailable\n"
        "try:\n    ProcEvents.open()\nexcept EventsUnavailable as exc:\n    print(exc)\n"
        "else:\n    print('subscribed')\n"
    )
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "the agent must run in the host's PID namespace" in out.stdout, out


def test_scans_with_events_find_a_new_ps_and_its_exit_without_listing_proc() -> None:
    procfs = CountingProcFs()
    with watcher() as watching, Scanner(new_scanner().rules, procfs, events=watching) as scan:
        first = scan.scan()  # the first scan sweeps: it lists /proc once
        assert first.process_events and first.processes_from.startswith("process events")
        listed = procfs.listings
        with holders() as start:
            ps = start(PS)
            assert ps.pid not in {task.pid for task in first.tasks}
            deadline = time.monotonic() + 10
            while not scan.changed() and time.monotonic() < deadline:
                watching.pump()
            assert scan.changed()  # news, before any scan

            def found(snapshot: DiscoverySnapshot) -> bool:
                watching.pump()
                return any(t.pid == ps.pid and t.listen_ports for t in snapshot.tasks)

            snapshot = scan_until(scan, found)
            assert found(snapshot)
        # The holder is stopped: its exit event drops it.

        def dropped(snapshot: DiscoverySnapshot) -> bool:
            watching.pump()
            return not snapshot.tasks

        snapshot = scan_until(scan, dropped, deadline_s=10)
        assert ps.pid not in {task.pid for task in snapshot.tasks}
        assert procfs.listings == listed  # every change came from events


def test_events_lost_to_a_full_buffer_make_the_next_scan_list_proc() -> None:
    procfs = CountingProcFs()
    # The smallest receive buffer the kernel allows: a burst of processes overflows it.
    with (
        watcher(rcvbuf_bytes=1) as watching,
        holders() as start,
        Scanner(new_scanner().rules, procfs, events=watching) as scan,
    ):
        scan.scan()
        listed = procfs.listings
        burst = "for i in $(seq 200); do /bin/true & done; wait"
        subprocess.run(["sh", "-c", burst], check=True, timeout=60)
        ps = start(PS)  # its own events may be among those dropped
        deadline = time.monotonic() + 10
        while not watching.lost_total and time.monotonic() < deadline:
            watching.pump()
        assert watching.lost_total >= 1
        snapshot = scan.scan()
        assert procfs.listings == listed + 1  # dropped events: /proc says what happened
        assert ps.pid in {task.pid for task in snapshot.tasks}
        assert snapshot.events_lost == watching.lost_total


def test_reading_past_an_overflow_raises_events_lost_then_goes_on() -> None:
    events = ProcEvents.open(1)
    try:
        subprocess.run(["sh", "-c", "for i in $(seq 200); do /bin/true & done; wait"], check=True)
        lost = False
        deadline = time.monotonic() + 10
        while not lost and time.monotonic() < deadline:
            try:
                events.read(0.1)
            except EventsLost:
                lost = True
        assert lost
        drained = False
        while not drained and time.monotonic() < deadline:  # what the buffer held
            try:
                drained = not events.read(0.2)
            except EventsLost:
                continue
        # The socket still works: a process started now is reported (its fork: the buffer
        # holds two events, so the rest of its own events overflow it again).
        child = subprocess.Popen(["/bin/true"])
        child.wait()
        reported = False
        deadline = time.monotonic() + 10
        while not reported and time.monotonic() < deadline:
            try:
                reported = (EventKind.FORK, child.pid) in {
                    (e.kind, e.tgid) for e in events.read(0.1)
                }
            except EventsLost:
                continue
        assert reported
    finally:
        events.close()


def test_new_rules_judge_every_process_again_not_only_those_events_name() -> None:
    """New rules (a reload, the controller's vouchers) forget every verdict: the next scan
    lists /proc again, or processes that started before would never be seen again."""
    with watcher() as watching, holders() as start, new_scanner(events=watching) as scan:
        ps = start(PS)

        def listed(snapshot: DiscoverySnapshot) -> bool:
            watching.pump()
            return ps.pid in {task.pid for task in snapshot.tasks}

        scan_until(scan, listed)
        scan.scan()  # takes what the last pump read: no event names the PS any more
        scan.set_rules(scan.rules)
        assert ps.pid in {task.pid for task in scan.scan().tasks}
