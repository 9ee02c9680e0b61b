"""Reading processes: psutil for the once-per-process facts, /proc directly on the hot path.

A process is identified by (pid, start time in clock ticks since boot): the pair never repeats,
so a reused PID is a different process. Every reader raises `ProcessGone` when the process
vanished and `ProcessHidden` when it exists but cannot be read; callers never take either as
"this process has no sockets".
"""

from __future__ import annotations

import os
import select
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

from tensorlights.discovery.rules import ProcessFacts

SOCKET_LINK_PREFIX = "socket:["
RDMA_LINK_PREFIX = "/dev/infiniband/"
RDMA_DEVICE = -1
"""`fd_sockets`' inode for a descriptor of an RDMA device (uverbs, rdma_cm): the process sends
with verbs, past the kernel's network stack."""


class ProcessGone(Exception):
    """The process exited (or its PID now belongs to another process)."""


class ProcessHidden(Exception):
    """The process exists but we may not read it (permissions, hidepid, LSM)."""


READ_ANY_PROCESS = {"CAP_DAC_READ_SEARCH": 2, "CAP_SYS_PTRACE": 19}
"""The capabilities (name: bit) that read another user's process: its environment, its file
table (where its sockets are)."""


def missing_read_capabilities(status: Path = Path("/proc/self/status")) -> list[str]:
    """Of READ_ANY_PROCESS, those this process's effective set lacks."""
    effective = 0
    for line in status.read_text().splitlines():
        if line.startswith("CapEff:"):
            effective = int(line.split()[1], 16)
    return [name for name, bit in READ_ANY_PROCESS.items() if not effective >> bit & 1]


@dataclass(frozen=True, slots=True)
class ProcKey:
    pid: int
    start_ticks: int


PF_KTHREAD = 0x00200000
"""The kernel's flag (in /proc/PID/stat) of its own threads."""


@dataclass(frozen=True, slots=True)
class ProcStat:
    key: ProcKey
    comm: str
    ppid: int
    zombie: bool
    cpu_ticks: int = 0
    """utime + stime, in clock ticks (ProcFs.ticks_per_second)."""
    kernel_thread: bool = False


@dataclass(frozen=True, slots=True)
class MachineTicks:
    """The machine's CPU time since boot, all cores together, in clock ticks."""

    busy: int
    """user + nice + system + irq + softirq (a guest's time is within user)."""
    steal: int
    """Time the hypervisor ran something else while this VM wanted a core."""


def machine_ticks(line: str) -> MachineTicks:
    """/proc/stat's first line: `cpu user nice system idle iowait irq softirq steal ...`
    (a kernel older than 2.6.11 stops before steal: none then)."""
    name, *fields = line.split()
    if name != "cpu" or len(fields) < 7:
        raise ValueError(f"not /proc/stat's total line: {line!r}")
    user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(f) for f in fields)
    return MachineTicks(user + nice + system + irq + softirq, rest[0] if rest else 0)


