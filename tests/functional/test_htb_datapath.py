"""The HTB datapath against the real kernel, in namespaces each test creates and removes."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from tensorlights.datapath import open_datapath
from tensorlights.datapath.htb import HtbDatapath
from tensorlights.errors import ForeignQdiscError, InterfaceNotFoundError, UnsupportedKernelError
from tensorlights.model import NUM_BANDS, DatapathSpec, JobShaping
from tensorlights.policy.tc_plan import FIRST_BAND_MINOR, UNMANAGED_MINOR, PutClass
from tensorlights.testbed import netns
from tests.functional.tcutil import (
    assert_green_slots,
    htb_classes,
    root_qdisc,
    sink_result,
    start_server,
    start_sink,
    tc_json,
)

pytestmark = pytest.mark.root

RATE = 200_000_000


def two_jobs(green: str, ports_a: set[int] | None = None) -> DatapathSpec:
    return DatapathSpec(
        "veth-a",
        RATE,
        (
            JobShaping("job-a", 0 if green == "job-a" else 1, frozenset(ports_a or {5001})),
            JobShaping("job-b", 0 if green == "job-b" else 1, frozenset({5002})),
        ),
    )


def delete_filter_by_hand(ns: str, handle: str) -> None:
    netns.run(
        ["tc", "-n", ns, *f"filter del dev veth-a parent 7a1: prio 10 handle {handle} u32".split()]
    )


def test_apply_twice_changes_nothing_and_hand_deletions_are_repaired(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    first = datapath.apply(two_jobs("job-a"))
    assert first.ops and first.took_over is not None and first.took_over.is_default
    assert datapath.apply(two_jobs("job-a")).ops == ()

    ns = pair.a.ns
    table = first.job_table["job-b"]
    delete_filter_by_hand(ns, "7fe:8a:1")  # job-b's port 5002 (0x138a) in its bucket
    delete_filter_by_hand(ns, f"{table:x}::1")
    netns.run(["tc", "-n", ns, "class", "del", "dev", "veth-a", "classid", "7a1:2"])
    netns.run(
        [
            "tc",
            "-n",
            ns,
            "class",
            "change",
            "dev",
            "veth-a",
            "parent",
            "7a1:1",
            "classid",
            "7a1:13",
            "htb",
            "rate",
            "1mbit",
            "ceil",
            "1mbit",
            "prio",
            "5",
        ]
    )
    repaired = datapath.apply(two_jobs("job-a"))
    assert len(repaired.ops) == 4, repaired.ops
    assert datapath.apply(two_jobs("job-a")).ops == ()

    classes = htb_classes(ns, "veth-a")
    assert {"7a1:1", "7a1:2", "7a1:10", "7a1:17"} <= set(classes)
    assert classes["7a1:13"]["prio"] == 3


def leaves(ns: str) -> dict[str, tuple[str, str, int | None]]:
    """parent class -> (kind, handle, limit) of every qdisc under one of our classes."""
    return {
        q["parent"]: (q["kind"], q["handle"], q.get("options", {}).get("limit"))
        for q in tc_json(ns, "qdisc", "show", "dev", "veth-a")
        if q.get("parent", "").startswith("7a1:")
    }


def test_short_waiting_queues_are_pfifo_leaves_kept_and_removed(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    short = dataclasses.replace(two_jobs("job-a"), short_waiting_queues=True)
    datapath.apply(short)
    ns = pair.a.ns
    # At least 16 packets, and the bands' rate raised to drain them in 0.1 s.
    assert leaves(ns) == {
        f"7a1:{0x10 + b:x}": ("pfifo", f"{0x7A2 + b:x}:", 16) for b in range(1, 8)
    }
    assert datapath.apply(short).ops == ()
    # Changed behind our back: put back on the next pass, and only that one.
    hand_edit = "qdisc replace dev veth-a parent 7a1:11 handle 7a3: pfifo limit 1000"
    netns.run(["tc", "-n", ns, *hand_edit.split(" ")])
    assert len(datapath.apply(short).ops) == 1
    assert leaves(ns)["7a1:11"] == ("pfifo", "7a3:", 16)
    # Turned off: the kernel's default leaves are back (ours are gone), and the 8 bands'
    # rates are 256 kbit again.
    ops = datapath.apply(two_jobs("job-a")).ops
    assert sorted(type(op).__name__ for op in ops) == ["DeleteLeaf"] * 7 + ["PutClass"] * 8
    assert {op.cls.rate for op in ops if isinstance(op, PutClass)} == {32_000}
    assert leaves(ns) == {}


def test_adopts_its_qdisc_after_restart_without_changes(
    pair: netns.HostPair, datapath: HtbDatapath, tmp_path: Path
) -> None:
    first = datapath.apply(two_jobs("job-b"))
    restarted = open_datapath("htb", tmp_path / "state", netns=pair.a.ns)
    try:
        again = restarted.apply(two_jobs("job-b"))
        assert again.ops == () and again.took_over is None
        assert again.job_table == first.job_table
    finally:
        restarted.sock.close()


def test_green_job_carries_the_link_and_rotation_moves_it(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    """Two backlogged flows from two PS ports (one over IPv4, one over IPv6) through a veth
    shaped at 200 Mbit: the green job gets >= 90% of the bytes, then after a rotation the
    other one does, and the link stays busy (LINK_BUSY)."""
    server = start_server(pair, [5001, 5002])
    try:
        datapath.apply(two_jobs("job-a"))
        interval, seconds, rotate_at = 0.5, 7.0, 3.5
        sink = start_sink([f"{pair.a.ipv4}:5001", f"[{pair.a.ipv6}]:5002"], seconds, interval, pair)
        time.sleep(rotate_at)  # a wall-clock experiment: the sink records what happens when
        rotation = datapath.rotate(two_jobs("job-b"))
        result = sink_result(sink, timeout=seconds + 10)
    finally:
        server.kill()
        server.wait()
    assert len(rotation.ops) == 2
    a = result["flows"][f"{pair.a.ipv4}:5001"]
    b = result["flows"][f"[{pair.a.ipv6}]:5002"]
    carried = result["link"]
    link_bytes = RATE / 8 * interval
    # steady slots: skip connection start-up (first slot) and the slot of the rotation
    before = range(1, int(rotate_at / interval) - 1)
    after = range(int(rotate_at / interval) + 1, int(seconds / interval))
    assert_green_slots(a, b, carried, result["stolen"], link_bytes, before, after)
    assert result["resets"] == 0 and not result["errors"]


def test_rotation_under_load_keeps_connections_and_drops_nothing(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    ports = [5001, 5002, 5003]

    def spec_of(green: int) -> DatapathSpec:
        return DatapathSpec(
            "veth-a",
            RATE,
            tuple(JobShaping(f"job-{p}", 0 if p == green else 1, frozenset({p})) for p in ports),
        )

    server = start_server(pair, ports)
    try:
        datapath.apply(spec_of(5001))
        handle_before = root_qdisc(pair.a.ns, "veth-a")["handle"]
        sink = start_sink([f"{pair.a.ipv4}:{p}" for p in ports], 5.0, 0.5, pair)
        rotations = 0
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            datapath.rotate(spec_of(ports[rotations % len(ports)]))
            rotations += 1
            time.sleep(0.1)  # rotation cadence of the experiment, not synchronisation
        result = sink_result(sink, timeout=20)
        root = root_qdisc(pair.a.ns, "veth-a")
    finally:
        server.kill()
        server.wait()
    assert rotations >= 20
    assert result["resets"] == 0 and not result["errors"]
    assert all(sum(flow) > 0 for flow in result["flows"].values())
    assert root["handle"] == handle_before == "7a1:"
    assert root["drops"] == 0
    for handle, cls in htb_classes(pair.a.ns, "veth-a").items():
        assert cls["drops"] == 0, handle


def test_foreign_root_qdisc_is_refused_then_taken_over_and_restored(
    pair: netns.HostPair, tmp_path: Path
) -> None:
    ns = pair.a.ns
    netns.run(
        [
            "tc",
            "-n",
            ns,
            "qdisc",
            "add",
            "dev",
            "veth-a",
            "root",
            "handle",
            "5:",
            "tbf",
            "rate",
            "50mbit",
            "burst",
            "32kb",
            "latency",
            "40ms",
        ]
    )
    original = root_qdisc(ns, "veth-a")

    polite = open_datapath("htb", tmp_path / "state", netns=ns)
    with pytest.raises(ForeignQdiscError, match="tbf 5:0"):
        polite.apply(two_jobs("job-a"))
    config = ("kind", "handle", "options")
    now = root_qdisc(ns, "veth-a")
    assert [now[k] for k in config] == [original[k] for k in config], "refusing changes nothing"
    polite.sock.close()

    bold = open_datapath("htb", tmp_path / "state", netns=ns, take_over_foreign=True)
    try:
        result = bold.apply(two_jobs("job-a"))
        assert result.took_over is not None and result.took_over.kind == "tbf"
        assert root_qdisc(ns, "veth-a")["kind"] == "htb"
        assert "restored tbf 5:0" in bold.cleanup("veth-a")
    finally:
        bold.sock.close()
    restored = root_qdisc(ns, "veth-a")
    assert [restored[k] for k in config] == [original[k] for k in config]


def test_cleanup_brings_back_the_kernel_default(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    before = root_qdisc(pair.a.ns, "veth-a")
    datapath.apply(two_jobs("job-a"))
    assert "kernel default" in datapath.cleanup("veth-a")
    after = root_qdisc(pair.a.ns, "veth-a")
    assert (after["kind"], after["handle"]) == (before["kind"], before["handle"])
    assert "nothing to do" in datapath.cleanup("veth-a")


def test_filters_of_others_in_our_qdisc_are_left_alone(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    datapath.apply(two_jobs("job-a"))
    netns.run(
        [
            "tc",
            "-n",
            pair.a.ns,
            "filter",
            "add",
            "dev",
            "veth-a",
            "parent",
            "7a1:",
            "prio",
            "5",
            "protocol",
            "ip",
            "u32",
            "match",
            "ip",
            "dport",
            "22",
            "0xffff",
            "flowid",
            f"7a1:{FIRST_BAND_MINOR:x}",
        ]
    )
    assert datapath.apply(two_jobs("job-b")).ops
    prios = {
        f.get("pref")
        for f in tc_json(pair.a.ns, "filter", "show", "dev", "veth-a", "parent", "7a1:")
    }
    assert 5 in prios


def test_missing_interface_is_a_clear_error_and_changes_nothing(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    before = tc_json(pair.a.ns, "qdisc", "show")
    spec = DatapathSpec("nosuch0", RATE, ())
    with pytest.raises(InterfaceNotFoundError, match="nosuch0"):
        datapath.apply(spec)
    assert tc_json(pair.a.ns, "qdisc", "show") == before


def test_prio_backend_names_the_missing_kernel_option(tmp_path: Path) -> None:
    fake_root = tmp_path / "root"
    (fake_root / "proc").mkdir(parents=True)
    import gzip

    (fake_root / "proc/config.gz").write_bytes(gzip.compress(b"CONFIG_NET_SCH_HTB=y\n"))
    with pytest.raises(UnsupportedKernelError, match="CONFIG_NET_SCH_PRIO"):
        open_datapath("prio", tmp_path / "state", kernel_root=fake_root)


def test_job_churn_leaves_no_tc_objects_behind(pair: netns.HostPair, datapath: HtbDatapath) -> None:
    """100 job starts and stops (jobs with ports of their own, some leaving while others
    arrive): every job's table and links go with it, so the object count returns to the
    baseline of the empty layout -- including the u32 tables the kernel reports busy for a
    moment after their links are deleted."""
    empty = DatapathSpec("veth-a", RATE, ())
    datapath.apply(empty)
    link = datapath.link("veth-a")
    baseline = datapath.read_actual(link.ifindex)
    present: list[int] = []
    for step in range(100):
        if len(present) >= 4 or (present and step % 3 == 0):
            present.pop(0)  # the oldest job finishes
        present.append(step)
        spec = DatapathSpec(
            "veth-a",
            RATE,
            tuple(
                JobShaping(f"job-{n}", i, frozenset({6000 + n, 30000 + n}))
                for i, n in enumerate(present)
            ),
        )
        result = datapath.apply(spec)
        assert set(result.job_table) == {f"job-{n}" for n in present}
    datapath.apply(empty)
    after = datapath.read_actual(link.ifindex)
    assert after.tables.keys() == baseline.tables.keys()
    assert after.links == baseline.links
    assert after.classes.keys() == baseline.classes.keys()
    assert datapath.apply(empty).ops == ()


def test_ports_sharing_a_hash_bucket_each_reach_their_own_jobs_band(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    """64 jobs x 64 ports (4096 per family: one more than a u32 table's node ids, which the
    root table held before ports were hashed) are programmed in one apply. Two ports ending
    in the same byte (one bucket of the IPv4 port table) and one over IPv6 each carry a
    stream, one at a time, into their own job's band and nowhere else."""
    bands = {0: 0, 4: 3, 8: 5}  # job index -> band; the rest wait in the last band
    spec = DatapathSpec(
        "veth-a",
        RATE,
        tuple(
            JobShaping(
                f"job-{i}",
                bands.get(i, NUM_BANDS - 1),
                frozenset(range(10000 + 64 * i, 10064 + 64 * i)),
            )
            for i in range(64)
        ),
    )
    result = datapath.apply(spec)
    assert len(result.job_table) == 64
    assert datapath.apply(spec).ops == ()
    # 10001 and 10257 (job-0, job-4) end in the same byte; 10513 is job-8's.
    streams = {
        f"{pair.a.ipv4}:10001": 0,
        f"{pair.a.ipv4}:10257": 3,
        f"[{pair.a.ipv6}]:10513": 5,
    }
    server = start_server(pair, [10001, 10257, 10513])
    try:
        for target, band in streams.items():
            before = datapath.class_counters("veth-a")
            sink_result(start_sink([target], 1.0, 0.5, pair), timeout=15)
            after = datapath.class_counters("veth-a")
            sent = {
                minor: after[minor][0] - before.get(minor, (0, 0, 0))[0]
                for minor in [UNMANAGED_MINOR, *(FIRST_BAND_MINOR + b for b in range(NUM_BANDS))]
            }
            total = sum(sent.values())
            assert total > RATE / 8 * 0.5, (target, sent)
            assert sent[FIRST_BAND_MINOR + band] >= 0.99 * total, (target, sent)
    finally:
        server.kill()
        server.wait()


