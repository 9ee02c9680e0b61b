"""Pure planning of the tc objects TensorLights owns on one interface.

`desired_layout` turns a DatapathSpec into the qdisc, classes and filters that must exist;
`diff` compares that with what the kernel reports and returns the smallest ordered list of
operations that makes them equal. No I/O here: the datapath reads and writes the kernel.

Layout (HTB backend, one qdisc of ours at the root, handle MAJOR:):

    MAJOR:1      root class, rate = ceil = link
      MAJOR:2    unmanaged traffic (default class): guaranteed share, borrows at its band
      MAJOR:1xx  one leaf class per job: tiny rate, ceil = link, HTB prio = the job's band

A leaf's tiny rate and one-packet burst mean it almost never sends "under rate"; everything it
sends is borrowed from the root, and HTB lends in priority order, so bands are strict priority.
Moving the green light is therefore only a change of the `prio` of the classes whose band
changed: the filters (source port -> job class) stay put.

Filters: u32, one per (family, source port), at a fixed filter priority per family
(FILTER_PRIO) in the root hash table; the node part of each handle is ours to allocate.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from tensorlights.model import DatapathSpec

DEFAULT_MAJOR = 0x7A1
ROOT_MINOR = 0x1
UNMANAGED_MINOR = 0x2
FIRST_JOB_MINOR = 0x100
LAST_JOB_MINOR = 0xFFFE
MAX_FILTER_NODE = 0xFFF
PSCHED_TICK_NS = 64  # the kernel's PSCHED_SHIFT = 6: HTB buffers travel in 64 ns ticks
U32_ROOT_HTID = 0x800


class Family(StrEnum):
    IPV4 = "ipv4"
    IPV6 = "ipv6"


FILTER_PRIO: Mapping[Family, int] = {Family.IPV4: 10, Family.IPV6: 11}
"""Our u32 filters live at these filter priorities (one per family) and nowhere else."""


@dataclass(frozen=True)
class HtbTuning:
    """Knobs that make HTB behave as strict priority; defaults measured on veth at 200 Mbit."""

    mtu: int = 1514
    """Largest frame on the link including the Ethernet header."""
    quantum: int = 0
    """Bytes a class may send per DRR round among classes of the same band; 0 = 2 x mtu."""
    min_job_rate_bps: int = 8_000
    """A job class's own (guaranteed) rate: tiny, so all it sends is borrowed in prio order."""
    ceil_burst_seconds: float = 0.002
    """Depth of the ceil buckets in seconds at link rate. Too small and the green class runs
    dry between timer ticks, letting lower bands borrow: strictness falls apart."""

    def effective_quantum(self) -> int:
        return self.quantum or 2 * self.mtu


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
class InstalledFilter:
    """A u32 filter read back from the kernel at one of our filter priorities."""

    family: Family
    handle: int
    port: int | None  # None: the filter does not have the shape we install
    target_minor: int | None


@dataclass(frozen=True)
class ActualState:
    """What the kernel has on the interface, restricted to our qdisc."""

    root_kind: str | None  # kind of the root qdisc, None if the kernel reports none
    root_handle: int
    default_minor: int | None  # HTB defcls of our qdisc, when the root qdisc is ours
    classes: Mapping[int, HtbClass] = field(default_factory=dict)
    filters: tuple[InstalledFilter, ...] = ()


@dataclass(frozen=True)
class DesiredLayout:
    major: int
    default_minor: int
    classes: Mapping[int, HtbClass]
    filters: Mapping[tuple[Family, int], int]  # (family, source port) -> target class minor
    job_minor: Mapping[str, int]


# Operations, in the order `diff` emits them -------------------------------------------------


@dataclass(frozen=True)
class PutClass:
    cls: HtbClass
    create: bool


@dataclass(frozen=True)
class PutFilter:
    family: Family
    port: int
    target_minor: int
    handle: int  # full handle for a replace, node-only (htid 0) for a create
    create: bool


@dataclass(frozen=True)
class DeleteFilter:
    family: Family
    handle: int


@dataclass(frozen=True)
class DeleteClass:
    minor: int


TcOp = PutClass | PutFilter | DeleteFilter | DeleteClass


def psched_ticks(size_bytes: int, rate_bytes_per_s: int) -> int:
    """Time to send `size_bytes` at `rate`, in the kernel's psched ticks (as tc computes it)."""
    return int(size_bytes * 1_000_000_000 / rate_bytes_per_s / PSCHED_TICK_NS)


def is_job_minor(minor: int) -> bool:
    return FIRST_JOB_MINOR <= minor <= LAST_JOB_MINOR


