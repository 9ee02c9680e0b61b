"""Edges the hardening review asked to decide (issue 19, item 13), each decided and held:
relative paths, operator rule roles, metrics beyond this host, reports whose jobs share a port,
rotation times before the epoch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tensorlights.agent.config import build_config as build_agent_config
from tensorlights.controller.config import build_config as build_controller_config
from tensorlights.daemon.http import exposure_warning
from tensorlights.errors import ConfigError
from tensorlights.rpc import convert
from tensorlights.rpc.convert import InvalidMessage
from tensorlights.rpc.v1 import agent_link_pb2 as pb


@pytest.mark.parametrize("key", ["status_socket", "state_dir"])
def test_agent_paths_must_be_absolute(key: str) -> None:
    with pytest.raises(ConfigError, match=f"{key} must be an absolute path"):
        build_agent_config({"interface": "eth0", key: "run/agent.sock"}, {})


def test_controller_paths_must_be_absolute(tmp_path: Path) -> None:
    for name in ("ca", "cert", "key"):
        (tmp_path / name).write_text("x")
    tls = {name: str(tmp_path / name) for name in ("ca", "cert", "key")}
    with pytest.raises(ConfigError, match=r"sources\.static\.file must be an absolute path"):
        build_controller_config({"tls": tls, "sources": {"static": {"file": "jobs.toml"}}}, {})
    config = build_controller_config({"tls": tls, "socket": ""}, {})
    assert config.socket is None  # "" still turns the local socket off


def test_an_operator_rule_names_a_known_role() -> None:
    rule = {"name": "r", "role": "boss", "job": "j", "exe": "x"}
    with pytest.raises(ConfigError, match="rule r: role must be one of ps, worker"):
        build_agent_config({"interface": "eth0", "discovery": {"rule": [rule]}}, {})
    rule["role"] = "ps"
    build_agent_config({"interface": "eth0", "discovery": {"rule": [rule]}}, {})


@pytest.mark.parametrize(
    ("address", "warned"),
    [
        (("127.0.0.1", 9731), False),
        (("::1", 9731), False),
        (("localhost", 9731), False),
        (("0.0.0.0", 9731), True),
        (("10.1.2.3", 9731), True),
        (("metrics.example.org", 9731), True),
    ],
)
def test_metrics_beyond_this_host_are_warned_about(address: tuple[str, int], warned: bool) -> None:
    warning = exposure_warning(address)
    assert (warning is not None) == warned
    if warning:
        assert "job names" in warning


def _report(*jobs: pb.PsJob, rotations: tuple[pb.Rotation, ...] = ()) -> bytes:
    message = pb.AgentReport(session="s", seq=1, mode="local", jobs=jobs, rotations=rotations)
    return message.SerializeToString()


def test_two_jobs_claiming_one_port_are_refused() -> None:
    with pytest.raises(InvalidMessage, match="port 5000 is claimed by jobs a and b"):
        convert.report(_report(pb.PsJob(job="a", ports=[5000]), pb.PsJob(job="b", ports=[5000])))
    convert.report(_report(pb.PsJob(job="a", ports=[5000]), pb.PsJob(job="b", ports=[5001])))


def test_rotation_times_before_the_epoch_are_refused_and_ended_jobs_accepted() -> None:
    before = pb.Rotation(green="a", applied_unix_ns=-5, plan_generation=1)
    with pytest.raises(InvalidMessage, match="applied_unix_ns <= 0"):
        convert.report(_report(rotations=(before,)))
    ended = pb.Rotation(green="gone", applied_unix_ns=1_700_000_000 * 10**9)
    report = convert.report(_report(pb.PsJob(job="a", ports=[1]), rotations=(ended,)))
    assert report.rotations[0].green == "gone"  # it may have ended right after its turn
