"""Reading TOML config files: typed values with messages that name the key (shared by the
agent's and the controller's configuration)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from tensorlights.errors import ConfigError
from tensorlights.tls_files import TlsFiles
from tensorlights.units import parse_duration

E = TypeVar("E", bound=StrEnum)


def read_config_file(path: Path, required: bool) -> dict[str, Any]:
    """The file's table; {} when it is absent and was not asked for explicitly."""
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError:
        if required:
            raise ConfigError(f"config file {path} does not exist") from None
        return {}
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path}: {exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text: {exc.reason}") from exc
    except RecursionError:
        raise ConfigError(f"config file {path} nests too deeply") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror}") from exc


def parse_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {text!r} must be HOST:PORT")
    return host.strip("[]") or "127.0.0.1", int(port)


def split_addresses(text: str) -> list[str]:
    """HOST:PORT,HOST:PORT,... (a service's replicas) as a list, blanks dropped."""
    return [item.strip() for item in text.split(",") if item.strip()]


def text(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value


def flag(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    return value


def number(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key} must be a number, got {value!r}")
    return float(value)


def integer(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key} must be an integer")
    return value


def duration(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ConfigError(f"{key} must be a duration such as 3s or 500ms, got {value!r}")
    return parse_duration(value) if isinstance(value, str) else float(value)


def choice(kind: type[E], value: Any, key: str) -> E:
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ConfigError(f"{key} must be one of {allowed}, got {value!r}") from None


def address(value: Any, key: str) -> tuple[str, int]:
    return parse_address(text(value, key))


def path(value: Any, key: str) -> Path:
    return Path(text(value, key))


def enum_reader(kind: type[E]) -> Callable[[Any, str], E]:
    return lambda value, key: choice(kind, value, key)


def tls_files(found: Mapping[str, Any], table: str) -> TlsFiles:
    """A [table]'s ca, cert and key: all three or none (the daemons speak mutual TLS only)."""
    missing = {"ca", "cert", "key"} - set(found)
    if missing:
        raise ConfigError(
            f"[{table}] needs all of ca, cert and key (missing {', '.join(sorted(missing))}): "
            "agents and the controller always use mutual TLS (scripts/dev_ca.py makes a "
            "development CA)"
        )
    return TlsFiles(*(path(found[key], f"{table}.{key}") for key in ("ca", "cert", "key")))


def section(table: Any, name: str, keys: set[str]) -> dict[str, Any]:
    """A [name] table of the file, with only the keys it may have."""
    if not isinstance(table, dict):
        raise ConfigError(f"[{name}] must be a table")
    unknown = set(table) - keys
    if unknown:
        raise ConfigError(f"unknown [{name}] keys: {', '.join(sorted(unknown))}")
    return table