def assign_job_minors(jobs: Iterable[str], previous: Mapping[str, int]) -> dict[str, int]:
    """Stable class minor per job: keep the one a job had, else a hash of its id, probing
    linearly on collision. Jobs are visited in sorted order so the result is deterministic."""
    job_list = sorted(set(jobs))
    capacity = LAST_JOB_MINOR - FIRST_JOB_MINOR + 1
    if len(job_list) > capacity:
        raise ValueError(f"{len(job_list)} jobs exceed the {capacity} class minors available")
    taken: dict[int, str] = {}
    result: dict[str, int] = {}
    for job in job_list:
        minor = previous.get(job)
        if minor is not None and is_job_minor(minor) and minor not in taken:
            taken[minor] = job
            result[job] = minor
    for job in job_list:
        if job in result:
            continue
        slot = zlib.crc32(job.encode()) % capacity
        while FIRST_JOB_MINOR + slot in taken:
            slot = (slot + 1) % capacity
        taken[FIRST_JOB_MINOR + slot] = job
        result[job] = FIRST_JOB_MINOR + slot
    return result


def minors_in_use(spec: DatapathSpec, actual: ActualState) -> dict[str, int]:
    """Which class each job's ports point at in the kernel now (majority vote per job)."""
    port_target = {(f.family, f.port): f.target_minor for f in actual.filters if f.port}
    hint: dict[str, int] = {}
    for job in spec.jobs:
        votes = Counter(
            target
            for family in Family
            for port in job.ports
            if (target := port_target.get((family, port))) is not None and is_job_minor(target)
        )
        if votes:
            hint[job.job] = votes.most_common(1)[0][0]
    return hint


def desired_layout(
    spec: DatapathSpec,
    tuning: HtbTuning,
    major: int = DEFAULT_MAJOR,
    previous_minors: Mapping[str, int] | None = None,
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
    job_rate = max(1, tuning.min_job_rate_bps // 8)
    job_buffer = psched_ticks(tuning.mtu, job_rate)
    job_minor = assign_job_minors((j.job for j in spec.jobs), previous_minors or {})
    filters: dict[tuple[Family, int], int] = {}
    for job in spec.jobs:
        minor = job_minor[job.job]
        classes[minor] = HtbClass(
            minor, ROOT_MINOR, job_rate, link, job_buffer, cbuffer, quantum, job.band
        )
        for port in job.ports:
            for family in Family:
                filters[(family, port)] = minor
    return DesiredLayout(major, UNMANAGED_MINOR, classes, filters, job_minor)


def _ours(minor: int) -> bool:
    return minor in (ROOT_MINOR, UNMANAGED_MINOR) or is_job_minor(minor)


def diff(actual: ActualState, desired: DesiredLayout) -> list[TcOp]:
    """Ordered operations that turn `actual` into `desired` without a moment in which a
    managed port's traffic lacks a class: classes first (parents before children), then
    filter retargets and additions, then stale filters, then stale classes."""
    ops: list[TcOp] = []
    for minor in sorted(desired.classes, key=lambda m: (desired.classes[m].parent_minor, m)):
        want = desired.classes[minor]
        have = actual.classes.get(minor)
        if have != want:
            ops.append(PutClass(want, create=have is None))

    wanted_filters = dict(desired.filters)
    used_nodes: dict[Family, set[int]] = {family: set() for family in Family}
    stale: list[InstalledFilter] = []
    for installed in actual.filters:
        used_nodes[installed.family].add(installed.handle & MAX_FILTER_NODE)
        key = (installed.family, installed.port) if installed.port is not None else None
        if key is None or key not in wanted_filters:
            stale.append(installed)
            continue
        target = wanted_filters.pop(key)
        if installed.target_minor != target:
            ops.append(PutFilter(key[0], key[1], target, installed.handle, create=False))
    next_node = {family: 1 for family in Family}
    for (family, port), target in sorted(wanted_filters.items()):
        node = next_node[family]
        while node in used_nodes[family]:
            node += 1
        if node > MAX_FILTER_NODE:
            raise ValueError(
                f"more than {MAX_FILTER_NODE} {family} PS ports on one interface; "
                "the u32 root table is full"
            )
        used_nodes[family].add(node)
        next_node[family] = node + 1
        ops.append(PutFilter(family, port, target, node, create=True))
    ops.extend(DeleteFilter(f.family, f.handle) for f in stale)

    for minor in sorted(actual.classes, reverse=True):
        if minor not in desired.classes and _ours(minor) and minor != ROOT_MINOR:
            ops.append(DeleteClass(minor))
    return ops
