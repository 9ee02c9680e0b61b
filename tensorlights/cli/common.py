"""Shared bits of the command-line tools: error reporting and JSON output."""

from __future__ import annotations

import functools
import json
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
from rich.text import Text

from tensorlights.configspec import help_text, params
from tensorlights.errors import ConfigError, TensorLightsError
from tensorlights.model import visible

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(func: F) -> F:
    """Turn our typed errors into one clear line on stderr (no traceback) and an exit code:
    2 for a bad configuration or value (nothing was done), 1 for any other error."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except ConfigError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except TensorLightsError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(1)
        except PermissionError as exc:
            click.echo(f"error: {exc}. Run as root (or with CAP_NET_ADMIN).", err=True)
            sys.exit(1)

    return wrapper  # type: ignore[return-value]


def literal(value: object) -> Text:
    """A data cell as it is: never read as Rich markup (a job may be named "[/bold]"), and
    with terminal escapes shown as \\x1b instead of sent to the operator's terminal. Every
    value that comes from a process, an agent or a resource manager goes through this."""
    return Text(visible(str(value)))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True))


log_level_option = click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
)


def setup_logging(level: str) -> None:
    """One line per message on stderr (journald adds the time)."""
    logging.basicConfig(
        level=level.upper(), format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def param_options(config_class: type) -> Callable[[F], F]:
    """A click option for every parameter of `config_class` that declares a flag (its help,
    choices and default from the declaration). They arrive as keyword arguments named by the
    file key ("." as "__"); `overrides` turns them back into file keys."""

    def decorate(func: F) -> F:
        for item, declared in reversed(list(params(config_class))):
            for key, flag in reversed(list(zip(declared.keys, declared.key_flags, strict=False))):
                func = click.option(
                    flag,
                    key.replace(".", "__"),
                    metavar="PATH",
                    default=None,
                    help=f"{declared.help} ({key} in the file)",
                )(func)
            if declared.flag is None:
                continue
            func = click.option(
                declared.flag,
                declared.key.replace(".", "__"),
                metavar=declared.metavar,
                # By value: click shows an Enum member's name, and the file takes values.
                type=click.Choice([getattr(c, "value", c) for c in declared.choices])
                if declared.choices
                else None,
                default=None,
                help=help_text(item, declared),
            )(func)
        return func

    return decorate


def overrides(flags: dict[str, Any]) -> dict[str, Any]:
    """param_options' keyword arguments by file key (None: not given)."""
    return {name.replace("__", "."): value for name, value in flags.items()}
