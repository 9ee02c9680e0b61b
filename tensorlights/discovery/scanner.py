"""Incremental discovery: parameter-server processes, their jobs, and their TCP sockets.

Each scan:
1. learns which processes are new: from the kernel's process events when the agent has them
   (proc_events.py: the PIDs forked, exec()ed or exited since the last scan), else by listing
   /proc. A process not seen before, or exec()ed since, is inspected once (environment,
   command line, cgroup) and classified by `rules.identify`; its verdict is cached under
   (pid, start time);
2. without events, re-checks young unclassified processes every scan (a launcher forks, then
   exec()s the PS: the first look may see the launcher); every process is re-checked once per
   sweep (`full_sweep_s`; with events, a safety sweep every `EVENTS_SWEEP_S`, and at once
   after the kernel dropped events): exec() of an old process, a PID reused between scans;
3. children of a PS that identify as nothing themselves belong to its job (sticky: they stay
   in it after the PS exits and they are re-parented);
4. reads the socket inodes of every PS process's file table (a descriptor number already seen
   is re-read once per `socket_refresh_s`; new numbers at once), then one inet_diag dump per
   network namespace that holds a PS (skipped while no new inode appeared, up to
   `dump_refresh_s`), and joins them by inode. A new socket is a new descriptor number,
   unless it reuses a number closed since the last scan: then it is seen within
   `socket_refresh_s` (1 s); connections accepted on a known listener share its port anyway.
   A socket is attributed only if a process whose (pid, start time) was verified after
   reading its descriptors holds it, so a port taken over by another process, or a reused
   PID, is never the old job's.

Between scans, `changed()` tells cheaply whether one is due now: events arrived, a PS younger
than `YOUNG_PS_S` opened or closed a descriptor, or, until it listens, holds another set of
socket inodes (its listen() is how a new job's port becomes known), an older PS holds more
descriptors than the last scan read (a worker connected: TensorFlow's workers connect to
their PS at their first step, whose push telemetry would miss at the next scan), a socket was
still unbound at the last dump; without events, the PIDs listed differ or a young process
exec()ed. The agent asks it every `poll_interval` while `polls()`: while there is a PS.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from tensorlights.discovery.proc_events import ProcessWatcher
from tensorlights.discovery.procfs import (
    RDMA_DEVICE,
    RDMA_LINK_PREFIX,
    READ_ANY_PROCESS,
    ProcessGone,
    ProcessHidden,
    ProcFs,
    ProcKey,
    missing_read_capabilities,
)
from tensorlights.discovery.rules import DiscoveryRules, Identity, ProcessFacts, identify
from tensorlights.discovery.sockdiag import SockDiag, TcpSocket, TcpState
from tensorlights.discovery.spank_records import SpankRecordError, SpankRecords
from tensorlights.discovery.trust import slurm_task
from tensorlights.errors import TensorLightsError, TransientError
from tensorlights.model import DiscoverySnapshot, PsConnection, PsTask

MAX_PARENT_DEPTH = 64
EVENTS_SWEEP_S = 30.0
"""With process events, every process is re-checked this often anyway (a safety net)."""
YOUNG_PS_S = 30.0
"""A PS this new has its descriptors checked every poll: a framework opens its listening
socket seconds after exec() (imports, rendezvous), and a new job's port should be known
within a poll, not a scan."""
HIDDEN_SHOWN = 5
"""The PIDs of unreadable processes status names (then "...")."""

_FdRead = set[int] | Literal["gone", "hidden"]


@dataclass
class _Entry:
    key: ProcKey
    comm: str
    ppid: int
    cmdline: bytes
    young_until: float
    """Until then (scanner clock) its command line is re-read every scan, to catch exec()."""
    identity: Identity | None = None
    problem: str | None = None
    untrusted: bool = False
    """It claims a job nothing vouches for: it inherits no PS parent's job either."""
    hidden: bool = False
    inherited: bool = False
    netns: int | None = None
    last_sockets: tuple[frozenset[int], tuple[PsConnection, ...]] | None = None
    rdma_device: bool = False
    """It has had an RDMA device open (procfs.RDMA_DEVICE): its traffic bypasses the qdisc."""
    fds: dict[str, int] | None = None
    """Descriptor -> socket inode as last read, trusted until `fds_fresh_until`."""
    fds_fresh_until: float = float("-inf")
    pidfd: int | None = None
    """Open while it is a PS: tells race-free whether this very process has exited."""
    found_at: float = 0.0
    """When (scanner clock) it was inspected: a PS is young for YOUNG_PS_S after."""


