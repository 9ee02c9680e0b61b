"""`tlctl`: the operator's view of jobs, hosts and rotations (talks to the controller)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from tensorlights import __version__
from tensorlights.cli.common import echo_json, literal, reports_errors
from tensorlights.configfile import parse_address
from tensorlights.controller.config import DEFAULT_SOCKET
from tensorlights.tls_files import TlsFiles
from tensorlights.units import parse_duration

if TYPE_CHECKING:  # imported when connecting: grpc must load after GRPC_VERBOSITY is set
    from tensorlights.rpc.operator_client import OperatorClient

F = TypeVar("F", bound=Callable[..., Any])


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "TLCTL"}
)
@click.version_option(__version__, prog_name="tlctl")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path, readable=False),  # tlctl explains a refused socket itself
    default=DEFAULT_SOCKET,
    show_default=True,
    help="The controller's local socket (root, or its socket_group).",
)
@click.option("--controller", metavar="HOST:PORT", help="Reach the controller over mTLS instead.")
@click.option("--ca", type=click.Path(path_type=Path), help="With --controller: CA bundle.")
@click.option("--cert", type=click.Path(path_type=Path), help="With --controller: client cert.")
@click.option("--key", type=click.Path(path_type=Path), help="With --controller: its key.")
@click.option("--server-name", help="With --controller: name in the controller's certificate.")
@click.option("--timeout", default="5s", show_default=True, help="Per-request deadline.")
@click.pass_context
@reports_errors
def main(
    ctx: click.Context,
    socket_path: Path,
    controller: str | None,
    ca: Path | None,
    cert: Path | None,
    key: Path | None,
    server_name: str | None,
    timeout: str,
) -> None:
    """Show TensorLights jobs, hosts and rotations from the controller.

    \b
    tlctl jobs                 every job: where its PSes run, its share of green time
    tlctl hosts                every agent: connected, following the plan or its own policy
    tlctl rotations [HOST]     who is green now, since when, who is next and when, history
    tlctl watch                the same, live
    Every view takes --json. Options can come from the environment: TLCTL_SOCKET,
    TLCTL_CONTROLLER, TLCTL_CA, TLCTL_CERT, TLCTL_KEY.
    """
    # gRPC's C core would log its own lines about a refused handshake before ours; it reads
    # this when grpc is imported, which happens only once connect() runs.
    os.environ.setdefault("GRPC_VERBOSITY", "NONE")
    if controller is not None:
        parse_address(controller)  # HOST:PORT, or a one-line error (exit 2)
    tls = TlsFiles(ca, cert, key) if ca and cert and key else None

    def connect() -> OperatorClient:
        from tensorlights.rpc.operator_client import OperatorClient

        return OperatorClient(
            socket_path=socket_path,
            address=controller,
            tls=tls,
            server_name=server_name,
            timeout_s=parse_duration(timeout),
        )

    ctx.obj = connect


def _client(func: F) -> F:
    """Pass a connected client as the first argument; close it afterwards."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        connect = click.get_current_context().obj
        client = connect()
        try:
            return func(client, *args, **kwargs)
        finally:
            client.close()

    return wrapper  # type: ignore[return-value]


def _ago(at: float | None, now: float) -> str:
    if not at:
        return "-"
    delta = now - at
    return f"{delta:.1f}s ago" if delta >= 0 else f"in {-delta:.1f}s"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f}ms"


JobCell = Callable[[dict[str, Any]], "str | Text"]

JOB_COLUMNS: tuple[tuple[str, JobCell, bool], ...] = (
    ("JOB", lambda job: literal(job["job"]), False),
    ("KIND", lambda job: literal(job.get("kind") or "-"), True),
    ("NAME", lambda job: literal(job["name"] or "-"), True),
    ("SOURCES", lambda job: literal(",".join(job["sources"])), True),
    ("HOSTS", lambda job: literal(",".join(job["ps_hosts"]) or "-"), False),
    ("GREEN", lambda job: f"{job['green_share']:.0%}" if job["ps_hosts"] else "-", False),
    ("DEMAND", lambda job: "-" if job["demand"] is None else f"{job['demand']:.2f}", False),
    (
        "LEFT",
        lambda job: "-" if job["remaining_s"] is None else f"{job['remaining_s']:.1f}s",
        False,
    ),
    ("SPREAD", lambda job: _seconds(job["spread_s"]), False),
    ("PERIOD", lambda job: _seconds(job["period_s"]), False),
    ("STATE", lambda job: literal(job["state"]), False),
)
"""(header, cell, --wide only). Without the wide ones a row fits 80 columns; names that
identify (job, hosts) fold onto more lines rather than lose their end."""
IDENTIFYING = {"JOB", "NAME", "HOSTS"}


def _table(title: str) -> Table:
    # Columns two spaces apart, no frame: kubectl's look, and rows that fit a terminal.
    return Table(
        title=title,
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
        padding=(0, 1, 0, 0),
    )


