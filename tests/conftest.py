from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tensorlights.datapath import open_datapath
from tensorlights.datapath.htb import HtbDatapath
from tensorlights.testbed import netns


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root: creates network namespaces")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def pair() -> Iterator[netns.HostPair]:
    """Two fresh namespaces on a veth link; removed even when the test fails."""
    created = netns.create_pair()
    try:
        yield created
    finally:
        netns.destroy_pair(created)
        assert not netns.leftover_namespaces(created.run_id)


@pytest.fixture
def datapath(pair: netns.HostPair, tmp_path: Path) -> Iterator[HtbDatapath]:
    dp = open_datapath("htb", tmp_path / "state", netns=pair.a.ns)
    try:
        yield dp
    finally:
        dp.sock.close()
