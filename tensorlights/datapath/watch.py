"""The kernel's change notifications for what we program, so that a hand edit is repaired at
once instead of at the next periodic full resync (30 s by default).

Two netlink multicast groups: rtnetlink's TC group (qdiscs, classes, filters) and nftables'.
Ours is judged from the message alone: on our interface, a deleted class, filter or qdisc of
our handle, or a root qdisc that is not ours; in our nftables table (inet tensorlights), a
deleted table, chain, set or set element, or a rule deleted from the hook chain. Rules deleted
from a job's chain are left to the periodic resync: every rotation flushes those chains, and a
read-back per rotation would cost more than it repairs. A lost notification (ENOBUFS) counts
as a change. The agent answers a change with a read-back of the datapath it last wrote,
restored before the pass's own writes (only that restoration is a repair, and warned of).
Our own writes notify too: they are not told apart (a window that ignored them would also
hide a hand edit made meanwhile) and cost one read-back that writes nothing.
"""

from __future__ import annotations

import errno
import logging
import select
import socket
import struct
from collections.abc import Callable

from tensorlights.netlink_io import call_in_netns
from tensorlights.policy.dscp_plan import HOOK_CHAIN, TABLE
from tensorlights.threads import daemon_thread

log = logging.getLogger("tensorlights.datapath")

NETLINK_ROUTE = 0
NETLINK_NETFILTER = 12
RTMGRP_TC = 0x8
NFNLGRP_NFTABLES = 7
RTM_NEWQDISC, RTM_DELQDISC = 36, 37
RTM_DELTCLASS, RTM_DELTFILTER = 41, 45
TC_H_ROOT = 0xFFFFFFFF
NFNL_SUBSYS_NFTABLES = 10
NFT_DELRULE = 8
NFT_DELETIONS = {2, 5, NFT_DELRULE, 11, 14}  # NFT_MSG_DEL{TABLE,CHAIN,RULE,SET,SETELEM}
NFPROTO_INET = 1
_NFGENMSG = 4
_NLA = struct.Struct("=HH")
_NLMSG = struct.Struct("=IHHII")
_TCMSG = struct.Struct("=BxxxiIII")


def tc_change_is_ours(msg_type: int, tcmsg: bytes, ifindex: int, major: int) -> bool:
    """Whether a TC notification undoes what we programmed on `ifindex` (pure)."""
    if len(tcmsg) < _TCMSG.size:
        return False
    fields: tuple[int, int, int, int, int] = _TCMSG.unpack_from(tcmsg)
    _family, index, handle, parent, _info = fields
    if index != ifindex:
        return False
    if msg_type == RTM_NEWQDISC:
        return parent == TC_H_ROOT and handle >> 16 != major  # another root replaced ours
    if msg_type in (RTM_DELQDISC, RTM_DELTCLASS, RTM_DELTFILTER):
        return handle >> 16 == major or parent >> 16 == major
    return False


def nft_change_is_ours(msg_type: int, body: bytes) -> bool:
    """Whether an nftables notification undoes what we programmed (pure): a deletion in our
    table, of anything but a rule of a job's chain (rotations flush those)."""
    if msg_type >> 8 != NFNL_SUBSYS_NFTABLES or msg_type & 0xFF not in NFT_DELETIONS:
        return False
    if len(body) < _NFGENMSG or body[0] != NFPROTO_INET:
        return False
    attributes = _attributes(body[_NFGENMSG:])
    if attributes.get(1) != TABLE.encode():  # NFTA_*_TABLE (NFTA_TABLE_NAME for tables)
        return False
    if msg_type & 0xFF == NFT_DELRULE:
        return attributes.get(2) == HOOK_CHAIN.encode()  # NFTA_RULE_CHAIN
    return True


def _attributes(data: bytes) -> dict[int, bytes]:
    """Top-level netlink attributes: type -> payload (strings without their NUL)."""
    found: dict[int, bytes] = {}
    offset = 0
    while offset + _NLA.size <= len(data):
        length, kind = _NLA.unpack_from(data, offset)
        if length < _NLA.size:
            break
        found[kind & 0x3FFF] = data[offset + _NLA.size : offset + length].rstrip(b"\0")
        offset += (length + 3) & ~3
    return found


def _subscribe(protocol: int, groups: int) -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, protocol)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind((0, groups))
    return sock


class KernelWatcher:
    def __init__(
        self,
        ifindex: Callable[[], int | None],
        major: int,
        on_change: Callable[[str], None],
        netns: str | None = None,
        marks: bool = True,
    ) -> None:
        """ifindex: our interface now (None: gone); on_change: called on the watcher's
        thread."""
        self._ifindex = ifindex
        self._major = major
        self._on_change = on_change

        def open_sockets() -> list[socket.socket]:
            opened = [_subscribe(NETLINK_ROUTE, RTMGRP_TC)]
            if marks:
                opened.append(_subscribe(NETLINK_NETFILTER, 1 << (NFNLGRP_NFTABLES - 1)))
            return opened

        self._socks = call_in_netns(netns, open_sockets) if netns else open_sockets()
        self._stop_r, self._stop_w = socket.socketpair()
        self._thread = daemon_thread(self._run, "kernel-watch")

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._stop_w.send(b"x")
        if self._thread.is_alive():
            self._thread.join(timeout=2)
        for sock in (*self._socks, self._stop_r, self._stop_w):
            sock.close()

    def _run(self) -> None:
        while True:
            ready, _, _ = select.select([*self._socks, self._stop_r], [], [])
            if self._stop_r in ready:
                return
            for sock in ready:
                if reason := self._read(sock):
                    self._on_change(reason)

    def _read(self, sock: socket.socket) -> str:
        """What the pending notifications changed of ours ("" for nothing)."""
        try:
            data = sock.recv(1 << 16)
        except OSError as exc:
            if exc.errno == errno.ENOBUFS:
                return "kernel notifications were lost (ENOBUFS)"
            raise
        is_route = sock is self._socks[0]
        ifindex = self._ifindex() if is_route else None
        offset = 0
        while offset + _NLMSG.size <= len(data):
            length, msg_type, _flags, _seq, _pid = _NLMSG.unpack_from(data, offset)
            if length < _NLMSG.size:
                break
            body = data[offset + _NLMSG.size : offset + length]
            if is_route and ifindex is not None:
                if tc_change_is_ours(msg_type, body, ifindex, self._major):
                    return "a tc object of ours was deleted or our root qdisc replaced"
            elif not is_route and nft_change_is_ours(msg_type, body):
                return "something of ours was deleted in nftables"
            offset += (length + 3) & ~3
        return ""
