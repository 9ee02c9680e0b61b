"""`tensorlights-controller`: the cluster controller's command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from prometheus_client import CollectorRegistry

from tensorlights import __version__
from tensorlights.cli.common import (
    log_level_option,
    overrides,
    param_options,
    reports_errors,
    setup_logging,
)
from tensorlights.configfile import read_config_file
from tensorlights.controller.config import DEFAULT_CONFIG, ControllerConfig, build_config
from tensorlights.daemon.sdnotify import Notifier


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tensorlights-controller")
def main() -> None:
    """TensorLights controller: learns which jobs run where (agents, Slurm, a jobs file,
    Kubernetes) and keeps jobs whose PSes span several hosts green on all of them at once.

    \b
    Agents connect with mutual TLS (scripts/dev_ca.py makes a development CA);
    operators use `tlctl` over the local socket.
    """


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help=f"TOML config file [default: {DEFAULT_CONFIG}, used if present].",
)
@param_options(ControllerConfig)
@log_level_option
@reports_errors
def run(config_path: Path | None, log_level: str, **flags: Any) -> None:
    """Run the controller (systemd runs this). Every flag overrides the config file's value.

    \b
    Exit status: 0 after SIGTERM; 2 for a bad configuration; 1 for another error.
    """
    setup_logging(log_level)
    values = read_config_file(config_path or DEFAULT_CONFIG, required=config_path is not None)
    config = build_config(values, overrides(flags))
    from tensorlights.controller_app import ControllerApp

    sys.exit(ControllerApp(config, CollectorRegistry(), Notifier.from_environment()).run())


if __name__ == "__main__":
    main()
