"""How the status words the datapath path and the NIC's hw-tc-offload offer."""

from __future__ import annotations

from tensorlights.datapath.offload import HwTcOffload, datapath_path


def test_each_offer_is_told_apart() -> None:
    assert "offers hw-tc-offload (off), not used" in datapath_path(
        "eth0", HwTcOffload(offered=True, enabled=False)
    )
    assert "has hw-tc-offload on, not used" in datapath_path(
        "eth0", HwTcOffload(offered=True, enabled=True)
    )
