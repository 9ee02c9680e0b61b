"""A real Slurm cluster as plain processes (no systemd): munged, slurmctld and one slurmd per
emulated node (Debian's Slurm runs several slurmd on one machine with `-N NAME` and a port
each), all configured in a private temporary directory, on free localhost ports.

    with slurm_cluster(["n1", "n2"]) as slurm:
        slurm.command("sbatch", "-N2", "-n4", "--wrap", "srun sleep 30")
        slurm.command("squeue", "--json")

Where a cgroup v1 freezer hierarchy is mounted (these machines), tasks are tracked as on a
real cluster: proctrack/cgroup puts each in `slurm_<node>/uid_<uid>/job_<id>/step_<step>`,
which is what lets agents believe a task's job (discovery/trust.py); `cgroups` says whether
this cluster does. (Slurm's cgroup v2 plugin needs systemd, which these machines lack.)

Teardown cancels every job, waits for their steps to end, stops the daemons, kills any step
still running from the private directory or the nodes' cgroups, and removes those. Needs root
and the slurmctld, slurmd, munge and slurm-client packages (scripts/setup.sh test installs
them).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensorlights.testbed.processes import free_port, stop

DAEMONS = ("munged", "slurmctld", "slurmd")
FREEZER = Path("/sys/fs/cgroup/freezer")
SPANK_SOURCE = Path(__file__).resolve().parents[2] / "deploy" / "slurm"
"""The TensorLights SPANK plugin's source and Makefile (in a checkout)."""


def build_spank_plugin(out_dir: Path) -> Path:
    """Compiles the TensorLights SPANK plugin into `out_dir` against the installed Slurm
    headers (libslurm-dev; scripts/setup.sh test installs it) and returns the .so."""
    if not (SPANK_SOURCE / "Makefile").exists():
        raise RuntimeError(f"no plugin source at {SPANK_SOURCE}: run from a checkout")
    result = subprocess.run(
        ["make", "-s", "-C", str(SPANK_SOURCE), f"OUT={out_dir}"], capture_output=True, text=True
    )
    if result.returncode != 0:
        raise RuntimeError(f"building the SPANK plugin failed:\n{result.stderr}")
    return out_dir / "tensorlights_spank.so"


