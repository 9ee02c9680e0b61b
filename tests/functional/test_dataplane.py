"""The dataplane facade on the real kernel: one call writes the HTB tree and the DSCP marks,
in that order, with each job's marks keyed to the u32 table tc gave it."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorlights.datapath import open_datapath
from tensorlights.datapath.dataplane import Dataplane, Marking
from tensorlights.datapath.dscp import DscpMarker
from tensorlights.datapath.nft import Nft
from tensorlights.errors import PermanentError
from tensorlights.model import DatapathSpec, JobShaping
from tensorlights.policy.dscp_plan import DEFAULT_BAND_DSCP, chain_name
from tensorlights.testbed import netns

pytestmark = pytest.mark.root


@pytest.fixture
def dataplane(pair: netns.HostPair, tmp_path: Path) -> Iterator[Dataplane]:
    tc = open_datapath("htb", tmp_path / "state", netns=pair.a.ns)
    made = Dataplane(tc, netns=pair.a.ns, marking=Marking(DEFAULT_BAND_DSCP))
    try:
        yield made
    finally:
        made.close()


def _spec(interface: str, bands: dict[str, int]) -> DatapathSpec:
    ports = {"a": frozenset({5001, 40001}), "b": frozenset({5002})}
    jobs = tuple(JobShaping(job, band, ports[job]) for job, band in bands.items())
    return DatapathSpec(interface, 300_000_000, jobs)


def _marks(pair: netns.HostPair) -> dict[int, int]:
    """Source port -> the DSCP our table gives it."""
    reader = DscpMarker(Nft(pair.a.ns))
    try:
        layout = reader.read_actual()
    finally:
        reader.close()
    assert layout is not None
    return {port: layout.chain_dscp[chain] for port, chain in layout.port_chain.items()}


def test_apply_rotate_and_cleanup_keep_tc_and_marks_together(
    pair: netns.HostPair, dataplane: Dataplane
) -> None:
    interface = pair.a.ifname
    assert dataplane.marking
    assert dataplane.apply(_spec(interface, {"a": 0, "b": 1})) > 0
    assert _marks(pair) == {5001: 34, 40001: 34, 5002: 26}
    actual = dataplane.tc.read_actual(dataplane.link(interface).ifindex)
    chains = {chain_name(htid) for htid in actual.tables}
    reader = DscpMarker(Nft(pair.a.ns))
    layout = reader.read_actual()
    reader.close()
    assert layout is not None and set(layout.chain_dscp) == chains  # keyed to tc's tables

    assert dataplane.apply(_spec(interface, {"a": 0, "b": 1})) == 0  # idempotent
    assert dataplane.rotate(_spec(interface, {"b": 0, "a": 1})) > 0
    assert _marks(pair) == {5001: 26, 40001: 26, 5002: 34}

    outcome = dataplane.cleanup(interface)
    assert "removed nftables table inet tensorlights" in outcome
    assert dataplane.tc.read_actual(dataplane.link(interface).ifindex).root_kind != "htb"


def test_marking_turned_off_removes_only_the_marks(
    pair: netns.HostPair, dataplane: Dataplane
) -> None:
    interface = pair.a.ifname
    dataplane.apply(_spec(interface, {"a": 0, "b": 1}))
    dataplane.set_marking(None)
    assert not dataplane.marking
    reader = DscpMarker(Nft(pair.a.ns))
    try:
        assert not reader.table_exists()
    finally:
        reader.close()
    assert dataplane.tc.read_actual(dataplane.link(interface).ifindex).root_kind == "htb"
    dataplane.set_marking(Marking(DEFAULT_BAND_DSCP))
    dataplane.apply(_spec(interface, {"a": 0, "b": 1}))
    assert _marks(pair) == {5001: 34, 40001: 34, 5002: 26}


def test_cleanup_finishes_every_step_when_one_fails(
    pair: netns.HostPair, dataplane: Dataplane, tmp_path: Path
) -> None:
    """The state directory cannot be written (immutable): the record of the old qdisc cannot
    be removed, but the qdisc and the marks still go, and the error says why."""
    interface = pair.a.ifname
    dataplane.apply(_spec(interface, {"a": 0, "b": 1}))
    state = tmp_path / "state"
    if subprocess.run(["chattr", "+i", str(state)], capture_output=True).returncode != 0:
        pytest.skip("this file system has no immutable attribute (chattr +i)")
    try:
        with pytest.raises(PermanentError, match="state directory must be writable"):
            dataplane.cleanup(interface)
    finally:
        subprocess.run(["chattr", "-i", str(state)], check=True)
    reader = DscpMarker(Nft(pair.a.ns))
    try:
        assert not reader.table_exists()  # the marks went although the tc step raised
    finally:
        reader.close()
    assert dataplane.tc.read_actual(dataplane.link(interface).ifindex).root_kind != "htb"
