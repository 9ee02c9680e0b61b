"""A synthetic parameter-server job, with its own ground truth.

    python -m tensorlights.testbed.psjob ps --port 0 --workers 3 --model-bytes 4000000 \
        --iterations 20
    python -m tensorlights.testbed.psjob worker --connect HOST:PORT --compute 0.25

Each iteration the PS pushes the model (--model-bytes) to every worker at once; each worker
reads it all, notes the moment it had the last byte (CLOCK_MONOTONIC, shared by every
namespace of a host), computes for --compute seconds and sends its gradient
(--gradient-bytes) back; the PS waits for every gradient (the barrier) and starts the next
iteration. The PS is identified the way real jobs are: its launcher sets TF_CONFIG (or DMLC_*).

The PS prints "listening PORT" when ready and a JSON summary at the end (iterations, and
`listening_at` / `finished_at`: when it began to listen and when its last iteration ended, on
CLOCK_MONOTONIC -- a job's completion time); each worker prints one JSON line:
{"received": [t0, t1, ...]} -- the ground truth for straggler telemetry.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from tensorlights.agent.status import AgentStatus
from tensorlights.discovery.rules import launcher_job
from tensorlights.telemetry.accuracy import Measured

CHUNK = 256 * 1024


def _recv_exactly(conn: socket.socket, size: int) -> None:
    view = memoryview(bytearray(min(size, CHUNK)))
    left = size
    while left:
        got = conn.recv_into(view, min(left, len(view)))
        if not got:
            raise ConnectionError("peer closed mid-message")
        left -= got


def run_ps(args: argparse.Namespace) -> int:
    family = socket.AF_INET6 if ":" in args.bind else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.bind, args.port))
    listener.listen(args.workers)
    listening_at = time.monotonic()
    print(f"listening {listener.getsockname()[1]}", flush=True)
    workers = [listener.accept()[0] for _ in range(args.workers)]
    model = b"\x01" * args.model_bytes
    barrier = threading.Barrier(args.workers + 1)
    failures: list[BaseException] = []

    def serve(conn: socket.socket) -> None:
        try:
            for _ in range(args.iterations):
                barrier.wait()  # everyone pushes at once, as a PS does
                conn.sendall(model)
                _recv_exactly(conn, args.gradient_bytes)
                barrier.wait()
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=serve, args=(conn,), daemon=True) for conn in workers]
    for thread in threads:
        thread.start()
    started = time.monotonic()
    iteration_ends = []
    try:
        for _ in range(args.iterations):
            barrier.wait()
            barrier.wait()
            iteration_ends.append(time.monotonic())
    except threading.BrokenBarrierError:
        pass
    summary = {
        "iterations": len(iteration_ends),
        "seconds": time.monotonic() - started,
        "listening_at": listening_at,
        "finished_at": iteration_ends[-1] if iteration_ends else None,
        "errors": [repr(exc) for exc in failures],
    }
    print(json.dumps(summary), flush=True)
    # Past its last iteration a PS may stay, sockets open (a TensorFlow PS serves until its
    # launcher ends it, a PS writes its checkpoint): --linger stands for that.
    time.sleep(args.linger)
    for conn in workers:
        conn.close()
    listener.close()
    return 1 if failures else 0


def run_worker(args: argparse.Namespace) -> int:
    """One connection per PS shard (--connect once per shard, each pushing --model-bytes):
    an iteration's compute starts once every shard is in, as a worker of a sharded model
    waits for its slowest PS."""
    conns = []
    for target in args.connect:
        host, _, port = target.rpartition(":")
        conns.append(socket.create_connection((host.strip("[]"), int(port))))
    gradient = b"\x02" * args.gradient_bytes
    received: list[float] = []
    shards: list[list[float]] = []
    pool = ThreadPoolExecutor(max_workers=len(conns))

    def pull(conn: socket.socket) -> float:
        _recv_exactly(conn, args.model_bytes)
        return time.monotonic()

    try:
        for _ in range(args.iterations):
            done = list(pool.map(pull, conns))
            received.append(max(done))
            shards.append(done)
            time.sleep(args.compute)
            for conn in conns:
                conn.sendall(gradient)
    except (ConnectionError, OSError) as exc:
        print(json.dumps({"received": received, "error": repr(exc)}), flush=True)
        return 1
    finally:
        pool.shutdown(wait=False)
    log: dict[str, Any] = {"received": received}
    if len(conns) > 1:
        log["shards"] = shards  # when each shard was in, per iteration
    print(json.dumps(log), flush=True)
    return 0


@dataclass
class RunningJob:
    """A job started across emulated hosts: its PS on one (or its PS shards on several), its
    workers on others."""

    ps: subprocess.Popen[str]
    workers: list[subprocess.Popen[str]]
    port: int
    """The PS's listening port: its pushes to the workers leave from it."""
    summary: dict[str, Any] | None = None
    """The PS's JSON summary (a sharded job's: every shard's, merged), once `received` has
    collected it."""
    job: str = ""
    """The id discovery gives its processes (set by testbed.workloads)."""
    more_ps: list[subprocess.Popen[str]] = field(default_factory=list)
    """A sharded job's other PS shards (`ps` is the first)."""
    ports: tuple[int, ...] = ()
    """Every shard's listening port, in shard order (a job of one PS: its `port`)."""
    shard_spreads: list[float] = field(default_factory=list)
    """A sharded job's, per iteration: how long the worker that waited longest waited from
    its first shard's arrival to its last (`received` fills it)."""

    def received(self, timeout: float) -> list[list[float]]:
        """Each worker's receive times, once they have finished (the PS summary is kept)."""
        logs = []
        shard_logs = []
        for worker in self.workers:
            out, _ = worker.communicate(timeout=timeout)
            log = json.loads(out)
            logs.append(log["received"])
            shard_logs.append(log.get("shards", []))
        summaries = []
        for ps in [self.ps, *self.more_ps]:
            out, _ = ps.communicate(timeout=timeout)
            lines = out.strip().splitlines()
            summaries.append(json.loads(lines[-1]) if lines else None)
        self.summary = _merged(summaries)
        self.shard_spreads = [
            max(max(shards) - min(shards) for shards in iteration)
            for iteration in zip(*shard_logs, strict=False)
            if iteration
        ]
        return logs

    def kill(self) -> None:
        for proc in [self.ps, *self.more_ps, *self.workers]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _merged(summaries: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """A sharded job's summary: from its first shard's start to its last shard's end."""
    if len(summaries) == 1:
        return summaries[0]
    present = [summary for summary in summaries if summary is not None]
    if len(present) < len(summaries):
        return None  # a shard that printed nothing: the job failed
    ends = [summary["finished_at"] for summary in present]
    return {
        "iterations": min(summary["iterations"] for summary in present),
        "seconds": max(summary["seconds"] for summary in present),
        "listening_at": min(summary["listening_at"] for summary in present),
        "finished_at": None if None in ends else max(ends),
        "errors": [error for summary in present for error in summary["errors"]],
    }


@dataclass(frozen=True)
class PsShard:
    """Where one PS shard runs: its host's command prefix and address, its launcher's env."""

    ns_args: list[str]
    address: str
    env: dict[str, str]


def start_job(
    ps_ns_args: list[str],
    worker_hosts: Sequence[list[str]],
    ps_address: str,
    env: dict[str, str],
    workers: int,
    model_bytes: int,
    iterations: int,
    compute_s: float,
    linger_s: float = 0.0,
) -> RunningJob:
    """Start the PS (with its launcher's `env`, e.g. TF_CONFIG) and its workers, spread
    round-robin over `worker_hosts` (each a command prefix that runs on that host)."""
    shard = PsShard(ps_ns_args, ps_address, env)
    return start_sharded_job(
        [shard], worker_hosts, workers, model_bytes, iterations, compute_s, linger_s
    )


def start_sharded_job(
    shards: Sequence[PsShard],
    worker_hosts: Sequence[list[str]],
    workers: int,
    shard_bytes: int,
    iterations: int,
    compute_s: float,
    linger_s: float = 0.0,
) -> RunningJob:
    """Start every PS shard (each pushing `shard_bytes` to every worker per iteration) and
    the workers, each connected to every shard; each PS stays `linger_s` past its last
    iteration (psjob ps --linger)."""
    common = ["--model-bytes", str(shard_bytes), "--iterations", str(iterations)]
    module = [sys.executable, "-m", "tensorlights.testbed.psjob"]
    started: list[subprocess.Popen[str]] = []
    targets = []
    for shard in shards:
        ps = subprocess.Popen(
            [
                *shard.ns_args,
                *module,
                "ps",
                "--workers",
                str(workers),
                "--linger",
                str(linger_s),
                *common,
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=shard.env,
        )
        started.append(ps)
        assert ps.stdout is not None
        line = ps.stdout.readline().split()
        if len(line) != 2 or line[0] != "listening":
            for proc in started:
                proc.kill()
            raise RuntimeError(f"PS did not start (exit {ps.wait()})")
        targets.append((f"{shard.address}:{line[1]}", int(line[1])))
    connects = [arg for target, _ in targets for arg in ("--connect", target)]
    worker_procs = [
        subprocess.Popen(
            [*worker_hosts[index % len(worker_hosts)], *module, "worker", *connects,
             "--compute", str(compute_s), *common],
            stdout=subprocess.PIPE,
            text=True,
        )
        for index in range(workers)
    ]  # fmt: skip
    ports = tuple(port for _, port in targets)
    return RunningJob(started[0], worker_procs, ports[0], more_ps=started[1:], ports=ports)


def tf_config_env(
    cluster: dict[str, list[str]], task: str = "ps", index: int = 0
) -> dict[str, str]:
    """The TF_CONFIG a TensorFlow launcher gives task `task`:`index` of `cluster`."""
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": task, "index": index}})}


def tf_launcher_env(tag: str, workers: int, shards: int = 1, index: int = 0) -> dict[str, str]:
    """The TF_CONFIG a launcher would give PS `index` of job `tag` (of `shards` PS tasks)."""
    ps = [f"ps-{tag}:1"] if shards == 1 else [f"ps{i}-{tag}:1" for i in range(shards)]
    return tf_config_env(
        {"ps": ps, "worker": [f"w{i}-{tag}:1" for i in range(workers)]}, index=index
    )


def launcher_job_id(env: dict[str, str]) -> str:
    """The job id discovery gives a process with this launcher environment."""
    found = launcher_job(env)
    assert found is not None
    return found[0]


def tf_job_id(tag: str, workers: int, shards: int = 1) -> str:
    """The job id discovery gives job `tag`'s processes (from their TF_CONFIG)."""
    return launcher_job_id(tf_launcher_env(tag, workers, shards))


def collect_iterations(
    read_status: Callable[[], AgentStatus | None],
    jobs: dict[str, RunningJob],
    timeout_s: float = 600,
) -> tuple[dict[str, list[list[float]]], dict[str, list[Measured]]]:
    """Run the jobs to their end while reading the agent's status; the workers' own receive
    times (truth) and the agent's measured iterations, per job."""
    seen: dict[str, dict[float, Measured]] = {job: {} for job in jobs}
    finished_at = None
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and (finished_at is None or time.monotonic() < finished_at):
        status = read_status()
        telemetry = status.telemetry if status is not None else None
        for job, items in (telemetry.iterations if telemetry is not None else {}).items():
            for item in items:
                measured = Measured(item.last_done_monotonic, item.spread_s, item.period_s)
                seen.setdefault(job, {})[measured.last_done] = measured
        if finished_at is None and all(r.ps.poll() is not None for r in jobs.values()):
            finished_at = time.monotonic() + 1.0  # final pushes close once connections go
        time.sleep(0.5)
    truths = {job: running.received(timeout=60) for job, running in jobs.items()}
    return truths, {job: list(items.values()) for job, items in seen.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("ps", "worker"):
        p = sub.add_parser(role)
        p.add_argument("--model-bytes", type=int, default=4_000_000)
        p.add_argument("--gradient-bytes", type=int, default=4096)
        p.add_argument("--iterations", type=int, default=20)
    sub.choices["ps"].add_argument("--bind", default="0.0.0.0")
    sub.choices["ps"].add_argument("--port", type=int, default=0)
    sub.choices["ps"].add_argument("--workers", type=int, required=True)
    sub.choices["ps"].add_argument(
        "--linger", type=float, default=0.0, metavar="S",
        help="stay S seconds past the last iteration, sockets open (a checkpoint, a TF PS)",
    )  # fmt: skip
    sub.choices["worker"].add_argument(
        "--connect", required=True, action="append", metavar="HOST:PORT", help="once per shard"
    )
    sub.choices["worker"].add_argument("--compute", type=float, default=0.25)
    args = parser.parse_args(argv)
    return run_ps(args) if args.role == "ps" else run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
