"""The controller's unit file: no privileges, and its ExecStart line runs as systemd would
run it (credentials directory, NOTIFY_SOCKET), serves tlctl, and stops cleanly on SIGTERM."""

from __future__ import annotations

import configparser
import shlex
import subprocess
import sys
from pathlib import Path

from tensorlights.testbed.processes import free_port
from tensorlights.testbed.socket_holder import clean_env

from .controllerproc import TLCTL, make_pki
from .notify import NotifyReceiver

UNIT = Path(__file__).parents[2] / "systemd" / "tensorlights-controller.service"
INSTALLED = "/opt/tensorlights/venv/bin/tensorlights-controller"
OURS = str(Path(sys.executable).parent / "tensorlights-controller")


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser["Service"]


def test_unit_runs_unprivileged_with_notify_and_watchdog() -> None:
    unit = service()
    assert unit["Type"] == "notify" and "WatchdogSec" in unit
    assert unit["DynamicUser"] == "yes" and unit["CapabilityBoundingSet"] == ""
    assert unit["NoNewPrivileges"] == "yes" and unit["ProtectSystem"] == "strict"
    assert "AF_NETLINK" not in unit["RestrictAddressFamilies"]


def test_execstart_line_serves_and_stops(tmp_path: Path) -> None:
    credentials = make_pki(tmp_path / "creds", ["127.0.0.1"], [])
    config = tmp_path / "controller.toml"
    socket_path = tmp_path / "tlctl.sock"
    config.write_text(
        f'listen = "127.0.0.1:{free_port()}"\nsocket = "{socket_path}"\n'
        f'metrics_address = "127.0.0.1:{free_port()}"\nstate_dir = "{tmp_path}/state"\n'
    )
    line = service()["ExecStart"].replace("%d", str(credentials))
    command = [OURS if part == INSTALLED else part for part in shlex.split(line)]
    command[command.index("/etc/tensorlights/controller.toml")] = str(config)
    receiver = NotifyReceiver(tmp_path / "notify.sock")
    proc = subprocess.Popen(
        command, env=clean_env({"NOTIFY_SOCKET": str(receiver.path)}), stderr=subprocess.PIPE
    )
    try:
        receiver.wait_for(lambda m: "READY=1" in m and "WATCHDOG=1" in m, proc, deadline_s=20)
        listed = subprocess.run(
            [*TLCTL, "--socket", str(socket_path), "hosts", "--json"],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert listed.returncode == 0 and listed.stdout.strip() == "[]", listed.stderr
        proc.send_signal(15)
        assert proc.wait(timeout=20) == 0
        assert "STOPPING=1" in receiver.drain()
        assert not socket_path.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        receiver.close()
