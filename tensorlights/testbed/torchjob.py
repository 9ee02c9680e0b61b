"""A real PyTorch parameter-server job (gloo point-to-point), the optional extra workload.

    pip install -e '.[torch]'        # torch==2.13.0 exactly: a local CPU wheel on our machines
    python -m tensorlights.testbed.torchjob ps --master ADDR:PORT --workers 2 --hidden 512
    python -m tensorlights.testbed.torchjob worker --master ADDR:PORT --rank 1 --workers 2

Rank 0 is the PS: it holds a real model (an MLP, --hidden sets its size), and every
iteration sends all its parameters to every worker at once (isend), receives every worker's
gradient (the barrier), averages them and takes an SGD step. Workers receive the parameters,
note when they had them all (CLOCK_MONOTONIC), run forward and backward on a random batch
(--batch sets the compute), and send their gradient back. Same outputs as the synthetic job
(tensorlights.testbed.psjob): the PS prints "listening PORT" once the group is up and a JSON
summary (listening_at, finished_at) at the end; each worker prints {"received": [...]}.

Gotchas measured on these machines, handled here or by the caller:
  * the hostname resolves to 127.0.0.1: set GLOO_SOCKET_IFNAME to the host's interface
    (the caller passes --ifname; it is exported before torch.distributed starts);
  * gloo's data connections use ephemeral ports: TensorLights finds them by process (the
    PS is identified by its launcher's TF_CONFIG), never by configuration;
  * torch.distributed.rpc's TensorPipe would use shared memory between namespaces of one
    kernel and send nothing over the network unless forced to _transports=['uv'],
    _channels=['basic']: plain gloo send/recv avoids that.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


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


def _init(args: argparse.Namespace, rank: int) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = args.ifname
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}",
        rank=rank,
        world_size=args.workers + 1,
    )


def run_ps(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    _init(args, 0)
    listening_at = time.monotonic()
    print(f"listening {args.master.rpartition(':')[2]}", flush=True)
    model = _model(args.hidden)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    grads = [torch.empty_like(flat) for _ in range(args.workers)]
    finished_at = None
    for _ in range(args.iterations):
        sends = [dist.isend(flat, dst=w + 1) for w in range(args.workers)]  # all at once
        for request in sends:
            if request is not None:  # None only for a rank outside the group
                request.wait()
        for w in range(args.workers):
            dist.recv(grads[w], src=w + 1)
        flat -= args.lr * torch.stack(grads).mean(dim=0)
        finished_at = time.monotonic()
    summary = {
        "iterations": args.iterations,
        "listening_at": listening_at,
        "finished_at": finished_at,
        "model_bytes": flat.numel() * 4,
        "errors": [],
    }
    print(json.dumps(summary), flush=True)
    dist.destroy_process_group()
    return 0


def run_worker(args: argparse.Namespace) -> int:
    import torch
    import torch.distributed as dist

    _init(args, args.rank)
    model = _model(args.hidden)
    flat = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    received = []
    for _ in range(args.iterations):
        dist.recv(flat, src=0)
        received.append(time.monotonic())
        torch.nn.utils.vector_to_parameters(flat, model.parameters())
        model.zero_grad()
        inputs = torch.randn(args.batch, args.hidden)
        labels = torch.randint(0, 10, (args.batch,))
        loss = torch.nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()  # type: ignore[no-untyped-call]
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.send(grad, dst=0)
    print(json.dumps({"received": received}), flush=True)
    dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("ps", "worker"):
        p = sub.add_parser(role)
        p.add_argument("--master", required=True, metavar="ADDR:PORT", help="the PS's address")
        p.add_argument("--workers", type=int, required=True)
        p.add_argument("--hidden", type=int, default=512, help="MLP width (model size)")
        p.add_argument("--iterations", type=int, default=20)
        p.add_argument("--ifname", default="eth0", help="GLOO_SOCKET_IFNAME")
    sub.choices["ps"].add_argument("--lr", type=float, default=0.01)
    sub.choices["worker"].add_argument("--rank", type=int, required=True)
    sub.choices["worker"].add_argument(
        "--batch", type=int, default=4096, help="samples per step: sets the compute time"
    )
    args = parser.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError:
        print(
            "PyTorch is not installed: pip install -e '.[torch]' (torch==2.13.0)", file=sys.stderr
        )
        return 2
    return run_ps(args) if args.role == "ps" else run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
