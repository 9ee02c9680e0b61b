"""Real PyTorch jobs: parameter servers over gloo point-to-point or torch.distributed.rpc
(TensorPipe), and data-parallel training (DDP) whose ranks all-reduce their gradients.

    pip install -e '.[torch]'        # torch==2.13.0 exactly: a local CPU wheel on our machines
    python -m tensorlights.testbed.torchjob ps --master ADDR:PORT --workers 2 --hidden 512
    python -m tensorlights.testbed.torchjob worker --master ADDR:PORT --rank 1 --workers 2
    python -m tensorlights.testbed.torchjob ddp --master ADDR:PORT --rank 0 --workers 3
    python -m tensorlights.testbed.torchjob ps --shards 2 --rank 1 --master ADDR:PORT --workers 2

or launched as torchrun launches a script: RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT in
the environment stand for --rank, --workers + --shards (ddp: --workers is WORLD_SIZE - 1,
the ranks other than this one's peer 0) and --master.

ddp: every rank wraps the same MLP in DistributedDataParallel (gloo, CPU): forward on a random
batch, the rest of --compute waited out (an accelerator's step), then backward, during which
DDP all-reduces the gradients in buckets (gloo's ring over one connection per pair of ranks,
ephemeral ports); backward returns once they are averaged, then an SGD step. Each rank notes
when its last bucket's all-reduce was done (CLOCK_MONOTONIC, in gloo's thread as it completes,
through a comm hook that is DDP's default all-reduce) and prints {"received": [...]}; rank 0 also
prints "listening PORT" once the group is up and the summary, as the PS does.

Rank 0 is the PS: it holds a real model (an MLP, --hidden sets its size), and every
iteration sends all its parameters to every worker at once, receives every worker's gradient
(the barrier), averages them and takes an SGD step. With --shards K (gloo) the model is
sharded over K PS ranks, 0..K-1 (as a launcher places them: one per PS host, each launched
with torchrun's --role ps, ROLE_NAME), each holding an equal slice of the flat parameters;
the workers are ranks K..K+n-1 and take every slice each iteration. Workers note when they
had the parameters (CLOCK_MONOTONIC; sharded, also when each slice came in), run forward and
backward on a random batch (--batch), and send their gradient back (sharded, each slice to
its PS rank). Two transports:
  gloo  torch.distributed isend/recv of the flat parameter vector (gloo's pairs, ephemeral
        data ports);
  rpc   torch.distributed.rpc: the PS calls `_rpc_step(parameters)` on every worker with
        rpc_async and waits for the gradients it returns; TensorPipe frames each message
        (several writes per push).
--compute S stands for an accelerator's step: the worker runs the real forward and backward,
then waits out the rest of S (a GPU host's CPU idles while its GPU computes; on two shared
cores, CPU-bound compute would make the jobs contend for the CPU, not for the link). Without
it the step takes what the CPU takes. --device cuda runs the model on the GPU: the
parameters go to it, the gradient comes back to the CPU for gloo or RPC (the PS keeps its
copy on the CPU), as a PS job's GPU workers do; DDP ranks keep model and buckets on the GPU
(gloo all-reduces CUDA tensors through host memory). Each worker's log then also holds how
long each real pass took ("passes", seconds, the GPU synchronised; DDP: the forward, as
its backward overlaps the all-reduce).

Same outputs as the synthetic job (tensorlights.testbed.psjob): the PS prints "listening PORT"
once the group is up and a JSON summary (listening_at, finished_at) at the end; each worker
prints {"received": [...]}.

Gotchas measured on these machines, handled here or by the caller:
  * the hostname resolves to 127.0.0.1: set GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME to the
    host's interface (the caller passes --ifname; exported before torch starts);
  * gloo's and TensorPipe's data connections use ephemeral ports: TensorLights finds them by
    process (the PS is identified by its launcher's variables), never by configuration;
  * TensorPipe would use shared memory between namespaces of one kernel and send nothing over
    the network unless forced to _transports=['uv'], _channels=['basic'].
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

_received: list[float] = []
"""A worker's receive times (rpc: filled by _rpc_step, which runs in the worker process)."""
_worker: dict[str, Any] = {}


def _model(hidden: int) -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10),
    )


