"""Text that processes, agents and resource managers choose (job names, health, interface
names) reaches operators: it is printed literally (never as Rich markup) with terminal escapes
made visible, and agents may send only printable free text."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from rich.table import Table

from tensorlights.agent.status_server import StatusBoard, StatusServer
from tensorlights.cli.agent import main as agent_main
from tensorlights.cli.tlctl import hosts_table, jobs_table, rotations_table
from tensorlights.model import HostReport, Registration, visible
from tensorlights.rpc import convert
from tensorlights.rpc.convert import InvalidMessage
from tensorlights.rpc.v1 import agent_link_pb2 as pb

MARKUP = ["[/bold]", "[red]x[/red]", "[link=http://evil]y[/link]"]
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"  # set the terminal title, clear the screen


def _render(table: Table) -> str:
    console = Console(record=True, width=250, color_system=None, force_terminal=False)
    console.print(table)
    return console.export_text()


def test_job_names_are_printed_literally_in_tlctl_tables() -> None:
    jobs = [
        {
            "job": name,
            "name": name,
            "sources": ["agent"],
            "ps_hosts": ["h1"],
            "green_share": 0.5,
            "demand": None,
            "remaining_s": None,
            "spread_s": None,
            "period_s": None,
            "state": "RUNNING",
        }
        for name in MARKUP
    ]
    text = _render(jobs_table(jobs, wide=True))
    for name in MARKUP:
        assert name in text
    rotations = {
        "at": time.time(),
        "hosts": [
            {
                "host": "h1",
                "green": MARKUP[0],
                "green_since": None,
                "next": MARKUP[1],
                "next_at": None,
                "recent": [{"green": MARKUP[2], "applied_at": time.time()}],
            }
        ],
    }
    text = _render(rotations_table(rotations, 3))
    assert all(name in text for name in MARKUP)


def test_agent_supplied_text_cannot_reach_the_terminal_as_escapes() -> None:
    hosts = [
        {
            "host": "h1",
            "connected": True,
            "mode": "plan",
            "jobs": [],
            "last_report_at": None,
            "plan_generation": 1,
            "health": f"disk full {ESCAPES}",
        }
    ]
    text = _render(hosts_table(hosts, time.time()))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;pwned\\x07" in text


def test_the_agent_status_prints_hostile_job_names_literally(tmp_path: Path) -> None:
    document = {
        "version": "0",
        "interface": "eth0",
        "link_rate_bps": 1,
        "policy": "static",
        "interval_s": 3.0,
        "standalone": True,
        "host": "h",
        "controller": None,
        "healthy": False,
        "health": f"bad {ESCAPES}",
        "last_error": f"[red]oops {ESCAPES}",
        "rotations": {"recent": [], "green": MARKUP[0], "green_since": None, "next": MARKUP[1]}
        | {"next_at": None},
        "last_pass": {"at": 1.0, "duration_s": 0.001, "kernel_ops": 0, "full_resync": False},
        "bands": {name: band for band, name in enumerate(MARKUP)},
        "dscp": {},
        "order": MARKUP,
        "mode": "local",
        "plan_generation": 0,
        "discovery": {"tasks": [], "job_ports": {}},
    }
    board = StatusBoard()
    board.publish(lambda: document)
    server = StatusServer(tmp_path / "agent.sock", board)
    server.start()
    try:
        result = CliRunner().invoke(
            agent_main, ["status", "--socket", str(tmp_path / "agent.sock")]
        )
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    # The job column's cells, each folded over as many lines as the terminal's width needs,
    # read as one text: every name is there, brackets and all.
    rows = [line.split("│") for line in result.output.splitlines() if line.count("│") > 2]
    job_column = "".join(cells[2].strip() for cells in rows)
    assert job_column == "".join(MARKUP), result.output
    assert "\x1b" not in result.output and "[red]oops" in result.output


def test_agents_may_send_only_printable_free_text() -> None:
    good = Registration("h1", 1, "0.1.0", (("eth0", 1000),), "pack")
    convert.registration(convert.registration_message(good).SerializeToString())
    for bad in (
        Registration("h1", 1, f"0.1 {ESCAPES}", (("eth0", 1000),), "pack"),
        Registration("h1", 1, "0.1.0", (("e\x1bth0", 1000),), "pack"),
    ):
        with pytest.raises(InvalidMessage, match=r"unprintable|not a valid"):
            convert.registration(convert.registration_message(bad).SerializeToString())
    report = pb.AgentReport(session="s", seq=1, mode="local", health=f"x {ESCAPES}")
    with pytest.raises(InvalidMessage, match="health has unprintable"):
        convert.report(report.SerializeToString())
    assert isinstance(
        convert.report(
            pb.AgentReport(session="s", seq=1, mode="local", health="ok").SerializeToString()
        ),
        HostReport,
    )


def test_what_the_agent_reports_is_made_printable_first() -> None:
    assert visible(f"a{ESCAPES}\n") == "a\\x1b]0;pwned\\x07\\x1b[2J\\n"
    assert visible("plain [text]") == "plain [text]"
