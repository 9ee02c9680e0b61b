"""Our nftables table on the real kernel: exact shape, repair, and nobody else's touched."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorlights.datapath.dscp import DscpMarker
from tensorlights.datapath.nft import Nft
from tensorlights.policy.dscp_plan import DscpLayout, render_rotation
from tensorlights.testbed import netns

pytestmark = pytest.mark.root

LAYOUT = DscpLayout(
    "veth-a",
    {"job_1": 34, "job_2": 26, "job_3": 18},
    {5001: "job_1", 40001: "job_1", 5002: "job_2", 5003: "job_3"},
)
FOREIGN = """
table inet other {
  chain out { type filter hook output priority 0; policy accept; tcp dport 9999 counter; }
}
table ip tensorlights {
  chain keep { counter; }
}
"""


@pytest.fixture
def marker(pair: netns.HostPair) -> Iterator[DscpMarker]:
    made = DscpMarker(Nft(pair.a.ns))
    try:
        yield made
    finally:
        made.close()


def ruleset(pair: netns.HostPair) -> str:
    return netns.run(["ip", "netns", "exec", pair.a.ns, "nft", "list", "ruleset"]).stdout


def foreign_part(pair: netns.HostPair) -> str:
    """Everything but our table (inet tensorlights)."""
    text = ruleset(pair)
    start = text.find("table inet tensorlights {")
    if start < 0:
        return text
    end = text.find("\n}\n", start) + 3
    return text[:start] + text[end:]


def test_apply_rotate_cleanup_leave_other_tables_alone(
    pair: netns.HostPair, marker: DscpMarker
) -> None:
    marker.nft.run(FOREIGN)
    before = foreign_part(pair)
    assert marker.apply(LAYOUT) is True
    assert marker.read_actual() == LAYOUT
    assert marker.apply(LAYOUT) is False  # idempotent: nothing rewritten
    moved = DscpLayout(LAYOUT.interface, {"job_1": 26, "job_2": 34, "job_3": 18}, LAYOUT.port_chain)
    commands = render_rotation(LAYOUT, moved)
    assert commands is not None and "job_3" not in commands  # only moved chains
    assert marker.rotate(moved) is True
    assert marker.read_actual() == moved
    assert foreign_part(pair) == before
    assert marker.cleanup() is True
    assert "inet tensorlights" not in ruleset(pair)
    assert foreign_part(pair) == before
    assert marker.cleanup() is False


@pytest.mark.parametrize(
    "vandalism",
    [
        "flush chain inet tensorlights job_2",
        "delete element inet tensorlights ps_ports { 5003 }",
        "flush chain inet tensorlights postrouting",
        "delete table inet tensorlights",
        "add element inet tensorlights ps_ports { 6000 : jump job_1 }",
    ],
)
def test_hand_edits_are_detected_and_repaired(
    pair: netns.HostPair, marker: DscpMarker, vandalism: str
) -> None:
    marker.apply(LAYOUT)
    netns.run(["ip", "netns", "exec", pair.a.ns, "nft", vandalism])
    assert marker.read_actual() != LAYOUT
    assert marker.apply(LAYOUT) is True
    assert marker.read_actual() == LAYOUT


def test_rotation_after_a_hand_edit_falls_back_to_a_full_rewrite(
    pair: netns.HostPair, marker: DscpMarker
) -> None:
    marker.apply(LAYOUT)
    netns.run(["ip", "netns", "exec", pair.a.ns, "nft", "delete table inet tensorlights"])
    moved = DscpLayout(LAYOUT.interface, {"job_1": 26, "job_2": 34, "job_3": 18}, LAYOUT.port_chain)
    marker.rotate(moved)
    assert marker.read_actual() == moved
