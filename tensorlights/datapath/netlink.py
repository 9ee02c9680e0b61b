"""The NETLINK_ROUTE socket of the datapath: the generic transport plus decoded tc and link
dumps (pyroute2's message classes decode; netlink_io.py sends and receives)."""

from __future__ import annotations

import errno as errno_mod
import socket
import struct
from typing import Any

from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from tensorlights.errors import NetlinkRequestError
from tensorlights.netlink_io import NETLINK_ROUTE, NLMSG_HDR, NetlinkSocket, Request

__all__ = ["NLMSG_HDR", "Request", "RtnlSocket"]

RTM_GETLINK = 18
IFLA_IFNAME = 3
RTM_GETQDISC = 38
RTM_GETTCLASS = 42
RTM_GETTFILTER = 46


class RtnlSocket(NetlinkSocket):
    """A NETLINK_ROUTE socket in the current or a named network namespace."""

    def __init__(self, netns: str | None = None) -> None:
        super().__init__(NETLINK_ROUTE, netns)

    # Decoded dumps ---------------------------------------------------------------------

    def dump_tc(self, msg_type: int, ifindex: int, parent: int = 0) -> list[Any]:
        payload = struct.pack("=BxxxiIII", socket.AF_UNSPEC, ifindex, 0, parent, 0)
        decoded = []
        for raw in self.dump(msg_type, payload):
            msg = tcmsg(raw)
            msg.decode()
            if msg["index"] == ifindex:
                decoded.append(msg)
        return decoded

    def link(self, name: str) -> Any | None:
        """The link called `name`, decoded, or None when there is none."""
        encoded = name.encode() + b"\0"
        attr = struct.pack("=HH", 4 + len(encoded), IFLA_IFNAME) + encoded
        attr += b"\0" * ((-len(attr)) % 4)
        payload = struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0) + attr
        try:
            raw = self.request_one(RTM_GETLINK, payload, f"look up interface {name}")
        except NetlinkRequestError as exc:
            if exc.errno == errno_mod.ENODEV:
                return None
            raise
        msg = ifinfmsg(raw)
        msg.decode()
        return msg