def jobs_table(jobs: list[dict[str, Any]], wide: bool = False) -> Table:
    table = _table("jobs")
    columns = [(header, cell) for header, cell, wide_only in JOB_COLUMNS if wide or not wide_only]
    for header, _ in columns:
        if header in IDENTIFYING:
            table.add_column(header, overflow="fold")
        else:
            table.add_column(header, no_wrap=True)
    for job in jobs:
        table.add_row(*(cell(job) for _, cell in columns))
    return table


def hosts_table(hosts: list[dict[str, Any]], now: float) -> Table:
    table = _table("hosts")
    for column in ("HOST", "AGENT", "MODE", "JOBS", "LAST REPORT", "PLAN", "HEALTH"):
        table.add_column(column)
    for host in hosts:
        table.add_row(
            literal(host["host"]),
            "connected" if host["connected"] else Text("disconnected", style="red"),
            literal(host["mode"]),
            str(len(host["jobs"])),
            _ago(host["last_report_at"], now),
            str(host["plan_generation"]),
            literal(host["health"] or "ok"),
        )
    return table


def rotations_table(rotations: dict[str, Any], history: int) -> Table:
    now = rotations["at"] or time.time()
    table = _table("rotations")
    for column in ("HOST", "GREEN", "SINCE", "NEXT", "AT", "RECENT (applied)"):
        table.add_column(column)
    for host in rotations["hosts"]:
        recent = [f"{r['green']} {_ago(r['applied_at'], now)}" for r in host["recent"][-history:]]
        table.add_row(
            literal(host["host"]),
            literal(host["green"] or "-"),
            _ago(host["green_since"], now),
            literal(host["next"] or "-"),
            _ago(host["next_at"], now),
            Text("\n").join(literal(line) for line in reversed(recent)) if recent else "-",
        )
    return table


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--wide", is_flag=True, help="Also each job's KIND, NAME and SOURCES.")
@reports_errors
@_client
def jobs(client: OperatorClient, as_json: bool, wide: bool) -> None:
    """Every job the controller knows: its PS hosts and share of green time, and what
    orders it: DEMAND, the share of a link's time it takes summed over its hosts (the least
    goes first), and LEFT, its remaining standalone time where it declared its iterations
    (TENSORLIGHTS_ITERATIONS; among equal demands the least goes first). SPREAD and PERIOD:
    its workers' straggler spread and iteration period as its hosts measure them. --wide
    adds KIND (ps, collective), NAME (the resource manager's) and SOURCES (who told the
    controller of it)."""
    found = client.jobs()
    if as_json:
        echo_json(found)
    else:
        Console().print(jobs_table(found, wide))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
@_client
def hosts(client: OperatorClient, as_json: bool) -> None:
    """Every host whose agent registered: connected or not, following the plan or not."""
    found = client.hosts()
    if as_json:
        echo_json(found)
    else:
        Console().print(hosts_table(found, time.time()))


@main.command()
@click.argument("host", required=False, default="")
@click.option("--upcoming", default=3, show_default=True, help="Next changes to list (JSON).")
@click.option("--history", default=3, show_default=True, help="Recent changes to show.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
@_client
def rotations(
    client: OperatorClient, host: str, upcoming: int, history: int, as_json: bool
) -> None:
    """Per host: who is green now and since when, who is next and when, what was applied."""
    found = client.rotations(host, upcoming)
    if as_json:
        echo_json(found)
    else:
        Console().print(rotations_table(found, history))


@main.command()
@click.option("--interval", default="1s", show_default=True, help="Refresh period.")
@click.option("--count", type=int, default=0, help="Stop after this many updates (0: never).")
@click.option("--json", "as_json", is_flag=True, help="One JSON document per line per update.")
@reports_errors
@_client
def watch(client: OperatorClient, interval: str, count: int, as_json: bool) -> None:
    """Jobs, hosts and rotations, refreshed live (Ctrl-C to stop)."""
    views = _limited(client.watch(parse_duration(interval)), count)
    with contextlib.suppress(KeyboardInterrupt):
        if as_json:
            for view in views:
                click.echo(json.dumps(view, sort_keys=True), nl=True)
            return
        console = Console()
        with Live(console=console, auto_refresh=False) as live:
            for view in views:
                now = view["at"] or time.time()
                live.update(
                    Group(
                        jobs_table(view["jobs"]),
                        hosts_table(view["hosts"], now),
                        rotations_table({"at": now, "hosts": view["rotations"]}, 3),
                    ),
                    refresh=True,
                )


def _limited(views: Iterator[dict[str, Any]], count: int) -> Iterator[dict[str, Any]]:
    for index, view in enumerate(views):
        yield view
        if count and index + 1 >= count:
            return


if __name__ == "__main__":
    main()
