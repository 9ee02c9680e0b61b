"""Which kernel notifications mean our programming was undone (pure message checks; the
watcher itself runs against the real kernel in tests/e2e/test_agent.py)."""

from __future__ import annotations

import struct

from tensorlights.datapath.watch import (
    RTM_DELQDISC,
    RTM_DELTCLASS,
    RTM_DELTFILTER,
    RTM_NEWQDISC,
    TC_H_ROOT,
    nft_change_is_ours,
    tc_change_is_ours,
)

OURS = 0x7A1
IFINDEX = 4


def tcmsg(ifindex: int, handle: int, parent: int) -> bytes:
    return struct.pack("=BxxxiIII", 0, ifindex, handle, parent, 0)


def test_deletions_of_our_objects_on_our_interface_count() -> None:
    assert tc_change_is_ours(RTM_DELTFILTER, tcmsg(IFINDEX, 0, OURS << 16), IFINDEX, OURS)
    assert tc_change_is_ours(RTM_DELTCLASS, tcmsg(IFINDEX, OURS << 16 | 0x10, 0), IFINDEX, OURS)
    assert tc_change_is_ours(RTM_DELQDISC, tcmsg(IFINDEX, OURS << 16, TC_H_ROOT), IFINDEX, OURS)


def test_another_root_qdisc_replacing_ours_counts() -> None:
    assert tc_change_is_ours(RTM_NEWQDISC, tcmsg(IFINDEX, 5 << 16, TC_H_ROOT), IFINDEX, OURS)
    assert not tc_change_is_ours(RTM_NEWQDISC, tcmsg(IFINDEX, OURS << 16, TC_H_ROOT), IFINDEX, OURS)


def test_other_interfaces_other_handles_and_our_own_replaces_do_not_count() -> None:
    assert not tc_change_is_ours(RTM_DELTFILTER, tcmsg(IFINDEX + 1, 0, OURS << 16), IFINDEX, OURS)
    assert not tc_change_is_ours(RTM_DELTCLASS, tcmsg(IFINDEX, 0x50010, 0x50000), IFINDEX, OURS)
    assert not tc_change_is_ours(44, tcmsg(IFINDEX, 0, OURS << 16), IFINDEX, OURS)  # NEWTFILTER
    assert not tc_change_is_ours(RTM_DELTFILTER, b"\x00" * 4, IFINDEX, OURS)  # truncated


def nft(msg: int, *attributes: tuple[int, bytes], family: int = 1) -> tuple[int, bytes]:
    body = struct.pack("=BBH", family, 0, 0)
    for kind, value in attributes:
        payload = value + b"\0"
        body += struct.pack("=HH", 4 + len(payload), kind) + payload
        body += b"\0" * (-len(body) % 4)
    return 10 << 8 | msg, body


def test_nftables_deletions_in_our_table_count() -> None:
    for deletion in (2, 5, 11, 14):  # table, chain, set, set element
        assert nft_change_is_ours(*nft(deletion, (1, b"tensorlights")))
    assert nft_change_is_ours(*nft(8, (1, b"tensorlights"), (2, b"postrouting")))


def test_rotations_additions_and_other_tables_do_not_count() -> None:
    assert not nft_change_is_ours(*nft(8, (1, b"tensorlights"), (2, b"job_1d7")))  # rotation
    for addition in (0, 3, 6, 9, 12):
        assert not nft_change_is_ours(*nft(addition, (1, b"tensorlights")))
    assert not nft_change_is_ours(*nft(2, (1, b"firewalld")))
    assert not nft_change_is_ours(*nft(2, (1, b"tensorlights"), family=2))  # ip, not inet
    assert not nft_change_is_ours(1 << 8 | 2, b"")  # another netfilter subsystem
