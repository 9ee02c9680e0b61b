"""DSCP planning (pure) and the DSCP settings of the agent's config."""

from __future__ import annotations

import pytest

from tensorlights.agent.config import OnUnsupported, build_config
from tensorlights.datapath import nft
from tensorlights.errors import ConfigError, UnsupportedKernelError
from tensorlights.model import DatapathSpec, JobShaping
from tensorlights.policy.dscp_plan import (
    DEFAULT_BAND_DSCP,
    DscpLayout,
    desired_dscp,
    render_replace,
    render_rotation,
    validate_band_dscp,
)

SPEC = DatapathSpec(
    "eth0",
    10**9,
    (
        JobShaping("a", 0, frozenset({5001, 40001})),
        JobShaping("b", 1, frozenset({5002})),
        JobShaping("c", 3, frozenset()),
    ),
)
TABLES = {"a": 0x10, "b": 0x11, "c": 0x12}


def test_desired_marks_follow_bands_and_name_chains_after_job_tables() -> None:
    layout = desired_dscp(SPEC, TABLES, DEFAULT_BAND_DSCP)
    assert layout.chain_dscp == {"job_10": 34, "job_11": 26, "job_12": 10}
    assert layout.port_chain == {5001: "job_10", 40001: "job_10", 5002: "job_11"}


def test_replace_is_one_atomic_script_that_touches_only_our_table() -> None:
    script = render_replace(desired_dscp(SPEC, TABLES, DEFAULT_BAND_DSCP))
    lines = script.splitlines()
    assert lines[:3] == [
        "add table inet tensorlights",
        "delete table inet tensorlights",
        "add table inet tensorlights",
    ]
    assert all(" inet tensorlights" in line for line in lines)
    assert 'oifname "eth0"' in script and "5001 : jump job_10" in script


def test_rotation_rewrites_only_moved_chains_or_asks_for_a_replace() -> None:
    before = desired_dscp(SPEC, TABLES, DEFAULT_BAND_DSCP)
    swapped = DatapathSpec(
        "eth0",
        10**9,
        (
            JobShaping("a", 1, frozenset({5001, 40001})),
            JobShaping("b", 0, frozenset({5002})),
            JobShaping("c", 3, frozenset()),
        ),
    )
    after = desired_dscp(swapped, TABLES, DEFAULT_BAND_DSCP)
    commands = render_rotation(before, after)
    assert commands is not None
    assert "job_10" in commands and "job_11" in commands and "job_12" not in commands
    assert render_rotation(before, before) == ""
    moved_port = DscpLayout("eth0", before.chain_dscp, {**before.port_chain, 6000: "job_12"})
    assert render_rotation(before, moved_port) is None
    other_interface = DscpLayout("eth1", before.chain_dscp, before.port_chain)
    assert render_rotation(before, other_interface) is None


@pytest.mark.parametrize("values", [[34] * 6, [34] * 8, [64] * 7, [-1] * 7, [True] * 7])
def test_bad_band_dscp_values(values: list[int]) -> None:
    with pytest.raises(ConfigError):
        validate_band_dscp(values)


def test_dscp_config() -> None:
    config = build_config(
        {
            "interface": "eth0",
            "dscp": {"bands": [46, 34, 26, 18, 10, 8, 8], "on_unsupported": "warn"},
        },
        {},
    )
    assert config.dscp_bands[0] == 46 and config.dscp_on_unsupported is OnUnsupported.WARN
    assert build_config({"interface": "eth0"}, {}).dscp_enabled
    with pytest.raises(ConfigError, match="unknown"):
        build_config({"interface": "eth0", "dscp": {"colour": 1}}, {})
    with pytest.raises(ConfigError, match="on_unsupported"):
        build_config({"interface": "eth0", "dscp": {"on_unsupported": "ignore"}}, {})


def test_missing_nftables_library_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # The library is installed here; a name that does not exist stands for a host without it.
    monkeypatch.setattr(nft, "LIBRARY", "libnftables-absent.so.0")
    with pytest.raises(UnsupportedKernelError, match="apt-get install nftables"):
        nft.Nft()