@dataclass(frozen=True)
class _Dump:
    wanted: frozenset[int]
    found: dict[int, TcpSocket]
    at: float
    unbound_new: bool = False
    """An inode first asked about in this dump was not found (a socket not yet listening or
    connected, or not TCP): dumped again at the next scan, once."""


@dataclass(frozen=True)
class _Sockets:
    listen_ports: frozenset[int]
    connections: tuple[PsConnection, ...]
    stale: bool


class Scanner:
    """Keeps what earlier scans learned; `scan()` returns the PS tasks as they are now."""

    def __init__(
        self,
        rules: DiscoveryRules,
        procfs: ProcFs | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        exec_grace_s: float = 3.0,
        full_sweep_s: float = 5.0,
        socket_refresh_s: float = 1.0,
        dump_refresh_s: float = 10.0,
        events: ProcessWatcher | None = None,
        polling_reason: str = "process events not asked for",
    ) -> None:
        self.rules = rules
        self.events = events
        """The kernel's process events; None: /proc is listed every scan."""
        self._polling_reason = polling_reason
        self._ps_entries: list[_Entry] = []
        """The PS processes as of the last scan (what `changed()` looks at)."""
        self._listed: set[int] = set()
        """The PIDs of the last listing of /proc (polling only)."""
        self._spank = SpankRecords(rules.slurm_spank_dir)
        self._proc = procfs or ProcFs()
        self._missing_capabilities = missing_read_capabilities()
        self._clock = clock
        self._exec_grace_s = exec_grace_s
        self._full_sweep_s = full_sweep_s
        self._entries: dict[int, _Entry] = {}
        self._last_sweep = float("-inf")
        self._socket_refresh_s = socket_refresh_s
        self._dump_refresh_s = dump_refresh_s
        self._diag: dict[int, SockDiag] = {}
        self._dumped: dict[int, _Dump] = {}
        self.agent_netns = self._proc.netns_inode("self")

    def close(self) -> None:
        for pid in list(self._entries):
            self._forget(pid)
        for diag in self._diag.values():
            diag.close()
        self._diag.clear()

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_rules(self, rules: DiscoveryRules) -> None:
        """New rules (a config reload): every process is classified again at the next scan."""
        self.rules = rules
        self._spank = SpankRecords(rules.slurm_spank_dir)
        for pid in list(self._entries):
            self._forget(pid)
        self._last_sweep = float("-inf")  # every process, not only those events name

    def _forget(self, pid: int) -> None:
        entry = self._entries.pop(pid, None)
        if entry is not None and entry.pidfd is not None:
            os.close(entry.pidfd)

    # The scan --------------------------------------------------------------------------

    def polls(self) -> bool:
        """Whether `changed()` is worth asking between scans: without events, or while there
        is a PS (one stat of its descriptor table a poll)."""
        return self._live_events() is None or bool(self._ps_entries)

    def changed(self) -> bool:
        """Whether a scan now would find something the last one did not. Cheap: no socket
        dump; a file table is read only for a young PS that has not listened yet."""
        if any(dump.unbound_new for dump in self._dumped.values()):
            return True
        events = self._live_events()
        if events is not None:
            if events.pending():
                return True
        else:
            try:
                if set(self._proc.pids()) != self._listed:
                    return True
            except OSError:
                return True
            now = self._clock()
            for entry in list(self._entries.values()):
                if entry.identity is None and entry.young_until > now and not entry.hidden:
                    try:
                        if self._proc.cmdline_bytes(entry.key.pid) != entry.cmdline:
                            return True
                    except (ProcessGone, ProcessHidden):
                        return True
        now = self._clock()
        for entry in self._ps_entries:
            if entry.fds is None:
                continue
            try:
                if self._awaits_listener(entry, now):
                    fds = self._proc.fd_sockets(entry.key.pid)
                    if set(fds.values()) != set(entry.fds.values()):
                        return True
                    continue
                count = self._proc.fd_count(entry.key.pid)
                if entry.found_at > now - YOUNG_PS_S:
                    if count != len(entry.fds):
                        return True
                elif count > len(entry.fds):
                    # Only more: a PS that opens and closes files keeps scanning at most
                    # until a scan has read it at its most (and again after each refresh).
                    return True
            except (ProcessGone, ProcessHidden):
                return True
        return False

    @staticmethod
    def _awaits_listener(entry: _Entry, now: float) -> bool:
        """A young PS that has not listened yet: its descriptors are read whole every time,
        not by count (a process starting up closes files as fast as it opens sockets, and
        a socket may take the number of a file just closed)."""
        listening = entry.last_sockets is not None and entry.last_sockets[0]
        return not listening and entry.found_at > now - YOUNG_PS_S

    def scan(self) -> DiscoverySnapshot:
        now = self._clock()
        events = self._live_events()
        changes = events.take() if events is not None else None
        sweep_s = self._full_sweep_s if changes is None else EVENTS_SWEEP_S
        full_sweep = now - self._last_sweep >= sweep_s or (changes is not None and changes.lost)
        changed: list[_Entry] = []
        if changes is None or full_sweep:
            pids = set(self._proc.pids())
            self._listed = pids
            for pid in self._entries.keys() - pids:
                self._forget(pid)
            for pid in sorted(pids - self._entries.keys()):
                changed.extend(self._inspect(pid, now))
        else:
            for pid in changes.exited:
                self._forget(pid)
            for pid in sorted(changes.started):  # forked, or exec()ed: inspected afresh
                self._forget(pid)
                changed.extend(self._inspect(pid, now))
        if full_sweep:
            self._last_sweep = now
        for entry in list(self._entries.values()):
            if full_sweep:
                changed.extend(self._recheck(entry, now))
            elif changes is None and entry.identity is None and entry.young_until > now:
                changed.extend(self._recheck_exec(entry, now))
        self._inherit(self._entries.values() if full_sweep else changed)
        tasks = self._collect_tasks()
        self._ps_entries = [entry for entry in self._entries.values() if _is_ps(entry)]
        return DiscoverySnapshot(
            tasks=tuple(sorted(tasks, key=lambda task: (task.job, task.pid))),
            members=self._members(),
            problems=self._problems(),
            untrusted=tuple(sorted(pid for pid, e in self._entries.items() if e.untrusted)),
            **self._process_source(),
        )

    def _live_events(self) -> ProcessWatcher | None:
        """The watcher while it reads; None without one or once it stopped (listing /proc;
        the first listing catches up on what it missed, except an old process's exec(),
        which the sweep finds)."""
        return self.events if self.events is not None and self.events.working else None

    def _process_source(self) -> dict[str, Any]:
        events = self.events
        if events is None:
            return {"processes_from": f"listing /proc ({self._polling_reason})"}
        if not events.working:
            return {"processes_from": f"listing /proc ({events.error})"}
        return {
            "process_events": True,
            "processes_from": f"process events ({events.events.where})",
            "events_lost": events.lost_total,
        }

    def _inspect(self, pid: int, now: float) -> list[_Entry]:
        try:
            stat = self._proc.stat(pid)
            if stat.zombie:
                return []  # no file table; looked at again next scan until reaped
            cmdline = self._proc.cmdline_bytes(pid)
        except ProcessGone:
            return []
        except ProcessHidden:
            self._entries[pid] = _Entry(
                key=ProcKey(pid, -1), comm="?", ppid=0, cmdline=b"", young_until=now, hidden=True
            )
            return []
        entry = _Entry(
            key=stat.key,
            comm=stat.comm,
            ppid=stat.ppid,
            cmdline=cmdline,
            young_until=now + self._exec_grace_s - self._proc.age(stat.key),
            found_at=now,
        )
        if cmdline:  # kernel threads have none, and no environment to read
            try:
                facts, record_problem = self._with_spank_record(self._proc.facts(stat.key))
                verdict = identify(facts, self.rules)
            except ProcessGone:
                return []
            except ProcessHidden:
                entry.hidden = True
            else:
                entry.identity, entry.untrusted = verdict.identity, verdict.untrusted
                entry.problem = "; ".join(filter(None, (record_problem, verdict.problem))) or None
        self._entries[pid] = entry
        return [entry]

    def _with_spank_record(self, facts: ProcessFacts) -> tuple[ProcessFacts, str | None]:
        """The facts with the PS tasks Slurm's plugin recorded for the process's job step (the
        step its cgroup names, else its SLURM_JOB_ID/SLURM_STEP_ID), and why a record there
        is not believed."""
        task = slurm_task(facts.cgroup)
        if task is not None:
            job, step = str(task.job_id), task.step
        else:
            job = facts.environ.get("SLURM_JOB_ID", "").strip()
            step = facts.environ.get("SLURM_STEP_ID", "").strip()
        if not (job.isdigit() and step.isdigit()):
            return facts, None  # not a task of a job step: the plugin records only those
        try:
            record = self._spank.step(int(job), step)
        except SpankRecordError as exc:
            return facts, str(exc)
        if record is None:
            return facts, None
        return replace(facts, declared_ps_tasks=record.ps_tasks), None

    def _recheck_exec(self, entry: _Entry, now: float) -> list[_Entry]:
        """A young process may have exec()ed since: its command line says so."""
        try:
            cmdline = self._proc.cmdline_bytes(entry.key.pid)
        except (ProcessGone, ProcessHidden):
            return []  # the full sweep settles it
        if cmdline == entry.cmdline:
            return []
        self._forget(entry.key.pid)
        return self._inspect(entry.key.pid, now)

    def _recheck(self, entry: _Entry, now: float) -> list[_Entry]:
        """Inspect again if the PID now names another process or the process exec()ed."""
        pid = entry.key.pid
        try:
            stat = self._proc.stat(pid)
            cmdline = self._proc.cmdline_bytes(pid)
        except ProcessGone:
            self._forget(pid)
            return []
        except ProcessHidden:
            return []
        if stat.key == entry.key and cmdline == entry.cmdline and not entry.hidden:
            return []
        self._forget(pid)
        return self._inspect(pid, now)

    def _inherit(self, entries: Iterable[_Entry]) -> None:
        for entry in list(entries):
            if entry.identity is not None or entry.hidden or entry.untrusted:
                continue
            parent = self._entries.get(entry.ppid)
            depth = 0
            while parent is not None and depth < MAX_PARENT_DEPTH:
                if parent.identity is not None:
                    if parent.identity.carries:
                        entry.identity = Identity(
                            job=parent.identity.job,
                            role=parent.identity.role,
                            source=f"parent:{parent.key.pid}",
                            peers=parent.identity.peers,
                            rdma=parent.identity.rdma,
                            iterations=parent.identity.iterations,
                        )
                        entry.inherited = True
                    break
                parent = self._entries.get(parent.ppid)
                depth += 1

    # Sockets ---------------------------------------------------------------------------

    def _collect_tasks(self) -> list[PsTask]:
        inodes_of: dict[int, tuple[_Entry, set[int] | None]] = {}
        for entry in list(self._entries.values()):
            if entry.identity is None or not entry.identity.carries:
                continue
            read = self._read_fds(entry)
            if read != "gone":
                inodes_of[entry.key.pid] = (entry, read if isinstance(read, set) else None)
        # Checked after the descriptors were read: they belonged to these very processes.
        pidfds = {e.pidfd: pid for pid, (e, _) in inodes_of.items() if e.pidfd is not None}
        for fd in self._proc.exited(pidfds):
            self._forget(pidfds[fd])
            del inodes_of[pidfds[fd]]
        by_netns: dict[int, list[tuple[_Entry, set[int] | None]]] = {}
        for entry, inodes in inodes_of.values():
            assert entry.netns is not None
            by_netns.setdefault(entry.netns, []).append((entry, inodes))
        for netns in self._diag.keys() - by_netns.keys():
            self._diag.pop(netns).close()
            self._dumped.pop(netns, None)

        tasks: list[PsTask] = []
        for netns, members in by_netns.items():
            wanted = set().union(*(inodes for _, inodes in members if inodes is not None))
            found = self._dump(netns, [entry.key.pid for entry, _ in members], wanted)
            for entry, inodes in members:
                sockets = self._sockets_of(entry, inodes, found)
                assert entry.identity is not None
                tasks.append(
                    PsTask(
                        pid=entry.key.pid,
                        create_time=self._proc.create_time(entry.key),
                        job=entry.identity.job,
                        source=entry.identity.source,
                        netns=netns,
                        in_agent_netns=netns == self.agent_netns,
                        listen_ports=sockets.listen_ports,
                        connections=sockets.connections,
                        peers=entry.identity.peers,
                        stale=sockets.stale,
                        kind=entry.identity.kind,
                        rdma=_rdma(entry),
                        iterations=entry.identity.iterations,
                    )
                )
        return tasks

    def _read_fds(self, entry: _Entry) -> _FdRead:
        """The socket inodes of a PS; "hidden" if unreadable now; "gone" if it exited."""
        pid = entry.key.pid
        try:
            if entry.pidfd is None:
                entry.pidfd = self._proc.pidfd(entry.key)
            now = self._clock()
            fresh = now < entry.fds_fresh_until and not self._awaits_listener(entry, now)
            trusted = entry.fds if fresh else None
            if trusted is not None and self._proc.fd_count(pid) == len(trusted):
                fds = trusted  # same count within the refresh period: nothing opened
            else:
                fds = self._proc.fd_sockets(pid, trusted)
                if trusted is None:
                    entry.fds_fresh_until = now + self._socket_refresh_s
            entry.fds = fds
            inodes = {inode for inode in fds.values() if inode > 0}
            if RDMA_DEVICE in fds.values():
                entry.rdma_device = True
            if entry.pidfd is None and self._proc.stat(pid).key != entry.key:
                raise ProcessGone(pid)  # no pidfds here: the start time tells instead
            if entry.netns is None:
                entry.netns = self._proc.netns_inode(pid)
        except ProcessGone:
            self._forget(pid)
            return "gone"
        except ProcessHidden:
            if entry.netns is None:
                entry.problem = "a PS whose descriptors or namespace cannot be read"
                return "gone"  # nothing was ever known about its sockets
            return "hidden"
        return inodes

    def _dump(self, netns: int, pids: list[int], wanted: set[int]) -> dict[int, TcpSocket] | None:
        """The wanted sockets of one namespace by inode, None when it cannot be read.

        The kernel's dump walks its whole TCP hash table (~2 ms even when few sockets match),
        so it is skipped while the PS processes hold no socket inode that the last dump was
        not asked about, for at most `dump_refresh_s`: a socket's ports never change once
        it is bound, and a new socket is a new inode. A new inode the dump did not find (a
        socket between socket() and listen() or connect(), or not TCP) is asked about again
        at the next scan; the refresh catches one that stayed unbound longer than that."""
        now = self._clock()
        last = self._dumped.get(netns)
        if (
            last is not None
            and not last.unbound_new
            and wanted <= last.wanted
            and now - last.at < self._dump_refresh_s
        ):
            return {inode: last.found[inode] for inode in wanted if inode in last.found}
        for attempt in range(2):
            try:
                diag = self._diag_for(netns, pids)
                found = {sock.inode: sock for sock in diag.tcp_sockets(wanted)}
                new = wanted - last.wanted if last is not None else wanted
                self._dumped[netns] = _Dump(frozenset(wanted), found, now, bool(new - found.keys()))
                return found
            except TransientError:
                if attempt:
                    return None
            except (TensorLightsError, OSError):
                self._diag.pop(netns, None)
                self._dumped.pop(netns, None)
                return None
        return None

    def _diag_for(self, netns: int, pids: list[int]) -> SockDiag:
        diag = self._diag.get(netns)
        if diag is not None:
            return diag
        diag = SockDiag() if netns == self.agent_netns else self._enter_netns(netns, pids)
        self._diag[netns] = diag
        return diag

    def _enter_netns(self, netns: int, pids: list[int]) -> SockDiag:
        for pid in pids:
            try:
                diag = SockDiag(self._proc.netns_path(pid))
            except (OSError, TensorLightsError):
                continue
            try:
                if self._proc.netns_inode(pid) == netns:
                    return diag
            except (ProcessGone, ProcessHidden):
                pass
            diag.close()
        raise OSError(f"could not enter network namespace {netns} through pids {pids[:5]}")

    def _sockets_of(
        self, entry: _Entry, inodes: set[int] | None, found: dict[int, TcpSocket] | None
    ) -> _Sockets:
        if inodes is None or found is None:
            entry.problem = (
                "its sockets could not be read this scan (permission or namespace); "
                "using the last ones known"
            )
            listen, conns = entry.last_sockets or (frozenset(), ())
            return _Sockets(listen, conns, stale=True)
        listen_ports: set[int] = set()
        connections: list[PsConnection] = []
        for inode in inodes:
            sock = found.get(inode)
            if sock is None:
                continue  # not TCP, or closed since the descriptors were read
            if sock.state == TcpState.LISTEN:
                listen_ports.add(sock.local_port)
            else:
                connections.append(
                    PsConnection(
                        sock.local_port,
                        sock.peer_addr,
                        sock.peer_port,
                        sock.family,
                        sock.sockid,
                        sock.local_addr,
                    )
                )
        connections.sort(key=lambda conn: (conn.local_port, conn.peer_addr, conn.peer_port))
        result = _Sockets(frozenset(listen_ports), tuple(connections), stale=False)
        entry.last_sockets = (result.listen_ports, result.connections)
        if entry.problem and entry.problem.startswith("its sockets"):
            entry.problem = None
        return result

    # Summaries -------------------------------------------------------------------------

    def _members(self) -> tuple[tuple[str, str, int], ...]:
        counts: dict[tuple[str, str], int] = {}
        for entry in self._entries.values():
            if entry.identity is not None:
                key = (entry.identity.job, entry.identity.role)
                counts[key] = counts.get(key, 0) + 1
        return tuple((job, role, n) for (job, role), n in sorted(counts.items()))

    def _problems(self) -> tuple[str, ...]:
        problems = [
            f"pid {entry.key.pid} ({entry.comm}): {entry.problem}"
            for entry in self._entries.values()
            if entry.problem
        ]
        hidden = sorted(entry.key.pid for entry in self._entries.values() if entry.hidden)
        if hidden:
            problems.append(hidden_problem(hidden, self._missing_capabilities))
        return tuple(sorted(problems))


