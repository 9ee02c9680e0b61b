"""Which processes are the benchmark run's own and which are other work (pure part)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tensorlights.bench.cpu_use import split_ours, ticks_since
from tensorlights.discovery.procfs import ProcKey, ProcStat


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
