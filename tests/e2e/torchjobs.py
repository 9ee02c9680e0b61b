"""A real PyTorch PS job (testbed/torchjob.py) launched as torchrun would launch it: the PS
with its launcher's variables (found by discovery alone), the workers elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tensorlights.testbed.netns import in_ns
from tensorlights.testbed.psjob import tf_launcher_env
from tensorlights.testbed.socket_holder import clean_env

MODULE = [sys.executable, "-m", "tensorlights.testbed.torchjob"]


@dataclass
class TorchJob:
    ps: subprocess.Popen[str]
    workers: list[subprocess.Popen[str]]

    def results(self) -> tuple[list[list[float]], dict[str, Any]]:
        """When each worker received each push (monotonic), and the PS's summary."""
        received = [json.loads(w.communicate(timeout=180)[0])["received"] for w in self.workers]
        summary = json.loads(self.ps.communicate(timeout=60)[0].strip().splitlines()[-1])
        return received, summary

    def kill(self) -> None:
        for proc in (self.ps, *self.workers):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def launch(
    ps: tuple[str, str],
    workers_at: tuple[str, str],
    master: str,
    workers: int,
    hidden: int,
    iterations: int,
    ps_env: Mapping[str, str] = {},
) -> TorchJob:
    """The PS in namespace ps[0] over interface ps[1], `workers` workers in workers_at[0] over
    workers_at[1]; `master` is the PS's ADDR:PORT; `ps_env`: more of the PS's environment."""
    common = ["--master", master, "--workers", str(workers), "--hidden", str(hidden),
              "--iterations", str(iterations)]  # fmt: skip
    ps_proc = subprocess.Popen(
        in_ns(ps[0], *MODULE, "ps", *common, "--ifname", ps[1]),
        stdout=subprocess.PIPE, text=True,
        env=clean_env({**tf_launcher_env("torch", workers), **ps_env}),
    )  # fmt: skip
    ranks = []
    for rank in range(1, workers + 1):
        args = [*MODULE, "worker", *common, "--rank", str(rank), "--ifname", workers_at[1]]
        ranks.append(
            subprocess.Popen(
                in_ns(workers_at[0], *args), stdout=subprocess.PIPE, text=True, env=clean_env()
            )
        )
    return TorchJob(ps_proc, ranks)