def tc(ns: str, command: str) -> None:
    netns.run(["tc", "-n", ns, *command.split()])


def test_a_previous_versions_filters_are_migrated_in_one_apply(
    pair: netns.HostPair, datapath: HtbDatapath
) -> None:
    """Built as the version before port tables did (each port's filter in the root table,
    job tables among them one on 7fe:, the IPv4 port table's id): one apply converges, and
    the port's stream lands in its band."""
    ns = pair.a.ns
    tc(ns, "qdisc add dev veth-a root handle 7a1: htb default 2")
    tc(ns, "filter add dev veth-a parent 7a1: prio 10 handle 7fe: protocol ip u32 divisor 1")
    tc(ns, "filter add dev veth-a parent 7a1: prio 10 handle 12: protocol ip u32 divisor 1")
    for table, band in (("7fe", 1), ("12", 0)):
        tc(
            ns,
            f"filter add dev veth-a parent 7a1: prio 10 handle {table}::1 protocol ip u32 "
            f"ht {table}: match u32 0 0 flowid 7a1:{0x10 + band:x}",
        )
    for node, (port, table) in enumerate(((5001, "12"), (5002, "7fe")), start=1):
        for prio, proto, match in ((10, "ip", "ip"), (11, "ipv6", "ip6")):
            tc(
                ns,
                f"filter add dev veth-a parent 7a1: prio {prio} handle ::{node} protocol {proto} "
                f"u32 match {match} protocol 6 0xff match {match} sport {port} 0xffff "
                f"link {table}:",
            )
    result = datapath.apply(two_jobs("job-b"))
    assert result.took_over is None
    assert datapath.apply(two_jobs("job-b")).ops == ()
    state = datapath.read_actual(datapath.link("veth-a").ifindex)
    assert sorted((link.family, link.port) for link in state.links) == [
        (family, port) for family in ("ipv4", "ipv6") for port in (5001, 5002)
    ]
    assert 0x7FE not in state.tables and set(state.port_tables.values()) == {256}
    server = start_server(pair, [5002])
    try:
        before = datapath.class_counters("veth-a")[FIRST_BAND_MINOR]
        sink_result(start_sink([f"{pair.a.ipv4}:5002"], 1.0, 0.5, pair), timeout=15)
        assert datapath.class_counters("veth-a")[FIRST_BAND_MINOR][0] - before[0] > RATE / 16
    finally:
        server.kill()
        server.wait()
