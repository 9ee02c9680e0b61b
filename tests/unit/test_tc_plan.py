"""Pure planning: layout, diff and the rotation fast path."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlights.model import NUM_BANDS, DatapathSpec, JobShaping
from tensorlights.policy.tc_plan import (
    FIRST_BAND_MINOR,
    HASH_LINK_NODE,
    JOB_TABLE_NODE,
    PORT_BUCKETS,
    PORT_TABLE,
    ROOT_MINOR,
    UNMANAGED_MINOR,
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
    LeafQdisc,
    PortLink,
    PutClass,
    PutLeaf,
    PutLink,
    PutTableTarget,
    TcOp,
    assign_job_tables,
    desired_layout,
    diff,
    leaf_handle,
    port_bucket,
    port_link_handle,
    retarget_tables,
    tables_in_use,
    u32_bucket,
    u32_htid,
    u32_table_handle,
)

TUNING = HtbTuning()


def spec_of(
    jobs: dict[str, tuple[int, set[int]]], rate: int = 200_000_000, short_queues: bool = False
) -> DatapathSpec:
    return DatapathSpec(
        "eth0",
        rate,
        tuple(JobShaping(j, b, frozenset(p)) for j, (b, p) in jobs.items()),
        short_waiting_queues=short_queues,
    )


ROOT_TABLE = {Family.IPV4: 0x800, Family.IPV6: 0x801}  # the kernel numbers the root tables


def simulate(actual: ActualState, ops: list[TcOp], layout: DesiredLayout) -> ActualState:
    """Apply ops to an ActualState the way the kernel would (enough for the diff's needs)."""
    classes = dict(actual.classes)
    links = {link.handle: link for link in actual.links}
    tables = {htid: t for htid, t in actual.tables.items()}
    leaves = dict(actual.leaves)
    port_tables = dict(actual.port_tables)
    hash_links = dict(actual.hash_links)
    for op in ops:
        match op:
            case PutLeaf(minor, handle, limit):
                assert minor in classes, "a leaf needs its class first"
                leaves[minor] = LeafQdisc(minor, "pfifo", handle, limit)
            case DeleteLeaf(minor, handle):
                assert leaves.pop(minor).handle == handle
            case PutClass(cls, create):
                assert (cls.minor not in classes) == create
                classes[cls.minor] = cls
            case DeleteClass(minor):
                del classes[minor]
            case AddTable(htid):
                assert htid not in tables and htid not in PORT_TABLE.values()
                tables[htid] = JobTable(htid, None, ())
            case PutTableTarget(htid, target, create):
                handle = u32_table_handle(htid) | JOB_TABLE_NODE
                assert (handle not in tables[htid].filter_handles) == create
                tables[htid] = JobTable(htid, target, (handle,))
            case AddPortTable(family):
                assert family not in port_tables
                port_tables[family] = PORT_BUCKETS
            case PutLink(family, port, htid, handle, create):
                assert u32_htid(handle) == PORT_TABLE[family] and family in port_tables
                assert u32_bucket(handle) == port_bucket(port), "the kernel hashes it there"
                assert (handle not in links) == create
                links[handle] = PortLink(family, handle, port, htid)
            case AddHashLink(family):
                assert family in port_tables and family not in hash_links
                handle = u32_table_handle(ROOT_TABLE[family]) | HASH_LINK_NODE
                hash_links[family] = HashLink(family, handle, ours=True)
            case DeleteAllFilters(family):
                links = {h: link for h, link in links.items() if link.family != family}
                hash_links.pop(family, None)
                port_tables.pop(family, None)
                if family is Family.IPV4:  # job tables live under the IPv4 priority
                    tables.clear()
            case DeleteFilter(family, handle):
                htid = u32_htid(handle)
                if handle in links:
                    del links[handle]
                elif family in hash_links and hash_links[family].handle == handle:
                    del hash_links[family]
                elif handle & 0xFFFFF == 0:
                    assert not any(link.htid == htid for link in links.values()), "in use"
                    del tables[htid]
                else:
                    t = tables[htid]
                    rest = tuple(h for h in t.filter_handles if h != handle)
                    tables[htid] = JobTable(htid, t.target_minor, rest)
    for link in links.values():
        assert link.htid in tables, "a link must never point at a missing table"
    return ActualState(
        "htb",
        0x7A10000,
        layout.default_minor,
        classes,
        tuple(links.values()),
        tables,
        leaves,
        port_tables,
        hash_links,
    )


def empty() -> ActualState:
    return ActualState("htb", 0x7A10000, 2)


def test_layout_has_root_unmanaged_and_every_band() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001})}), TUNING)
    assert set(layout.classes) == {ROOT_MINOR, UNMANAGED_MINOR} | {
        FIRST_BAND_MINOR + b for b in range(NUM_BANDS)
    }
    root = layout.classes[ROOT_MINOR]
    assert root.rate == root.ceil == 25_000_000
    for band in range(NUM_BANDS):
        cls = layout.classes[FIRST_BAND_MINOR + band]
        assert cls.prio == band
        assert cls.ceil == root.rate, "bands borrow up to the link: strict priority by borrowing"
        assert cls.rate < root.rate // 100, "a band's own rate stays small"
    unmanaged = layout.classes[UNMANAGED_MINOR]
    assert unmanaged.rate == int(25_000_000 * 0.05), "unmanaged traffic keeps its guaranteed share"
    assert layout.default_minor == UNMANAGED_MINOR


