"""`tensorlights-agent`: the per-host agent's command line."""

from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from tensorlights import __version__
from tensorlights.cli.common import echo_json, reports_errors
from tensorlights.datapath import BACKENDS, open_datapath
from tensorlights.datapath.tc_messages import format_handle, handle
from tensorlights.policy.tc_plan import FIRST_BAND_MINOR, UNMANAGED_MINOR

DEFAULT_STATE_DIR = Path("/var/lib/tensorlights")

interface_option = click.option(
    "--interface", "interface", required=True, metavar="DEV", help="Network interface, e.g. eth0."
)
netns_option = click.option(
    "--netns",
    default=None,
    metavar="NAME",
    help="Work on an interface in this network namespace (testbeds); default: our own.",
)
state_dir_option = click.option(
    "--state-dir",
    type=click.Path(path_type=Path),
    default=DEFAULT_STATE_DIR,
    show_default=True,
    help="Where the root qdisc we replaced is recorded, so cleanup can restore it.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tensorlights-agent")
def main() -> None:
    """TensorLights per-host agent.

    Gives one parameter-server job at a time the green light (top egress priority) on this
    host's NIC with an HTB qdisc of its own (handle 7a1:), and rotates it so nobody starves.

    \b
    Examples:
      tensorlights-agent show --interface eth0          what is programmed now
      tensorlights-agent cleanup --interface eth0       remove it, restore the old qdisc
      tensorlights-agent discover                       the PS processes found here
    """


@main.command()
@interface_option
@netns_option
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def show(interface: str, netns: str | None, as_json: bool) -> None:
    """Show TensorLights' qdisc on DEV: which job table sits in which band."""
    datapath = open_datapath("htb", DEFAULT_STATE_DIR, netns=netns)
    link = datapath.link(interface)
    actual = datapath.read_actual(link.ifindex)
    ours = actual.root_kind == "htb" and actual.root_handle == handle(datapath.major, 0)
    tables = {
        f"{htid:x}:": (t.target_minor - FIRST_BAND_MINOR if t.target_minor is not None else None)
        for htid, t in sorted(actual.tables.items())
    }
    ports: dict[str, list[int]] = {}
    for port_link in actual.links:
        if port_link.htid is not None and port_link.port is not None:
            ports.setdefault(f"{port_link.htid:x}:", []).append(port_link.port)
    data = {
        "interface": interface,
        "root_qdisc": {"kind": actual.root_kind, "handle": format_handle(actual.root_handle)},
        "managed": ours,
        "job_tables": [
            {"table": table, "band": band, "ports": sorted(set(ports.get(table, [])))}
            for table, band in tables.items()
        ],
        "unmanaged_class": f"{datapath.major:x}:{UNMANAGED_MINOR:x}" if ours else None,
    }
    if as_json:
        echo_json(data)
        return
    console = Console()
    if not ours:
        console.print(
            f"{interface}: not managed by TensorLights (root qdisc "
            f"{actual.root_kind} {format_handle(actual.root_handle)})"
        )
        return
    table = Table(title=f"{interface}: job tables (band 0 = green)")
    for column in ("u32 table", "band", "source ports"):
        table.add_column(column)
    for row in data["job_tables"]:  # type: ignore[attr-defined]
        table.add_row(row["table"], str(row["band"]), " ".join(map(str, row["ports"])))
    console.print(table)


@main.command()
@interface_option
@netns_option
@state_dir_option
@reports_errors
def cleanup(interface: str, netns: str | None, state_dir: Path) -> None:
    """Remove TensorLights from DEV and restore the root qdisc that was there before.

    Only our qdisc (handle 7a1:) is touched; an interface we do not manage is left as it is.
    """
    datapath = open_datapath("htb", state_dir, netns=netns)
    click.echo(datapath.cleanup(interface))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def discover(as_json: bool) -> None:
    """Find the parameter-server processes on this host, their jobs and their TCP sockets.

    A PS is recognised from what its launcher put in its environment (TF_CONFIG task type ps,
    DMLC_ROLE=server, torchrun ROLE_NAME=ps, TENSORLIGHTS_JOB/TENSORLIGHTS_ROLE) or its Slurm
    job; its children belong to it. Run as root to see every user's processes.
    """
    from tensorlights.discovery.rules import DiscoveryRules
    from tensorlights.discovery.scanner import Scanner
    from tensorlights.views import snapshot_view

    with Scanner(DiscoveryRules()) as scanner:
        view = snapshot_view(scanner.scan())
    if as_json:
        echo_json(view)
        return
    console = Console()
    table = Table(title="Parameter-server processes on this host")
    for column in ("job", "pid", "found by", "netns", "listening", "connections", "workers"):
        table.add_column(column, overflow="fold")
    for task in view["tasks"]:
        table.add_row(
            task["job"],
            str(task["pid"]),
            task["source"],
            "own" if task["in_agent_netns"] else str(task["netns"]),
            " ".join(map(str, task["listen_ports"])),
            str(len(task["connections"])) + (" (stale)" if task["stale"] else ""),
            " ".join(task["peers"]),
        )
    console.print(table)
    members = ", ".join(f"{m['job']}: {m['processes']} {m['role']}" for m in view["members"])
    console.print(f"training processes: {members or 'none'}")
    if view["contested_ports"]:
        console.print(f"ports used by several jobs (shaped as none): {view['contested_ports']}")
    for problem in view["problems"]:
        console.print(f"[yellow]warning:[/yellow] {problem}")


@main.command()
def backends() -> None:
    """List datapath backends and whether this kernel supports them."""
    from tensorlights.datapath.kernel_features import qdisc_available

    for name in BACKENDS:
        available = qdisc_available(name)
        status = {True: "supported", False: "not in this kernel", None: "unknown"}[available]
        click.echo(f"{name}: {status}")
