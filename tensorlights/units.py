"""Parsing of human-written rates, sizes and durations (pure)."""

from __future__ import annotations

import math
import re

from tensorlights.errors import ConfigError

_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,  # tc's convention: bps = bytes per second
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}
_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_rate(text: str) -> int:
    """'200mbit' -> 200_000_000 (bits per second). Units as tc(8): bit, kbit, mbit,
    gbit, tbit, and bps/kbps/mbps/gbps meaning *bytes* per second."""
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ConfigError(f"rate {text!r} is not a number with a unit such as 200mbit or 10gbit")
    number, unit = float(match.group(1)), match.group(2).lower() or "bit"
    if unit not in _RATE_UNITS:
        raise ConfigError(f"rate {text!r}: unknown unit {unit!r}; use one of {sorted(_RATE_UNITS)}")
    bits = round(number * _RATE_UNITS[unit])
    if bits <= 0:
        raise ConfigError(f"rate {text!r} must be positive")
    return bits


def parse_duration(text: str) -> float:
    """'500ms' -> 0.5, '3s' -> 3.0, '2m' -> 120.0 (seconds). A bare number means seconds."""
    match = _NUMBER_UNIT.match(text)
    if not match:
        raise ConfigError(f"duration {text!r} is not a number with a unit such as 500ms or 3s")
    number, unit = float(match.group(1)), match.group(2).lower() or "s"
    if unit not in _DURATION_UNITS:
        raise ConfigError(
            f"duration {text!r}: unknown unit {unit!r}; use one of {sorted(_DURATION_UNITS)}"
        )
    seconds = number * _DURATION_UNITS[unit]
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"duration {text!r} must be positive")
    return seconds


def format_rate(bits_per_second: float) -> str:
    """200_000_000 -> '200mbit' (as tc prints it, for messages and views)."""
    for unit in ("tbit", "gbit", "mbit", "kbit"):
        scale = _RATE_UNITS[unit]
        if bits_per_second >= scale:
            value = bits_per_second / scale
            return f"{value:g}{unit}" if value == int(value) else f"{value:.2f}{unit}"
    return f"{bits_per_second:g}bit"