def model_bytes(hidden: int) -> int:
    """What one push carries: every float32 parameter of the model."""
    return 4 * (2 * (hidden * hidden + hidden) + hidden * 10 + 10)


def hidden_for(target_bytes: int) -> int:
    """The MLP width whose parameters come closest to `target_bytes`."""
    hidden = max(16, int((target_bytes / 8) ** 0.5))
    while model_bytes(hidden + 1) <= target_bytes:
        hidden += 1
    while hidden > 16 and model_bytes(hidden) > target_bytes:
        hidden -= 1
    return hidden


_passes: list[float] = []
"""A worker's real forward-and-backward times (seconds; the GPU synchronised)."""


def _gradient(model: Any, flat: Any, batch: int, hidden: int, compute_s: float) -> Any:
    """One real forward and backward pass at `flat` on the model's device; the gradient on
    the CPU; then the rest of `compute_s` waited out."""
    import torch

    began = time.monotonic()
    device = next(model.parameters()).device
    torch.nn.utils.vector_to_parameters(flat.to(device), model.parameters())
    model.zero_grad()
    inputs = torch.randn(batch, hidden, device=device)
    labels = torch.randint(0, 10, (batch,), device=device)
    loss = torch.nn.functional.cross_entropy(model(inputs), labels)
    loss.backward()  # type: ignore[no-untyped-call]
    grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).cpu()  # synchronises
    _passes.append(time.monotonic() - began)
    rest = compute_s - (time.monotonic() - began)
    if rest > 0:
        time.sleep(rest)
    return grad


def _rpc_step(flat: Any) -> Any:
    """Runs on a worker, called by the PS over RPC: the parameters arrived."""
    _received.append(time.monotonic())
    w = _worker
    return _gradient(w["model"], flat, w["batch"], w["hidden"], w["compute"])


def _wait_until(start_at: float | None) -> float:
    """Hold the first iteration until `start_at` (CLOCK_MONOTONIC), when given: a benchmark
    launches jobs early so that each framework's start-up is over by its arrival time."""
    if start_at is not None:
        time.sleep(max(0.0, start_at - time.monotonic()))
    return time.monotonic()


def _summary(args: argparse.Namespace, listening_at: float, finished_at: float | None) -> str:
    return json.dumps(
        {
            "iterations": args.iterations,
            "seconds": (finished_at or time.monotonic()) - listening_at,
            "listening_at": listening_at,
            "finished_at": finished_at,
            "model_bytes": model_bytes(args.hidden),
            "errors": [],
        }
    )


def _init_gloo(args: argparse.Namespace, rank: int) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://{args.master}", rank=rank, world_size=_world(args)
    )


def _world(args: argparse.Namespace) -> int:
    """Every rank: the PS shards (one PS: rank 0) and the workers."""
    return int(args.shards) + int(args.workers)


def _shard_range(args: argparse.Namespace, shard: int, total: int) -> tuple[int, int]:
    """Which slice of the flat parameters (of `total` values) PS shard `shard` holds."""
    return shard * total // args.shards, (shard + 1) * total // args.shards


def _init_rpc(args: argparse.Namespace, rank: int) -> None:
    from torch.distributed import rpc

    options = rpc.TensorPipeRpcBackendOptions(
        init_method=f"tcp://{args.master}",
        num_worker_threads=4,
        rpc_timeout=600,
        _transports=["uv"],
        _channels=["basic"],
    )
    name = "ps" if rank == 0 else f"worker{rank}"
    rpc.init_rpc(  # type: ignore[no-untyped-call]
        name, rank=rank, world_size=args.workers + 1, rpc_backend_options=options
    )


def run_ps(args: argparse.Namespace) -> int:
    import torch

    (_init_rpc if args.transport == "rpc" else _init_gloo)(args, args.rank)
    print(f"listening {args.master.rpartition(':')[2]}", flush=True)
    listening_at = _wait_until(args.start_at)
    model = _model(args.hidden)
    whole = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    low, high = _shard_range(args, args.rank, whole.numel())
    flat = whole[low:high].clone()  # this shard's slice (one PS: all of it)
    finished_at = None
    for _ in range(args.iterations):
        grads = _ps_round_rpc(args, flat) if args.transport == "rpc" else _ps_round_gloo(args, flat)
        flat -= args.lr * torch.stack(grads).mean(dim=0)
        finished_at = time.monotonic()
    print(_summary(args, listening_at, finished_at), flush=True)
    _shutdown(args)
    return 0