@dataclass
class SlurmCluster:
    root: Path
    nodes: tuple[str, ...]
    cgroups: bool
    """Tasks sit in their job's cgroup (proctrack/cgroup); else only Slurm's own bookkeeping
    knows them (proctrack/linuxproc)."""
    spank: tuple[str, ...] = ()
    """plugstack.conf lines (SPANK plugins every daemon and command loads)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def command(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # In the private directory: sbatch writes its slurm-N.out to the working directory.
        result = subprocess.run(
            list(args), capture_output=True, text=True, env=self.env, cwd=self.root
        )
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")
        return result


def _config(
    root: Path,
    nodes: Sequence[str],
    ctld_port: int,
    node_ports: list[int],
    cgroups: bool,
    spank: Sequence[str],
) -> str:
    if spank:
        (root / "plugstack.conf").write_text("".join(f"{line}\n" for line in spank))
    if cgroups:
        (root / "cgroup.conf").write_text(
            f"CgroupPlugin=cgroup/v1\nCgroupAutomount=no\nCgroupMountpoint={FREEZER.parent}\n"
        )
    lines = [
        f"ClusterName=tl{os.getpid()}",
        "SlurmctldHost=localhost(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        f"AuthInfo=socket={root}/munge.sock",
        "CredType=cred/munge",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/slurmctld.pid",
        f"SlurmdPidFile={root}/slurmd.%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd.%n.log",
        f"ProctrackType=proctrack/{'cgroup' if cgroups else 'linuxproc'}",
        "TaskPlugin=task/none",
        "ReturnToService=2",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "MpiDefault=none",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
    ]
    if spank:
        lines.append(f"PlugStackConfig={root}/plugstack.conf")
    for name, port in zip(nodes, node_ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
            "CPUs=2 State=UNKNOWN"
        )
    lines.append(
        f"PartitionName=debug Nodes={','.join(nodes)} Default=YES MaxTime=INFINITE State=UP"
    )
    return "\n".join(lines) + "\n"


def start_slurm(
    nodes: Sequence[str], ready_timeout_s: float = 30, spank: Sequence[str] = ()
) -> SlurmCluster:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        raise RuntimeError(f"Slurm is not installed (missing {missing}): scripts/setup.sh test")
    root = Path(tempfile.mkdtemp(prefix="tl-slurm-"))
    os.chmod(root, 0o700)  # munged refuses keys and sockets others could reach
    cluster = SlurmCluster(
        root, tuple(nodes), cgroups=(FREEZER / "cgroup.procs").exists(), spank=tuple(spank)
    )
    try:
        for sub in ("state", "spool", "log"):
            (root / sub).mkdir()
        key = root / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        ports = [free_port() for _ in nodes]
        cluster.conf.write_text(
            _config(root, nodes, free_port(), ports, cluster.cgroups, cluster.spank)
        )
        munged = [
            "munged", "--foreground", f"--socket={root}/munge.sock", f"--key-file={key}",
            f"--pid-file={root}/munged.pid", f"--log-file={root}/log/munged.log",
            f"--seed-file={root}/munge.seed", "--force",
        ]  # fmt: skip
        _spawn(cluster, munged)
        _wait(lambda: (root / "munge.sock").exists(), ready_timeout_s, "munged")
        _spawn(cluster, ["slurmctld", "-D", "-f", str(cluster.conf)])
        for name in nodes:
            _spawn(cluster, ["slurmd", "-D", "-f", str(cluster.conf), "-N", name])

        def all_idle() -> bool:
            listing = cluster.command("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout
            out = listing.split()
            return out.count("idle") == len(nodes)

        _wait(all_idle, ready_timeout_s, "slurm nodes to become idle")
    except BaseException:
        stop_slurm(cluster)
        raise
    return cluster


def _spawn(cluster: SlurmCluster, args: list[str]) -> None:
    log = open(cluster.root / "log" / f"{args[0]}.{len(cluster.processes)}.out", "wb")  # noqa: SIM115
    with log:
        cluster.processes.append(
            subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=cluster.env,
                             start_new_session=True)
        )  # fmt: skip


def _wait(done: Callable[[], bool], timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if done():
            return
        time.sleep(0.1)
    raise RuntimeError(f"timed out waiting for {what}")


def stop_slurm(cluster: SlurmCluster) -> None:
    if cluster.conf.exists():
        cluster.command("scancel", "--full", "--quiet", "--user", "root", check=False)
        with contextlib.suppress(RuntimeError):
            _wait(
                lambda: not cluster.command("squeue", "-h", check=False).stdout.strip(),
                15,
                "jobs to end",
            )
    for proc in reversed(cluster.processes):  # slurmd first, munged last
        stop(proc)
    _kill_leftover_steps(cluster.root)
    if cluster.cgroups:
        _remove_cgroups([FREEZER / f"slurm_{node}" for node in cluster.nodes])
    shutil.rmtree(cluster.root, ignore_errors=True)


def _remove_cgroups(tops: Sequence[Path], timeout_s: float = 10) -> None:
    """The nodes' cgroup trees: any process still in them (a step slurmd lost track of) is
    killed, then the trees are removed deepest first."""
    end = time.monotonic() + timeout_s
    for top in tops:
        while top.is_dir():
            directories = sorted((p for p in top.rglob("*") if p.is_dir()), reverse=True)
            for directory in [*directories, top]:
                with contextlib.suppress(OSError):
                    for pid in (directory / "cgroup.procs").read_text().split():
                        os.kill(int(pid), signal.SIGKILL)
                    directory.rmdir()
            if time.monotonic() > end:
                raise RuntimeError(f"{top} still holds processes after {timeout_s} s")
            time.sleep(0.05)


def _kill_leftover_steps(root: Path) -> None:
    """slurmstepd daemonizes itself; a step still running works inside our private dir."""
    prefix = str(root)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                cmdline = handle.read().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(prefix) or prefix in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(entry), signal.SIGKILL)


@contextlib.contextmanager
def slurm_cluster(nodes: Sequence[str], spank: Sequence[str] = ()) -> Iterator[SlurmCluster]:
    cluster = start_slurm(nodes, spank=spank)
    try:
        yield cluster
    finally:
        stop_slurm(cluster)
