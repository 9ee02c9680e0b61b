"""The unit file, checked with systemd-analyze and run through its own ExecStart line with a
real NOTIFY_SOCKET (no systemd as PID 1 on these machines)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tensorlights.testbed import netns
from tensorlights.testbed.socket_holder import clean_env

from ..functional.tcutil import root_qdisc
from .notify import NotifyReceiver

UNIT = Path(__file__).parents[2] / "systemd" / "tensorlights-agent.service"
INSTALLED_AGENT = "/opt/tensorlights/venv/bin/tensorlights-agent"
OUR_AGENT = str(Path(sys.executable).parent / "tensorlights-agent")


def unit_section(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser[name]


def test_unit_declares_notify_watchdog_restart_and_least_privilege() -> None:
    service = unit_section("Service")
    assert service["Type"] == "notify"
    assert service["Restart"] == "on-failure"
    assert "WatchdogSec" in service
    assert set(service["CapabilityBoundingSet"].split()) == {
        "CAP_NET_ADMIN",
        "CAP_SYS_PTRACE",
        "CAP_DAC_READ_SEARCH",
    }
    assert set(service["RestrictAddressFamilies"].split()) == {
        "AF_UNIX",
        "AF_NETLINK",
        "AF_INET",
        "AF_INET6",
    }
    for hardening in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert service[hardening] == "yes"
    assert service["ProtectSystem"] == "strict"
    assert shlex.split(service["ExecStart"])[0] == INSTALLED_AGENT


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("name", ["agent", "controller"])
def test_unit_file_verifies(tmp_path: Path, name: str) -> None:
    # verify also checks that ExecStart's binary exists: point it at this checkout's.
    source = UNIT.parent / f"tensorlights-{name}.service"
    unit = tmp_path / source.name
    installed, ours = (
        f"/opt/tensorlights/venv/bin/tensorlights-{name}",
        OUR_AGENT.replace("tensorlights-agent", f"tensorlights-{name}"),
    )
    unit.write_text(source.read_text().replace(installed, ours))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in result.stderr.splitlines()
        if source.name in line and "Failed to" not in line
    ]
    assert result.returncode == 0 and not problems, result.stderr


@pytest.mark.root
def test_execstart_line_runs_with_notify_socket(pair: netns.HostPair, tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        'interface = "veth-a"\nlink_rate = "200mbit"\n'
        f'status_socket = "{tmp_path}/agent.sock"\nstate_dir = "{tmp_path}/state"\n'
    )
    command = shlex.split(unit_section("Service")["ExecStart"])
    command = [OUR_AGENT if part == INSTALLED_AGENT else part for part in command]
    command[command.index("/etc/tensorlights/agent.toml")] = str(config)

    receiver = NotifyReceiver(tmp_path / "notify.sock")
    env = clean_env({"NOTIFY_SOCKET": str(receiver.path)})
    agent = subprocess.Popen(pair.a.exec_args(*command), env=env, stderr=subprocess.PIPE)
    try:
        receiver.wait_for(
            lambda m: "READY=1" in m and m.count("WATCHDOG=1") >= 3, agent, deadline_s=20
        )
        assert root_qdisc(pair.a.ns, "veth-a")["kind"] == "htb"
        agent.send_signal(15)  # what `systemctl stop` does with KillSignal=SIGTERM
        assert agent.wait(timeout=20) == 0
        assert "STOPPING=1" in receiver.drain()
        assert root_qdisc(pair.a.ns, "veth-a")["kind"] == "noqueue"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        receiver.close()
