"""Domain types shared by every layer (frozen, validated on construction)."""

from __future__ import annotations

import functools
import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple, TypeVar

from tensorlights.errors import ConfigError

T = TypeVar("T")

NUM_BANDS = 8
"""HTB has eight priorities (0-7); band 0 is the green light."""
GREEN_BAND = 0
MAX_PORT = 65535
MAX_JOB_ID = 256
"""A job id is 1-256 printable characters, wherever it comes from (a process's environment,
a launcher's spec, a jobs file, an agent's report)."""

_HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,252})$")


def visible(text: str) -> str:
    """`text` with every unprintable character (terminal escapes, newlines) written as its
    Python escape, e.g. \\x1b: text from processes and agents, shown to an operator."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


def interface_name_problem(name: str) -> str | None:
    """Why `name` is not an interface name we work with, or None. Linux takes any bytes but
    "/", ":" and white space; we also refuse unprintable ones (they reach terminals)."""
    if not name or len(name) > 15 or not name.isprintable() or any(c in "/: " for c in name):
        return f"interface name {visible(name)!r} is not a valid Linux name"
    return None


def job_id_problem(job: str) -> str | None:
    """Why `job` is not a job id, or None when it is one."""
    if not job or len(job) > MAX_JOB_ID or not job.isprintable():
        return f"job id {job[:80]!r} must be 1-{MAX_JOB_ID} printable characters"
    return None


def host_name_problem(host: str) -> str | None:
    """Why `host` is not a host name as the controller knows hosts, or None."""
    if not _HOST_NAME.match(host):
        return f"host {host[:80]!r} is not a host name (letters, digits, . _ -)"
    return None


@dataclass(frozen=True)
class JobShaping:
    """One job's PS traffic on this host and the band it is in now.

    `ports` are the local (source) ports of the job's PS sockets on this host: its
    listeners and its established connections. A port belongs to at most one job.
    """

    job: str
    band: int
    ports: frozenset[int]
    pod_endpoints: frozenset[tuple[str, int]] = frozenset()
    """(address, port) of the job's PS sockets in pods' own network namespaces whose traffic
    this host forwards (routed or encapsulated): classified before it leaves the host."""

    def __post_init__(self) -> None:
        if problem := job_id_problem(self.job):
            raise ConfigError(problem)
        for address, port in self.pod_endpoints:
            try:
                ipaddress.ip_address(address)
            except ValueError:
                raise ConfigError(f"job {self.job}: pod address {address!r} is not an IP") from None
            if not 0 < port <= MAX_PORT:
                raise ConfigError(f"job {self.job}: pod port {port} is outside 1..{MAX_PORT}")
        if not 0 <= self.band < NUM_BANDS:
            raise ConfigError(f"job {self.job}: band {self.band} is outside 0..{NUM_BANDS - 1}")
        bad = sorted(p for p in self.ports if not 1 <= p <= MAX_PORT)
        if bad:
            raise ConfigError(f"job {self.job}: ports {bad[:5]} are outside 1..{MAX_PORT}")


@dataclass(frozen=True)
class DatapathSpec:
    """Everything the datapath must make true on one interface."""

    interface: str
    link_rate_bps: int
    jobs: tuple[JobShaping, ...] = ()
    unmanaged_share: float = 0.05
    """Share of the link guaranteed to traffic that is not a managed PS (never starved)."""
    unmanaged_band: int = NUM_BANDS - 1
    """Priority at which unmanaged traffic borrows beyond its guaranteed share."""
    short_waiting_queues: bool = False
    """The waiting bands (all but the green one) queue only a short time of their guaranteed
    rate, raised so the queue drains fast (policy/tc_plan.py, HtbTuning.waiting_queue_seconds).
    For traffic the host forwards (pods): no TCP small queues hold those senders back, and a
    waiting band's default queue (txqueuelen packets at its trickle) strands their packets for
    tens of seconds; a long queue is a long round trip, and a long RTO once green."""

    def __post_init__(self) -> None:
        if problem := interface_name_problem(self.interface):
            raise ConfigError(problem)
        if self.link_rate_bps <= 0:
            raise ConfigError(f"link rate must be positive, got {self.link_rate_bps}")
        if not (math.isfinite(self.unmanaged_share) and 0.0 < self.unmanaged_share <= 0.5):
            raise ConfigError(
                f"unmanaged_share {self.unmanaged_share} must be in (0, 0.5]: non-PS traffic "
                "needs a guaranteed share and PS jobs need the rest"
            )
        if not 0 <= self.unmanaged_band < NUM_BANDS:
            raise ConfigError(f"unmanaged_band {self.unmanaged_band} is outside 0..{NUM_BANDS - 1}")
        seen_jobs: set[str] = set()
        port_owner: dict[int, str] = {}
        endpoint_owner: dict[tuple[str, int], str] = {}
        for job in self.jobs:
            if job.job in seen_jobs:
                raise ConfigError(f"job {job.job} appears twice in the datapath spec")
            seen_jobs.add(job.job)
            for port in job.ports:
                other = port_owner.setdefault(port, job.job)
                if other != job.job:
                    raise ConfigError(f"port {port} is claimed by both {other} and {job.job}")
            for endpoint in job.pod_endpoints:
                other = endpoint_owner.setdefault(endpoint, job.job)
                if other != job.job:
                    raise ConfigError(
                        f"pod endpoint {endpoint[0]}:{endpoint[1]} is claimed by both {other} "
                        f"and {job.job}"
                    )

    def band_of(self) -> dict[str, int]:
        return {job.job: job.band for job in self.jobs}


@dataclass(frozen=True)
class PreviousRootQdisc:
    """The root qdisc that was on an interface before TensorLights took it over.

    `options` is the raw TCA_OPTIONS payload, replayed verbatim on cleanup.
    `handle == 0` with `is_default` means the kernel's own default, which comes back by itself
    when our qdisc is deleted.
    """

    kind: str
    handle: int
    is_default: bool
    options: bytes = field(default=b"", repr=False)


class JobKind(StrEnum):
    """How a job's processes talk; either way its traffic gets one band (discovery/rules.py)."""

    PS = "ps"
    """Parameter servers push to their workers: the PS processes' sockets are the traffic."""
    COLLECTIVE = "collective"
    """All-reduce among ranks (DDP, Horovod, MPI): every rank's sockets are the traffic."""


