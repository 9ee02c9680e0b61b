"""Fuzz targets (Hypothesis, a bounded budget in CI): whatever bytes or values arrive, the wire
conversion and the config loaders either return a valid model object or raise their one typed
refusal (InvalidMessage, ConfigError) -- never another exception, never a half-valid object.

A longer run: TENSORLIGHTS_FUZZ=long .venv/bin/pytest tests/unit/test_fuzz.py
"""

from __future__ import annotations

import contextlib
import math
import os
import tomllib
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorlights.agent.config import build_config as build_agent_config
from tensorlights.configfile import read_config_file
from tensorlights.controller.config import build_config as build_controller_config
from tensorlights.errors import ConfigError
from tensorlights.model import MAX_PORT, job_id_problem
from tensorlights.rpc import convert
from tensorlights.rpc.convert import InvalidMessage
from tensorlights.rpc.v1 import agent_link_pb2 as pb

# Per test, not a global profile: the other property tests keep their own budgets.
fuzz = settings(
    max_examples=20_000 if os.environ.get("TENSORLIGHTS_FUZZ") == "long" else 300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

texts = st.text(max_size=40)
numbers = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**70), 2**70)
ports = st.integers(-5, 70_000)


@st.composite
def reports(draw: st.DrawFn) -> bytes:
    """Well-formed protobuf with hostile values: the field checks are what is fuzzed."""
    jobs = [
        pb.PsJob(
            job=draw(texts),
            ports=[p for p in draw(st.lists(ports, max_size=6)) if 0 <= p < 2**32],
            processes=draw(st.integers(0, 2**32 - 1)),
            connections=draw(st.integers(0, 2**32 - 1)),
        )
        for _ in range(draw(st.integers(0, 4)))
    ]
    for job in jobs:
        for name in ("spread_s", "period_s", "demand"):
            if draw(st.booleans()):
                value = draw(st.floats(allow_nan=True, allow_infinity=True))
                setattr(job, name, value)
    rotations = [
        pb.Rotation(
            green=draw(texts),
            applied_unix_ns=draw(st.integers(-(2**63), 2**63 - 1)),
            plan_generation=draw(st.integers(0, 2**64 - 1)),
        )
        for _ in range(draw(st.integers(0, 3)))
    ]
    message = pb.AgentReport(
        session=draw(texts),
        seq=draw(st.integers(0, 2**64 - 1)),
        jobs=jobs,
        rotations=rotations,
        mode=draw(st.sampled_from(["plan", "local", "", "sideways"]) | texts),
        health=draw(texts),
    )
    return message.SerializeToString()


@fuzz
@given(st.binary(max_size=300))
def test_any_bytes_are_a_report_or_invalid(data: bytes) -> None:
    def reply(data: bytes) -> object:  # what an agent makes of a report's reply
        return convert.vouchers(convert.parse(pb.ReportReply, data))

    for parse in (convert.report, convert.registration, convert.watch_plan_session, reply):
        with contextlib.suppress(InvalidMessage):
            parse(data)


@fuzz
@given(reports())
def test_hostile_reports_are_valid_once_accepted(data: bytes) -> None:
    try:
        report = convert.report(data)
    except InvalidMessage:
        return
    owners: dict[int, str] = {}
    for job in report.jobs:
        assert job_id_problem(job.job) is None
        assert all(1 <= port <= MAX_PORT for port in job.ports)
        for port in job.ports:
            assert owners.setdefault(port, job.job) == job.job  # no port in two jobs
        for value in (job.spread_s, job.period_s):
            assert value is None or (math.isfinite(value) and value >= 0)
        assert job.demand is None or 0 < job.demand <= 1
    assert all(r.applied_at > 0 for r in report.rotations)
    assert report.health.isprintable() and report.session


@fuzz
@given(
    st.builds(
        pb.RegisterRequest,
        host=texts,
        agent_incarnation=st.integers(0, 2**64 - 1),
        agent_version=texts,
        interfaces=st.lists(
            st.builds(pb.Interface, name=texts, link_rate_bps=st.integers(0, 2**64 - 1)),
            max_size=3,
        ),
        fallback_policy=st.sampled_from(["pack", "fifo", "static", "rotate", ""]) | texts,
    )
)
def test_hostile_registrations_are_valid_once_accepted(message: pb.RegisterRequest) -> None:
    try:
        registration = convert.registration(message.SerializeToString())
    except InvalidMessage:
        return
    assert registration.agent_version.isprintable()
    assert all(name.isprintable() and 0 < len(name) <= 15 for name, _ in registration.interfaces)


# Config values: any TOML-shaped value under any key the files take, or a few unknown ones.
toml_values = st.recursive(
    st.none().map(lambda _: "")
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
AGENT_KEYS = [
    "interface", "link_rate", "policy", "interval", "max_slowdown", "scan_interval",
    "metrics_address", "status_socket", "state_dir", "on_stop", "unmanaged_share",
    "standalone", "controller", "discovery", "dscp", "telemetry", "nonsense",
]  # fmt: skip
CONTROLLER_KEYS = [
    "listen", "socket", "metrics_address", "policy", "slot", "lease", "report_interval",
    "host_timeout", "sources", "tls", "nonsense",
]  # fmt: skip


@fuzz
@given(st.dictionaries(st.sampled_from(AGENT_KEYS), toml_values, max_size=6))
def test_agent_config_is_valid_or_a_config_error(values: dict[str, Any]) -> None:
    values.setdefault("interface", "eth0")
    try:
        config = build_agent_config(values, {})
    except ConfigError:
        return
    assert config.interface and config.scan_interval_s >= 0.01


@fuzz
@given(st.dictionaries(st.sampled_from(CONTROLLER_KEYS), toml_values, max_size=6))
def test_controller_config_is_valid_or_a_config_error(values: dict[str, Any]) -> None:
    try:
        config = build_controller_config(values, {})
    except ConfigError:
        return
    assert config.slot_s >= 0.1  # (never reached without readable TLS files: refused first)


@fuzz
@given(st.binary(max_size=200))
def test_any_file_content_is_a_table_or_a_config_error(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "fuzzed.toml"
    path.write_bytes(content)
    try:
        table = read_config_file(path, required=True)
    except ConfigError:
        return
    assert table == tomllib.loads(content.decode())
