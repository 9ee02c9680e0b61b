"""Encoding of the tc requests we send and decoding of the dumps we read.

Layouts follow include/uapi/linux/{rtnetlink,pkt_sched,pkt_cls}.h. Every request is a
`Request` for RtnlSocket.execute(); decoding takes pyroute2's decoded tcmsg objects.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import Any

from tensorlights.datapath.netlink import Request
from tensorlights.policy.tc_plan import (
    FILTER_PRIO,
    HASH_LINK_NODE,
    JOB_TABLE_FAMILY,
    JOB_TABLE_NODE,
    MAX_FILTER_NODE,
    PORT_BUCKETS,
    PORT_TABLE,
    Family,
    HashLink,
    HtbClass,
    LeafQdisc,
    PortLink,
    is_job_table,
    u32_bucket,
    u32_htid,
    u32_table_handle,
)

RTM_NEWQDISC, RTM_DELQDISC = 36, 37
RTM_NEWTCLASS, RTM_DELTCLASS = 40, 41
RTM_NEWTFILTER, RTM_DELTFILTER = 44, 45
NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 0x100, 0x200, 0x400
TC_H_ROOT = 0xFFFFFFFF
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_HTB_PARMS, TCA_HTB_INIT, TCA_HTB_RATE64, TCA_HTB_CEIL64 = 1, 2, 6, 7
TCA_U32_CLASSID, TCA_U32_HASH, TCA_U32_LINK, TCA_U32_DIVISOR, TCA_U32_SEL = 1, 2, 3, 4, 5
TC_U32_TERMINAL = 1
ETH_P_IP, ETH_P_IPV6 = 0x0800, 0x86DD
IPPROTO_TCP = 6
HTB_VERSION = 3
U32_MAX = 0xFFFFFFFF
NLMSG_HEADER_SIZE = 16

_TCMSG = struct.Struct("=BxxxiIII")
_RATESPEC = struct.Struct("=BBHhHI")
_HTB_GLOB = struct.Struct("=IIIII")
_U32_SEL = struct.Struct("=BBBxHHhhI")  # offmask is big-endian on the wire; we send 0
_U32_KEY_MATCH = struct.Struct(">II")  # mask and value are big-endian
_U32_KEY_OFFSETS = struct.Struct("=ii")  # offsets are host order

ETH_PROTO: dict[Family, int] = {Family.IPV4: ETH_P_IP, Family.IPV6: ETH_P_IPV6}
# (offset of the 32-bit word, mask, value) matching TCP, then the offset of the source port.
# Without IPv4 options / IPv6 extension headers, as tc's `match ip sport` assumes.
_TCP_MATCH: dict[Family, tuple[int, int, int]] = {
    Family.IPV4: (8, 0x00FF0000, IPPROTO_TCP << 16),
    Family.IPV6: (4, 0x0000FF00, IPPROTO_TCP << 8),
}
_SPORT_OFFSET: dict[Family, int] = {Family.IPV4: 20, Family.IPV6: 40}
# The hash key of the port tables: the low byte of the source port, in the 32-bit word at
# _SPORT_OFFSET (source port, destination port); the kernel shifts it down by the mask.
_PORT_HASH_MASK = 0x00FF0000
_TABLE_FAMILY = {htid: family for family, htid in PORT_TABLE.items()}


def handle(major: int, minor: int) -> int:
    return ((major & 0xFFFF) << 16) | (minor & 0xFFFF)


def format_handle(value: int) -> str:
    return f"{value >> 16:x}:{value & 0xFFFF:x}"


def _nla(nla_type: int, payload: bytes) -> bytes:
    length = 4 + len(payload)
    return struct.pack("=HH", length, nla_type) + payload + b"\0" * ((-length) % 4)


def _nested(nla_type: int, *children: bytes) -> bytes:
    return _nla(nla_type | 0x8000, b"".join(children))  # NLA_F_NESTED


def _kind(name: str) -> bytes:
    return _nla(TCA_KIND, name.encode() + b"\0")


def _tcmsg(ifindex: int, handle_: int, parent: int, info: int = 0) -> bytes:
    return _TCMSG.pack(socket.AF_UNSPEC, ifindex, handle_, parent, info)


# Qdiscs -----------------------------------------------------------------------------------


def add_htb_root(ifindex: int, major: int, default_minor: int, replace: bool) -> Request:
    glob = _HTB_GLOB.pack(HTB_VERSION, 10, default_minor, 0, 0)
    payload = _tcmsg(ifindex, handle(major, 0), TC_H_ROOT)
    payload += _kind("htb") + _nested(TCA_OPTIONS, _nla(TCA_HTB_INIT, glob))
    flags = NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_EXCL)
    verb = "replace" if replace else "add"
    return Request(RTM_NEWQDISC, flags, payload, f"{verb} htb root qdisc {major:x}: on #{ifindex}")


def add_root_qdisc_raw(ifindex: int, kind: str, handle_: int, options: bytes) -> Request:
    """Re-create a recorded root qdisc (kind + its TCA_OPTIONS payload verbatim)."""
    payload = _tcmsg(ifindex, handle_, TC_H_ROOT) + _kind(kind)
    if options:
        payload += _nla(TCA_OPTIONS, options)
    flags = NLM_F_CREATE | NLM_F_REPLACE
    return Request(RTM_NEWQDISC, flags, payload, f"restore {kind} root qdisc on #{ifindex}")


def delete_root_qdisc(ifindex: int, handle_: int) -> Request:
    payload = _tcmsg(ifindex, handle_, TC_H_ROOT)
    what = f"delete root qdisc {format_handle(handle_)} on #{ifindex}"
    return Request(RTM_DELQDISC, 0, payload, what)


def put_leaf_fifo(ifindex: int, major: int, minor: int, handle_: int, limit: int) -> Request:
    """Our pfifo of `limit` packets as the leaf of class major:minor (replacing its current
    leaf). Options: struct tc_fifo_qopt."""
    payload = _tcmsg(ifindex, handle_, handle(major, minor)) + _kind("pfifo")
    payload += _nla(TCA_OPTIONS, struct.pack("=I", limit))
    what = f"attach pfifo leaf {format_handle(handle_)} (limit {limit}) to {major:x}:{minor:x}"
    return Request(RTM_NEWQDISC, NLM_F_CREATE | NLM_F_REPLACE, payload, f"{what} on #{ifindex}")


def delete_leaf(ifindex: int, major: int, minor: int, handle_: int) -> Request:
    payload = _tcmsg(ifindex, handle_, handle(major, minor))
    what = f"delete leaf {format_handle(handle_)} of {major:x}:{minor:x} on #{ifindex}"
    return Request(RTM_DELQDISC, 0, payload, what)


# HTB classes ------------------------------------------------------------------------------


def put_htb_class(ifindex: int, major: int, cls: HtbClass, create: bool) -> Request:
    rate32 = min(cls.rate, U32_MAX)
    ceil32 = min(cls.ceil, U32_MAX)
    parms = (
        _RATESPEC.pack(0, 0, 0, 0, 0, rate32)
        + _RATESPEC.pack(0, 0, 0, 0, 0, ceil32)
        + struct.pack("=IIIII", cls.buffer, cls.cbuffer, cls.quantum, 0, cls.prio)
    )
    options = [_nla(TCA_HTB_PARMS, parms)]
    if cls.rate >= U32_MAX:
        options.append(_nla(TCA_HTB_RATE64, struct.pack("=Q", cls.rate)))
    if cls.ceil >= U32_MAX:
        options.append(_nla(TCA_HTB_CEIL64, struct.pack("=Q", cls.ceil)))
    parent = handle(major, cls.parent_minor)
    payload = _tcmsg(ifindex, handle(major, cls.minor), parent)
    payload += _kind("htb") + _nested(TCA_OPTIONS, *options)
    flags = NLM_F_CREATE | NLM_F_EXCL if create else NLM_F_REPLACE
    verb = "add" if create else "change"
    what = f"{verb} htb class {major:x}:{cls.minor:x} (prio {cls.prio}) on #{ifindex}"
    return Request(RTM_NEWTCLASS, flags, payload, what)


def delete_htb_class(ifindex: int, major: int, minor: int) -> Request:
    payload = _tcmsg(ifindex, handle(major, minor), handle(major, 0))
    what = f"delete htb class {major:x}:{minor:x} on #{ifindex}"
    return Request(RTM_DELTCLASS, 0, payload, what)


# u32 filters ------------------------------------------------------------------------------


def _filter_info(family: Family) -> int:
    return (FILTER_PRIO[family] << 16) | socket.htons(ETH_PROTO[family])


def _selector(
    flags: int, keys: list[tuple[int, int, int]], hash_at: int = 0, hash_mask: int = 0
) -> bytes:
    sel = _U32_SEL.pack(flags, 0, len(keys), 0, 0, 0, hash_at, socket.htonl(hash_mask))
    return sel + b"".join(
        _U32_KEY_MATCH.pack(mask, val) + _U32_KEY_OFFSETS.pack(off, 0) for mask, val, off in keys
    )


def _tcp_key(family: Family) -> tuple[int, int, int]:
    proto_off, proto_mask, proto_val = _TCP_MATCH[family]
    return (proto_mask, proto_val, proto_off)


def _sport_keys(family: Family, port: int) -> list[tuple[int, int, int]]:
    return [_tcp_key(family), (0xFFFF0000, port << 16, _SPORT_OFFSET[family])]


def _u32(
    ifindex: int,
    major: int,
    family: Family,
    handle_: int,
    create: bool,
    what: str,
    *options: bytes,
) -> Request:
    payload = _tcmsg(ifindex, handle_, handle(major, 0), _filter_info(family))
    payload += _kind("u32") + _nested(TCA_OPTIONS, *options)
    flags = NLM_F_CREATE | NLM_F_EXCL if create else NLM_F_REPLACE
    return Request(RTM_NEWTFILTER, flags, payload, what)


def add_job_table(ifindex: int, major: int, htid: int) -> Request:
    what = f"add u32 job table {htid:x}: on #{ifindex}"
    divisor = _nla(TCA_U32_DIVISOR, struct.pack("=I", 1))
    return _u32(ifindex, major, JOB_TABLE_FAMILY, u32_table_handle(htid), True, what, divisor)


def add_port_table(ifindex: int, major: int, family: Family) -> Request:
    htid = PORT_TABLE[family]
    what = f"add u32 {family} port table {htid:x}: ({PORT_BUCKETS} buckets) on #{ifindex}"
    divisor = _nla(TCA_U32_DIVISOR, struct.pack("=I", PORT_BUCKETS))
    return _u32(ifindex, major, family, u32_table_handle(htid), True, what, divisor)


def add_hash_link(ifindex: int, major: int, family: Family) -> Request:
    """In the family's root table: TCP -> its port table, bucket = source port's low byte."""
    table = u32_table_handle(PORT_TABLE[family])
    what = f"add {family} TCP hash link -> port table {PORT_TABLE[family]:x}: on #{ifindex}"
    selector = _selector(0, [_tcp_key(family)], _SPORT_OFFSET[family], _PORT_HASH_MASK)
    return _u32(
        ifindex,
        major,
        family,
        HASH_LINK_NODE,
        True,
        what,
        _nla(TCA_U32_LINK, struct.pack("=I", table)),
        _nla(TCA_U32_SEL, selector),
    )


def delete_all_filters(ifindex: int, major: int, family: Family) -> Request:
    payload = _tcmsg(ifindex, 0, handle(major, 0), _filter_info(family)) + _kind("u32")
    what = f"delete every {family} u32 filter of {major:x}: on #{ifindex}"
    return Request(RTM_DELTFILTER, 0, payload, what)


def put_table_target(
    ifindex: int, major: int, htid: int, target_minor: int, create: bool
) -> Request:
    """The single match-all filter in a job's table: the job's packets go to `target`."""
    table = u32_table_handle(htid)
    what = f"point job table {htid:x}: at {major:x}:{target_minor:x} on #{ifindex}"
    return _u32(
        ifindex,
        major,
        JOB_TABLE_FAMILY,
        table | JOB_TABLE_NODE,
        create,
        what,
        _nla(TCA_U32_HASH, struct.pack("=I", table)),
        _nla(TCA_U32_CLASSID, struct.pack("=I", handle(major, target_minor))),
        _nla(TCA_U32_SEL, _selector(TC_U32_TERMINAL, [(0, 0, 0)])),
    )


def put_port_link(
    ifindex: int, major: int, family: Family, port: int, htid: int, handle_: int, create: bool
) -> Request:
    """(TCP, source port) at `handle_` (a bucket of the family's port table) -> the job's
    table."""
    verb = "add" if create else "relink"
    what = f"{verb} {family} sport {port} -> job table {htid:x}: on #{ifindex}"
    bucket = handle_ & ~MAX_FILTER_NODE
    return _u32(
        ifindex,
        major,
        family,
        handle_,
        create,
        what,
        _nla(TCA_U32_HASH, struct.pack("=I", bucket)),
        _nla(TCA_U32_LINK, struct.pack("=I", u32_table_handle(htid))),
        _nla(TCA_U32_SEL, _selector(0, _sport_keys(family, port))),
    )


def delete_filter(ifindex: int, major: int, family: Family, handle_: int) -> Request:
    payload = _tcmsg(ifindex, handle_, handle(major, 0), _filter_info(family)) + _kind("u32")
    what = f"delete {family} u32 filter {handle_:#x} on #{ifindex}"
    return Request(RTM_DELTFILTER, 0, payload, what)


# Decoding ---------------------------------------------------------------------------------


def decode_htb_class(msg: Any) -> HtbClass | None:
    if msg.get_attr("TCA_KIND") != "htb":
        return None
    options = msg.get_attr("TCA_OPTIONS")
    parms = options.get_attr("TCA_HTB_PARMS") if options else None
    if parms is None:
        return None
    rate = options.get_attr("TCA_HTB_RATE64") or parms["rate"]
    ceil = options.get_attr("TCA_HTB_CEIL64") or parms["ceil"]
    parent = msg["parent"]
    parent_minor = 0 if parent == TC_H_ROOT or parent & 0xFFFF == 0 else parent & 0xFFFF
    return HtbClass(
        minor=msg["handle"] & 0xFFFF,
        parent_minor=parent_minor,
        rate=rate,
        ceil=ceil,
        buffer=parms["buffer"],
        cbuffer=parms["cbuffer"],
        quantum=parms["quantum"],
        prio=parms["prio"],
    )


def attributes(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """Top-level netlink attributes of `data[offset:]` by type (nested flag stripped)."""
    found: dict[int, bytes] = {}
    while offset + 4 <= len(data):
        length, nla_type = struct.unpack_from("=HH", data, offset)
        if length < 4:
            break
        found.setdefault(nla_type & 0x3FFF, data[offset + 4 : offset + length])
        offset += (length + 3) & ~3
    return found


def decode_leaf(raw: bytes, major: int) -> LeafQdisc | None:
    """A qdisc attached to one of our classes (parent MAJOR:minor), else None."""
    _, _, handle_, parent, _ = _TCMSG.unpack_from(raw, NLMSG_HEADER_SIZE)
    if parent == TC_H_ROOT or parent >> 16 != major or parent & 0xFFFF == 0:
        return None
    attrs = attributes(raw, NLMSG_HEADER_SIZE + _TCMSG.size)
    kind = attrs.get(TCA_KIND, b"").rstrip(b"\0").decode(errors="replace")
    options = attrs.get(TCA_OPTIONS, b"")
    limit = (
        struct.unpack_from("=I", options)[0]
        if kind.endswith("fifo") and len(options) >= 4
        else None
    )
    return LeafQdisc(parent & 0xFFFF, kind, handle_, limit)


@dataclass(frozen=True)
class TableEntry:
    """A job table itself (node 0) or a filter inside one."""

    htid: int
    handle: int
    target_minor: int | None


@dataclass(frozen=True)
class PortTableEntry:
    """A family's port table itself."""

    family: Family
    buckets: int


def decode_filter(raw: bytes) -> PortLink | TableEntry | PortTableEntry | HashLink | None:
    """Classify one dumped filter of our qdisc: a job table or a filter in one, a port table,
    a port link (in a port table, or a previous version's in a root table), the hash link of
    a root table; None for anything not at our priorities. Parsed from the raw message:
    pyroute2 0.9.7 decodes u32 keys four bytes off."""
    _, _, handle_, _, info = _TCMSG.unpack_from(raw, NLMSG_HEADER_SIZE)
    attrs = attributes(raw, NLMSG_HEADER_SIZE + _TCMSG.size)
    if attrs.get(TCA_KIND, b"").rstrip(b"\0") != b"u32":
        return None
    family = next((f for f, p in FILTER_PRIO.items() if p == info >> 16), None)
    if family is None or handle_ == 0:
        return None
    options = attributes(attrs.get(TCA_OPTIONS, b""))
    htid = u32_htid(handle_)
    if is_job_table(htid):
        classid = options.get(TCA_U32_CLASSID)
        target = struct.unpack("=I", classid)[0] & 0xFFFF if classid else None
        return TableEntry(htid, handle_, target)
    link = options.get(TCA_U32_LINK)
    linked = u32_htid(struct.unpack("=I", link)[0]) if link else None
    port_table = _TABLE_FAMILY.get(htid)
    if handle_ & MAX_FILTER_NODE == 0:
        if port_table is None or u32_bucket(handle_):
            return None  # a family's root table: the kernel's bookkeeping
        divisor = options.get(TCA_U32_DIVISOR)
        return PortTableEntry(port_table, struct.unpack("=I", divisor)[0] if divisor else 0)
    selector = options.get(TCA_U32_SEL)
    if port_table is None and handle_ & MAX_FILTER_NODE == HASH_LINK_NODE:
        ours = linked == PORT_TABLE[family] and _is_hash_selector(family, selector)
        return HashLink(family, handle_, ours)
    return PortLink(family, handle_, _port_from_selector(family, selector), linked)


def _is_hash_selector(family: Family, sel: bytes | None) -> bool:
    """Whether the selector is exactly (TCP) hashed as add_hash_link installs it."""
    if sel is None or len(sel) < _U32_SEL.size + 16:
        return False
    _, _, nkeys, _, _, _, hash_at, hash_mask = _U32_SEL.unpack_from(sel)
    mask, val = _U32_KEY_MATCH.unpack_from(sel, _U32_SEL.size)
    off, _ = _U32_KEY_OFFSETS.unpack_from(sel, _U32_SEL.size + 8)
    return (
        nkeys == 1
        and (mask, val, off) == _tcp_key(family)
        and hash_at == _SPORT_OFFSET[family]
        and socket.ntohl(hash_mask) == _PORT_HASH_MASK
    )


def _port_from_selector(family: Family, sel: bytes | None) -> int | None:
    """The source port if the selector is exactly (TCP, sport) as we install it."""
    if sel is None or len(sel) < _U32_SEL.size:
        return None
    nkeys = _U32_SEL.unpack_from(sel)[2]
    keys: set[tuple[int, int, int]] = set()
    for index in range(nkeys):
        at = _U32_SEL.size + index * 16
        if at + 16 > len(sel):
            return None
        mask, val = _U32_KEY_MATCH.unpack_from(sel, at)
        off, _ = _U32_KEY_OFFSETS.unpack_from(sel, at + 8)
        keys.add((off, mask, val))
    proto = _TCP_MATCH[family]
    sport = (_SPORT_OFFSET[family], 0xFFFF0000)
    ports: list[int] = [val >> 16 for off, mask, val in keys if (off, mask) == sport]
    if nkeys == 2 and proto in keys and len(ports) == 1:
        return ports[0]
    return None
