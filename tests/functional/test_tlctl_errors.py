"""tlctl tells the operator what is wrong when the controller cannot be reached."""

from __future__ import annotations

import socket
from pathlib import Path

from click.testing import CliRunner

from tensorlights.cli.tlctl import main


def test_no_socket_names_the_service(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--socket", str(tmp_path / "absent.sock"), "jobs"])
    assert result.exit_code == 1
    assert "no controller socket" in result.output and "tensorlights-controller" in result.output


def test_a_stale_socket_says_nothing_listens(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(str(path))  # bound, never listening: what a crashed server leaves
    leftover.close()
    result = CliRunner().invoke(main, ["--socket", str(path), "hosts", "--json"])
    assert result.exit_code == 1 and "nothing listens" in result.output


def test_tls_mode_needs_its_files(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--controller", "127.0.0.1:1", "rotations"])
    assert result.exit_code == 1 and "needs --ca, --cert and --key" in result.output
