"""The shipped, commented example configs against the parameters' declarations: every
parameter is documented there, every value the example sets is the declared default (a
default is written once, in its dataclass field), and every flag the messages and the help
name exists."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tensorlights.agent.config import AgentConfig
from tensorlights.agent.config import build_config as build_agent_config
from tensorlights.cli.agent import main as agent_main
from tensorlights.cli.controller import main as controller_main
from tensorlights.configspec import default_of, lookup, params, read_fields
from tensorlights.controller.config import ControllerConfig
from tensorlights.errors import ConfigError

SYSTEMD = Path(__file__).parents[2] / "systemd"
EXAMPLES = [(SYSTEMD / "agent.toml", AgentConfig), (SYSTEMD / "controller.toml", ControllerConfig)]
REQUIRED = {"interface", "tls.ca", "tls.cert", "tls.key"}
"""Keys with no default: the example shows a value to replace."""

_COMMENTED = re.compile(r"^#\s?((?:\[\[?[a-z_.]+\]\]?|[a-z_]+\s*=).*)$")


def _uncommented(text: str) -> str:
    """The example with its commented-out settings and tables switched on."""
    return "\n".join(
        match.group(1) if (match := _COMMENTED.match(line)) else line for line in text.splitlines()
    )


@pytest.mark.parametrize(("path", "config_class"), EXAMPLES, ids=lambda v: getattr(v, "name", ""))
def test_every_parameter_is_documented_in_the_example(path: Path, config_class: type) -> None:
    everything = tomllib.loads(_uncommented(path.read_text()))
    missing = [
        key
        for _, declared in params(config_class)
        for key in declared.keys
        if lookup(everything, key) is dataclasses.MISSING
    ]
    assert missing == []


@pytest.mark.parametrize(("path", "config_class"), EXAMPLES, ids=lambda v: getattr(v, "name", ""))
def test_the_example_sets_only_the_declared_defaults(path: Path, config_class: type) -> None:
    active = tomllib.loads(path.read_text())
    read = read_fields(config_class, active)
    differing = {}
    for item, declared in params(config_class):
        if item.name not in read or set(declared.keys) & REQUIRED:
            continue
        default = default_of(item)
        if read[item.name] != default:
            differing[declared.key] = (read[item.name], default)
    assert differing == {}


def test_the_uncommented_agent_example_is_a_valid_config(tmp_path: Path) -> None:
    values: dict[str, Any] = tomllib.loads(_uncommented((SYSTEMD / "agent.toml").read_text()))
    for key in ("ca", "cert", "key"):
        (tmp_path / key).write_text("x")
        values["controller"][key] = str(tmp_path / key)
    values["standalone"] = False
    config = build_agent_config(values, {})
    assert not config.standalone and config.controller == "tl-controller.example.org:9740"
    assert config.discovery.operator_rules[0].name == "legacy-ps"


def test_flags_come_from_the_declarations_and_the_help_names_the_defaults() -> None:
    agent_help = " ".join(CliRunner().invoke(agent_main, ["run", "--help"]).output.split())
    for flag in ("--controller", "--standalone / --no-standalone", "--link-rate", "--policy"):
        assert flag in agent_help
    assert "[default: 3s]" in agent_help and "[default: 127.0.0.1:9731]" in agent_help
    assert "[default: pack]" in agent_help
    controller_help = " ".join(
        CliRunner().invoke(controller_main, ["run", "--help"]).output.split()
    )
    for flag in ("--tls-ca", "--slot", "--policy", "--jobs-file", "--slurm / --no-slurm"):
        assert flag in controller_help
    assert "[default: 0.0.0.0:9740]" in controller_help and "[default: 15s]" in controller_help


def test_the_controller_flag_the_messages_name_exists() -> None:
    # --controller turns standalone off, so the link's TLS files are asked for next.
    with pytest.raises(ConfigError, match="always mutual TLS"):
        build_agent_config({}, {"interface": "eth0", "controller.address": "c:1"})
    with pytest.raises(ConfigError, match="--controller HOST:PORT"):
        build_agent_config({}, {"interface": "eth0", "standalone": False})
