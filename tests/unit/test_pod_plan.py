"""Pods' endpoints from discovery to the pods' nftables plan (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlights.errors import ConfigError
from tensorlights.model import DatapathSpec, DiscoverySnapshot, JobShaping, PsConnection, PsTask
from tensorlights.policy.pod_plan import ChainAction, desired_pods, render_replace, render_rotation


def task(job: str, *conns: tuple[str, int], in_agent_netns: bool = False) -> PsTask:
    connections = tuple(
        PsConnection(port, "10.0.0.9", 40000 + i, local_addr=addr)
        for i, (addr, port) in enumerate(conns)
    )
    return PsTask(1, 0.0, job, "env", 4026531999, in_agent_netns, frozenset(), connections)


def test_pod_endpoints_are_the_connections_of_ps_tasks_in_other_namespaces() -> None:
    snapshot = DiscoverySnapshot(
        (
            task("a", ("10.244.1.2", 5001), ("::ffff:10.244.1.2", 5001), ("fd00::2", 5001)),
            task("b", ("10.244.1.3", 5001), ("127.0.0.1", 7000)),
            task("c", ("10.1.0.1", 6000), in_agent_netns=True),  # the host's own: by port
            task("d", ("10.244.1.9", 7100)),
            task("e", ("10.244.1.9", 7100)),  # two jobs at one endpoint: neither gets it
        )
    )
    assert snapshot.job_pod_endpoints() == {
        # a dual-stack socket's IPv4 peer leaves as an IPv4 packet from the IPv4 address
        "a": frozenset({("10.244.1.2", 5001), ("fd00::2", 5001)}),
        "b": frozenset({("10.244.1.3", 5001)}),  # loopback never leaves the pod
        "d": frozenset(),
        "e": frozenset(),
    }
    assert snapshot.job_ports() == {"c": frozenset({6000})}


def test_a_spec_refuses_bad_or_shared_pod_endpoints() -> None:
    with pytest.raises(ConfigError, match="not an IP"):
        JobShaping("a", 0, frozenset(), frozenset({("pod-a", 5001)}))
    with pytest.raises(ConfigError, match=r"outside 1\.\.65535"):
        JobShaping("a", 0, frozenset(), frozenset({("10.0.0.1", 0)}))
    shared = frozenset({("10.244.1.2", 5001)})
    with pytest.raises(ConfigError, match="claimed by both a and b"):
        DatapathSpec(
            "eth0",
            10**9,
            (JobShaping("a", 0, frozenset(), shared), JobShaping("b", 1, frozenset(), shared)),
        )


def spec(green: str) -> DatapathSpec:
    return DatapathSpec(
        "eth0",
        10**9,
        (
            JobShaping(
                "a", 0 if green == "a" else 1, frozenset({5000}), frozenset({("10.244.1.2", 5001)})
            ),
            JobShaping("b", 0 if green == "b" else 1, frozenset(), frozenset({("fd00::3", 5001)})),
            JobShaping("c", 2, frozenset({6000})),  # no pods: no chain here
        ),
    )


TABLES = {"a": 0x11, "b": 0x22, "c": 0x33}


def test_each_pod_job_gets_its_band_class_and_dscp() -> None:
    layout = desired_pods(spec("a"), TABLES, 0x7A1, (34, 26, 18, 10, 10, 10, 10))
    assert layout.chain_action == {
        "job_11": ChainAction(0x7A10010, 34),
        "job_22": ChainAction(0x7A10011, 26),
    }
    assert layout.endpoint_chain == {("10.244.1.2", 5001): "job_11", ("fd00::3", 5001): "job_22"}
    unmarked = desired_pods(spec("a"), TABLES, 0x7A1, None)
    assert {a.dscp for a in unmarked.chain_action.values()} == {None}
    text = render_replace(layout)
    assert "add rule inet tensorlights_pods job_11 meta priority set 7a1:10" in text
    assert "add element inet tensorlights_pods pods_v4 { 10.244.1.2 . 5001 : jump job_11 }" in text
    assert "add element inet tensorlights_pods pods_v6 { fd00::3 . 5001 : jump job_22 }" in text
    assert "hook forward priority mangle" in text


@given(st.sampled_from(["a", "b"]), st.sampled_from(["a", "b"]))
def test_a_rotation_rewrites_exactly_the_moved_chains(before: str, after: str) -> None:
    bands = (34, 26, 18, 10, 10, 10, 10)
    old = desired_pods(spec(before), TABLES, 0x7A1, bands)
    new = desired_pods(spec(after), TABLES, 0x7A1, bands)
    commands = render_rotation(old, new)
    assert commands is not None
    if before == after:
        assert commands == ""
    else:
        assert commands.count("flush chain") == 2 and "job_11" in commands and "job_22" in commands
    # Anything but bands changed: a full replace.
    moved = DatapathSpec(
        "eth0", 10**9, (JobShaping("a", 0, frozenset(), frozenset({("10.244.1.7", 5001)})),)
    )
    assert render_rotation(old, desired_pods(moved, TABLES, 0x7A1, bands)) is None
