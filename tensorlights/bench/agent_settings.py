"""Settings a benchmark run adds to every agent's config (`bench run --agent-setting`): an
experiment's switch -- DSCP marks off, telemetry off -- kept as a setting of the results
folder (meta.json, the report's header) instead of a patch of the tree that the figures
no longer show."""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Sequence

from tensorlights.agent.config import build_config
from tensorlights.errors import ConfigError

BENCH_SETS = {
    "starvation_window": "--starvation-window",
    "interval": "--interval",
    "trust": "the bench (one tenant: any)",
    "discovery": "the bench (per scenario)",
    "controller": "the bench (per policy)",
    "interface": "the bench",
    "link_rate": "--rate",
    "policy": "--policies",
    "standalone": "--policies",
    "status_socket": "the bench",
    "state_dir": "the bench",
}
"""Top-level keys and tables of the agent's config that the bench writes or passes itself,
and what sets each: a setting of them would clash with, or be overridden by, the bench's."""


def agent_settings_toml(settings: Sequence[str], policies: Iterable[str]) -> str:
    """`KEY=VALUE` settings (TOML keys, dotted for a table's: dscp.enabled=false; TOML
    values: "5s" quoted) as the lines to put first in an agent's config file; refused with a
    ConfigError naming the setting where one is not TOML, is not an agent setting, is one
    the bench sets itself, or makes an agent of one of `policies` (its --policy) refuse to
    start."""
    lines = []
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise ConfigError(f"agent setting {setting!r}: expected KEY=VALUE")
        line = f"{key.strip()} = {value.strip()}"
        try:
            parsed = tomllib.loads(line)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(
                f"agent setting {setting!r} is not TOML ({exc}); quote strings: "
                'telemetry.sample_interval="50ms"'
            ) from None
        owner = next((BENCH_SETS[top] for top in parsed if top in BENCH_SETS), None)
        if owner is not None:
            raise ConfigError(f"agent setting {setting!r}: set by {owner}, not here")
        lines.append(line)
    text = "".join(f"{line}\n" for line in lines)
    try:
        values = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"agent settings {list(settings)}: {exc}") from None
    for policy in sorted(set(policies)) or ["static"]:  # the keys checked even without agents
        try:
            build_config(values, {"interface": "tl-bench", "link_rate": "1gbit", "policy": policy})
        except ConfigError as exc:
            raise ConfigError(f"agent settings {list(settings)} under {policy}: {exc}") from None
    return text