@dataclass(frozen=True)
class PsConnection:
    """An established connection of a PS: its local port and the worker at the other end."""

    local_port: int
    peer_addr: str
    peer_port: int
    family: int = 2
    """AF_INET (2) or AF_INET6 (10)."""
    kernel_id: bytes = field(default=b"", repr=False, compare=False)
    """The kernel's inet_diag id of this socket, for per-socket tcp_info queries."""
    local_addr: str = ""
    """The local address (a pod's own, for a PS in a pod's network namespace)."""


@dataclass(frozen=True)
class PsTask:
    """One process whose sockets are its job's traffic (a parameter server, or a rank of a
    collective job) found on this host, and its TCP sockets now."""

    pid: int
    create_time: float
    """Seconds since the epoch; with `pid` it names the process (a reused PID differs)."""
    job: str
    source: str
    """What identified it: env, rule:<name>, tf_config, dmlc, torch, slurm, or parent:<pid>."""
    netns: int
    """Inode of its network namespace."""
    in_agent_netns: bool
    listen_ports: frozenset[int]
    connections: tuple[PsConnection, ...]
    peers: tuple[str, ...] = ()
    """Worker endpoints named by the job's launcher (TF_CONFIG), when it names them."""
    stale: bool = False
    """True when this scan could not read its sockets and these are the last ones known."""
    kind: JobKind = JobKind.PS
    rdma: str | None = None
    """Why its traffic bypasses the kernel (RDMA verbs): then its job is not shaped here."""
    iterations: int | None = None
    """The job's total iterations, where its environment declares them."""

    @property
    def local_ports(self) -> frozenset[int]:
        return self.listen_ports | {conn.local_port for conn in self.connections}


