"""Each configuration parameter declared once, on its dataclass field: the field holds the
type and the default; `param(...)` adds the file key, how a file or flag value is read, the
range, the help and the command-line flag. From that one declaration come the keys a file may
have, the reading of a file merged with flags, the range checks, the click options, and the
check of the commented example files (tests/unit/test_config_examples.py).

Time-free and I/O-free: reading the file is configfile.read_config_file's job.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from tensorlights.configfile import E, address, duration, enum_reader, path, text
from tensorlights.configfile import flag as read_flag
from tensorlights.errors import ConfigError

Reader = Callable[[Any, str], Any]
"""(raw value from the file or a flag, its key) -> the field's value, or ConfigError."""


@dataclass(frozen=True)
class Param:
    keys: tuple[str, ...]
    """File keys, dotted for tables ("telemetry.sample_interval"). Several keys: the reader
    gets a dict of those present, by their last part (a TLS triple)."""
    read: Reader
    help: str
    check: Callable[[Any], bool] | None = None
    """The range, on the field's value; `rule` says it in the error message."""
    rule: str = ""
    flag: str | None = None
    """Command-line flag of `run` (its value is read like the file's)."""
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    show: Callable[[Any], str] = str
    """The default written as the file writes it (help texts)."""
    default_text: str | None = None
    """Says the default where `show` cannot (a default looked up at start)."""
    table: bool = False
    """The key names a whole table read by `read` (which checks its keys)."""
    key_flags: tuple[str, ...] = ()
    """With several keys: a flag for each (a TLS triple's --tls-ca, --tls-cert, --tls-key)."""

    @property
    def key(self) -> str:
        return self.keys[0]


def param(
    key: str | tuple[str, ...],
    read: Reader,
    help: str,
    default: Any = dataclasses.MISSING,
    default_factory: Any = dataclasses.MISSING,
    **options: Any,
) -> Any:
    """A dataclass field declared as a configuration parameter."""
    keys = (key,) if isinstance(key, str) else key
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata={"param": Param(keys, read, help, **options)},
    )


def duration_param(
    key: str,
    help: str,
    default: float,
    flag: str | None = None,
    *,
    low: float,
    high: float,
    rule: str | None = None,
) -> Any:
    """A duration ("3s", "500ms", or seconds as a number) in [low, high]: no busy loop from
    "1ns", no timer that never fires from 1e308 s."""
    return param(
        key,
        duration,
        help,
        default=default,
        check=lambda value: low <= value <= high,
        rule=rule or f"must be between {show_duration(low)} and {show_duration(high)}",
        flag=flag,
        metavar="DURATION" if flag else None,
        show=show_duration,
    )


def address_param(key: str, help: str, default: tuple[str, int], flag: str | None = None) -> Any:
    """HOST:PORT."""
    return param(
        key,
        address,
        help,
        default=default,
        flag=flag,
        metavar="HOST:PORT" if flag else None,
        show=show_address,
    )


def path_param(
    key: str, help: str, default: Any, flag: str | None = None, read: Reader = path
) -> Any:
    """A file or directory (default None: not set), absolute: a relative path would depend on
    the working directory the daemon happens to have (/ under systemd)."""
    return param(
        key,
        read,
        help,
        default=default,
        flag=flag,
        metavar="PATH" if flag else None,
        check=lambda value: value.is_absolute(),
        rule="must be an absolute path",
    )


def choice_param(key: str, kind: type[E], help: str, default: E, flag: str | None = None) -> Any:
    """One of an enum's values (the file and the flag take the value)."""
    return param(
        key,
        enum_reader(kind),
        help,
        default=default,
        flag=flag,
        choices=tuple(member.value for member in kind),
    )


def flag_param(key: str, help: str, default: bool, flag: str | None = None, **extra: Any) -> Any:
    """true or false; the flag comes as --name/--no-name."""
    return param(key, read_flag, help, default=default, flag=flag, **extra)


def text_param(key: str, help: str, default: str | None, **extra: Any) -> Any:
    return param(key, text, help, default=default, **extra)


def params(cls: type) -> Iterator[tuple[dataclasses.Field[Any], Param]]:
    for item in dataclasses.fields(cls):
        declared = item.metadata.get("param")
        if declared is not None:
            yield item, declared


