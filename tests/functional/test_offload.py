"""The interface's hw-tc-offload feature as the agent reads it (ethtool ioctl), on the veth
pairs these machines have: none offers it. A NIC that does (ConnectX-6 Dx) cannot be tested
here; docs/design.md says what the agent would need to use it."""

from __future__ import annotations

from tensorlights.datapath.offload import HwTcOffload, datapath_path, read_hw_tc_offload
from tensorlights.netlink_io import call_in_netns
from tensorlights.testbed import netns


def test_a_veth_offers_no_hw_tc_offload_and_the_path_is_software(pair: netns.HostPair) -> None:
    offload = call_in_netns(pair.a.ns, lambda: read_hw_tc_offload("veth-a"))
    assert offload == HwTcOffload(offered=False, enabled=False)
    assert datapath_path("veth-a", offload) == "software HTB (veth-a offers no hw-tc-offload)"


def test_an_interface_that_is_not_there_has_no_answer(pair: netns.HostPair) -> None:
    assert call_in_netns(pair.a.ns, lambda: read_hw_tc_offload("veth-zz")) is None
    assert "answers no hw-tc-offload query" in datapath_path("veth-zz", None)
