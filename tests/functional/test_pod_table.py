"""The pods' nftables table (inet tensorlights_pods) on the real kernel: exact shape read
back, level-triggered repair, rotation of the moved chains only, and cleanup of ours alone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tensorlights.datapath.dscp import PodClassifier
from tensorlights.datapath.nft import Nft
from tensorlights.policy.pod_plan import ChainAction, PodLayout, render_rotation
from tensorlights.testbed import netns

pytestmark = pytest.mark.root

GREEN, AMBER = 0x7A10010, 0x7A10011
LAYOUT = PodLayout(
    {
        "job_1": ChainAction(GREEN, 34),
        "job_2": ChainAction(AMBER, 26),
        "job_3": ChainAction(AMBER, None),
    },
    {
        ("10.244.1.2", 5001): "job_1",
        ("10.244.1.3", 5001): "job_2",  # the same port in another pod: another job
        ("fd00:244::3", 5001): "job_2",
        ("10.244.2.9", 40001): "job_3",
    },
)


@pytest.fixture
def table(pair: netns.HostPair) -> Iterator[PodClassifier]:
    made = PodClassifier(Nft(pair.a.ns))
    try:
        yield made
    finally:
        made.cleanup()
        made.close()


def test_apply_read_back_rotate_and_cleanup(pair: netns.HostPair, table: PodClassifier) -> None:
    assert table.apply(LAYOUT) is True
    assert table.read_actual() == LAYOUT
    assert table.apply(LAYOUT) is False  # idempotent: nothing rewritten
    moved = PodLayout(
        {**LAYOUT.chain_action, "job_1": ChainAction(AMBER, 26), "job_2": ChainAction(GREEN, 34)},
        LAYOUT.endpoint_chain,
    )
    commands = render_rotation(LAYOUT, moved)
    assert commands is not None and "job_3" not in commands  # only the moved chains
    assert table.rotate(moved) is True
    assert table.read_actual() == moved
    assert table.cleanup() is True
    listing = netns.run(["ip", "netns", "exec", pair.a.ns, "nft", "list", "tables"]).stdout
    assert "tensorlights_pods" not in listing


@pytest.mark.parametrize(
    "vandalism",
    [
        "flush chain inet tensorlights_pods job_2",
        "delete element inet tensorlights_pods pods_v4 { 10.244.1.3 . 5001 }",
        "flush chain inet tensorlights_pods forward",
        "delete table inet tensorlights_pods",
        "add rule inet tensorlights_pods job_1 meta priority set 7a1:17",
    ],
)
def test_hand_edits_are_detected_and_repaired(
    pair: netns.HostPair, table: PodClassifier, vandalism: str
) -> None:
    table.apply(LAYOUT)
    netns.run(["ip", "netns", "exec", pair.a.ns, "nft", vandalism])
    assert table.read_actual() != LAYOUT
    assert table.apply(LAYOUT) is True
    assert table.read_actual() == LAYOUT
