"""Which processes are the benchmark run's own and which are other work (pure part)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlights.bench.cpu_use import CpuUse, split_ours, ticks_since
from tensorlights.discovery.procfs import MachineTicks, ProcFs, ProcKey, ProcStat, machine_ticks


def _stat(pid: int, ppid: int, ticks: int = 0, kernel: bool = False) -> ProcStat:
    return ProcStat(ProcKey(pid, pid * 10), f"p{pid}", ppid, False, ticks, kernel)


@given(st.lists(st.integers(min_value=0, max_value=30), min_size=1, max_size=30), st.data())
def test_ours_are_the_roots_descendants_and_every_other_process_is_other_work(
    parents: list[int], data: st.DataObject
) -> None:
    """Process i+1's parent is parents[i] (an earlier process, 0 for init): ours are exactly
    those with the root among their ancestors; kernel threads are neither."""
    ppid = {pid: min(parent, pid - 1) for pid, parent in enumerate(parents, start=1)}
    kernel = set(data.draw(st.lists(st.sampled_from(sorted(ppid)), max_size=3)))
    root = data.draw(st.sampled_from(sorted(ppid)))
    stats = [_stat(pid, parent, pid, pid in kernel) for pid, parent in ppid.items()]

    def descends(pid: int) -> bool:
        while pid and pid != root:
            if pid in kernel:
                return False
            pid = ppid[pid]
        return pid == root and root not in kernel

    ours, others = split_ours(stats, root, set())
    assert {key.pid for key in ours} == {p for p in ppid if descends(p) and p not in kernel}
    assert {key.pid for key in others} == set(ppid) - kernel - {key.pid for key in ours}
    assert all(ticks == key.pid for key, ticks in {**ours, **others}.items())


def test_a_process_once_ours_stays_ours_when_init_adopts_it() -> None:
    bench, job = _stat(100, 1), _stat(101, 100)
    ours, _ = split_ours([bench, job], 100, set())
    adopted = _stat(101, 1, ticks=50)  # its parent ended; same identity
    ours, others = split_ours([bench, adopted, _stat(200, 1, ticks=7)], 100, ours.keys())
    assert ours == {bench.key: 0, job.key: 50} and others == {ProcKey(200, 2000): 7}


def test_a_new_process_counts_whole_and_a_reused_pid_is_a_new_process() -> None:
    before = {ProcKey(5, 50): 100, ProcKey(6, 60): 10}
    after = {ProcKey(5, 50): 130, ProcKey(6, 61): 4, ProcKey(7, 70): 9}  # 6 ended, pid reused
    assert ticks_since(before, after) == 30 + 4 + 9


def test_the_machines_busy_ticks_leave_out_idle_and_iowait_and_steal_is_apart() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice (as this VM's kernel)
    assert machine_ticks("cpu  9603 4 2970 1283701 459 3 109 1029 0 0") == MachineTicks(
        9603 + 4 + 2970 + 3 + 109, 1029
    )
    assert machine_ticks("cpu 10 0 5 100 0 1 2") == MachineTicks(18, 0)  # before steal
    with pytest.raises(ValueError, match="total line"):
        machine_ticks("cpu0 1090 0 909 646341 48 0 31 533 0 0")


def _write_proc(
    root: Path, machine: tuple[int, int], processes: dict[int, tuple[int, int]]
) -> None:
    """A /proc layout with the machine's busy and steal ticks (on user and steal) and each
    pid's (ppid, utime); the stat line's fields as the kernel writes them."""
    busy, steal = machine
    (root / "stat").write_text(f"cpu  {busy} 0 0 999 0 0 0 {steal} 0 0\ncpu0 ...\n")
    for pid in {int(d.name) for d in root.iterdir() if d.name.isdigit()} - set(processes):
        (root / str(pid) / "stat").unlink()
        (root / str(pid)).rmdir()
    for pid, (ppid, utime) in processes.items():
        fields = ["S", str(ppid), *["0"] * 9, str(utime), "0", *["0"] * 6, str(pid * 10)]
        (root / str(pid)).mkdir(exist_ok=True)
        (root / str(pid) / "stat").write_text(f"{pid} (p {pid}) {' '.join(fields)} 0 0\n")


def test_the_runs_cpu_is_the_machines_busy_time_less_other_processes_and_steal_is_other(
    tmp_path: Path,
) -> None:
    """The run (pid 100) and its job (101) beside another user's process (200): the job that
    lived between two reads (never listed) and the kernel's work still count as the run's."""
    procfs = ProcFs(tmp_path)
    cpu = CpuUse(procfs, root_pid=100)
    _write_proc(tmp_path, (1000, 10), {100: (1, 5), 101: (100, 50), 200: (1, 300)})
    cpu.sample(0.0)
    assert cpu.own_cores() is None and cpu.other_cores() is None
    # 2 s at 100 ticks/s on 2 cores: 400 ticks, 60 of them idle; 200 took 120, 30 stolen.
    _write_proc(tmp_path, (1310, 40), {100: (1, 6), 101: (100, 150), 200: (1, 420)})
    cpu.sample(2.0)
    hz = procfs.ticks_per_second
    assert cpu.own_cpu_s == pytest.approx((310 - 120) / hz)
    assert cpu.other_cpu_s == pytest.approx((120 + 30) / hz)
    # 200 ends and 201 (another user's) starts and takes 40 ticks: counted whole.
    _write_proc(tmp_path, (1400, 40), {100: (1, 6), 101: (100, 190), 201: (1, 40)})
    cpu.sample(4.0)
    assert cpu.other_cpu_s == pytest.approx((150 + 40) / hz)
    assert cpu.own_cpu_s == pytest.approx((190 + 50) / hz)
    assert cpu.own_cores() == pytest.approx(240 / hz / 4.0)


def test_the_daemons_cpu_counts_from_when_each_is_first_named(tmp_path: Path) -> None:
    """The agent (102) took 60 ticks starting up before the run named it: not counted. It is
    restarted as 103 mid-run, whose start-up before its first naming is not counted either;
    the span runs from the first read that named a daemon."""
    procfs = ProcFs(tmp_path)
    cpu = CpuUse(procfs, root_pid=100)
    hz = procfs.ticks_per_second
    reads = [
        (0.0, (), {102: (100, 40)}),
        (1.0, {102}, {102: (100, 60)}),
        (3.0, {102}, {102: (100, 80)}),
        (5.0, {103}, {103: (100, 30)}),
        (7.0, {103}, {103: (100, 50)}),
    ]
    for at, daemons, processes in reads:
        _write_proc(tmp_path, (1000 + int(at * 100), 0), {100: (1, 5), **processes})
        cpu.sample(at, daemons)
        if at == 0.0:
            assert cpu.daemon_cores() is None  # none named yet
    assert cpu.daemon_cpu_s == pytest.approx((20 + 20) / hz)
    assert cpu.daemon_cores() == pytest.approx(40 / hz / 6.0)
    fifo = CpuUse(procfs, root_pid=100)
    fifo.sample(0.0)
    fifo.sample(2.0)
    assert fifo.daemon_cores() is None  # no daemon: FIFO, a job alone
