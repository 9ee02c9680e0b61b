"""The HTB datapath: makes one interface's egress match a DatapathSpec.

`apply` is level-triggered: read what the kernel has, plan (pure), send the minimal diff in one
batch. `rotate` is the hot path for band changes: against what we last wrote, it re-points
each moved job's u32 table at its new band's class (one filter per moved job, one batch;
classes and port filters stay put); a refusal there, or jobs or ports that changed, send it
through `apply`. The agent writes through datapath.dataplane.Dataplane, which adds the DSCP
marks after this.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink.rtnl.tcmsg import tcmsg

from tensorlights.datapath import tc_messages as tcm
from tensorlights.datapath.netlink import (
    NLMSG_HDR,
    RTM_GETQDISC,
    RTM_GETTCLASS,
    RTM_GETTFILTER,
    Request,
    RtnlSocket,
)
from tensorlights.datapath.root_record import RootQdiscRecords
from tensorlights.errors import (
    ForeignQdiscError,
    InterfaceNotFoundError,
    NetlinkRequestError,
    TransientError,
)
from tensorlights.model import DatapathSpec, PreviousRootQdisc
from tensorlights.policy.tc_plan import (
    DEFAULT_MAJOR,
    JOB_TABLE_NODE,
    MAX_FILTER_NODE,
    ActualState,
    AddHashLink,
    AddPortTable,
    AddTable,
    DeleteAllFilters,
    DeleteClass,
    DeleteFilter,
    DeleteLeaf,
    DesiredLayout,
    Family,
    HashLink,
    HtbTuning,
    JobTable,
    PortLink,
    PutClass,
    PutLeaf,
    PutLink,
    PutTableTarget,
    TcOp,
    desired_layout,
    diff,
    retarget_tables,
    tables_in_use,
    u32_htid,
)

ETH_HEADER = 14
_TCMSG_SIZE = 20


@dataclass(frozen=True)
class LinkInfo:
    ifindex: int
    mtu: int
    up: bool


@dataclass(frozen=True)
class ApplyResult:
    ops: tuple[TcOp, ...]
    took_over: PreviousRootQdisc | None  # the root qdisc we replaced on this pass, if any
    job_table: dict[str, int]  # job -> its u32 table id


@dataclass(frozen=True)
class PlannedChange:
    installs_root: bool
    """Our root qdisc is not there yet: it would replace the current root."""
    ops: tuple[TcOp, ...]
    job_table: dict[str, int]


TABLE_DELETE_RETRIES = (0.001, 0.005, 0.02, 0.05)


def _ifindex(raw: bytes) -> int:
    """The interface of a dumped tc message (a dump by ifindex may still list others)."""
    return int(struct.unpack_from("=i", raw, tcm.NLMSG_HEADER_SIZE + 4)[0])


def _root_of(qdiscs: list[bytes]) -> tuple[Any | None, bytes | None]:
    """The root qdisc among one interface's dumped qdiscs (decoded, raw); Nones if none."""
    for raw in qdiscs:
        msg = tcm_decode(raw)
        if msg["parent"] == tcm.TC_H_ROOT:
            return msg, raw
    return None, None


def _deletes_table(op: TcOp) -> bool:
    return isinstance(op, DeleteFilter) and op.handle & 0xFFFFF == 0


