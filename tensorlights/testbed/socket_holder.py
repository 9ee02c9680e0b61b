"""A process that holds real TCP sockets, as a PS does, for discovery tests and benchmarks.

    python -m tensorlights.testbed.socket_holder --connections 19 [--host ::1] [--port P]
        [--connect HOST:PORT] [--child [--child-unset VAR ...]] [--open PATH ...]

Opens one listener (on --port, or an ephemeral one like TensorPipe's), makes --connections
connections to it and accepts them, optionally connects out to --connect, optionally starts a
child (fork + exec, without the variables named by --child-unset) that opens a listener of its
own, optionally holds files open (--open: a device, as an RDMA job holds one); prints one JSON
line with its pid and the local ports it holds, then keeps everything open until its stdin
closes (or it is killed); a line "listen" on stdin opens one more listener.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

HOLDER = [sys.executable, "-m", "tensorlights.testbed.socket_holder"]
# Launcher variables of the test runner itself must not leak into the children.
_LAUNCHER_PREFIXES = (
    *("TF_CONFIG", "DMLC_", "TORCHELASTIC_", "SLURM_", "TENSORLIGHTS_", "HOROVOD_", "OMPI_"),
    *("PMI_", "PMIX_", "NCCL_"),
)
_LAUNCHER_KEYS = {"MASTER_ADDR", "MASTER_PORT", "RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_RANK"}


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

    def listen_more(self) -> int:
        """Make the process open one more listener now; its port."""
        return int(self.listen_more_report()["listen_port"])

    def listen_more_report(self) -> dict[str, Any]:
        """Make the process open one more listener now; its listen_port and listened_at."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("listen\n")
        self.proc.stdin.flush()
        reply: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return reply

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
    env: Mapping[str, str],
    *args: str,
    prefix: Sequence[str] = (),
    timeout: float = 20,
    python: str = sys.executable,
) -> Holder:
    """`python`: another interpreter (this module needs only the standard library), e.g. one
    an unprivileged user may run where ours lives in root's home."""
    proc = subprocess.Popen(
        [*prefix, python, *HOLDER[1:], *args],
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


def _listener(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--connections", type=int, default=0)
    parser.add_argument("--connect", action="append", default=[], metavar="HOST:PORT")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--child-unset", action="append", default=[], metavar="VAR")
    parser.add_argument("--open", action="append", default=[], metavar="PATH", help="hold it open")
    parser.add_argument("--report-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    held: list[socket.socket] = []
    files = [open(path, "rb") for path in args.open]  # noqa: SIM115 (held until exit)
    listener = _listener(args.host, args.port)
    held.append(listener)
    listen_port = listener.getsockname()[1]
    listened_at = time.monotonic()  # CLOCK_MONOTONIC: comparable across processes
    connection_ports: list[int] = []
    for _ in range(args.connections):
        client = socket.create_connection((args.host, listen_port))
        server_side, _ = listener.accept()
        held += [client, server_side]
        connection_ports.append(client.getsockname()[1])
    for target in args.connect:
        host, _, port = target.rpartition(":")
        client = socket.create_connection((host.strip("[]"), int(port)))
        held.append(client)
        connection_ports.append(client.getsockname()[1])

    child: dict[str, int] = {"pid": 0, "listen_port": 0}
    if args.child:
        read_end, write_end = os.pipe()
        os.set_inheritable(write_end, True)
        env = {k: v for k, v in os.environ.items() if k not in args.child_unset}
        command = [sys.executable, "-m", "tensorlights.testbed.socket_holder"]
        command += ["--host", args.host, "--report-fd", str(write_end)]
        child_pid = os.fork()
        if child_pid == 0:
            os.close(read_end)
            os.execve(sys.executable, command, env)
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            child = json.loads(pipe.read())

    report = {
        "pid": os.getpid(),
        "listen_port": listen_port,
        "listened_at": listened_at,
        "connection_ports": connection_ports,
        "child_pid": child["pid"],
        "child_listen_port": child["listen_port"],
    }
    if args.report_fd is not None:
        with os.fdopen(args.report_fd, "w") as pipe:
            pipe.write(json.dumps(report))
    else:
        print(json.dumps(report), flush=True)
    for line in sys.stdin:  # until EOF; "listen" opens one more listener and reports it
        if line.strip() == "listen" and args.report_fd is None:
            extra = _listener(args.host, 0)
            held.append(extra)
            reply = {"listen_port": extra.getsockname()[1], "listened_at": time.monotonic()}
            print(json.dumps(reply), flush=True)
    if child["pid"]:
        os.waitpid(child["pid"], 0)
    for file in files:
        file.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