class ProcFs:
    """/proc of the host (or a test's copy of the layout, via `root`)."""

    def __init__(self, root: Path = Path("/proc")) -> None:
        self.root = root
        self._prefix = str(root)
        self.ticks_per_second = os.sysconf("SC_CLK_TCK")
        self.boot_time = psutil.boot_time()

    def machine_ticks(self) -> MachineTicks:
        """The machine's CPU time since boot, from /proc/stat's total line."""
        return machine_ticks((self.root / "stat").read_text().split("\n", 1)[0])

    def pids(self) -> list[int]:
        return [int(name) for name in os.listdir(self.root) if name.isdigit()]

    def stat(self, pid: int) -> ProcStat:
        try:
            with open(f"{self._prefix}/{pid}/stat", "rb") as handle:
                text = handle.read()
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(pid) from exc
        # comm may contain spaces and parentheses: it ends at the last ')'.
        open_paren = text.index(b"(")
        close_paren = text.rindex(b")")
        fields = text[close_paren + 2 :].split()
        return ProcStat(
            key=ProcKey(pid, int(fields[19])),
            comm=text[open_paren + 1 : close_paren].decode(errors="replace"),
            ppid=int(fields[1]),
            zombie=fields[0] in (b"Z", b"X"),
            cpu_ticks=int(fields[11]) + int(fields[12]),
            kernel_thread=bool(int(fields[6]) & PF_KTHREAD),
        )

    def create_time(self, key: ProcKey) -> float:
        """Start time as seconds since the epoch (for display; identity uses the ticks)."""
        return self.boot_time + key.start_ticks / self.ticks_per_second

    def age(self, key: ProcKey) -> float:
        """Seconds since the process started (boot-time clock, as /proc counts)."""
        return time.clock_gettime(time.CLOCK_BOOTTIME) - key.start_ticks / self.ticks_per_second

    def facts(self, key: ProcKey) -> ProcessFacts:
        """What classification needs: name, executable, command line, environment, cgroup."""
        try:
            proc = psutil.Process(key.pid)
            with proc.oneshot():
                environ = proc.environ()
                cmdline = tuple(proc.cmdline())
                name = proc.name()
                uid = proc.uids().real
                try:
                    exe = os.path.basename(proc.exe())
                except psutil.AccessDenied:
                    exe = ""
            cgroup = self._read_text(key.pid, "cgroup")
        except (psutil.NoSuchProcess, psutil.ZombieProcess) as exc:
            raise ProcessGone(key.pid) from exc
        except psutil.AccessDenied as exc:
            raise ProcessHidden(key.pid) from exc
        # The PID may have been reused while we read: trust the facts only if it did not.
        if self.stat(key.pid).key != key:
            raise ProcessGone(key.pid)
        return ProcessFacts(
            pid=key.pid,
            name=name,
            exe=exe,
            cmdline=cmdline,
            environ=environ,
            cgroup=cgroup,
            uid=uid,
        )

    def cmdline_bytes(self, pid: int) -> bytes:
        """Raw command line, to notice an exec() cheaply."""
        try:
            with open(f"{self._prefix}/{pid}/cmdline", "rb") as handle:
                return handle.read()
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(pid) from exc

    def pidfd(self, key: ProcKey) -> int | None:
        """A pidfd for exactly this process (verified after opening), or None where the
        kernel has no pidfd_open (< 5.3): then callers re-check the start time instead."""
        try:
            fd = os.pidfd_open(key.pid)
        except ProcessLookupError as exc:
            raise ProcessGone(key.pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(key.pid) from exc
        except OSError:
            return None
        try:
            if self.stat(key.pid).key != key:
                raise ProcessGone(key.pid)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def exited(pidfds: Iterable[int]) -> set[int]:
        """Which of these pidfds' processes have exited (one poll, no waiting)."""
        poller = select.poll()
        for fd in pidfds:
            poller.register(fd, select.POLLIN)
        return {fd for fd, _ in poller.poll(0)}

    def fd_count(self, pid: int) -> int:
        """Open descriptors, from the size the kernel reports for /proc/PID/fd (Linux 6.2+;
        0 on older kernels, which makes callers read the directory)."""
        try:
            return os.stat(f"{self._prefix}/{pid}/fd").st_size
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(pid) from exc

    def socket_inodes(self, pid: int) -> set[int]:
        """Inodes of the sockets in the process's file table (shared by its threads)."""
        return {inode for inode in self.fd_sockets(pid).values() if inode > 0}

    def fd_sockets(self, pid: int, known: Mapping[str, int] | None = None) -> dict[str, int]:
        """Descriptor number -> socket inode (0: not a socket; RDMA_DEVICE) for every open
        descriptor.
        Descriptors in `known` are taken from it instead of read again (the caller decides
        how long its knowledge stays good: a descriptor number may be closed and reused)."""
        fd_dir = f"{self._prefix}/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(pid) from exc
        known = known or {}
        found: dict[str, int] = {}
        prefix_len = len(SOCKET_LINK_PREFIX)
        for name in names:
            inode = known.get(name)
            if inode is None:
                try:
                    target = os.readlink(f"{fd_dir}/{name}")
                except (FileNotFoundError, ProcessLookupError):
                    continue  # that descriptor was closed meanwhile
                except PermissionError as exc:
                    raise ProcessHidden(pid) from exc
                if target.startswith(SOCKET_LINK_PREFIX):
                    inode = int(target[prefix_len:-1])
                else:
                    inode = RDMA_DEVICE if target.startswith(RDMA_LINK_PREFIX) else 0
            found[name] = inode
        return found

    def netns_inode(self, pid: int | str) -> int:
        try:
            return os.stat(self.netns_path(pid)).st_ino
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(pid) from exc

    def netns_path(self, pid: int | str) -> str:
        return f"{self._prefix}/{pid}/ns/net"

    def _read_text(self, pid: int, name: str) -> str:
        try:
            return (self.root / str(pid) / name).read_text(errors="replace")
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise ProcessGone(pid) from exc
        except PermissionError as exc:
            raise ProcessHidden(pid) from exc
