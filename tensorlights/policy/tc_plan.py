"""Pure planning of the tc objects TensorLights owns on one interface.

`desired_layout` turns a DatapathSpec into the classes and filters that must exist; `diff`
compares that with what the kernel reports and returns the smallest ordered list of
operations that makes them equal. No I/O here: the datapath reads and writes the kernel.

Layout (HTB backend, one qdisc of ours at the root, handle MAJOR:):

    MAJOR:1        root class, rate = ceil = link
      MAJOR:2      unmanaged traffic (the default class): guaranteed share, borrows at its band
      MAJOR:10+b   band b (0 = green): small rate, ceil = link, HTB prio b
        MAJOR+1+b: a pfifo leaf of waiting_queue_packets, for b >= 1 with short waiting
                   queues (spec.short_waiting_queues); else the kernel's default leaf

    u32, root table of each family:  TCP --link, hashed on the source port's low byte-->
    u32, the family's port table P (256 buckets):  (TCP, source port) --link--> job table J
    u32, job table J (one per job):  match all --> MAJOR:10+band(job)

A u32 table holds at most 4095 filters, and the ports of collective jobs pass that (64 jobs of
64 ranks' connections: 4096 per family); hashed, each bucket holds the ports ending in one
byte, and a packet is checked against its bucket's ports only.

A band's small rate and one-packet burst mean it almost never sends "under rate"; what it
sends is borrowed from the root, and HTB lends in priority order: bands are strict priority.
Moving the green light replaces the single filter in the table of each job whose band changed;
port filters stay put. (Changing a class's HTB prio instead does not work: the kernel keeps a
backlogged class in the lists of its old priority until its queue drains.)
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum

from tensorlights.model import NUM_BANDS, DatapathSpec

DEFAULT_MAJOR = 0x7A1
ROOT_MINOR = 0x1
UNMANAGED_MINOR = 0x2
FIRST_BAND_MINOR = 0x10
FIRST_JOB_TABLE = 0x001
LAST_JOB_TABLE = 0x7FD  # the kernel numbers its own u32 tables from 0x800 up
MAX_FILTER_NODE = 0xFFF
JOB_TABLE_NODE = 1  # the one filter inside a job's table
PORT_BUCKETS = 256
"""Buckets of each family's port table: hashed on the source port's low byte."""
HASH_LINK_NODE = MAX_FILTER_NODE
"""The filter in a family's root table that hashes TCP packets into its port table. The
last node: a root table that still holds a previous version's port filters (nodes from 1)
keeps them matching first while the hashed ones are put in, then loses them."""
PSCHED_TICK_NS = 64  # the kernel's PSCHED_SHIFT = 6: HTB buffers travel in 64 ns ticks


class Family(StrEnum):
    IPV4 = "ipv4"
    IPV6 = "ipv6"


FILTER_PRIO: Mapping[Family, int] = {Family.IPV4: 10, Family.IPV6: 11}
"""Our u32 filters live at these filter priorities (one per family) and nowhere else.
Job tables are created under the IPv4 priority and linked to from both."""
JOB_TABLE_FAMILY = Family.IPV4
PORT_TABLE: Mapping[Family, int] = {Family.IPV4: 0x7FE, Family.IPV6: 0x7FF}
"""Each family's port table (its u32 table id), created under the family's priority."""


def band_minor(band: int) -> int:
    return FIRST_BAND_MINOR + band


def u32_table_handle(htid: int) -> int:
    return (htid & 0xFFF) << 20


def u32_htid(handle: int) -> int:
    return (handle >> 20) & 0xFFF


def u32_bucket(handle: int) -> int:
    return (handle >> 12) & 0xFF


def port_bucket(port: int) -> int:
    """The port table bucket of a source port (the kernel hashes its low byte)."""
    return port & (PORT_BUCKETS - 1)


def port_link_handle(family: Family, port: int, node: int) -> int:
    """The handle of the filter for `port` at `node` of its bucket in the family's table."""
    return u32_table_handle(PORT_TABLE[family]) | port_bucket(port) << 12 | node