def _ps_round_gloo(args: argparse.Namespace, flat: Any) -> list[Any]:
    import torch
    import torch.distributed as dist

    workers = range(args.shards, _world(args))
    sends = [dist.isend(flat, dst=w) for w in workers]  # all at once
    for request in sends:
        if request is not None:  # None only for a rank outside the group
            request.wait()
    grads = [torch.empty_like(flat) for _ in workers]
    for grad, w in zip(grads, workers, strict=True):
        dist.recv(grad, src=w)
    return grads


def _ps_round_rpc(args: argparse.Namespace, flat: Any) -> list[Any]:
    from torch.distributed import rpc

    calls = [rpc.rpc_async(f"worker{w + 1}", _rpc_step, args=(flat,)) for w in range(args.workers)]
    return [call.wait() for call in calls]


def run_ddp(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    _init_gloo(args, args.rank)
    model = DistributedDataParallel(_model(args.hidden).to(args.device))
    # DDP's own all-reduce (allreduce_hook is its default, as a hook), timed where gloo
    # completes it: after backward returns, the rank's CPU (shared, contended) adds 10-50 ms
    # of noise to when the network was done.
    bucket_done = [0.0]

    def stamp(fut: Any) -> Any:
        bucket_done[0] = time.monotonic()
        return fut.value()

    # A lambda: DDP refuses a hook whose parameters are annotated other than with its types.
    model.register_comm_hook(None, lambda state, bucket: allreduce_hook(state, bucket).then(stamp))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    if args.rank == 0:
        print(f"listening {args.master.rpartition(':')[2]}", flush=True)
    listening_at = _wait_until(args.start_at)
    reduced: list[float] = []
    for _ in range(args.iterations):
        began = time.monotonic()
        inputs = torch.randn(args.batch, args.hidden, device=args.device)
        labels = torch.randint(0, 10, (args.batch,), device=args.device)
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.item()  # the forward done (on a GPU: synchronised)
        _passes.append(time.monotonic() - began)
        time.sleep(max(0.0, args.compute - (time.monotonic() - began)))
        loss.backward()  # type: ignore[no-untyped-call]
        reduced.append(bucket_done[0])  # the last bucket's: every gradient averaged
        optimizer.step()
        optimizer.zero_grad()
    print(json.dumps({"received": reduced, "passes": _passes}), flush=True)
    if args.rank == 0:
        print(_summary(args, listening_at, reduced[-1] if reduced else None), flush=True)
    dist.destroy_process_group()
    return 0


def _shutdown(args: argparse.Namespace) -> None:
    if args.transport == "rpc":
        from torch.distributed import rpc

        rpc.shutdown()  # waits for every rank
    else:
        import torch.distributed as dist

        dist.destroy_process_group()


def run_worker(args: argparse.Namespace) -> int:
    import torch

    model = _model(args.hidden).to(args.device)
    if args.transport == "rpc":
        _worker.update(model=model, batch=args.batch, hidden=args.hidden, compute=args.compute)
        _init_rpc(args, args.rank)
        _shutdown(args)  # serves the PS's calls until every rank is done
        print(json.dumps({"received": _received, "passes": _passes}), flush=True)
        return 0
    import torch.distributed as dist

    _init_gloo(args, args.rank)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().cpu().clone()
    slices = [_shard_range(args, shard, flat.numel()) for shard in range(args.shards)]
    shards: list[list[float]] = []  # sharded: when each shard's slice was in, per iteration
    for _ in range(args.iterations):
        # Every shard pushes at once: take them as they come (a view per slice).
        recvs = [dist.irecv(flat[low:high], src=shard) for shard, (low, high) in enumerate(slices)]
        arrived = []
        for request in recvs:
            if request is not None:  # None only for a rank outside the group
                request.wait()
            arrived.append(time.monotonic())
        _received.append(arrived[-1])
        shards.append(arrived)
        grad = _gradient(model, flat, args.batch, args.hidden, args.compute)
        sends = [dist.isend(grad[low:high], dst=shard) for shard, (low, high) in enumerate(slices)]
        for request in sends:
            if request is not None:
                request.wait()
    log: dict[str, Any] = {"received": _received, "passes": _passes}
    if args.shards > 1:
        log["shards"] = shards
    print(json.dumps(log), flush=True)
    _shutdown(args)
    return 0


def _torchrun_defaults() -> dict[str, Any]:
    """What torchrun's variables say, where it set them."""
    env = os.environ
    defaults: dict[str, Any] = {}
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        defaults["master"] = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
    if env.get("WORLD_SIZE", "").isdigit():
        defaults["world"] = int(env["WORLD_SIZE"])
    if env.get("RANK", "").isdigit():
        defaults["rank"] = int(env["RANK"])
    return defaults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    defaults = _torchrun_defaults()
    for role in ("ps", "worker", "ddp"):
        p = sub.add_parser(role)
        p.add_argument("--master", metavar="ADDR:PORT", help="the PS's address (MASTER_ADDR/PORT)")
        p.add_argument("--workers", type=int, help="workers (WORLD_SIZE less the PS shards)")
        p.add_argument("--hidden", type=int, default=512, help="MLP width (model size)")
        p.add_argument("--iterations", type=int, default=20)
        p.add_argument("--ifname", default="eth0", help="GLOO_SOCKET_IFNAME / TP_SOCKET_IFNAME")
        p.add_argument("--transport", choices=("gloo", "rpc"), default="gloo")
        if role == "ddp":
            p.set_defaults(shards=1)
        else:
            p.add_argument(
                "--shards", type=int, default=1, metavar="K",
                help="PS ranks the model is sharded over, 0..K-1 (gloo only)",
            )  # fmt: skip
        p.set_defaults(**{"world": None, **defaults})
    for role in ("ps", "ddp"):
        sub.choices[role].add_argument("--lr", type=float, default=0.01)
        sub.choices[role].add_argument(
            "--start-at", type=float, metavar="T", help="first iteration at CLOCK_MONOTONIC T"
        )
    sub.choices["ps"].add_argument(
        "--rank", type=int, default=defaults.get("rank", 0),
        help="this PS shard's rank, 0..K-1 (RANK)",
    )  # fmt: skip
    for role in ("worker", "ddp"):
        worker = sub.choices[role]
        worker.add_argument("--rank", type=int, help="this worker's rank (RANK)")
        worker.add_argument(
            "--batch", type=int, default=4096, help="samples per step: the real compute"
        )
        worker.add_argument(
            "--compute", type=float, default=0.0, metavar="S",
            help="an accelerator's step time: the real pass, then the rest of S waited out",
        )  # fmt: skip
        worker.add_argument(
            "--device", default="cpu", metavar="DEV",
            help="where the model computes: cpu, or cuda (cuda:N) for the real pass on a GPU",
        )  # fmt: skip
        worker.set_defaults(**defaults)
    args = parser.parse_args(argv)
    # Errors in a role's arguments print that role's usage, not the top-level one.
    role_parser = sub.choices[args.role]
    if args.workers is None and args.world is not None:
        args.workers = args.world - args.shards  # ddp: the ranks other than 0
    if args.shards < 1 or (args.shards > 1 and args.transport != "gloo"):
        role_parser.error("--shards: 1 or more, and more than 1 only with --transport gloo")
    if args.role == "ps" and not 0 <= args.rank < args.shards:
        role_parser.error(f"--rank {args.rank}: a PS shard's rank is 0..{args.shards - 1}")
    missing = [
        flag for flag, value in (("--master", args.master), ("--workers", args.workers))
        if value is None
    ] + (["--rank"] if args.role != "ps" and args.rank is None else [])  # fmt: skip
    if missing:
        role_parser.error(f"{', '.join(missing)} required (or torchrun's variables)")
    os.environ["GLOO_SOCKET_IFNAME"] = os.environ["TP_SOCKET_IFNAME"] = args.ifname
    try:
        import torch
    except ImportError:
        print(
            "PyTorch is not installed: pip install -e '.[torch]' (torch==2.13.0)", file=sys.stderr
        )
        return 2
    if getattr(args, "device", "cpu").startswith("cuda") and not torch.cuda.is_available():
        print(f"--device {args.device}: this PyTorch sees no CUDA device", file=sys.stderr)
        return 2
    return {"ps": run_ps, "worker": run_worker, "ddp": run_ddp}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
