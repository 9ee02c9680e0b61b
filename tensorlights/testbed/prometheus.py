"""A real Prometheus (the distribution's `prometheus` package) as a plain process, for tests:
it scrapes the given targets every second with the shipped scrape settings
(deploy/prometheus/prometheus.yml) and evaluates the shipped alerting rules.

    with prometheus_server(workdir, {"tensorlights-agent": ["127.0.0.1:9731"]},
                           prefix=host.exec_args()) as prom:
        prom.query('up{job="tensorlights-agent"}')

It runs where `prefix` puts it (a test's network namespace, to reach targets there), listens
on 127.0.0.1 of that namespace and is queried through its HTTP API from inside it. Storage is
a private directory, removed with it. Needs root (namespaces) and the `prometheus` package
(scripts/setup.sh test installs it).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tensorlights.testbed.processes import free_port, stop

DEPLOY = Path(__file__).parents[2] / "deploy" / "prometheus"
SCRAPE_CONFIG = DEPLOY / "prometheus.yml"
ALERT_RULES = DEPLOY / "tensorlights-alerts.yml"

_QUERY = """
import json, sys, urllib.parse, urllib.request
url = sys.argv[1] + "?" + urllib.parse.urlencode({"query": sys.argv[2]})
with urllib.request.urlopen(url, timeout=10) as response:
    sys.stdout.write(response.read().decode())
"""


@dataclass
class Prometheus:
    proc: subprocess.Popen[bytes]
    address: str
    prefix: tuple[str, ...]
    log: Path

    def api(self, path: str, expr: str = "") -> Any:
        """GET /api/v1/<path> (with `query=expr`), run inside the namespace; the data."""
        out = subprocess.run(
            [*self.prefix, sys.executable, "-c", _QUERY, f"http://{self.address}/api/v1/{path}",
             expr],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if out.returncode != 0:
            raise RuntimeError(f"Prometheus API {path}: {out.stderr.strip()[-500:]}")
        document = json.loads(out.stdout)
        if document.get("status") != "success":
            raise RuntimeError(f"Prometheus API {path}: {document}")
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's samples: [{"metric": {labels}, "value": [t, "v"]}, ...]."""
        result: list[dict[str, Any]] = self.api("query", expr)["result"]
        return result

    def wait_for(
        self, expr: str, done: Callable[[list[dict[str, Any]]], bool], deadline_s: float = 30
    ) -> list[dict[str, Any]]:
        end = time.monotonic() + deadline_s
        while True:
            result = self.query(expr)
            if done(result):
                return result
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            if time.monotonic() > end:
                raise AssertionError(f"{expr} never matched; last: {result}")
            time.sleep(0.5)


def config_text(targets: Mapping[str, Sequence[str]], rule_files: Sequence[Path]) -> str:
    """The shipped scrape config with these targets per job and a 1 s interval (JSON is YAML)."""
    shipped = SCRAPE_CONFIG.read_text()
    # The shipped file is the documentation; a test only swaps the targets and the pace.
    if "tensorlights-agent" not in shipped or "tensorlights-controller" not in shipped:
        raise RuntimeError(f"{SCRAPE_CONFIG} no longer names the jobs this testbed scrapes")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(path) for path in rule_files],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(addresses)}]}
            for job, addresses in targets.items()
        ],
    }
    return json.dumps(config, indent=2)


@contextlib.contextmanager
def prometheus_server(
    workdir: Path,
    targets: Mapping[str, Sequence[str]],
    prefix: Sequence[str] = (),
    rule_files: Sequence[Path] = (ALERT_RULES,),
    ready_timeout_s: float = 30,
) -> Iterator[Prometheus]:
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus is not installed: scripts/setup.sh test")
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(config_text(targets, rule_files))
    address = f"127.0.0.1:{free_port()}"
    log = workdir / "prometheus.log"
    command = [
        *prefix, binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address={address}", "--log.level=warn",
    ]  # fmt: skip
    with open(log, "wb") as log_file:
        proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    server = Prometheus(proc, address, tuple(prefix), log)
    try:
        end = time.monotonic() + ready_timeout_s
        while True:
            if proc.poll() is not None:
                tail = log.read_text()[-2000:]
                raise RuntimeError(f"prometheus exited {proc.returncode}: {tail}")
            with contextlib.suppress(RuntimeError):
                server.api("status/runtimeinfo")
                break
            if time.monotonic() > end:
                raise RuntimeError(f"prometheus not ready in {ready_timeout_s} s")
            time.sleep(0.2)
        yield server
    finally:
        stop(proc, timeout_s=15)
        shutil.rmtree(workdir / "data", ignore_errors=True)