@dataclass(frozen=True)
class HtbTuning:
    """Knobs that make HTB behave as strict priority; defaults measured on veth at 200 Mbit."""

    mtu: int = 1514
    """Largest frame on the link including the Ethernet header."""
    quantum: int = 0
    """Bytes a class may send per DRR round among classes of the same band; 0 = 2 x mtu."""
    min_band_rate_bps: int = 256_000
    """A band's own (guaranteed) rate: small, so nearly all it sends is borrowed in priority
    order, yet enough for a packet every ~50 ms. Lower (8 kbit: a packet every 1.5 s) and a
    waiting job's TCP flows fall into exponential RTO backoff and stay silent for seconds
    after they get the green light (measured on veth at 200 Mbit)."""
    min_band_share: float = 0.001
    """On fast links a band's guaranteed rate is at least this share of the link."""
    ceil_burst_seconds: float = 0.002
    """Depth of the ceil buckets in seconds at link rate. Too small and the green class runs
    dry between timer ticks, letting lower bands borrow: strictness falls apart."""
    waiting_queue_seconds: float = 0.1
    """With short waiting queues: a waiting band's leaf holds this long of its guaranteed
    rate, and that rate is raised until its leaf's packets drain in this long. The queue
    is a waiting flow's round trip, and its RTO follows (about twice that): a flow that loses
    its first packets when it turns green sits out that RTO. With 16 packets at 256 kbit
    (0.76 s) waiting pods carried RTOs of 1.1-2.2 s into their turns, and one move in ~110
    stalled 1.5 s; drained in 0.1 s, they carry 0.3 s (two pods at 200 Mbit, VXLAN)."""
    waiting_queue_min_packets: int = 16
    """...and never fewer packets. Measured with two pods' cubic and BBR flows at 100 Mbit,
    the light moving every 2 s: at 16 and 48 packets every move took the link within a
    0.5 s slot; at 8, BBR read the steady drops as a policer and kept pacing at the band's
    rate once green; with the default 1000, a waiting flow's retransmissions sat seconds
    behind its own stranded packets, and the next green one stalled in RTO backoff for 5 s."""

    def effective_quantum(self) -> int:
        return self.quantum or 2 * self.mtu

    def band_rate(self, link: int, short_waiting_queues: bool) -> int:
        """A band's guaranteed rate in bytes/s on a link of `link` bytes/s: with short waiting
        queues, at least what drains a minimal leaf in waiting_queue_seconds (1.9 Mbit; more
        than the floor below ~2 Gbit links only)."""
        rate = max(1, self.min_band_rate_bps // 8, int(link * self.min_band_share))
        if not short_waiting_queues:
            return rate
        drains = math.ceil(self.waiting_queue_min_packets * self.mtu / self.waiting_queue_seconds)
        return max(rate, drains)

    def waiting_queue_packets(self, band_rate: int) -> int:
        """The pfifo limit of a waiting band whose guaranteed rate is `band_rate` bytes/s."""
        return max(
            self.waiting_queue_min_packets, int(band_rate * self.waiting_queue_seconds) // self.mtu
        )


@dataclass(frozen=True)
class HtbClass:
    """One HTB class as the kernel stores it (rates in bytes/s, buffers in psched ticks)."""

    minor: int
    parent_minor: int  # 0: the qdisc itself
    rate: int
    ceil: int
    buffer: int
    cbuffer: int
    quantum: int
    prio: int


@dataclass(frozen=True)
class PortLink:
    """A u32 port filter: (TCP, source port) -> a job table. Ours sit in the port's bucket of
    the family's port table (`port_link_handle`); one anywhere else is a previous version's,
    in the root table."""

    family: Family
    handle: int
    port: int | None  # None: the filter does not have the shape we install
    htid: int | None  # job table it links to


@dataclass(frozen=True)
class HashLink:
    """The filter at HASH_LINK_NODE of a family's root table, as the kernel reports it."""

    family: Family
    handle: int
    ours: bool
    """It hashes TCP packets on the source port's low byte into the family's port table."""


@dataclass(frozen=True)
class JobTable:
    """A job's u32 table and where its single filter sends the job's packets."""

    htid: int
    target_minor: int | None  # of the filter at JOB_TABLE_NODE; None if it is missing
    filter_handles: tuple[int, ...] = ()  # every filter in the table (ours: just one)


@dataclass(frozen=True)
class LeafQdisc:
    """The qdisc under one of our band classes, as the kernel reports it."""

    minor: int  # of the class it is attached to
    kind: str
    handle: int
    limit: int | None  # a fifo's; None for other kinds


def leaf_handle(major: int, band: int) -> int:
    """Our pfifo leaf under band `band`'s class: major MAJOR+1+band."""
    return ((major + 1 + band) & 0xFFFF) << 16


@dataclass(frozen=True)
class ActualState:
    """What the kernel has on the interface, restricted to our qdisc."""

    root_kind: str | None  # kind of the root qdisc, None if the kernel reports none
    root_handle: int
    default_minor: int | None  # HTB defcls of our qdisc, when the root qdisc is ours
    classes: Mapping[int, HtbClass] = field(default_factory=dict)
    links: tuple[PortLink, ...] = ()
    tables: Mapping[int, JobTable] = field(default_factory=dict)
    leaves: Mapping[int, LeafQdisc] = field(default_factory=dict)
    """Qdiscs attached to our band classes (the kernel's default ones are not reported)."""
    port_tables: Mapping[Family, int] = field(default_factory=dict)
    """Each family's port table that exists, with its number of buckets."""
    hash_links: Mapping[Family, HashLink] = field(default_factory=dict)


@dataclass(frozen=True)
class DesiredLayout:
    major: int
    default_minor: int
    classes: Mapping[int, HtbClass]
    job_table: Mapping[str, int]  # job -> htid
    table_target: Mapping[int, int]  # htid -> band class minor
    links: Mapping[tuple[Family, int], int]  # (family, source port) -> htid
    leaves: Mapping[int, int] = field(default_factory=dict)
    """Band class minor -> the packet limit of its pfifo leaf; absent: the default leaf."""
    job_ports: Mapping[str, frozenset[int]] = field(default_factory=dict)
    """The ports each job's links were built from (`links` follows from them and
    `job_table`): the rotation fast path compares these sets, not every link."""


# Operations, in the order `diff` emits them -------------------------------------------------


@dataclass(frozen=True)
class PutClass:
    cls: HtbClass
    create: bool


@dataclass(frozen=True)
class AddTable:
    htid: int


@dataclass(frozen=True)
class PutTableTarget:
    htid: int
    target_minor: int
    create: bool


@dataclass(frozen=True)
class AddPortTable:
    family: Family


@dataclass(frozen=True)
class PutLink:
    family: Family
    port: int
    htid: int
    handle: int  # in the port's bucket of the family's port table (port_link_handle)
    create: bool


@dataclass(frozen=True)
class AddHashLink:
    family: Family


@dataclass(frozen=True)
class DeleteAllFilters:
    """Remove every u32 filter and table of the family's priority (the tc filter instance)."""

    family: Family


@dataclass(frozen=True)
class DeleteFilter:
    family: Family
    handle: int


@dataclass(frozen=True)
class DeleteClass:
    minor: int


@dataclass(frozen=True)
class PutLeaf:
    """Attach (or replace with) our pfifo leaf of `limit` packets under class `minor`."""

    minor: int
    handle: int
    limit: int


@dataclass(frozen=True)
class DeleteLeaf:
    """Remove the qdisc under class `minor`: the kernel puts its default leaf back."""

    minor: int
    handle: int


TcOp = (
    PutClass
    | AddTable
    | PutTableTarget
    | AddPortTable
    | PutLink
    | AddHashLink
    | DeleteAllFilters
    | DeleteFilter
    | DeleteClass
    | PutLeaf
    | DeleteLeaf
)


def psched_ticks(size_bytes: int, rate_bytes_per_s: int) -> int:
    """Time to send `size_bytes` at `rate`, in the kernel's psched ticks (as tc computes it)."""
    return int(size_bytes * 1_000_000_000 / rate_bytes_per_s / PSCHED_TICK_NS)


def is_job_table(htid: int) -> bool:
    return FIRST_JOB_TABLE <= htid <= LAST_JOB_TABLE


def assign_job_tables(jobs: Iterable[str], previous: Mapping[str, int]) -> dict[str, int]:
    """Stable u32 table id per job: keep the one a job had, else a hash of its id, probing
    linearly on collision. Jobs are visited in sorted order so the result is deterministic."""
    job_list = sorted(set(jobs))
    capacity = LAST_JOB_TABLE - FIRST_JOB_TABLE + 1
    if len(job_list) > capacity:
        raise ValueError(f"{len(job_list)} jobs exceed the {capacity} job tables of one interface")
    taken: set[int] = set()
    result: dict[str, int] = {}
    for job in job_list:
        htid = previous.get(job)
        if htid is not None and is_job_table(htid) and htid not in taken:
            taken.add(htid)
            result[job] = htid
    for job in job_list:
        if job in result:
            continue
        slot = zlib.crc32(job.encode()) % capacity
        while FIRST_JOB_TABLE + slot in taken:
            slot = (slot + 1) % capacity
        taken.add(FIRST_JOB_TABLE + slot)
        result[job] = FIRST_JOB_TABLE + slot
    return result


def tables_in_use(spec: DatapathSpec, actual: ActualState) -> dict[str, int]:
    """Which job table each job's ports link to in the kernel now (majority vote per job)."""
    port_table = {(link.family, link.port): link.htid for link in actual.links if link.port}
    hint: dict[str, int] = {}
    for job in spec.jobs:
        votes = Counter(
            htid
            for family in Family
            for port in job.ports
            if (htid := port_table.get((family, port))) is not None and is_job_table(htid)
        )
        if votes:
            hint[job.job] = votes.most_common(1)[0][0]
    return hint


def desired_layout(
    spec: DatapathSpec,
    tuning: HtbTuning,
    major: int = DEFAULT_MAJOR,
    previous_tables: Mapping[str, int] | None = None,
) -> DesiredLayout:
    link = max(1, spec.link_rate_bps // 8)
    ceil_burst = max(int(link * tuning.ceil_burst_seconds), 10 * tuning.mtu)
    cbuffer = psched_ticks(ceil_burst, link)
    quantum = tuning.effective_quantum()

    classes: dict[int, HtbClass] = {
        ROOT_MINOR: HtbClass(ROOT_MINOR, 0, link, link, cbuffer, cbuffer, quantum, 0),
    }
    unmanaged_rate = max(1, int(link * spec.unmanaged_share))
    unmanaged_burst = max(int(unmanaged_rate * tuning.ceil_burst_seconds), 2 * tuning.mtu)
    classes[UNMANAGED_MINOR] = HtbClass(
        UNMANAGED_MINOR,
        ROOT_MINOR,
        unmanaged_rate,
        link,
        psched_ticks(unmanaged_burst, unmanaged_rate),
        cbuffer,
        quantum,
        spec.unmanaged_band,
    )
    band_rate = tuning.band_rate(link, spec.short_waiting_queues)
    band_buffer = psched_ticks(tuning.mtu, band_rate)
    leaves: dict[int, int] = {}
    for band in range(NUM_BANDS):
        minor = band_minor(band)
        classes[minor] = HtbClass(
            minor, ROOT_MINOR, band_rate, link, band_buffer, cbuffer, quantum, band
        )
        if spec.short_waiting_queues and band > 0:
            leaves[minor] = tuning.waiting_queue_packets(band_rate)
    job_table = assign_job_tables((j.job for j in spec.jobs), previous_tables or {})
    links: dict[tuple[Family, int], int] = {}
    table_target: dict[int, int] = {}
    for job in spec.jobs:
        htid = job_table[job.job]
        table_target[htid] = band_minor(job.band)
        for port in job.ports:
            for family in Family:
                links[(family, port)] = htid
    job_ports = {job.job: job.ports for job in spec.jobs}
    return DesiredLayout(
        major, UNMANAGED_MINOR, classes, job_table, table_target, links, leaves, job_ports
    )


def _our_class(minor: int) -> bool:
    return minor in (ROOT_MINOR, UNMANAGED_MINOR) or (
        FIRST_BAND_MINOR <= minor < FIRST_BAND_MINOR + NUM_BANDS
    )


def diff(actual: ActualState, desired: DesiredLayout) -> list[TcOp]:
    """Ordered operations that turn `actual` into `desired` without a moment in which a
    managed port's packets have nowhere to go: classes first (parents before children) and
    their leaves, then job tables and their targets, then port tables, port links and the
    hash links into them, then stale links and tables."""
    ops: list[TcOp] = []
    for minor in sorted(desired.classes, key=lambda m: (desired.classes[m].parent_minor, m)):
        want = desired.classes[minor]
        have = actual.classes.get(minor)
        if have != want:
            ops.append(PutClass(want, create=have is None))
    ops += _leaf_ops(actual, desired)

    if any(buckets != PORT_BUCKETS for buckets in actual.port_tables.values()):
        # A port table's id taken by another table (a previous version's job table): a table
        # cannot go while links point at it, and the links are what is being rebuilt. Only
        # removing every filter frees it; ports are unshaped until this pass ends.
        ops += [DeleteAllFilters(family) for family in Family]
        actual = replace(actual, links=(), tables={}, port_tables={}, hash_links={})

    for htid, target in sorted(desired.table_target.items()):
        table = actual.tables.get(htid)
        if table is None:
            ops += [AddTable(htid), PutTableTarget(htid, target, create=True)]
            continue
        has_node = JOB_TABLE_NODE in {h & MAX_FILTER_NODE for h in table.filter_handles}
        ops.extend(
            DeleteFilter(JOB_TABLE_FAMILY, h)
            for h in table.filter_handles
            if h & MAX_FILTER_NODE != JOB_TABLE_NODE
        )
        if not has_node or table.target_minor != target:
            ops.append(PutTableTarget(htid, target, create=not has_node))
    ops.extend(AddPortTable(family) for family in Family if family not in actual.port_tables)

    link_ops, kept = _link_ops(actual, desired)
    ops += link_ops
    for family in Family:
        hash_link = actual.hash_links.get(family)
        if hash_link is not None and not hash_link.ours:
            ops.append(DeleteFilter(family, hash_link.handle))
        if hash_link is None or not hash_link.ours:
            ops.append(AddHashLink(family))
    ops.extend(DeleteFilter(link.family, link.handle) for link in actual.links if link not in kept)

    for htid in sorted(actual.tables):
        if htid not in desired.table_target:
            ops.append(DeleteFilter(JOB_TABLE_FAMILY, u32_table_handle(htid)))
    for minor in sorted(actual.classes, reverse=True):
        if minor not in desired.classes and _our_class(minor) and minor != ROOT_MINOR:
            ops.append(DeleteClass(minor))
    return ops


def _in_place(link: PortLink) -> bool:
    """In its port's bucket of its family's port table (not a previous version's root link)."""
    return (
        link.port is not None
        and u32_htid(link.handle) == PORT_TABLE[link.family]
        and u32_bucket(link.handle) == port_bucket(link.port)
    )


def _link_ops(actual: ActualState, desired: DesiredLayout) -> tuple[list[TcOp], set[PortLink]]:
    """Port links to re-point (their job's table changed) and to create, and the links kept:
    the first one in place of each wanted port (any other is stale)."""
    ops: list[TcOp] = []
    kept: set[PortLink] = set()
    wanted_links = dict(desired.links)
    used_nodes: dict[tuple[Family, int], set[int]] = {}
    for link in actual.links:
        if not _in_place(link):
            continue
        assert link.port is not None
        used_nodes.setdefault((link.family, port_bucket(link.port)), set()).add(
            link.handle & MAX_FILTER_NODE
        )
        htid = wanted_links.pop((link.family, link.port), None)
        if htid is None:
            continue
        kept.add(link)
        if link.htid != htid:
            ops.append(PutLink(link.family, link.port, htid, link.handle, create=False))
    # A bucket holds the ports ending in its byte: at most 256, under a table's 4095 nodes.
    next_node: dict[tuple[Family, int], int] = {}
    for (family, port), htid in sorted(wanted_links.items()):
        bucket = (family, port_bucket(port))
        used = used_nodes.setdefault(bucket, set())
        node = next_node.get(bucket, 1)
        while node in used:
            node += 1
        used.add(node)
        next_node[bucket] = node + 1
        ops.append(PutLink(family, port, htid, port_link_handle(family, port, node), create=True))
    return ops, kept


def _leaf_ops(actual: ActualState, desired: DesiredLayout) -> list[TcOp]:
    ops: list[TcOp] = []
    for band in range(NUM_BANDS):
        minor = band_minor(band)
        handle = leaf_handle(desired.major, band)
        limit = desired.leaves.get(minor)
        have = actual.leaves.get(minor)
        if limit is not None and have != LeafQdisc(minor, "pfifo", handle, limit):
            ops.append(PutLeaf(minor, handle, limit))
        elif limit is None and have is not None and have.handle == handle:
            ops.append(DeleteLeaf(minor, handle))  # only ours: a leaf someone else put stays
    return ops


def retarget_tables(
    layout: DesiredLayout, spec: DatapathSpec
) -> tuple[DesiredLayout, list[TcOp]] | None:
    """The rotation fast path: if `spec` differs from what `layout` was built from only in
    bands, the new layout and the table retargets; else None (a full reconcile is needed)."""
    if set(layout.job_table) != {job.job for job in spec.jobs}:
        return None
    if bool(layout.leaves) != spec.short_waiting_queues:
        return None
    # Same ports per job: the same links (a set comparison in C; checking every link in
    # Python took 3 ms of a rotation at 64 jobs x 63 ports).
    if any(layout.job_ports.get(job.job) != job.ports for job in spec.jobs):
        return None
    targets = dict(layout.table_target)
    ops: list[TcOp] = []
    for job in spec.jobs:
        htid = layout.job_table[job.job]
        target = band_minor(job.band)
        if targets[htid] != target:
            targets[htid] = target
            ops.append(PutTableTarget(htid, target, create=False))
    new_layout = DesiredLayout(
        layout.major,
        layout.default_minor,
        layout.classes,
        layout.job_table,
        targets,
        layout.links,
        layout.leaves,
        layout.job_ports,
    )
    return new_layout, ops
