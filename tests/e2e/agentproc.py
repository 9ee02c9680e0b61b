"""The real agent as a process in a test namespace, and ways to look at it from outside."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tensorlights.agent.status import read_status_document
from tensorlights.errors import TransientError
from tensorlights.testbed import netns
from tensorlights.testbed.socket_holder import clean_env

from ..functional.tcutil import LINK_BUSY_ROTATING

AGENT = [sys.executable, "-m", "tensorlights.cli.agent"]
METRICS = "127.0.0.1:9731"


class AgentProcess:
    def __init__(
        self,
        where: netns.HostPair | netns.Host,
        workdir: Path,
        *flags: str,
        standalone: bool = True,
        metrics: str = METRICS,
        trust: str = "any",
    ) -> None:
        """An agent on `where`: a pair's sender (veth-a) or a cluster host (its eth0). The
        test's jobs are root processes naming themselves: believed unless `trust` says not."""
        self.host = where.a if isinstance(where, netns.HostPair) else where
        self.metrics = metrics
        self.workdir = workdir
        self.socket = workdir / "agent.sock"
        self.log = open(workdir / "agent.log", "a")  # noqa: SIM115 - closed in stop()
        command = [
            *AGENT,
            "run",
            "--interface",
            self.host.ifname,
            "--link-rate",
            "200mbit",
            *(["--standalone"] if standalone else []),
            "--trust",
            trust,
            "--metrics-address",
            metrics,
            "--status-socket",
            str(self.socket),
            "--state-dir",
            str(workdir / "state"),
            "--config",
            str(workdir / "agent.toml"),
            *flags,
        ]
        if not (workdir / "agent.toml").exists():
            # These tests exercise the rotation unless they choose otherwise (default: pack).
            (workdir / "agent.toml").write_text('policy = "rotate"\n')
        self.proc = subprocess.Popen(
            self.host.exec_args(*command), stderr=self.log, env=clean_env(), text=True
        )

    def status(self) -> dict[str, Any] | None:
        try:
            return read_status_document(self.socket, timeout_s=2)
        except (TransientError, OSError, json.JSONDecodeError):
            return None

    def wait_status(
        self, done: Callable[[dict[str, Any]], bool], deadline_s: float = 20
    ) -> dict[str, Any]:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"agent exited with {self.proc.returncode}: {self.log_text()}")
            document = self.status()
            if document is not None and done(document):
                return document
            time.sleep(0.1)
        raise AssertionError(f"agent status never matched; last: {self.status()}")

    def http(self, path: str) -> tuple[int, str]:
        """GET on the agent's metrics address, from inside its namespace."""
        script = (
            "import sys, urllib.request, urllib.error\n"
            "try:\n"
            "    r = urllib.request.urlopen(sys.argv[1], timeout=5)\n"
            "    code, body = r.status, r.read()\n"
            "except urllib.error.HTTPError as e:\n"
            "    code, body = e.code, e.read()\n"
            "print(code); sys.stdout.write(body.decode())\n"
        )
        out = subprocess.run(
            self.host.exec_args(sys.executable, "-c", script, f"http://{self.metrics}{path}"),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        code, _, body = out.partition("\n")
        return int(code), body

    def log_text(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.workdir / "agent.log").read_text()

    def stop(self, sig: str = "TERM", timeout: float = 15) -> int:
        if self.proc.poll() is None:
            if sig == "KILL":
                self.proc.kill()
            else:
                self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def metric(text: str, name: str, labels: str = "") -> float:
    """The value of one sample in Prometheus text format."""
    wanted = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(wanted + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{wanted} not in metrics")


def dominant_slots(flows: dict[str, list[int]]) -> list[tuple[str, float, int]]:
    """Per slot: the flow carrying most bytes, its share, and the slot's total."""
    targets = sorted(flows)
    slots = []
    for i in range(len(flows[targets[0]])):
        sizes = {t: flows[t][i] for t in targets}
        total = sum(sizes.values())
        top = max(sizes, key=lambda t: sizes[t])
        slots.append((top, sizes[top] / total if total else 0.0, total))
    return slots


def assert_light_rotates(
    result: dict[str, Any],
    interval: float,
    skip: int,
    changes_allowed: tuple[int, int],
    link_bytes_per_s: float,
) -> None:
    """The sink's result (tcutil.start_sink) shows one flow at a time carrying the link (>= 85%
    of the bytes read, and the link busy: LINK_BUSY_ROTATING, in every steady slot) and the
    light moving between them a number of times within `changes_allowed`. The first `skip` slots
    (connections starting, jobs not yet found) and the last (a switch there shows no change
    after it) are left out."""
    slots = dominant_slots(result["flows"])[skip:-1]
    carried = result["link"][skip:-1]
    changes = [i for i in range(1, len(slots)) if slots[i][0] != slots[i - 1][0]]
    assert changes_allowed[0] <= len(changes) <= changes_allowed[1], slots
    # The first and last slots may hold a switch whose neighbour was cut off.
    near_change = {0, len(slots) - 1} | {j for i in changes for j in (i - 1, i)}
    steady = [i for i in range(len(slots)) if i not in near_change]
    assert len(steady) >= 6, slots
    for i in steady:
        assert slots[i][1] >= 0.85, " ".join(f"{t[-1]}:{s:.2f}" for t, s, _ in slots)
        assert carried[i] >= LINK_BUSY_ROTATING * link_bytes_per_s * interval, (i, carried, slots)
