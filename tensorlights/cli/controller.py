"""`tensorlights-controller`: the cluster controller's command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from prometheus_client import CollectorRegistry

from tensorlights import __version__
from tensorlights.cli.common import log_level_option, reports_errors, setup_logging
from tensorlights.configfile import read_config_file
from tensorlights.controller.config import (
    DEFAULT_CONFIG,
    DEFAULT_LISTEN,
    DEFAULT_METRICS,
    DEFAULT_SOCKET,
    POLICIES,
    build_config,
)
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
@click.option(
    "--listen", metavar="HOST:PORT", help=f"Agents' mTLS port [default: {DEFAULT_LISTEN}]."
)
@click.option("--socket", metavar="PATH", help=f"tlctl's Unix socket [default: {DEFAULT_SOCKET}].")
@click.option("--metrics-address", metavar="HOST:PORT", help=f"[default: {DEFAULT_METRICS}]")
@click.option(
    "--policy",
    type=click.Choice(POLICIES),
    help="rotate: a coordinated cycle of green slots; pack: one cluster-wide order by the "
    "demand agents measure [default: pack].",
)
@click.option("--slot", metavar="DURATION", help="Rotation slot length [default: 3s].")
@click.option("--lease", metavar="DURATION", help="How long a plan holds unrenewed [default: 15s].")
@click.option("--state-dir", metavar="DIR", help="Where the incarnation number is kept.")
@click.option("--tls-ca", type=click.Path(path_type=Path), help="CA that signs agent certs.")
@click.option("--tls-cert", type=click.Path(path_type=Path), help="The controller's certificate.")
@click.option("--tls-key", type=click.Path(path_type=Path), help="Its private key.")
@click.option("--jobs-file", type=click.Path(path_type=Path), help="Static jobs file (TOML).")
@click.option("--slurm", is_flag=True, default=None, help="Poll Slurm (squeue --json).")
@click.option("--kubernetes-url", metavar="URL", help="Kubernetes API server to poll.")
@log_level_option
@reports_errors
def run(config_path: Path | None, log_level: str, **flags: Any) -> None:
    """Run the controller (systemd runs this).

    \b
    Exit status: 0 after SIGTERM; 2 for a bad configuration; 1 for another error.
    """
    setup_logging(log_level)
    values = read_config_file(config_path or DEFAULT_CONFIG, required=config_path is not None)
    tls = dict(values.get("tls", {}))
    for flag, key in (("tls_ca", "ca"), ("tls_cert", "cert"), ("tls_key", "key")):
        if flags[flag] is not None:
            tls[key] = str(flags[flag])
    sources = {key: dict(table) for key, table in values.get("sources", {}).items()}
    if flags["jobs_file"] is not None:
        sources.setdefault("static", {})["file"] = str(flags["jobs_file"])
    if flags["slurm"]:
        sources.setdefault("slurm", {})["enabled"] = True
    if flags["kubernetes_url"] is not None:
        sources.setdefault("kubernetes", {})["url"] = flags["kubernetes_url"]
    file_values = {**values}
    if tls:
        file_values["tls"] = tls
    if sources:
        file_values["sources"] = sources
    overrides = {
        key: flags[key]
        for key in ("listen", "socket", "metrics_address", "policy", "slot", "lease", "state_dir")
    }
    config = build_config(file_values, overrides)
    from tensorlights.controller_app import ControllerApp

    sys.exit(ControllerApp(config, CollectorRegistry(), Notifier.from_environment()).run())


if __name__ == "__main__":
    main()
