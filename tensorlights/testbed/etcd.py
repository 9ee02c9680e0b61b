"""A real etcd cluster on loopback for tests and demos: `etcd` (Debian's etcd-server) as plain
processes, each member its own data directory and ports; members can be stopped, killed
and started again with their data.

    with EtcdCluster(Path(tmp), members=3) as etcd:
        client = EtcdClient(etcd.endpoints)
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

from tensorlights.testbed.processes import free_port, stop

ETCD = "etcd"
START_TIMEOUT_S = 20.0


class EtcdCluster:
    def __init__(self, workdir: Path, members: int = 3) -> None:
        if shutil.which(ETCD) is None:
            raise RuntimeError("etcd is not installed (apt-get install etcd-server)")
        self.workdir = workdir
        self.names = [f"m{i}" for i in range(members)]
        self.client_ports = [free_port() for _ in self.names]
        self.peer_ports = [free_port() for _ in self.names]
        self.token = f"tl-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * members
        self._started_once = [False] * members

    @property
    def endpoints(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.client_ports]

    def start(self) -> None:
        for index in range(len(self.names)):
            self.start_member(index, wait=False)
        self.wait_healthy(range(len(self.names)))

    def start_member(self, index: int, wait: bool = True) -> None:
        name = self.names[index]
        peers = ",".join(
            f"{n}=http://127.0.0.1:{p}" for n, p in zip(self.names, self.peer_ports, strict=True)
        )
        client = f"http://127.0.0.1:{self.client_ports[index]}"
        peer = f"http://127.0.0.1:{self.peer_ports[index]}"
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 (the process owns it)
        self.procs[index] = subprocess.Popen(
            [
                ETCD, "--name", name, "--data-dir", str(self.workdir / name),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-token", self.token,
                "--initial-cluster-state", "existing" if self._started_once[index] else "new",
                "--heartbeat-interval", "100", "--election-timeout", "1000",
            ],
            stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        self._started_once[index] = True
        if wait:
            self.wait_healthy([index])

    def wait_healthy(self, members: range | list[int]) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        for index in members:
            while not self.healthy(index):
                proc = self.procs[index]
                if proc is not None and proc.poll() is not None:
                    raise RuntimeError(
                        f"etcd member {self.names[index]} exited with {proc.returncode}; see "
                        f"{self.workdir / self.names[index]}.log"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"etcd member {self.names[index]} not healthy in time")
                time.sleep(0.1)

    def healthy(self, index: int) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoints[index]}/health", timeout=1) as reply:
                return bool(json.loads(reply.read()).get("health") == "true")
        except (OSError, ValueError):
            return False

    def stop_member(self, index: int) -> None:
        proc = self.procs[index]
        if proc is not None:
            stop(proc)
        self.procs[index] = None

    def kill_member(self, index: int) -> None:
        proc = self.procs[index]
        if proc is not None:
            proc.kill()
            proc.wait()
        self.procs[index] = None

    def close(self) -> None:
        for index in range(len(self.names)):
            self.kill_member(index)

    def __enter__(self) -> EtcdCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
