"""Agent configuration: file + flags, validation, defaults; health; the shipped example."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorlights.agent.config import (
    AgentConfig,
    OnStop,
    build_config,
    discovery_rules,
    with_link_rate,
)
from tensorlights.configfile import parse_address, read_config_file
from tensorlights.daemon.health import Health
from tensorlights.discovery.trust import Trust, TrustMode
from tensorlights.errors import ConfigError, LinkRateUnknownError
from tensorlights.policy.bands import PolicyName

EXAMPLE = Path(__file__).parents[2] / "systemd" / "agent.toml"


def test_shipped_example_config_is_valid() -> None:
    config = build_config(read_config_file(EXAMPLE, required=True), {})
    assert config.interface == "eth0" and config.policy is PolicyName.PACK
    assert config.metrics_address == ("127.0.0.1", 9731)


def test_flags_override_the_file_and_parse_units() -> None:
    file_values = {"interface": "eth0", "policy": "static", "interval": "10s"}
    flags = {"interface": "eth1", "link_rate": "10gbit", "interval": "500ms", "policy": None}
    config = build_config(file_values, flags)
    assert config.interface == "eth1" and config.link_rate_bps == 10_000_000_000
    assert config.interval_s == 0.5 and config.policy is PolicyName.STATIC


def test_defaults() -> None:
    config = build_config({"interface": "eth0"}, {})
    assert config.policy is PolicyName.PACK and config.interval_s == 3.0
    assert config.standalone and config.on_stop is OnStop.RESTORE
    assert config.metrics_address[0] == "127.0.0.1"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({}, "no interface"),
        ({"interface": "eth0", "polcy": "x"}, "unknown config keys: polcy"),
        ({"interface": "eth0", "policy": "best"}, "policy must be one of"),
        ({"interface": "eth0", "interval": "0s"}, "positive"),
        ({"interface": "eth0", "interval": True}, "duration"),
        ({"interface": "eth0", "link_rate": "fast"}, "rate"),
        ({"interface": "eth0", "metrics_address": "localhost"}, "HOST:PORT"),
        ({"interface": "eth0", "on_stop": "explode"}, "on_stop"),
        ({"interface": "eth0", "unmanaged_share": 0.0}, "unmanaged_share"),
        ({"interface": "a/b"}, "not a valid Linux name"),
        ({"interface": "eth0", "standalone": False}, "needs the controller's address"),
        ({"interface": "eth0", "controller": {"address": "c:1"}}, "always mutual TLS"),
        ({"interface": "eth0", "controller": {"address": "c", "ca": "x"}}, "all of ca, cert"),
        ({"interface": "eth0", "controller": {"address": "c:1", "tls": 1}}, "unknown [controller]"),
        (
            {
                "interface": "eth0",
                "controller": {"address": "c:1", "ca": "/x", "cert": "/y", "key": "/z"},
            },
            "controller.ca /x",
        ),
        ({"interface": "eth0", "health_max_age": "100ms"}, "health_max_age"),
        ({"interface": "eth0", "discovery": {"torch_ps_ranks": [-1]}}, "non-negative"),
        ({"interface": "eth0", "discovery": {"extra": 1}}, "unknown [discovery] keys"),
        ({"interface": "eth0", "discovery": {"rule": [{"name": "r"}]}}, "rule r"),
        ({"interface": "eth0", "trust": "everyone"}, "trust must be one of resource-manager, any"),
        ({"interface": "eth0", "trusted_users": "root"}, "trusted_users must be a list"),
        ({"interface": "eth0", "trusted_users": ["no-such-user-x"]}, "no user 'no-such-user-x'"),
        ({"interface": "eth0", "trusted_users": [-1]}, "neither a user name nor a uid"),
    ],
)
def test_invalid_configs_are_refused_with_a_clear_message(
    values: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(values, {})
    assert message in str(caught.value)


def test_discovery_rules_from_the_file() -> None:
    config = build_config(
        {
            "interface": "eth0",
            "discovery": {
                "torch_ps_ranks": [0],
                "slurm_ps_procids": [0, 1],
                "slurm_spank_dir": "/run/slurm-tl",
                "rule": [{"name": "r", "role": "ps", "job": "j-${X}", "env": {"A": "1"}}],
            },
        },
        {},
    )
    assert config.discovery.torch_ps_ranks == {0}
    assert config.discovery.slurm_ps_procids == {0, 1}
    assert config.discovery.slurm_spank_dir == "/run/slurm-tl"
    assert build_config({"interface": "eth0"}, {}).discovery.slurm_spank_dir == (
        "/run/tensorlights/slurm"
    )
    with pytest.raises(ConfigError, match="slurm_spank_dir must be an absolute path"):
        build_config({"interface": "eth0", "discovery": {"slurm_spank_dir": "run/x"}}, {})
    assert config.discovery.operator_rules[0].job == "j-${X}"


def test_trust_defaults_to_the_resource_manager_and_reaches_the_scanner_rules() -> None:
    strict = build_config({"interface": "eth0"}, {}).rules.trust
    assert strict == Trust(TrustMode.RESOURCE_MANAGER, frozenset())
    config = build_config({"interface": "eth0", "trusted_users": ["root", 1234]}, {"trust": "any"})
    assert config.rules.trust == Trust(TrustMode.ANY, frozenset({0, 1234}))
    # `discover` reads the same keys from a file, with its own --trust on top.
    file_values = {"interface": "eth0", "trust": "any", "discovery": {"torch_ps_ranks": [0]}}
    assert discovery_rules(file_values).trust.mode is TrustMode.ANY
    assert discovery_rules(file_values).torch_ps_ranks == {0}
    assert discovery_rules(file_values, {"trust": "resource-manager"}).trust == Trust()


def test_config_file_errors(tmp_path: Path) -> None:
    assert read_config_file(tmp_path / "absent.toml", required=False) == {}
    with pytest.raises(ConfigError, match="does not exist"):
        read_config_file(tmp_path / "absent.toml", required=True)
    bad = tmp_path / "bad.toml"
    bad.write_text("interface = \n")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        read_config_file(bad, required=True)


def test_link_rate_from_sysfs_or_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "eth0").mkdir()
    (tmp_path / "eth0" / "speed").write_text("25000\n")
    (tmp_path / "veth0").mkdir()
    (tmp_path / "veth0" / "speed").write_text("-1\n")
    assert with_link_rate(AgentConfig("eth0"), tmp_path).link_rate_bps == 25_000_000_000
    with pytest.raises(LinkRateUnknownError, match="--link-rate"):
        with_link_rate(AgentConfig("veth0"), tmp_path)
    with pytest.raises(LinkRateUnknownError):
        with_link_rate(AgentConfig("nosuch"), tmp_path)


def test_parse_address() -> None:
    assert parse_address("0.0.0.0:9100") == ("0.0.0.0", 9100)
    assert parse_address("[::1]:9100") == ("::1", 9100)
    for bad in ("9100", "h:0", "h:99999", "h:x"):
        with pytest.raises(ConfigError):
            parse_address(bad)


def test_health_turns_unhealthy_when_successes_stop() -> None:
    now = [100.0]
    health = Health(max_age_s=2.0, clock=lambda: now[0])
    assert health.check() == (True, "starting")
    now[0] = 103.0
    health.failure("InterfaceNotFoundError: eth9")
    ok, reason = health.check()
    assert not ok and "eth9" in reason
    health.success()
    assert health.check()[0]
    now[0] = 104.5
    assert health.check()[0]
    now[0] = 105.5  # a hung loop: nothing recorded at all
    ok, reason = health.check()
    assert not ok and "not progressing" in reason


def test_host_comes_from_the_flag_and_names_its_tls_files(tmp_path: Path) -> None:
    """On Kubernetes one Secret holds every node's files: `{host}` picks this node's."""
    for name in ("ca.pem", "gpu7.pem", "gpu7.key"):
        (tmp_path / name).write_text("x")
    controller = {
        "address": "ctl:9740",
        "ca": f"{tmp_path}/ca.pem",
        "cert": f"{tmp_path}/{{host}}.pem",
        "key": f"{tmp_path}/{{host}}.key",
    }
    config = build_config(
        {"interface": "eth0", "controller": controller}, {"controller.host": "gpu7"}
    )
    assert config.host_name == "gpu7"
    assert config.controller_tls is not None
    assert config.controller_tls.cert == tmp_path / "gpu7.pem"
    assert config.controller_tls.key == tmp_path / "gpu7.key"
    assert config.controller_tls.ca == tmp_path / "ca.pem"
