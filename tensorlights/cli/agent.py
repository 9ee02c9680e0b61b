"""`tensorlights-agent`: the per-host agent's command line."""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from prometheus_client import CollectorRegistry
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tensorlights import __version__
from tensorlights.agent.app import AgentApp
from tensorlights.agent.config import (
    DEFAULT_CONFIG,
    DEFAULT_STATE_DIR,
    DEFAULT_STATUS_SOCKET,
    AgentConfig,
    discovery_rules,
    load_config_function,
    with_link_rate,
)
from tensorlights.cli.common import (
    echo_json,
    literal,
    log_level_option,
    overrides,
    param_options,
    reports_errors,
    setup_logging,
)
from tensorlights.configfile import read_config_file
from tensorlights.daemon.sdnotify import Notifier
from tensorlights.datapath import BACKENDS, open_datapath
from tensorlights.datapath.dataplane import Dataplane, remove_everything
from tensorlights.datapath.tc_messages import format_handle, handle
from tensorlights.discovery.trust import TrustMode
from tensorlights.model import JobKind, Mode
from tensorlights.policy.tc_plan import FIRST_BAND_MINOR, UNMANAGED_MINOR

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
    host's NIC with an HTB qdisc of its own (handle 7a1:) and DSCP marks; by default the jobs
    are ordered by the link demand the agent measures, with a bound on any job's slowdown.
    With a controller (--controller HOST:PORT and [controller] TLS files in the config) it
    follows the cluster's plan instead.

    \b
    Examples:
      tensorlights-agent run --interface eth0 --link-rate 10gbit --policy pack
      tensorlights-agent status                         health, jobs, who is green and next
      tensorlights-agent plan --dry-run --interface eth0  what run would program now
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

    Only our qdisc (handle 7a1:) and our nftables table (inet tensorlights) are touched; an
    interface we do not manage is left as it is.
    """
    for done in remove_everything(open_datapath("htb", state_dir, netns=netns), interface, netns):
        click.echo(done)


def _config_options(func: Any) -> Any:
    """Flags shared by `run` and `plan`: --config, and every parameter that declares a flag
    (each overrides the config file's value)."""
    func = param_options(AgentConfig)(func)
    return click.option(
        "--config",
        "config_path",
        type=click.Path(path_type=Path),
        default=None,
        help=f"TOML config file [default: {DEFAULT_CONFIG}, used if present].",
    )(func)


def _loader(config_path: Path | None, flags: dict[str, Any]) -> Callable[[], AgentConfig]:
    path = config_path or DEFAULT_CONFIG
    return load_config_function(
        lambda: read_config_file(path, required=config_path is not None), overrides(flags)
    )


@main.command()
@_config_options
@log_level_option
@reports_errors
def run(config_path: Path | None, log_level: str, **flags: Any) -> None:
    """Run the agent: discover PS jobs, shape DEV, rotate the green light (systemd runs this).

    \b
    Exit status: 0 after SIGTERM; 2 for a bad configuration (nothing is programmed);
    1 for another error that retrying cannot fix (message on stderr).
    SIGHUP reloads the config file (kept unchanged if the new one is invalid).
    """
    setup_logging(log_level)
    app = AgentApp(_loader(config_path, flags), CollectorRegistry(), Notifier.from_environment())
    app.install_signal_handlers()
    sys.exit(app.run())


@main.command()
@_config_options
@click.option("--dry-run", is_flag=True, required=True, help="Required: plan touches nothing.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def plan(config_path: Path | None, dry_run: bool, as_json: bool, **flags: Any) -> None:
    """Show what the agent would program on DEV now, touching nothing."""
    from tensorlights.agent.reconcile import Reconciler
    from tensorlights.discovery.scanner import Scanner

    config = with_link_rate(_loader(config_path, flags)())
    dataplane = Dataplane(open_datapath("htb", config.state_dir))  # marks: not written here
    with Scanner(config.rules) as scanner:
        band_plan, spec, change = Reconciler(config, scanner, dataplane).dry_run()
    jobs = [
        {
            "job": job.job,
            "band": job.band,
            "dscp": config.dscp_bands[job.band] if config.dscp_enabled else None,
            "ports": sorted(job.ports),
        }
        for job in (spec.jobs if spec else ())
    ]
    operations = [repr(op) for op in change.ops] if change else []
    if as_json:
        echo_json(
            {
                "interface": config.interface,
                "policy": config.policy.value,
                "jobs": jobs,
                "green": band_plan.green,
                "installs_root_qdisc": change.installs_root if change else False,
                "operations": operations,
            }
        )
        return
    if spec is None:
        click.echo(f"policy {config.policy.value}: {config.interface} would not be shaped")
        return
    click.echo(f"{config.interface}: {len(jobs)} jobs, green: {band_plan.green}")
    for job in jobs:
        click.echo(f"  band {job['band']}  dscp {job['dscp']}  {job['job']}  ports {job['ports']}")
    if change is not None and change.installs_root:
        click.echo("would install the root qdisc (replacing the current one)")
    click.echo(f"{len(operations)} tc operations:")
    for op in operations:
        click.echo(f"  {op}")


_CARRIERS = {JobKind.PS.value: "PS", JobKind.COLLECTIVE.value: "ranks"}


@main.command()
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    default=DEFAULT_STATUS_SOCKET,
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def status(socket_path: Path, as_json: bool) -> None:
    """The running agent's state: health, jobs and bands, who is green and who is next."""
    from tensorlights.agent.status import AgentStatus, read_status_document

    document = read_status_document(socket_path)
    if as_json:
        echo_json(document)
        return
    console = Console()
    if document.get("state") == "starting":
        console.print("the agent is starting (no pass yet)")
        return
    status = AgentStatus.from_json(document)
    console.print(
        literal(f"{status.interface}: policy {status.policy} every {status.interval_s}s, "),
        Text("healthy") if status.healthy else Text("UNHEALTHY", style="red"),
        literal(f"({status.health})"),
    )
    shaping = status.shaping
    if status.controller is not None:
        following = (
            f"following plan generation {shaping.plan_generation}"
            if shaping is not None and shaping.mode is Mode.PLAN
            else f"own policy ({status.policy})"
        )
        link = status.controller.link
        detail = f" ({link.detail})" if link.detail else ""
        address = status.controller.address
        console.print(literal(f"controller {address}: {link.state}{detail}; {following}"))
    if shaping is not None and shaping.light.green:
        light = shaping.light
        console.print(
            literal(
                f"green: {light.green} since {_clock_text(light.green_since)}; "
                f"next: {light.next or '-'} at {_clock_text(light.next_at)}"
            )
        )
    table = Table(title="jobs (band 0 = green)")
    columns = ("band", "job", "pids", "ports", "spread p50 ms", "iteration p50 s")
    for column in columns:
        table.add_column(column, overflow="fold")
    discovery = shaping.discovery if shaping is not None else {}
    tasks = discovery.get("tasks", [])
    ports = discovery.get("job_ports", {})
    kinds = discovery.get("job_kinds", {})
    iterations = status.telemetry.iterations if status.telemetry is not None else {}
    bands = shaping.bands if shaping is not None else {}
    for job in shaping.order if shaping is not None else ():
        pids = sorted(t["pid"] for t in tasks if t["job"] == job)
        measured = iterations.get(job, ())
        spread = _median([it.spread_s * 1e3 for it in measured], "{:.0f}")
        period = _median([it.period_s for it in measured if it.period_s is not None], "{:.2f}")
        table.add_row(
            str(bands.get(job, "-")),
            literal(job),
            # The job's kind in one word: which of its processes carry its traffic.
            " ".join([_CARRIERS.get(kinds.get(job, ""), ""), *map(str, pids)]).strip(),
            " ".join(map(str, ports.get(job, []))),
            spread,
            period,
        )
    console.print(table)
    for job, reason in discovery.get("unshapeable", {}).items():
        console.print(
            Text("not shapeable on this host:", style="yellow"), literal(f"{job}: {reason}")
        )
    for voucher in discovery.get("vouchers", []):
        vouched = voucher["user"] or f"{len(voucher['pods'])} pods"
        console.print(
            literal(f"the controller vouches for {voucher['job']} ({voucher['source']}: {vouched})")
        )
    if shaping is not None and shaping.datapath:
        console.print(literal(f"datapath: {shaping.datapath}"))
    if discovery.get("processes_from"):
        console.print(literal(f"processes found from: {discovery['processes_from']}"))
    for problem in discovery.get("problems", []):
        console.print(Text("warning:", style="yellow"), literal(problem))
    if status.last_error:
        console.print(Text("last error:", style="red"), literal(status.last_error))


def _median(values: list[float], fmt: str) -> str:
    """The median, formatted; "-" before the first measured iteration."""
    return fmt.format(statistics.median(values)) if values else "-"


def _clock_text(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return time.strftime("%H:%M:%S", time.localtime(timestamp)) + f".{int(timestamp * 10) % 10}"


@main.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    default=None,
    help=f"Take the [discovery] rules from this file [default: {DEFAULT_CONFIG}, if present].",
)
@click.option(
    "--trust",
    type=click.Choice([mode.value for mode in TrustMode]),
    default=None,
    help="Whose job claims to believe [default: the config file's, else resource-manager].",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors
def discover(config_path: Path | None, trust: str | None, as_json: bool) -> None:
    """Find the training processes whose sockets are their jobs' traffic on this host -- the
    parameter servers of PS jobs and the ranks of collective (all-reduce) jobs -- and their
    TCP sockets.

    A PS is recognised from what its launcher put in its environment (TF_CONFIG task type ps,
    DMLC_ROLE=server, torchrun ROLE_NAME=ps, TENSORLIGHTS_JOB/TENSORLIGHTS_ROLE) or its Slurm
    job; a rank from torchrun's or DeepSpeed's variables (no PS configured), Horovod's or
    MPI's; their children belong to them. A job using NCCL over InfiniBand/RoCE (NCCL_IB_*,
    an open /dev/infiniband device) is listed as not shapeable: RDMA bypasses the qdisc.

    Under trust = "resource-manager" a claim counts here only in its own Slurm job's cgroup
    or from a trusted user, and others are listed as not trusted: this command has no
    controller, so pods and jobs-file entries the controller vouches for show as not trusted
    too (`tensorlights-agent status` shows what the running agent believes). Run as root to
    see every user's processes.
    """
    from tensorlights.discovery.scanner import Scanner
    from tensorlights.views import snapshot_view

    file_values = read_config_file(config_path or DEFAULT_CONFIG, required=config_path is not None)
    with Scanner(discovery_rules(file_values, {"trust": trust})) as scanner:
        view = snapshot_view(scanner.scan())
    if as_json:
        echo_json(view)
        return
    console = Console()
    table = Table(title="Processes carrying training traffic on this host (PS, ranks)")
    columns = ("job", "kind", "pid", "found by", "netns", "listening", "connections", "workers")
    for column in columns:
        table.add_column(column, overflow="fold")
    for task in view["tasks"]:
        table.add_row(
            literal(task["job"]),
            task["kind"],
            str(task["pid"]),
            literal(task["source"]),
            "own" if task["in_agent_netns"] else str(task["netns"]),
            " ".join(map(str, task["listen_ports"])),
            str(len(task["connections"])) + (" (stale)" if task["stale"] else ""),
            literal(" ".join(task["peers"])),
        )
    console.print(table)
    members = ", ".join(f"{m['job']}: {m['processes']} {m['role']}" for m in view["members"])
    console.print(literal(f"training processes: {members or 'none'}"))
    if view["contested_ports"]:
        console.print(f"ports used by several jobs (shaped as none): {view['contested_ports']}")
    for job, reason in view["unshapeable"].items():
        console.print(
            Text("not shapeable on this host:", style="yellow"), literal(f"{job}: {reason}")
        )
    for problem in view["problems"]:
        console.print(Text("warning:", style="yellow"), literal(problem))


@main.command()
def backends() -> None:
    """List datapath backends and whether this kernel supports them."""
    from tensorlights.datapath.kernel_features import qdisc_available

    for name in BACKENDS:
        available = qdisc_available(name)
        status = {True: "supported", False: "not in this kernel", None: "unknown"}[available]
        click.echo(f"{name}: {status}")


if __name__ == "__main__":
    main()
