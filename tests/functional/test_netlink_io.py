"""The netlink socket against the real kernel (rtnetlink, in this process's namespace): an
exchange that raised before reading its answers leaves the next exchanges right."""

from __future__ import annotations

import socket
import struct

import pytest

from tensorlights.errors import TransientError
from tensorlights.netlink_io import NetlinkSocket

NETLINK_ROUTE = 0
RTM_GETLINK = 18
IFLA_IFNAME = 3
_IFINFOMSG = struct.Struct("=BxHiII")


def _link_name(answer: bytes | int) -> str:
    """IFLA_IFNAME of an RTM_NEWLINK answer (header, ifinfomsg, then attributes)."""
    assert isinstance(answer, bytes), answer
    offset = 16 + _IFINFOMSG.size
    while offset + 4 <= len(answer):
        length, kind = struct.unpack_from("=HH", answer, offset)
        if kind == IFLA_IFNAME:
            return answer[offset + 4 : offset + length].rstrip(b"\0").decode()
        offset += (length + 3) & ~3
    raise AssertionError("no IFLA_IFNAME")


def _get_link(index: int) -> bytes:
    return _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)


def test_answers_left_by_an_exchange_that_raised_do_not_reach_the_next() -> None:
    lo = socket.if_nametoindex("lo")
    with NetlinkSocket(NETLINK_ROUTE) as sock:
        real_recv = sock._recv

        def fails_once() -> bytes:
            sock._recv = real_recv  # type: ignore[method-assign]
            raise TransientError("injected: the exchange ends before reading its answers")

        sock._recv = fails_once  # type: ignore[method-assign]
        with pytest.raises(TransientError, match="injected"):
            sock.request_many(RTM_GETLINK, [_get_link(lo)] * 3)  # 3 answers left unread
        for _ in range(3):
            answers = sock.request_many(RTM_GETLINK, [_get_link(lo), _get_link(lo)])
            assert [_link_name(answer) for answer in answers] == ["lo", "lo"]
        missing = sock.request_many(RTM_GETLINK, [_get_link(0x7FFFFFF0)])
        assert missing == [19]  # ENODEV: an error answer is an answer, not a failure
        with pytest.raises(BlockingIOError):  # nothing left over on the socket
            sock._sock.recv(1 << 16, socket.MSG_DONTWAIT)
