"""Every duration and rate a config takes has a range (issue: "1ns" made the agent busy-loop,
1e308 s was accepted, a rate past 64 bits crashed after programming half a qdisc)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tensorlights.agent.config import AgentConfig
from tensorlights.agent.config import build_config as build_agent_config
from tensorlights.cli.agent import main as agent_main
from tensorlights.configspec import params, show_duration
from tensorlights.controller.config import ControllerConfig
from tensorlights.controller.config import build_config as build_controller_config
from tensorlights.errors import ConfigError


def _durations(config_class: type) -> list[str]:
    return [declared.key for _, declared in params(config_class) if declared.show is show_duration]


def _tls(tmp_path: Path) -> dict[str, str]:
    for name in ("ca", "cert", "key"):
        (tmp_path / name).write_text("x")
    return {name: str(tmp_path / name) for name in ("ca", "cert", "key")}


@pytest.mark.parametrize("value", ["1ns", "0.001ms", 1e308, "100000h"])
def test_every_agent_duration_refuses_absurd_values(value: Any) -> None:
    keys = _durations(AgentConfig)
    assert {"interval", "scan_interval", "telemetry.sample_interval"} <= set(keys)
    for key in keys:
        *table, leaf = key.split(".")
        values: dict[str, Any] = {"interface": "eth0"}
        (values.setdefault(table[0], {}) if table else values)[leaf] = value
        with pytest.raises(ConfigError, match=f"{key} must be"):
            build_agent_config(values, {})


@pytest.mark.parametrize("value", ["1ns", 1e308])
def test_every_controller_duration_refuses_absurd_values(value: Any, tmp_path: Path) -> None:
    keys = _durations(ControllerConfig)
    assert {"slot", "lease", "report_interval", "sources.slurm.interval"} <= set(keys)
    for key in keys:
        values: dict[str, Any] = {"tls": _tls(tmp_path)}
        *tables, leaf = key.split(".")
        where = values
        for name in tables:
            where = where.setdefault(name, {})
        where[leaf] = value
        with pytest.raises(ConfigError, match=f"{key} must be"):
            build_controller_config(values, {})


def test_link_rate_is_bounded_before_anything_is_programmed() -> None:
    for rate in ("99999999999999tbit", "11tbit", "999bit"):
        with pytest.raises(ConfigError, match="link_rate must be between 1kbit and 10tbit"):
            build_agent_config({"interface": "eth0", "link_rate": rate}, {})
    assert build_agent_config({"interface": "eth0", "link_rate": "10tbit"}, {}).link_rate_bps


def test_the_flag_the_foreign_qdisc_error_names_exists() -> None:
    from tensorlights.datapath import htb

    source = Path(htb.__file__).read_text()
    assert "--take-over-foreign-qdisc" in source  # the error message names it
    help_text = CliRunner().invoke(agent_main, ["run", "--help"]).output
    assert "--take-over-foreign-qdisc" in help_text
    config = build_agent_config({"interface": "eth0"}, {"take_over_foreign_qdisc": True})
    assert config.take_over_foreign_qdisc


@pytest.mark.parametrize("interface", ['et"h0', "eth*"])
def test_an_interface_nftables_cannot_match_exactly_is_refused_before_anything_runs(
    interface: str,
) -> None:
    """A legal Linux name with a quote used to make every pass fail after our qdisc and
    table were installed; a trailing * would have marked other interfaces' packets too."""
    result = CliRunner().invoke(
        agent_main, ["run", "--interface", interface, "--link-rate", "1gbit"]
    )
    assert result.exit_code == 2 and "cannot be matched exactly in an nftables rule" in (
        result.output
    )
    without_marks = build_agent_config({"interface": interface, "dscp": {"enabled": False}}, {})
    assert without_marks.interface == interface  # tc alone can shape it
    from tensorlights.policy.dscp_plan import DscpLayout, render_replace

    with pytest.raises(ConfigError):
        render_replace(DscpLayout(interface, {}, {}))