def test_short_waiting_queues_bound_every_band_but_the_green_one() -> None:
    for rate, limit in ((100_000_000, 16), (10_000_000_000, 82)):
        layout = desired_layout(spec_of({"a": (0, {5001})}, rate, short_queues=True), TUNING)
        # A tenth of a second of a band's guaranteed rate, at least 16 packets...
        assert layout.leaves == {FIRST_BAND_MINOR + b: limit for b in range(1, NUM_BANDS)}
        # ...and a band's rate drains its leaf in that tenth (a waiting flow's round trip,
        # which its RTO follows): 1.9 Mbit on slow links, 0.1% of the link on fast ones.
        band = layout.classes[FIRST_BAND_MINOR + 1]
        assert limit * TUNING.mtu / band.rate <= 0.1 + 1e-9
        assert band.rate == max(242_240, rate // 8 // 1000)
        ops = diff(empty(), layout)
        puts = [op for op in ops if isinstance(op, PutLeaf)]
        assert [op.handle for op in puts] == [leaf_handle(0x7A1, b) for b in range(1, NUM_BANDS)]
        assert diff(simulate(empty(), ops, layout), layout) == []
    plain = desired_layout(spec_of({"a": (0, {5001})}, 100_000_000), TUNING)
    assert plain.leaves == {}
    assert plain.classes[FIRST_BAND_MINOR + 1].rate == 32_000, "256 kbit without them"


def test_leaves_go_when_not_wanted_but_only_ours() -> None:
    ours = LeafQdisc(FIRST_BAND_MINOR + 1, "pfifo", leaf_handle(0x7A1, 1), 16)
    theirs = LeafQdisc(FIRST_BAND_MINOR + 2, "bfifo", 0x1230000, 9000)
    layout = desired_layout(spec_of({"a": (0, {5001})}), TUNING)
    state = simulate(empty(), diff(empty(), layout), layout)
    state = replace(state, leaves={ours.minor: ours, theirs.minor: theirs})
    assert diff(state, layout) == [DeleteLeaf(ours.minor, ours.handle)]
    # Wanted, a leaf someone else put (or ours with another limit) is replaced.
    short = desired_layout(spec_of({"a": (0, {5001})}, short_queues=True), TUNING)
    puts = [op for op in diff(state, short) if isinstance(op, PutLeaf | DeleteLeaf)]
    assert len(puts) == NUM_BANDS - 2 and theirs.minor in {op.minor for op in puts}


def test_each_port_links_both_families_to_its_jobs_table() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001, 5002}), "b": (3, {6001})}), TUNING)
    ta, tb = layout.job_table["a"], layout.job_table["b"]
    assert ta != tb
    assert layout.links == {
        (Family.IPV4, 5001): ta,
        (Family.IPV6, 5001): ta,
        (Family.IPV4, 5002): ta,
        (Family.IPV6, 5002): ta,
        (Family.IPV4, 6001): tb,
        (Family.IPV6, 6001): tb,
    }
    assert layout.table_target == {ta: FIRST_BAND_MINOR, tb: FIRST_BAND_MINOR + 3}


