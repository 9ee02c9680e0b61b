"""`tensorlights-controller`: the cluster controller's command line.

The controller (job membership from Slurm/static files, coordinated rotation, the gRPC API)
is being built; this entry point exists so packaging and unit files are stable."""

from __future__ import annotations

import click

from tensorlights import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tensorlights-controller")
def main() -> None:
    """TensorLights controller: learns job membership and keeps multi-host jobs green on all
    their PS hosts at once. Not yet part of this release: agents run standalone."""
