from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tensorlights.errors import ConfigError
from tensorlights.model import DatapathSpec, JobShaping
from tensorlights.units import format_rate, parse_duration, parse_rate


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("200mbit", 200_000_000),
        ("10gbit", 10_000_000_000),
        ("1.5gbit", 1_500_000_000),
        ("800", 800),
        ("100kbit", 100_000),
        ("1mbps", 8_000_000),
        (" 300Mbit ", 300_000_000),
    ],
)
def test_parse_rate(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["", "fast", "10 parsecs", "-5mbit", "0mbit", "1e9bit"])
def test_parse_rate_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_rate(text)


@pytest.mark.parametrize(
    ("text", "seconds"), [("3s", 3.0), ("500ms", 0.5), ("2m", 120.0), ("1h", 3600.0), ("7", 7.0)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert math.isclose(parse_duration(text), seconds)


@pytest.mark.parametrize("text", ["", "0s", "soon", "3 fortnights"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ConfigError):
        parse_duration(text)


@given(st.integers(1, 10**13))
def test_format_rate_round_trips_to_within_a_percent(bits: int) -> None:
    assert abs(parse_rate(format_rate(bits)) - bits) <= bits * 0.01


def test_spec_rejects_port_in_two_jobs() -> None:
    with pytest.raises(ConfigError, match="port 5001"):
        DatapathSpec(
            "eth0",
            10**9,
            (JobShaping("a", 0, frozenset({5001})), JobShaping("b", 1, frozenset({5001}))),
        )


@pytest.mark.parametrize(
    "make",
    [
        lambda: JobShaping("a", 8, frozenset()),
        lambda: JobShaping("a", -1, frozenset()),
        lambda: JobShaping("a", 0, frozenset({0})),
        lambda: JobShaping("a", 0, frozenset({70000})),
        lambda: JobShaping("", 0, frozenset()),
        lambda: DatapathSpec("eth0", 0),
        lambda: DatapathSpec("", 10**9),
        lambda: DatapathSpec("a-very-long-interface-name", 10**9),
        lambda: DatapathSpec("eth0", 10**9, unmanaged_share=0.0),
        lambda: DatapathSpec("eth0", 10**9, unmanaged_share=float("nan")),
        lambda: DatapathSpec("eth0", 10**9, (JobShaping("a", 0, frozenset()),) * 2),
    ],
)
def test_invalid_specs_are_config_errors(make: object) -> None:
    with pytest.raises(ConfigError):
        make()  # type: ignore[operator]