@dataclass(frozen=True)
class DiscoverySnapshot:
    """Everything one discovery scan found."""

    tasks: tuple[PsTask, ...]
    members: tuple[tuple[str, str, int], ...] = ()
    """(job, role, local process count) for every training process found, PS or not."""
    problems: tuple[str, ...] = ()
    """Processes that look like training jobs but could not be identified, and why."""
    untrusted: tuple[int, ...] = ()
    """PIDs whose job claims the trust setting does not believe (listed in `problems`)."""
    process_events: bool = False
    """New processes are learned from the kernel's process events (else by listing /proc)."""
    processes_from: str = ""
    """Where new processes are learned from, and why not from events, in words."""
    events_lost: int = 0
    """Times the kernel dropped process events since the agent started (each made a scan
    list /proc and re-check every process)."""

    def jobs(self) -> tuple[str, ...]:
        return tuple(sorted({task.job for task in self.tasks}))

    def job_kinds(self) -> dict[str, JobKind]:
        """Each job's kind (a rank anywhere makes it collective)."""
        kinds: dict[str, JobKind] = {}
        for task in self.tasks:
            if kinds.get(task.job) is not JobKind.COLLECTIVE:
                kinds[task.job] = task.kind
        return kinds

    @functools.cached_property
    def collective_jobs(self) -> frozenset[str]:
        """Jobs of ranks (all-reduce), whose traffic spans hosts (read by the sampler and
        the reconciler from the same scan: computed once)."""
        return frozenset(
            job for job, kind in self.job_kinds().items() if kind is JobKind.COLLECTIVE
        )

    @functools.cached_property
    def declared_iterations(self) -> dict[str, int]:
        """Each job's total iterations where its processes declare them (the fewest where
        they differ: fewer only brings the starvation guard's promotion earlier)."""
        declared: dict[str, int] = {}
        for task in self.tasks:
            if task.iterations is not None:
                declared[task.job] = min(declared.get(task.job, task.iterations), task.iterations)
        return declared

    @functools.cached_property
    def unshapeable(self) -> dict[str, str]:
        """Jobs whose traffic here bypasses the kernel (RDMA), and why: a qdisc cannot give
        them a band, so they get none (no ports, no pod endpoints) and are listed instead."""
        found: dict[str, str] = {}
        for task in self.tasks:
            if task.rdma and task.job not in found:
                found[task.job] = f"pid {task.pid}: {task.rdma}"
        return found

    @functools.cached_property
    def _ports_by_job(self) -> dict[str, set[int]]:
        ports: dict[str, set[int]] = {}
        for task in self.tasks:
            if task.in_agent_netns and task.job not in self.unshapeable:
                ports.setdefault(task.job, set()).update(task.local_ports)
        return ports

    def contested_ports(self) -> frozenset[int]:
        """Local ports that PS sockets of more than one job use at once. The kernel lets
        connections to different peers share an ephemeral port, so this happens; a source
        port filter cannot tell those jobs apart, so such a port is given to no job."""
        return _shared(self._ports_by_job)

    def job_pod_endpoints(self) -> dict[str, frozenset[tuple[str, int]]]:
        """(address, port) of each job's PS connections in other network namespaces than
        the agent's (pods, where `pod_shaping` is on), less those two jobs share."""
        return dict(self._job_pod_endpoints)

    @functools.cached_property
    def _job_pod_endpoints(self) -> dict[str, frozenset[tuple[str, int]]]:
        endpoints: dict[str, set[tuple[str, int]]] = {}
        for task in self.tasks:
            if task.in_agent_netns or task.job in self.unshapeable:
                continue
            for conn in task.connections:
                if not conn.local_addr:
                    continue
                address = ipaddress.ip_address(conn.local_addr)
                if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
                    address = address.ipv4_mapped  # a dual-stack socket's IPv4 peer: on the
                    # wire an IPv4 packet from the pod's IPv4 address
                if not address.is_loopback:
                    endpoints.setdefault(task.job, set()).add((str(address), conn.local_port))
        contested = _shared(endpoints)
        return {job: frozenset(found - contested) for job, found in endpoints.items()}

    def job_ports(self) -> dict[str, frozenset[int]]:
        """Local ports of each job's PS sockets in the agent's own network namespace (the
        ones its interface's egress filters can see), less the contested ones."""
        return dict(self._job_ports)

    @functools.cached_property
    def _job_ports(self) -> dict[str, frozenset[int]]:
        contested = self.contested_ports()
        return {job: frozenset(ports - contested) for job, ports in self._ports_by_job.items()}


