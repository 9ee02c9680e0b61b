"""The real controller as a process (in a test namespace or on loopback), a dev PKI, tlctl."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensorlights.testbed import netns
from tensorlights.testbed.daemons import controller_command, controller_section
from tensorlights.testbed.socket_holder import clean_env

ROOT = Path(__file__).resolve().parents[2]
TLCTL = [sys.executable, "-m", "tensorlights.cli.tlctl"]


def make_pki(directory: Path, controller_names: list[str], agents: list[str], *extra: str) -> Path:
    """scripts/dev_ca.py, as an operator runs it."""
    command = [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), str(directory)]
    command += [arg for name in controller_names for arg in ("--controller", name)]
    command += [arg for name in agents for arg in ("--agent", name)]
    subprocess.run([*command, "--operator", *extra], check=True, capture_output=True)
    return directory


def expired_copy(pki: Path, directory: Path, agent: str) -> Path:
    """Same CA, but `agent`'s certificate expired yesterday."""
    directory.mkdir()
    for name in ("ca.pem", "ca.key"):
        shutil.copy(pki / name, directory / name)
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "dev_ca.py"), str(directory), "--agent", agent,
         "--expired", agent],
        check=True, capture_output=True,
    )  # fmt: skip
    return directory


def agent_config(
    path: Path, address: str, pki: Path, host: str, extra: str = "", ca: Path | None = None
) -> Path:
    """An agent config following the controller: `pki` has the host's cert, `ca` (default
    pki's) is the CA it trusts."""
    path.write_text(controller_section(address, pki, host, ca) + extra)
    return path


class ControllerProcess:
    def __init__(
        self,
        host: netns.Host | None,
        workdir: Path,
        pki: Path,
        *flags: str,
        listen: str,
        env: dict[str, str] | None = None,
        socket: Path | None = None,
        metrics: str | None = None,
        max_open_files: int | None = None,
        ready: Callable[[ControllerProcess], bool] | None = None,
    ) -> None:
        """Started when `ready` (default: tlctl answers over the socket, which a follower
        replica does not)."""
        self.workdir = workdir
        self.pki = pki
        self.listen = listen
        self.socket = socket or workdir / "ctl.sock"
        self.log = open(workdir / "controller.log", "a")  # noqa: SIM115 - closed in stop()
        metrics = metrics or f"{listen.rpartition(':')[0]}:9741"
        command = controller_command(
            workdir / "none.toml", listen, self.socket, workdir / "state", pki,
            "--metrics-address", metrics, *flags,
        )  # fmt: skip
        (workdir / "none.toml").write_text("")
        prefix = host.exec_args() if host is not None else []
        if max_open_files is not None:  # the descriptor limit of a small deployment
            prefix += ["prlimit", f"--nofile={max_open_files}:{max_open_files}", "--"]
        self.proc = subprocess.Popen(
            [*prefix, *command], stderr=self.log, env=env or clean_env(), text=True
        )
        self.metrics = metrics
        if ready is None:
            self.wait(lambda: self.socket.exists() and self.tlctl("hosts").returncode == 0)
        else:
            self.wait(lambda: ready(self))

    def tlctl(self, *args: str, uid: int | None = None) -> subprocess.CompletedProcess[str]:
        """tlctl over the local socket (as user `uid` when given)."""
        prefix = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"] if uid else []
        return subprocess.run(
            [*prefix, *TLCTL, "--socket", str(self.socket), *args],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip

    def query(self, *args: str) -> Any:
        result = self.tlctl(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)

    def wait(self, done: Callable[[], bool], deadline_s: float = 20, what: str = "") -> None:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"controller exited {self.proc.returncode}: {self.log_text()}")
            if done():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what or done}: {self.log_text()[-3000:]}")

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.workdir / "controller.log").read_text()

    def stop(self, kill: bool = False) -> int:
        if self.proc.poll() is None:
            self.proc.kill() if kill else self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