def default_of(item: dataclasses.Field[Any]) -> Any:
    if item.default is not dataclasses.MISSING:
        return item.default
    if item.default_factory is not dataclasses.MISSING:
        return item.default_factory()
    return dataclasses.MISSING


def allowed_keys(cls: type, extra: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Table ("" = top level) -> the keys it may hold."""
    tables: dict[str, set[str]] = {"": set()}
    for _, declared in params(cls):
        for key in declared.keys:
            _add_key(tables, key, declared.table)
    for key in extra:
        _add_key(tables, key, False)
    return tables


def _add_key(tables: dict[str, set[str]], key: str, is_table: bool) -> None:
    parts = key.split(".")
    for depth in range(len(parts)):
        table = ".".join(parts[:depth])
        tables.setdefault(table, set()).add(parts[depth])
        if depth < len(parts) - 1:
            tables.setdefault(".".join(parts[: depth + 1]), set())
    if is_table:
        tables.pop(key, None)  # its reader checks its own keys


def merge(file_values: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The file's values with the given flags (dotted keys; None = not given) on top."""
    merged = _copy(file_values)
    for key, value in overrides.items():
        if value is None:
            continue
        *tables, leaf = key.split(".")
        where = merged
        for name in tables:
            inner = where.get(name)
            where[name] = inner = dict(inner) if isinstance(inner, dict) else {}
            where = inner
        where[leaf] = value
    return merged


def _copy(table: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in table.items()}


def check_keys(values: Mapping[str, Any], tables: dict[str, set[str]], where: str = "") -> None:
    """Unknown keys and non-tables refused, naming them (a typo must not fall back silently)."""
    allowed = tables.get(where, set())
    unknown = set(values) - allowed
    if unknown:
        if where:
            raise ConfigError(f"unknown [{where}] keys: {', '.join(sorted(unknown))}")
        raise ConfigError(f"unknown config keys: {', '.join(sorted(unknown))}")
    for key, value in values.items():
        inner = f"{where}.{key}" if where else key
        if inner in tables:
            if not isinstance(value, dict):
                raise ConfigError(f"[{inner}] must be a table")
            check_keys(value, tables, inner)


def lookup(values: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted key, or MISSING."""
    where: Any = values
    for part in key.split("."):
        if not isinstance(where, Mapping) or part not in where:
            return dataclasses.MISSING
        where = where[part]
    return where


def read_fields(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Field name -> value for every parameter the values give (others keep the default)."""
    read: dict[str, Any] = {}
    for item, declared in params(cls):
        if len(declared.keys) == 1:
            raw = lookup(values, declared.key)
            if raw is not dataclasses.MISSING:
                read[item.name] = declared.read(raw, declared.key)
            continue
        found = {
            key.rsplit(".", 1)[-1]: raw
            for key in declared.keys
            if (raw := lookup(values, key)) is not dataclasses.MISSING
        }
        if found:
            read[item.name] = declared.read(found, declared.key.rsplit(".", 1)[0])
    return read


C = TypeVar("C")


def build(
    cls: type[C],
    file_values: Mapping[str, Any],
    overrides: Mapping[str, Any],
    rules: Callable[[dict[str, Any]], None] = lambda fields: None,
) -> C:
    """A config of `cls`: the file's values with the given flags on top (by file key; None =
    not given), unknown keys refused, each value read by its declaration, then `rules` (what
    follows from what was given), then the class's own checks. Absent keys keep defaults."""
    values = merge(file_values, overrides)
    check_keys(values, allowed_keys(cls))
    fields = read_fields(cls, values)
    rules(fields)
    try:
        return cls(**fields)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def check_ranges(instance: object) -> None:
    """Every parameter's range, on a built config (however it was built)."""
    for item, declared in params(type(instance)):
        value = getattr(instance, item.name)
        if declared.check is not None and value is not None and not declared.check(value):
            raise ConfigError(f"{declared.key} {declared.rule}")


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def help_text(item: dataclasses.Field[Any], declared: Param) -> str:
    """The flag's help: the parameter's, with its default as the file writes it."""
    default = declared.default_text
    if default is None:
        value = default_of(item)
        default = "none" if value is None or value is dataclasses.MISSING else declared.show(value)
    return f"{declared.help} [default: {default}]"


def show_duration(seconds: float) -> str:
    """3.0 -> "3s", 0.25 -> "250ms", 3600 -> "1h" (as the example files write durations)."""
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    for unit, size in (("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def show_address(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"