class HtbDatapath:
    def __init__(
        self,
        sock: RtnlSocket,
        records: RootQdiscRecords,
        *,
        major: int = DEFAULT_MAJOR,
        tuning: HtbTuning | None = None,
        take_over_foreign: bool = False,
    ) -> None:
        self.sock = sock
        self.records = records
        self.major = major
        self.tuning = tuning
        self.take_over_foreign = take_over_foreign
        self._written: tuple[int, DesiredLayout] | None = None  # (ifindex, layout) last applied

    # Reading --------------------------------------------------------------------------

    def link(self, interface: str) -> LinkInfo:
        msg = self.sock.link(interface)
        if msg is None:
            where = f" in network namespace {self.sock.netns}" if self.sock.netns else ""
            raise InterfaceNotFoundError(f"interface {interface!r} does not exist{where}")
        return LinkInfo(
            ifindex=msg["index"],
            mtu=msg.get_attr("IFLA_MTU") or 1500,
            up=bool(msg["flags"] & 1),
        )

    def _qdiscs(self, ifindex: int) -> list[bytes]:
        request = struct.pack("=BxxxiIII", 0, ifindex, 0, 0, 0)
        return [raw for raw in self.sock.dump(RTM_GETQDISC, request) if _ifindex(raw) == ifindex]

    def _root_qdisc(self, ifindex: int) -> tuple[Any | None, bytes | None]:
        return _root_of(self._qdiscs(ifindex))

    def read_actual(self, ifindex: int) -> ActualState:
        qdiscs = self._qdiscs(ifindex)
        root, _ = _root_of(qdiscs)
        if root is None:
            return ActualState(root_kind=None, root_handle=0, default_minor=None)
        kind = root.get_attr("TCA_KIND")
        root_handle = root["handle"]
        if not self._is_ours(kind, root_handle):
            return ActualState(root_kind=kind, root_handle=root_handle, default_minor=None)
        options = root.get_attr("TCA_OPTIONS")
        glob = options.get_attr("TCA_HTB_INIT") if options else None
        our_qdisc = tcm.handle(self.major, 0)
        classes = {}
        for msg in self.sock.dump_tc(RTM_GETTCLASS, ifindex):
            if msg["handle"] >> 16 != self.major:
                continue
            cls = tcm.decode_htb_class(msg)
            if cls is not None:
                classes[cls.minor] = cls
        links: list[PortLink] = []
        table_handles: dict[int, list[int]] = {}
        table_target: dict[int, int | None] = {}
        port_tables: dict[Family, int] = {}
        hash_links: dict[Family, HashLink] = {}
        request = struct.pack("=BxxxiIII", 0, ifindex, 0, our_qdisc, 0)
        for raw in self.sock.dump(RTM_GETTFILTER, request):
            entry = tcm.decode_filter(raw)
            if isinstance(entry, PortLink):
                links.append(entry)
            elif isinstance(entry, tcm.PortTableEntry):
                port_tables[entry.family] = entry.buckets
            elif isinstance(entry, HashLink):
                hash_links[entry.family] = entry
            elif isinstance(entry, tcm.TableEntry):
                handles = table_handles.setdefault(entry.htid, [])
                if entry.handle & MAX_FILTER_NODE:
                    handles.append(entry.handle)
                if entry.handle & MAX_FILTER_NODE == JOB_TABLE_NODE:
                    table_target[entry.htid] = entry.target_minor
        tables = {
            htid: JobTable(htid, table_target.get(htid), tuple(handles))
            for htid, handles in table_handles.items()
        }
        leaves = {
            leaf.minor: leaf
            for raw in qdiscs
            if (leaf := tcm.decode_leaf(raw, self.major)) is not None
        }
        return ActualState(
            root_kind=kind,
            root_handle=root_handle,
            default_minor=glob["defcls"] if glob else None,
            classes=classes,
            links=tuple(links),
            tables=tables,
            leaves=leaves,
            port_tables=port_tables,
            hash_links=hash_links,
        )

    def _is_ours(self, kind: str | None, root_handle: int) -> bool:
        return kind == "htb" and root_handle == tcm.handle(self.major, 0)

    # Writing --------------------------------------------------------------------------

    def apply(self, spec: DatapathSpec) -> ApplyResult:
        link = self.link(spec.interface)
        actual = self.read_actual(link.ifindex)
        took_over = None
        if not self._is_ours(actual.root_kind, actual.root_handle):
            took_over = self._install_root(spec.interface, link.ifindex, actual)
            actual = self.read_actual(link.ifindex)
        tuning = self.tuning or HtbTuning(mtu=link.mtu + ETH_HEADER)
        layout = desired_layout(spec, tuning, self.major, tables_in_use(spec, actual))
        ops = diff(actual, layout)
        if actual.default_minor != layout.default_minor:
            # Our qdisc, but someone changed its default class: only a replace fixes that.
            self.sock.execute(
                [tcm.add_htb_root(link.ifindex, self.major, layout.default_minor, replace=True)]
            )
        self._written = None
        table_deletes = [op for op in ops if _deletes_table(op)]
        self.sock.execute([self._encode(link.ifindex, op) for op in ops if not _deletes_table(op)])
        self._delete_tables(link.ifindex, table_deletes)
        self._written = (link.ifindex, layout)
        return ApplyResult(tuple(ops), took_over, dict(layout.job_table))

    def class_counters(self, interface: str) -> dict[int, tuple[int, int, int]]:
        """Our classes' kernel counters: minor -> (bytes, packets, drops) since creation."""
        ifindex = self.link(interface).ifindex
        counters = {}
        for msg in self.sock.dump_tc(RTM_GETTCLASS, ifindex):
            if msg["handle"] >> 16 != self.major:
                continue
            stats = msg.get_attr("TCA_STATS") or {}
            counters[msg["handle"] & 0xFFFF] = (
                int(stats.get("bytes", 0)),
                int(stats.get("packets", 0)),
                int(stats.get("drop", 0)),
            )
        return counters

    def plan(self, spec: DatapathSpec) -> PlannedChange:
        """What `apply(spec)` would change now, touching nothing (for `plan --dry-run`)."""
        link = self.link(spec.interface)
        actual = self.read_actual(link.ifindex)
        installs_root = not self._is_ours(actual.root_kind, actual.root_handle)
        if installs_root:
            actual = ActualState(root_kind="htb", root_handle=0, default_minor=None)
        tuning = self.tuning or HtbTuning(mtu=link.mtu + ETH_HEADER)
        layout = desired_layout(spec, tuning, self.major, tables_in_use(spec, actual))
        ops = tuple(diff(actual, layout))
        return PlannedChange(installs_root, ops, dict(layout.job_table))

    def _delete_tables(self, ifindex: int, deletes: list[TcOp]) -> None:
        """A job table can be deleted only once the links into it are gone, and the kernel
        drops those references in deferred work (cls_u32 answers EBUSY "in-use" meanwhile):
        retry briefly; a table still busy stays, empty and unreferenced, for the next pass."""
        for delay in TABLE_DELETE_RETRIES:
            if not deletes:
                return
            try:
                self.sock.execute([self._encode(ifindex, op) for op in deletes])
                return
            except TransientError:
                time.sleep(delay)
                actual = self.read_actual(ifindex).tables
                deletes = [
                    op
                    for op in deletes
                    if isinstance(op, DeleteFilter) and u32_htid(op.handle) in actual
                ]

    def rotate(self, spec: DatapathSpec) -> ApplyResult:
        """Band changes only, against what we last wrote: one batch of class changes.
        Falls back to a full `apply` when jobs or ports changed or nothing is cached."""
        if self._written is None:
            return self.apply(spec)
        ifindex, layout = self._written
        planned = retarget_tables(layout, spec)
        if planned is None:
            return self.apply(spec)
        new_layout, ops = planned
        self._written = None
        try:
            self.sock.execute([self._encode(ifindex, op) for op in ops])
        except NetlinkRequestError:
            # The fast path trusts what we last wrote; a refusal means the kernel's state
            # drifted from it (a class deleted by hand, the link recreated). The full apply
            # reads the kernel back, and raises what the kernel really refuses.
            return self.apply(spec)
        self._written = (ifindex, new_layout)
        return ApplyResult(tuple(ops), None, dict(new_layout.job_table))

    def _install_root(self, interface: str, ifindex: int, actual: ActualState) -> PreviousRootQdisc:
        _, raw = self._root_qdisc(ifindex)
        is_default = actual.root_handle == 0
        if not is_default and not self.take_over_foreign:
            raise ForeignQdiscError(
                f"{interface} already has a root qdisc {actual.root_kind} "
                f"{tcm.format_handle(actual.root_handle)} that TensorLights did not install. "
                "Remove it, or allow the takeover (take_over_foreign_qdisc = true / "
                "--take-over-foreign-qdisc); cleanup will restore it."
            )
        options = b""
        if raw is not None and not is_default:
            header = NLMSG_HDR.size + _TCMSG_SIZE
            options = tcm.attributes(raw, header).get(tcm.TCA_OPTIONS, b"")
        previous = PreviousRootQdisc(
            kind=actual.root_kind or "none",
            handle=actual.root_handle,
            is_default=is_default,
            options=options,
        )
        if self.records.load(interface) is None:
            # Keep the oldest record: after a crash mid-install the root may already be ours.
            self.records.save(interface, previous)
        self.sock.execute([tcm.add_htb_root(ifindex, self.major, 0x2, replace=True)])
        return previous

    def _encode(self, ifindex: int, op: TcOp) -> Request:
        match op:
            case PutClass(cls, create):
                return tcm.put_htb_class(ifindex, self.major, cls, create)
            case AddTable(htid):
                return tcm.add_job_table(ifindex, self.major, htid)
            case PutTableTarget(htid, target, create):
                return tcm.put_table_target(ifindex, self.major, htid, target, create)
            case AddPortTable(family):
                return tcm.add_port_table(ifindex, self.major, family)
            case PutLink(family, port, htid, handle_, create):
                return tcm.put_port_link(ifindex, self.major, family, port, htid, handle_, create)
            case AddHashLink(family):
                return tcm.add_hash_link(ifindex, self.major, family)
            case DeleteAllFilters(family):
                return tcm.delete_all_filters(ifindex, self.major, family)
            case DeleteFilter(family, handle_):
                return tcm.delete_filter(ifindex, self.major, family, handle_)
            case DeleteClass(minor):
                return tcm.delete_htb_class(ifindex, self.major, minor)
            case PutLeaf(minor, handle_, limit):
                return tcm.put_leaf_fifo(ifindex, self.major, minor, handle_, limit)
            case DeleteLeaf(minor, handle_):
                return tcm.delete_leaf(ifindex, self.major, minor, handle_)
        raise AssertionError(f"unknown op {op!r}")

    # Cleanup --------------------------------------------------------------------------

    def cleanup(self, interface: str) -> str:
        """Remove our qdisc and put back what was there before. Returns what was done."""
        self._written = None
        link = self.link(interface)
        root, _ = self._root_qdisc(link.ifindex)
        record = self.records.load(interface)
        if root is None or not self._is_ours(root.get_attr("TCA_KIND"), root["handle"]):
            self.records.forget(interface)
            return f"{interface}: no TensorLights qdisc; nothing to do"
        if record is not None and not record.is_default:
            self.sock.execute(
                [tcm.add_root_qdisc_raw(link.ifindex, record.kind, record.handle, record.options)]
            )
            done = f"{interface}: restored {record.kind} {tcm.format_handle(record.handle)}"
        else:
            self.sock.execute([tcm.delete_root_qdisc(link.ifindex, tcm.handle(self.major, 0))])
            done = f"{interface}: removed TensorLights qdisc; kernel default root qdisc back"
        self.records.forget(interface)
        return done


def tcm_decode(raw: bytes) -> Any:
    msg = tcmsg(raw)
    msg.decode()
    return msg