def _shared(by_job: Mapping[str, set[T]]) -> frozenset[T]:
    """What more than one job holds (a filter keyed on it could not tell them apart)."""
    seen: set[T] = set()
    shared: set[T] = set()
    for held in by_job.values():
        shared |= seen & held
        seen |= held
    return frozenset(shared)


class TcpInfo(NamedTuple):
    """The fields of the kernel's struct tcp_info that telemetry uses (a tuple: one is made
    per connection per sampling round)."""

    unacked: int
    """Segments in flight, not yet acknowledged."""
    last_data_sent_ms: int
    last_data_recv_ms: int
    """Since data last arrived from the peer: a worker's answer (its gradient, its next
    request) between two pushes."""
    last_ack_recv_ms: int
    rtt_us: int
    bytes_acked: int
    bytes_received: int
    segs_out: int
    notsent_bytes: int
    data_segs_out: int
    """Segments carrying data sent, retransmissions included (packets, for counters)."""
    delivery_rate: int
    """Bytes per second, the kernel's most recent estimate."""
    bytes_sent: int
    """Retransmissions included."""
    bytes_retrans: int = 0

    @property
    def outstanding(self) -> int:
        """Bytes sent and not acknowledged yet."""
        return max(0, self.bytes_sent - self.bytes_retrans - self.bytes_acked)


# Agent <-> controller ------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportedJob:
    """One job as an agent reports it to the controller."""

    job: str
    ports: frozenset[int]
    processes: int
    connections: int
    spread_s: float | None = None
    period_s: float | None = None
    demand: float | None = None
    """Share of the host's link it needs at standalone speed (policy/packing.py)."""
    kind: JobKind = JobKind.PS
    lag_s: float | None = None
    """Set while this host's starvation guard would promote the job: the time it lost to
    waiting over the starvation window (packing.StarvationGuard), for the controller's
    cluster-wide order to put it first, as an agent's own pack does."""
    waits_for_siblings: bool = False
    """With lag_s: the job waits in time for its siblings, the only jobs on this host
    (packing.StarvationGuard.waits_in_time); kept waiting where every host says so."""
    remaining_s: float | None = None
    """The job declared its iterations: its remaining standalone time here (seconds;
    packing.StarvationGuard.remaining_work), by which the controller orders equal jobs, the
    least first, as an agent's own pack does. None where it declared none or is unmeasured."""


DEMAND_NOISE = 1.1
"""Demands (and remaining times) within this factor of each other are the same measurement
(pack groups them within x1.3): moving less is not news to the controller."""


def moved_beyond_noise(old: float | None, new: float | None) -> bool:
    """A change of a job's reported demand, or of its remaining time, worth telling the
    controller (and replanning)."""
    if old is None or new is None:
        return old is not new
    return max(old, new) > DEMAND_NOISE * min(old, new)


