"""tlctl tells the operator what is wrong when the controller cannot be reached."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from tensorlights.cli.tlctl import main
from tensorlights.testbed.socket_holder import clean_env

TLCTL = [sys.executable, "-m", "tensorlights.cli.tlctl"]


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


def test_a_controller_address_without_a_port_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--controller", "nonsense", "jobs"])
    assert result.exit_code == 2
    assert result.output.strip() == "error: address 'nonsense' must be HOST:PORT"


def test_tls_errors_come_as_one_line_without_grpc_log_lines(tmp_path: Path) -> None:
    """gRPC's C core writes to the process's stderr itself, so this runs the real tlctl."""
    from tensorlights.devca import make_pki

    make_pki(tmp_path, [], [], operator=True)
    (tmp_path / "bad.key").write_text("not a key\n")
    result = subprocess.run(
        [*TLCTL, "--controller", "127.0.0.1:1", "--ca", str(tmp_path / "ca.pem"),
         "--cert", str(tmp_path / "operator.pem"), "--key", str(tmp_path / "bad.key"), "jobs"],
        capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()  # no gRPC log lines before ours
    assert line.startswith("error: UNAUTHENTICATED: our TLS files cannot be loaded")


def test_config_files_that_are_not_text_or_nest_too_deeply_are_one_line_errors(
    tmp_path: Path,
) -> None:
    from tensorlights.cli.agent import main as agent_main
    from tensorlights.cli.controller import main as controller_main

    (tmp_path / "binary.toml").write_bytes(b'interface = "\xff\xfe"\n')
    (tmp_path / "deep.toml").write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    for command in (agent_main, controller_main):
        for name, message in (("binary.toml", "is not UTF-8 text"), ("deep.toml", "too deeply")):
            result = CliRunner().invoke(command, ["run", "--config", str(tmp_path / name)])
            assert result.exit_code == 2, result.output
            assert message in result.output and "Traceback" not in result.output