def test_apply_to_empty_then_nothing_left_to_do() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001}), "b": (1, {6001})}), TUNING)
    ops = diff(empty(), layout)
    assert sum(isinstance(op, PutClass) for op in ops) == 2 + NUM_BANDS
    after = simulate(empty(), ops, layout)
    assert diff(after, layout) == []


def test_rotation_is_one_retarget_per_job_that_moved() -> None:
    spec1 = spec_of({"a": (0, {5001, 5002, 5003}), "b": (1, {6001}), "c": (1, {7001})})
    layout = desired_layout(spec1, TUNING)
    spec2 = spec_of({"a": (1, {5001, 5002, 5003}), "b": (0, {6001}), "c": (1, {7001})})
    planned = retarget_tables(layout, spec2)
    assert planned is not None
    new_layout, ops = planned
    assert ops == [
        PutTableTarget(layout.job_table["a"], FIRST_BAND_MINOR + 1, create=False),
        PutTableTarget(layout.job_table["b"], FIRST_BAND_MINOR, create=False),
    ]
    after = simulate(simulate(empty(), diff(empty(), layout), layout), ops, new_layout)
    assert diff(after, desired_layout(spec2, TUNING, previous_tables=layout.job_table)) == []


def test_rotation_fast_path_refuses_when_ports_or_jobs_change() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001}), "b": (1, {6001})}), TUNING)
    assert retarget_tables(layout, spec_of({"a": (1, {5001, 5009}), "b": (0, {6001})})) is None
    assert retarget_tables(layout, spec_of({"a": (1, {5001})})) is None
    assert retarget_tables(layout, spec_of({"a": (1, {5001}), "b": (0, {6002})})) is None


def test_duplicate_and_foreign_shaped_filters_are_removed() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001})}), TUNING)
    state = simulate(empty(), diff(empty(), layout), layout)
    htid = layout.job_table["a"]
    dup = PortLink(Family.IPV4, port_link_handle(Family.IPV4, 5001, 0x50), 5001, htid)
    odd = PortLink(Family.IPV4, port_link_handle(Family.IPV4, 5001, 0x51), None, None)
    noisy = replace(state, links=(*state.links, dup, odd))
    ops = diff(noisy, layout)
    assert ops == [DeleteFilter(Family.IPV4, dup.handle), DeleteFilter(Family.IPV4, odd.handle)]


def test_a_previous_versions_root_table_links_give_way_to_the_hashed_ones() -> None:
    # Before port tables, each port's filter sat in the family's root table (nodes from 1):
    # the hashed links go in first, the old ones go last.
    spec = spec_of({"a": (0, {5001, 5002}), "b": (1, {6001})})
    layout = desired_layout(spec, TUNING)
    state = simulate(empty(), diff(empty(), layout), layout)
    old = tuple(
        PortLink(family, u32_table_handle(ROOT_TABLE[family]) | node, port, htid)
        for node, ((family, port), htid) in enumerate(sorted(layout.links.items()), start=1)
    )
    before = replace(state, links=old, port_tables={}, hash_links={})
    ops = diff(before, layout)
    first_delete = min(i for i, op in enumerate(ops) if isinstance(op, DeleteFilter))
    assert all(not isinstance(op, DeleteFilter) for op in ops[:first_delete])
    assert sum(isinstance(op, PutLink) for op in ops[:first_delete]) == len(old)
    assert sum(isinstance(op, AddHashLink) for op in ops[:first_delete]) == 2
    after = simulate(before, ops, layout)
    assert diff(after, layout) == []
    assert {link.handle for link in after.links}.isdisjoint(link.handle for link in old)


def test_a_port_table_id_held_by_an_old_job_table_is_freed_by_removing_every_filter() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001})}), TUNING)
    state = simulate(empty(), diff(empty(), layout), layout)
    clash = replace(state, port_tables={**state.port_tables, Family.IPV4: 1})
    ops = diff(clash, layout)
    assert ops[:2] == [DeleteAllFilters(Family.IPV4), DeleteAllFilters(Family.IPV6)]
    assert diff(simulate(clash, ops, layout), layout) == []