def jobs_moved(old: Sequence[ReportedJob], new: Sequence[ReportedJob]) -> bool:
    """News between two reports of a host's jobs: a job came or went, or its ports, kind,
    processes or connections changed, or its demand or remaining time moved beyond noise, or
    it began (or ceased) to be measured iterating, which the controller's order holds on, or
    to starve (lag_s) or wait for its siblings (telemetry that only fluctuates, spread, period
    and a lag's size, is not news: heartbeats carry it)."""
    before = {job.job: job for job in old}
    after = {job.job: job for job in new}
    if before.keys() != after.keys():
        return True

    def shape(job: ReportedJob) -> tuple[object, ...]:
        return (
            job.ports, job.kind, job.processes, job.connections, job.period_s is None,
            job.lag_s is None, job.waits_for_siblings,
        )  # fmt: skip

    return any(
        shape(before[name]) != shape(job)
        or moved_beyond_noise(before[name].demand, job.demand)
        or moved_beyond_noise(before[name].remaining_s, job.remaining_s)
        for name, job in after.items()
    )


@dataclass(frozen=True)
class AppliedRotation:
    """A green-light change an agent applied: who, when (Unix seconds), under which plan."""

    green: str
    applied_at: float
    generation: int


@dataclass(frozen=True)
class Registration:
    host: str
    incarnation: int
    agent_version: str
    interfaces: tuple[tuple[str, int], ...]
    """(name, link rate in bit/s)."""
    fallback_policy: str


class Mode(StrEnum):
    """Whose decision a host's bands are."""

    PLAN = "plan"
    """The controller's plan (its lease runs)."""
    LOCAL = "local"
    """The host's own policy (standalone, no plan yet, or the lease ran out)."""


class LinkStatus(StrEnum):
    """An agent's link to the controller."""

    CONNECTING = "connecting"
    CONNECTED = "connected"
    UNREACHABLE = "unreachable"
    UNAUTHENTICATED = "unauthenticated"
    REFUSED = "refused"


@dataclass(frozen=True)
class LinkState:
    """An agent's link to the controller as status shows it; replaced whole, never changed
    in place (the link's threads write it, the status reads it)."""

    state: LinkStatus = LinkStatus.CONNECTING
    detail: str = ""
    session: str = ""
    controller_incarnation: int = 0
    plans: int = 0
    last_plan_generation: int = 0
    reports: int = 0
    reports_skipped: int = 0
    """Report intervals with no news and no heartbeat due: nothing sent."""
    renewals: int = 0
    """Report replies that renewed the plan's lease (PlanRenewal)."""
    since: float = 0.0
    """Unix time of the last change of state."""


class VoucherSource(StrEnum):
    """The resource-manager sources whose word the agents' trust setting takes."""

    SLURM = "slurm"
    """The job's user; its tasks are known by their job cgroup."""
    STATIC = "static"
    """The jobs file: the job's user on its PS hosts."""
    KUBERNETES = "kubernetes"
    """The job's pods on the host."""


@dataclass(frozen=True)
class Voucher:
    """What a resource-manager source tells one host of a job there, so that its agent can
    believe that job's processes (discovery/trust.py)."""

    job: str
    source: VoucherSource
    user: str = ""
    """The job's user by name ("" where the source does not say)."""
    pods: tuple[tuple[str, int | None], ...] = ()
    """(pod UID, the uid its containers run as or None where the pod does not say)."""


@dataclass(frozen=True)
class HostReport:
    session: str
    seq: int
    jobs: tuple[ReportedJob, ...]
    rotations: tuple[AppliedRotation, ...]
    mode: Mode
    health: str


@dataclass(frozen=True)
class PlanSlots:
    """A host's plan as the controller sends it (times in Unix seconds)."""

    incarnation: int
    generation: int
    lease_s: float
    epoch: float
    slot_s: float
    slots: tuple[tuple[str, ...], ...]

    @property
    def version(self) -> tuple[int, int]:
        return self.incarnation, self.generation


@dataclass(frozen=True)
class PlanRenewal:
    """A report's reply: the plan the controller holds for the host, renewed for `lease_s`
    from its arrival. An agent following exactly that version extends its lease; the plan
    stream stays quiet meanwhile (at 10,000 hosts, its renewals were twice the heartbeats)."""

    incarnation: int
    generation: int
    lease_s: float

    @property
    def version(self) -> tuple[int, int]:
        return self.incarnation, self.generation
