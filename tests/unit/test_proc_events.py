"""Parsing the process connector's datagrams, and what the scanner is told from them."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from tensorlights.discovery.proc_events import (
    CN_IDX_PROC,
    CN_VAL_PROC,
    EventKind,
    ProcessChanges,
    ProcEvent,
    parse_events,
    subscribe_message,
)
from tensorlights.netlink_io import NLMSG_HDR

PIDS = st.integers(min_value=1, max_value=4_194_304)
UID_EVENT = 0x4  # a kind discovery does not use: skipped


def encode(what: int, fields: bytes, idx: int = CN_IDX_PROC) -> bytes:
    """One netlink message as the kernel sends it: nlmsghdr, cn_msg, proc_event."""
    event = struct.pack("=IIQ", what, 0, 123456789) + fields
    cn = struct.pack("=IIIIHH", idx, CN_VAL_PROC, 7, 0, len(event), 0) + event
    message = NLMSG_HDR.pack(NLMSG_HDR.size + len(cn), 3, 0, 7, 0) + cn
    return message + b"\0" * (-len(message) % 4)


def encoded(event: ProcEvent) -> bytes:
    if event.kind is EventKind.FORK:
        fields = struct.pack("=IIII", 1, event.parent_tgid, event.pid, event.tgid)
    elif event.kind is EventKind.EXEC:
        fields = struct.pack("=II", event.pid, event.tgid)
    else:  # exit: pid, tgid, exit code, signal, parent pid, parent tgid
        fields = struct.pack("=IIIIII", event.pid, event.tgid, 0, 17, 1, 1)
    return encode(event.kind, fields)


EVENTS = st.builds(ProcEvent, st.sampled_from(list(EventKind)), PIDS, PIDS, PIDS).map(
    lambda e: e if e.kind is EventKind.FORK else ProcEvent(e.kind, e.pid, e.tgid)
)


@given(st.lists(st.tuples(EVENTS, st.booleans()), max_size=20))
def test_every_fork_exec_and_exit_is_read_back_and_other_kinds_are_skipped(
    events: list[tuple[ProcEvent, bool]],
) -> None:
    data = b"".join(
        encoded(event) + (encode(UID_EVENT, struct.pack("=IIII", 5, 5, 0, 0)) if noise else b"")
        for event, noise in events
    )
    assert list(parse_events(data)) == [event for event, _ in events]


@given(st.binary(max_size=400))
def test_any_bytes_parse_without_error(data: bytes) -> None:
    for event in parse_events(data):
        assert event.kind in EventKind


@given(EVENTS, st.integers(min_value=0, max_value=80))
def test_a_truncated_message_yields_nothing_from_it(event: ProcEvent, keep: int) -> None:
    whole = encoded(event)
    assert list(parse_events(whole[: min(keep, len(whole) - 1)])) == []


def test_messages_of_another_connector_are_skipped() -> None:
    other = encode(EventKind.EXEC, struct.pack("=II", 10, 10), idx=CN_IDX_PROC + 1)
    assert list(parse_events(other + encoded(ProcEvent(EventKind.EXEC, 11, 11)))) == [
        ProcEvent(EventKind.EXEC, 11, 11)
    ]


def test_the_subscription_message_asks_to_listen() -> None:
    message = subscribe_message()
    length, kind, _, _, _ = NLMSG_HDR.unpack_from(message)
    assert length == len(message) == NLMSG_HDR.size + 20 + 4
    assert kind == 3  # NLMSG_DONE, as the connector expects
    assert struct.unpack_from("=IIIIHHI", message, NLMSG_HDR.size) == (1, 1, 0, 0, 4, 0, 1)


def test_changes_keep_processes_and_drop_threads() -> None:
    changes = ProcessChanges()
    assert not changes
    assert changes.add(ProcEvent(EventKind.FORK, 100, 100, 1))
    assert not changes.add(ProcEvent(EventKind.FORK, 101, 100, 1))  # a thread of 100
    assert not changes.add(ProcEvent(EventKind.EXIT, 101, 100))
    assert changes.started == {100} and not changes.exited
    assert changes.add(ProcEvent(EventKind.EXIT, 100, 100))
    assert changes.exited == {100} and not changes.started  # gone before anyone looked
    assert changes.add(ProcEvent(EventKind.EXEC, 100, 100))  # the PID reused
    assert changes.started == {100} and not changes.exited
    assert changes


@given(st.lists(EVENTS, max_size=40))
def test_the_last_word_on_each_process_wins(events: list[ProcEvent]) -> None:
    changes = ProcessChanges()
    last: dict[int, EventKind] = {}
    for event in events:
        changes.add(event)
        if event.pid == event.tgid:
            last[event.tgid] = event.kind
    assert changes.exited == {pid for pid, kind in last.items() if kind is EventKind.EXIT}
    assert changes.started == {pid for pid, kind in last.items() if kind is not EventKind.EXIT}
