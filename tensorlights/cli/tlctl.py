"""`tlctl`: the operator's view of jobs, hosts and rotations (talks to the controller)."""

from __future__ import annotations

import click

from tensorlights import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tlctl")
def main() -> None:
    """Show TensorLights jobs, hosts and rotations. Needs the controller, which is not yet part
    of this release; on one host use `tensorlights-agent show --interface DEV`."""
