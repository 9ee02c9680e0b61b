"""`bench run --agent-setting`: what reaches the agents' config, and what is refused before
any run (pure: the agents' own config rules, no agent started)."""

from __future__ import annotations

import tomllib

import pytest

from tensorlights.bench.agent_settings import agent_settings_toml
from tensorlights.bench.runner import agent_policy
from tensorlights.bench.scenarios import FAULTS, Policy, StaticOrder
from tensorlights.errors import ConfigError


def test_settings_become_toml_lines_the_agents_config_reads_with_the_benchs_own() -> None:
    text = agent_settings_toml(
        ["dscp.enabled=false", ' telemetry.sample_interval = "50ms" '], ["pack", "static"]
    )
    assert text == 'dscp.enabled = false\ntelemetry.sample_interval = "50ms"\n'
    # First in the file, the bench's own lines and tables after them (runner.AgentOnHost).
    config = text + 'starvation_window = "30s"\ntrust = "any"\n[discovery]\ntorch_ps_ranks = [0]\n'
    assert tomllib.loads(config) == {
        "dscp": {"enabled": False},
        "telemetry": {"sample_interval": "50ms"},
        "starvation_window": "30s",
        "trust": "any",
        "discovery": {"torch_ps_ranks": [0]},
    }
    assert agent_settings_toml([], ["pack"]) == ""


@pytest.mark.parametrize(
    ("settings", "policies", "message"),
    [
        (["dscp.enabled"], ["pack"], "expected KEY=VALUE"),
        (["=false"], ["pack"], "expected KEY=VALUE"),
        (["dscp.enabled=fals"], ["pack"], "is not TOML"),
        (["telemetry.sample_interval=50ms"], ["pack"], "quote strings"),
        (["dscp.nope=1"], [], "unknown [dscp] keys: nope"),  # checked without agents too
        (["dscp.enabled=false", "dscp.enabled=true"], ["pack"], "Cannot overwrite"),
        (['starvation_window="5s"'], ["pack"], "set by --starvation-window"),
        (["discovery.torch_ps_ranks=[1]"], ["pack"], "set by the bench (per scenario)"),
        (['controller.address="x:1"'], ["pack"], "set by the bench (per policy)"),
        (['policy="static"'], ["pack"], "set by --policies"),
        (['telemetry.sample_interval="1ns"'], ["pack"], "between 5ms and 10s"),
        # Off is an agent setting, but pack's agents refuse to start without telemetry.
        (["telemetry.enabled=false"], ["static", "pack"], "under pack: policy pack orders"),
    ],
)
def test_a_setting_the_agents_would_refuse_or_the_bench_sets_itself_is_refused(
    settings: list[str], policies: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        agent_settings_toml(settings, policies)
    assert message in str(refused.value)


def test_off_switches_for_agents_that_do_without_are_accepted() -> None:
    assert agent_settings_toml(["telemetry.enabled=false"], ["static", "rotate"])


def test_each_bench_policy_names_the_agents_policy_or_none_where_no_agent_runs() -> None:
    none = [Policy.FIFO, Policy.ALONE, Policy.FAIR, Policy.TL_RR_ORIGINAL, Policy.ORDERS]
    assert all(agent_policy(policy) is None for policy in none)
    assert all(agent_policy(order) is None for order in StaticOrder.every(3))
    assert agent_policy(Policy.STATIC) == "static" and agent_policy(Policy.ROTATE) == "rotate"
    assert agent_policy(Policy.PACK) == agent_policy(Policy.PACK_ITERATIONS) == "pack"
    assert agent_policy(Policy.CONTROLLER_PACK) == "pack"
    assert agent_policy(Policy.CONTROLLER_ROTATE) == "rotate"
    assert agent_policy(Policy.CONTROLLER_PACK_ITERATIONS) == "pack"
    assert all(agent_policy(fault) == "pack" for fault in FAULTS)
