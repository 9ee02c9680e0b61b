"""Real processes holding real sockets, with launcher-style environments, for discovery tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.model import DiscoverySnapshot

HOLDER = [sys.executable, "-m", "tensorlights.testbed.socket_holder"]
# Launcher variables of the test runner itself must not leak into the children.
_LAUNCHER_PREFIXES = ("TF_CONFIG", "DMLC_", "TORCHELASTIC_", "SLURM_", "TENSORLIGHTS_")
_LAUNCHER_KEYS = {"MASTER_ADDR", "MASTER_PORT", "RANK", "ROLE_NAME"}


def clean_env(extra: Mapping[str, str] = {}) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(_LAUNCHER_PREFIXES) and key not in _LAUNCHER_KEYS
    }
    env.update(extra)
    return env


@dataclass
class Holder:
    proc: subprocess.Popen[str]
    report: dict[str, Any]

    @property
    def pid(self) -> int:
        return int(self.report["pid"])

    @property
    def ports(self) -> set[int]:
        return {self.report["listen_port"], *self.report["connection_ports"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_holder(
    env: Mapping[str, str], *args: str, prefix: Sequence[str] = (), timeout: float = 20
) -> Holder:
    proc = subprocess.Popen(
        [*prefix, *HOLDER, *args],
        env=clean_env(env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError(f"socket holder exited with {proc.wait(timeout)}")
    return Holder(proc, json.loads(line))


@contextmanager
def holders() -> Iterator[Callable[..., Holder]]:
    """Start holders through the yielded function; all are stopped at the end."""
    started: list[Holder] = []

    def start(env: Mapping[str, str], *args: str, **kwargs: Any) -> Holder:
        holder = start_holder(env, *args, **kwargs)
        started.append(holder)
        return holder

    try:
        yield start
    finally:
        for holder in started:
            holder.stop()


def scan_until(
    scanner: Scanner,
    done: Callable[[DiscoverySnapshot], bool],
    deadline_s: float = 10.0,
    every_s: float = 0.05,
) -> DiscoverySnapshot:
    """Scan until `done` holds (polling with a deadline); the last snapshot either way."""
    end = time.monotonic() + deadline_s
    while True:
        snapshot = scanner.scan()
        if done(snapshot) or time.monotonic() > end:
            return snapshot
        time.sleep(every_s)


def new_scanner(rules: DiscoveryRules | None = None, **kwargs: Any) -> Scanner:
    return Scanner(rules or DiscoveryRules(), **kwargs)


def tf_config(task_type: str, index: int | str, workers: int = 2, tag: str = "a") -> str:
    cluster = {
        "ps": [f"ps-{tag}:2222"],
        "worker": [f"w{i}-{tag}:2222" for i in range(workers)],
    }
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})