def test_a_hash_link_of_another_shape_is_replaced() -> None:
    layout = desired_layout(spec_of({"a": (0, {5001})}), TUNING)
    state = simulate(empty(), diff(empty(), layout), layout)
    foreign = HashLink(Family.IPV6, state.hash_links[Family.IPV6].handle, ours=False)
    ops = diff(replace(state, hash_links={**state.hash_links, Family.IPV6: foreign}), layout)
    assert ops == [DeleteFilter(Family.IPV6, foreign.handle), AddHashLink(Family.IPV6)]


def test_job_leaving_deletes_links_before_its_table() -> None:
    layout1 = desired_layout(spec_of({"a": (0, {5001}), "b": (1, {6001})}), TUNING)
    state = simulate(empty(), diff(empty(), layout1), layout1)
    layout2 = desired_layout(spec_of({"a": (0, {5001})}), TUNING, previous_tables=layout1.job_table)
    ops = diff(state, layout2)
    table_delete = ops.index(DeleteFilter(Family.IPV4, u32_table_handle(layout1.job_table["b"])))
    link_deletes = [
        i
        for i, op in enumerate(ops)
        if isinstance(op, DeleteFilter) and u32_htid(op.handle) in PORT_TABLE.values()
    ]
    assert len(link_deletes) == 2 and max(link_deletes) < table_delete
    assert diff(simulate(state, ops, layout2), layout2) == []


def test_tables_are_stable_across_restarts() -> None:
    spec = spec_of({"a": (0, {5001}), "b": (1, {6001})})
    layout = desired_layout(spec, TUNING)
    state = simulate(empty(), diff(empty(), layout), layout)
    assert tables_in_use(spec, state) == layout.job_table


def test_table_assignment_keeps_previous_and_resolves_collisions() -> None:
    jobs = [f"job-{i}" for i in range(300)]
    first = assign_job_tables(jobs, {})
    assert len(set(first.values())) == 300
    again = assign_job_tables([*jobs, "newcomer"], first)
    assert all(again[j] == first[j] for j in jobs)
    assert again["newcomer"] not in first.values()


job_names = st.text(alphabet="abcdefghij-0123456789", min_size=1, max_size=12)


@st.composite
def specs(draw: st.DrawFn) -> DatapathSpec:
    names = draw(st.lists(job_names, min_size=0, max_size=12, unique=True))
    ports = iter(
        draw(
            st.lists(
                st.integers(1, 65535), min_size=len(names) * 3, max_size=len(names) * 3, unique=True
            )
        )
    )
    jobs = {}
    for name in names:
        count = draw(st.integers(0, 3))
        jobs[name] = (draw(st.integers(0, NUM_BANDS - 1)), {next(ports) for _ in range(count)})
        for _ in range(3 - count):
            next(ports)
    return spec_of(jobs, short_queues=draw(st.booleans()))


@settings(max_examples=200, deadline=None)
@given(before=specs(), after=specs())
def test_diff_converges_from_any_state_in_one_pass(
    before: DatapathSpec, after: DatapathSpec
) -> None:
    layout1 = desired_layout(before, TUNING)
    state = simulate(empty(), diff(empty(), layout1), layout1)
    layout2 = desired_layout(after, TUNING, previous_tables=tables_in_use(after, state))
    state2 = simulate(state, diff(state, layout2), layout2)
    assert diff(state2, layout2) == []
    planned = retarget_tables(layout1, after)
    if planned is not None:
        # the fast path and the full reconcile agree
        fast_state = simulate(state, planned[1], planned[0])
        assert diff(fast_state, planned[0]) == []


def test_64_collective_jobs_of_64_ports_fit_in_the_hashed_port_tables() -> None:
    # 4096 ports per family: one more than a u32 table's node ids, which the root table held
    # before ports were hashed into 256 buckets.
    jobs = {
        f"j{i}": (min(i, NUM_BANDS - 1), set(range(10000 + 64 * i, 10064 + 64 * i)))
        for i in range(64)
    }
    layout = desired_layout(spec_of(jobs), TUNING)
    ops = diff(empty(), layout)
    puts = [op for op in ops if isinstance(op, PutLink)]
    assert len(puts) == 2 * 64 * 64  # IPv4, IPv6
    assert max(op.handle & 0xFFF for op in puts) == 4096 // PORT_BUCKETS
    assert diff(simulate(empty(), ops, layout), layout) == []
