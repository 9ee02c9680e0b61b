"""The benchmark's workloads, each launched as its launcher launches it (one entry point).

  synthetic   tensorlights.testbed.psjob: our own PS job, identified by TF_CONFIG;
  torch-gloo  tensorlights.testbed.torchjob over gloo send/recv, with torchrun's variables
              (RANK, WORLD_SIZE, MASTER_ADDR/PORT, TORCHELASTIC_RUN_ID): discovery needs
              `torch_ps_ranks = [0]`; sharded over several PS hosts, its PS ranks launched
              as `torchrun --role ps` launches them (ROLE_NAME=ps, found with no
              configuration) and its workers with --role trainer;
  torch-rpc   the same over torch.distributed.rpc (TensorPipe);
  torch-ddp   a collective job: torchjob's DistributedDataParallel ranks (gloo all-reduce),
              rank 0 where the others have their PS, with torchrun's variables: found with no
              configuration (each agent must *not* set `torch_ps_ranks`);
  horovod-ddp the same ranks launched with the environment horovodrun's Gloo mode gives
              (HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT, ...): Horovod
              itself does not build against this torch (its last release, 0.28.1, needs
              C++14 where torch >= 2.1 needs C++17), so the training is DDP's;
  tf-ps       tensorlights.testbed.tfjob: TensorFlow's ParameterServerStrategy with TF_CONFIG
              (its own virtualenv: see tfjob's docstring).

Every job prints what the benchmark measures the same way (see psjob.RunningJob).
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from tensorlights.discovery.rules import ENV_ITERATIONS
from tensorlights.testbed.netns import Host
from tensorlights.testbed.psjob import (
    PsShard,
    RunningJob,
    launcher_job_id,
    start_sharded_job,
    tf_config_env,
    tf_job_id,
    tf_launcher_env,
)
from tensorlights.testbed.socket_holder import clean_env
from tensorlights.testbed.torchjob import hidden_for

TORCH_MODULE = [sys.executable, "-m", "tensorlights.testbed.torchjob"]
TORCH_BATCH = {"cpu": 32, "cuda": 16384}
"""Samples per real forward/backward pass on each device; --compute pads the step to the
asked time. On a GPU, enough to make the pass the GPU's work (an 8 MB model: a few ms on an
H100, the workers of a scenario sharing it), not the launch of its kernels."""
_master_ports = itertools.count(29500)


class Workload(StrEnum):
    SYNTHETIC = "synthetic"
    TORCH_GLOO = "torch-gloo"
    TORCH_RPC = "torch-rpc"
    TORCH_DDP = "torch-ddp"
    HOROVOD_DDP = "horovod-ddp"
    TF_PS = "tf-ps"

    @property
    def start_up_s(self) -> float:
        """How long before its arrival a job of this kind is launched (`start_at`): the
        framework's import and rendezvous, measured with a whole scenario starting at once
        on this 2-core machine (torch ~4-8 s, TensorFlow ~20-35 s), with a margin. The
        synthetic job starts in well under a second and is launched at its arrival."""
        return {
            "synthetic": 0.0, "torch-gloo": 15.0, "torch-rpc": 15.0, "torch-ddp": 15.0,
            "horovod-ddp": 15.0, "tf-ps": 50.0,
        }[self]  # fmt: skip


START_UP_PROCESSES_PER_CORE = 4
"""Up to this many framework processes per core start within Workload.start_up_s (r2's 9 on
this 2-core machine met within 4-8 s); m5's 15 PyTorch processes (7 PS shards, 8 workers)
met 21-22 s after their launch, 6-7 s past a 15 s lead."""


def start_up_factor(processes: int, cores: int | None = None) -> float:
    """How much longer than Workload.start_up_s `processes` framework processes launched
    together take to start on `cores` (this machine's): importing a framework is CPU-bound,
    so in proportion to the processes a core has to start."""
    per_core = processes / (cores or os.cpu_count() or 1)
    return max(1.0, per_core / START_UP_PROCESSES_PER_CORE)


@dataclass(frozen=True)
class JobShape:
    """What a job does, whichever framework runs it."""

    workers: int
    model_bytes: int
    iterations: int
    compute_s: float
    device: str = "cpu"
    """Where a real PyTorch job's workers compute (torchjob --device); the others ignore it."""
    declares: bool = False
    """Its processes declare its iterations to TensorLights (ENV_ITERATIONS)."""

    def declared_env(self) -> dict[str, str]:
        """What its launcher adds to every process's environment to declare its iterations."""
        return {ENV_ITERATIONS: str(self.iterations)} if self.declares else {}


def round_robin(worker_hosts: Sequence[Host], workers: int) -> list[Host]:
    """Where each worker runs: spread over the worker hosts in turn."""
    return [worker_hosts[i % len(worker_hosts)] for i in range(workers)]


def torchrun_env(
    run_id: str, rank: int, world_size: int, master: str, role: str = "default"
) -> dict[str, str]:
    """The variables torchrun (static rendezvous, one process per node, `--role role`)
    gives a rank."""
    addr, _, port = master.rpartition(":")
    return {
        "RANK": str(rank), "LOCAL_RANK": "0", "GROUP_RANK": str(rank),
        "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": "1", "ROLE_NAME": role,
        "MASTER_ADDR": addr, "MASTER_PORT": port, "TORCHELASTIC_RUN_ID": run_id,
        # Quiet: gloo's ProcessGroup deprecation and c10d's hostname lookups, on every rank.
        "PYTHONWARNINGS": "ignore::UserWarning", "TORCH_CPP_LOG_LEVEL": "ERROR",
    }  # fmt: skip


_rendezvous_ports = itertools.count(28000)
"""Where each job's horovodrun would run its rendezvous server on the launching host (in
every rank's environment: the job's id, the same on every host)."""


def horovodrun_env(rendezvous: str, rank: int, world_size: int, ifname: str) -> dict[str, str]:
    """The variables horovodrun's Gloo mode (one process per host) gives a rank."""
    return {
        "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": str(world_size),
        "HOROVOD_LOCAL_RANK": "0", "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": str(rank), "HOROVOD_CROSS_SIZE": str(world_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": rendezvous.rpartition(":")[0],
        "HOROVOD_GLOO_RENDEZVOUS_PORT": rendezvous.rpartition(":")[2],
        "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": ifname, "HOROVOD_GLOO_TIMEOUT_SECONDS": "30",
        "PYTHONWARNINGS": "ignore::UserWarning", "TORCH_CPP_LOG_LEVEL": "ERROR",
    }  # fmt: skip


def start_workload(
    workload: Workload,
    tag: str,
    ps_host: Host,
    worker_hosts: Sequence[Host],
    shape: JobShape,
    start_at: float | None = None,
    more_ps_hosts: Sequence[Host] = (),
) -> RunningJob:
    """Start job `tag`: its PS on `ps_host`, its workers round-robin over `worker_hosts`;
    the returned job knows the id discovery gives it. A real framework's job holds its first
    iteration until `start_at` (CLOCK_MONOTONIC) and is not waited for here; the synthetic
    job starts at once and is waited for until its PS listens. With `more_ps_hosts` the
    model is sharded over PS tasks on `ps_host` and those, each pushing its share (synthetic,
    PyTorch gloo and TensorFlow jobs)."""
    if workload is Workload.SYNTHETIC:
        ps_hosts = [ps_host, *more_ps_hosts]
        shards = [
            PsShard(
                host.exec_args(), host.ipv4,
                clean_env(
                    {**tf_launcher_env(tag, shape.workers, len(ps_hosts), index),
                     **shape.declared_env()}
                ),
            )
            for index, host in enumerate(ps_hosts)
        ]  # fmt: skip
        job = start_sharded_job(
            shards, [host.exec_args() for host in worker_hosts], shape.workers,
            shape.model_bytes // len(ps_hosts), shape.iterations, shape.compute_s,
        )  # fmt: skip
        job.job = tf_job_id(tag, shape.workers, len(ps_hosts))
        return job
    if workload is Workload.TF_PS:
        return start_tf_job([ps_host, *more_ps_hosts], worker_hosts, shape, start_at)
    if more_ps_hosts and workload is not Workload.TORCH_GLOO:
        raise ValueError(f"{workload}: only synthetic, gloo PS and TensorFlow jobs are sharded")
    transport = {Workload.TORCH_RPC: "rpc", Workload.TORCH_DDP: "ddp", Workload.HOROVOD_DDP: "ddp"}
    return start_torch_job(
        transport.get(workload, "gloo"), tag, ps_host, worker_hosts, shape, start_at,
        horovod=workload is Workload.HOROVOD_DDP, more_ps_hosts=more_ps_hosts,
    )  # fmt: skip


def start_torch_job(
    transport: str,
    tag: str,
    ps_host: Host,
    worker_hosts: Sequence[Host],
    shape: JobShape,
    start_at: float | None,
    horovod: bool = False,
    more_ps_hosts: Sequence[Host] = (),
) -> RunningJob:
    """testbed/torchjob.py's PS as torchrun's rank 0 on `ps_host`, its workers as ranks 1..n;
    `tag` is the run id. Transport "ddp": every rank, 0 included, trains and all-reduces;
    `horovod`: launched with horovodrun's variables instead of torchrun's. With
    `more_ps_hosts` (gloo): the model sharded over PS ranks 0..K-1, one on `ps_host` and one
    on each of those, launched with --role ps, and the workers (--role trainer) ranks
    K..K+n-1; each shard's entry in the job's `ports` is the master port (its data ports,
    gloo's ephemeral ones, are discovery's to find)."""
    port = next(_master_ports)
    master = f"{ps_host.ipv4}:{port}"
    ps_hosts = [ps_host, *more_ps_hosts]
    shards = len(ps_hosts)
    world = shape.workers + shards
    ddp = transport == "ddp"
    common = ["--hidden", str(hidden_for(shape.model_bytes)), "--iterations",
              str(shape.iterations), "--transport", "gloo" if ddp else transport,
              *(["--shards", str(shards)] if shards > 1 else [])]  # fmt: skip
    device = shape.device.partition(":")[0]
    step = ["--batch", str(TORCH_BATCH[device]), "--compute", str(shape.compute_s),
            "--device", shape.device]  # fmt: skip
    hold = [] if start_at is None else ["--start-at", repr(start_at)]
    hosts = [*ps_hosts, *round_robin(worker_hosts, shape.workers)]
    rendezvous = f"{ps_host.ipv4}:{next(_rendezvous_ports)}"

    def rank_args(rank: int, host: Host) -> list[str]:
        if not ddp:
            return ["ps", *common, "--ifname", host.ifname, *hold] if rank < shards else [
                "worker", *common, "--ifname", host.ifname, *step]  # fmt: skip
        # Horovod gives no master address: its ranks meet at horovodrun's rendezvous
        # server, which the script's own gloo group stands in for here (--master).
        where = ["--master", master, "--rank", str(rank), "--workers", str(shape.workers)]
        return ["ddp", *common, "--ifname", host.ifname, *step, *hold, *where]

    declared = shape.declared_env()

    def env(rank: int, host: Host) -> dict[str, str]:
        if horovod:
            return {**horovodrun_env(rendezvous, rank, world, host.ifname), **declared}
        role = "default" if shards == 1 else "ps" if rank < shards else "trainer"
        return {**torchrun_env(tag, rank, world, master, role), **declared}

    procs = [
        subprocess.Popen(
            host.exec_args(*TORCH_MODULE, *rank_args(rank, host)),
            stdout=subprocess.PIPE, text=True, env=clean_env(env(rank, host)),
        )
        for rank, host in enumerate(hosts)
    ]  # fmt: skip
    job = f"horovod/{rendezvous}" if horovod else f"torch/{tag}"
    if ddp:
        return DdpJob(procs[0], procs[1:], port, job=job)
    return RunningJob(
        procs[0], procs[shards:], port, job=job, more_ps=procs[1:shards],
        ports=(port,) * shards if shards > 1 else (),
    )  # fmt: skip


class DdpJob(RunningJob):
    """Rank 0 stands where the others have their PS: it prints "listening", its own log and
    the summary; every rank's log is the job's ground truth (when its all-reduce was done)."""

    def received(self, timeout: float) -> list[list[float]]:
        logs = [json.loads(w.communicate(timeout=timeout)[0])["received"] for w in self.workers]
        out, _ = self.ps.communicate(timeout=timeout)
        lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        own: list[float] = next((line["received"] for line in lines if "received" in line), [])
        self.summary = next((line for line in reversed(lines) if "iterations" in line), None)
        return [own, *logs]


CHECKOUT = Path(__file__).resolve().parents[2]
DEFAULT_TF_PYTHON = CHECKOUT / ".venv-tf" / "bin" / "python"
_tf_ports = itertools.count(31000)


def tf_python() -> str:
    """The interpreter with TensorFlow (TENSORLIGHTS_TF_PYTHON, else the checkout's .venv-tf)."""
    python = os.environ.get("TENSORLIGHTS_TF_PYTHON") or str(DEFAULT_TF_PYTHON)
    if not Path(python).exists():
        raise RuntimeError(
            f"no TensorFlow interpreter at {python}: run `scripts/setup.sh bench` (it makes "
            ".venv-tf) or set TENSORLIGHTS_TF_PYTHON"
        )
    return python


def start_tf_job(
    ps_hosts: Sequence[Host], worker_hosts: Sequence[Host], shape: JobShape, start_at: float | None
) -> RunningJob:
    """A PS task on each of `ps_hosts` (the model sharded over them), the chief on the first,
    workers round-robin over `worker_hosts`. Fresh ports make each job's cluster spec, hence
    its id, its own."""
    python = tf_python()
    ps_host = ps_hosts[0]
    cluster = {
        "chief": [f"{ps_host.ipv4}:{next(_tf_ports)}"],
        "ps": [f"{host.ipv4}:{next(_tf_ports)}" for host in ps_hosts],
        "worker": [
            f"{host.ipv4}:{next(_tf_ports)}" for host in round_robin(worker_hosts, shape.workers)
        ],
    }
    env = {"PYTHONPATH": str(CHECKOUT), "TF_CPP_MIN_LOG_LEVEL": "2", **shape.declared_env()}
    module = [python, "-m", "tensorlights.testbed.tfjob"]  # its own interpreter
    servers = [
        subprocess.Popen(
            host.exec_args(*module, "server"), stdout=subprocess.DEVNULL,
            env=clean_env({**env, **tf_config_env(cluster, "worker", i)}),
        )
        for i, host in enumerate(round_robin(worker_hosts, shape.workers))
    ]  # fmt: skip
    ps_servers = [
        subprocess.Popen(
            host.exec_args(*module, "server"), stdout=subprocess.DEVNULL,
            env=clean_env({**env, **tf_config_env(cluster, "ps", i)}),
        )
        for i, host in enumerate(ps_hosts)
    ]  # fmt: skip
    hold = [] if start_at is None else ["--start-at", repr(start_at)]
    chief = subprocess.Popen(
        ps_host.exec_args(*module, "chief", "--iterations", str(shape.iterations),
                          "--model-bytes", str(shape.model_bytes), "--compute",
                          str(shape.compute_s), *hold),
        stdout=subprocess.PIPE, text=True,
        env=clean_env({**env, **tf_config_env(cluster, "chief")}),
    )  # fmt: skip
    ports = tuple(int(address.rpartition(":")[2]) for address in cluster["ps"])
    job = TfJob(chief, ports[0], [*ps_servers, *servers], launcher_job_id(tf_config_env(cluster)))
    job.ports = ports
    return job


class TfJob(RunningJob):
    """The chief reports for every worker (its log is the job's ground truth); the servers
    are ended once it has finished, as a TF launcher ends them."""

    def __init__(
        self,
        chief: subprocess.Popen[str],
        port: int,
        servers: list[subprocess.Popen[bytes]],
        job: str,
    ) -> None:
        super().__init__(chief, [], port, job=job)
        self.servers = servers

    def received(self, timeout: float) -> list[list[float]]:
        out, _ = self.ps.communicate(timeout=timeout)
        lines = out.strip().splitlines()
        self.summary = json.loads(lines[-1]) if lines else None
        self._end_servers()
        return [] if self.summary is None else list(self.summary.pop("received"))

    def kill(self) -> None:
        super().kill()
        self._end_servers()

    def _end_servers(self) -> None:
        for proc in self.servers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