def hidden_problem(pids: Sequence[int], missing: Sequence[str]) -> str:
    """What status says of processes discovery could not read, and what to do about them:
    grant what the agent lacks (`missing`), or, where it lacks nothing, know that nothing
    the agent can do will show them (the Firecracker VMs this project runs on refuse their
    PID 1 to root, and the old hint told root to run as root)."""
    shown = ", ".join(str(pid) for pid in pids[:HIDDEN_SHOWN])
    if len(pids) > HIDDEN_SHOWN:
        shown += ", ..."
    if missing:
        return (
            f"{len(pids)} processes could not be read (permission denied; pids {shown}): "
            f"the agent lacks {' and '.join(missing)}; run it as root or grant them to see "
            "their jobs"
        )
    return (
        f"{len(pids)} processes could not be read even with {' and '.join(READ_ANY_PROCESS)} "
        f"(pids {shown}): the kernel refuses them to root too (a security module, a "
        "sandbox's own processes); jobs among them are not scheduled"
    )


def _is_ps(entry: _Entry) -> bool:
    """Its sockets are read: a PS, or a rank of a collective job."""
    return entry.identity is not None and entry.identity.carries


def _rdma(entry: _Entry) -> str | None:
    """Why this process's traffic bypasses the kernel, if it does."""
    if entry.rdma_device:
        return f"it has an RDMA device open ({RDMA_LINK_PREFIX}*): verbs bypass the qdisc"
    return entry.identity.rdma if entry.identity is not None else None
