"""A real TensorFlow parameter-server job: tf.distribute.ParameterServerStrategy with TF_CONFIG.

TensorFlow lives in its own virtualenv (`scripts/setup.sh bench` makes .venv-tf with the
package index's tensorflow-cpu; TENSORLIGHTS_TF_PYTHON names another interpreter): it is
large, and nothing else of ours needs it. This module's processes run under that
interpreter with the checkout on PYTHONPATH.

    python -m tensorlights.testbed.tfjob server      # ps or worker: a tf.distribute.Server
    python -m tensorlights.testbed.tfjob chief --iterations 25 --model-bytes 4000000 \
        --compute 0.15                               # the coordinator: runs the training

Every process gets TF_CONFIG naming the whole cluster (chief, ps, workers) and its own task,
as TensorFlow's launchers write it; TensorLights finds the PS from its TF_CONFIG alone. This
module imports only the standard library and TensorFlow; testbed/workloads.py launches it. The
variables (a dense layer of --model-bytes of float32) live on the PS; with several PS tasks in
TF_CONFIG, as one variable per PS task (the strategy places them round-robin), so each PS
holds and pushes an equal shard and a step waits for the last one. Each iteration the chief
schedules one step per worker (ClusterCoordinator) and waits for all of them (a barrier, as
synchronous PS training has): a step reads every variable from the PS (the PS's push, over
gRPC), then takes its batch from a per-worker tf.data pipeline that sleeps --compute (the
accelerator's step: no CPU contention on a 2-core host), computes the gradient and applies it
to the PS's variables. Each step returns the wall-clock time it had the variables; the chief
prints {"received": [[...] per worker slot]} (each iteration's times sorted: which worker ran
which step is not visible to the chief) and the summary line psjob's PS prints.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _resolver() -> Any:
    import tensorflow as tf

    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


def run_server() -> int:
    import tensorflow as tf

    resolver = _resolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol="grpc", start=True,
    )  # fmt: skip
    server.join()
    return 0


def run_chief(args: argparse.Namespace) -> int:
    import tensorflow as tf

    resolver = _resolver()
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    # One variable per PS task: the strategy places variables round-robin over the PS tasks,
    # so a TF_CONFIG with several `ps` entries shards the model evenly over them.
    shards = len(resolver.cluster_spec().as_dict()["ps"])
    width = max(16, int((args.model_bytes / 4 / shards) ** 0.5))
    with strategy.scope():
        variables = [
            tf.Variable(tf.random.normal([width, width], stddev=0.01), name=f"weights{i}")
            for i in range(shards)
        ]
    compute_us = int(args.compute * 1_000_000)
    # SleepDataset, a C++ op the worker runs (a py_function would need the chief's Python);
    # tf.data.experimental.sleep until TF 2.x, now only under this internal path.
    from tensorflow.python.data.experimental.ops.testing import sleep

    def dataset_fn() -> Any:
        batch = (tf.random.normal([8, width]), tf.random.normal([8, width]))
        options = tf.data.Options()
        options.experimental_optimization.inject_prefetch = False  # compute follows the read
        dataset = tf.data.Dataset.from_tensors(batch).repeat()
        return dataset.apply(sleep(compute_us)).with_options(options)

    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function  # type: ignore[untyped-decorator]
    def step(iterator: Any) -> Any:
        current = [v.read_value() for v in variables]  # from every PS: their pushes
        with tf.control_dependencies(current):
            had_at = tf.timestamp()  # once the last shard is in
            inputs, labels = next(iterator)  # the accelerator's step follows the read
        with tf.GradientTape() as tape:  # on the copies read once: one push per step
            tape.watch(current)
            outputs = sum(tf.matmul(inputs, shard) for shard in current)
            loss = tf.reduce_mean(tf.square(outputs - labels))
        for variable, gradient in zip(variables, tape.gradient(loss, current), strict=True):
            variable.assign_sub(0.01 * gradient)  # SGD, on each PS
        return had_at

    print(f"listening {resolver.cluster_spec().as_dict()['ps'][0].rpartition(':')[2]}", flush=True)
    if args.start_at is not None:  # a benchmark launched it early: start-up is over by then
        time.sleep(max(0.0, args.start_at - time.monotonic()))
    listening_at = time.monotonic()
    offset = time.time() - time.monotonic()  # tf.timestamp() is wall-clock time
    received: list[list[float]] = [[] for _ in range(workers)]
    for _ in range(args.iterations):
        steps = [coordinator.schedule(step, args=(iterator,)) for _ in range(workers)]
        coordinator.join()
        for slot, had_at in enumerate(sorted(float(s.fetch()) for s in steps)):
            received[slot].append(had_at - offset)
    finished_at = time.monotonic()
    summary = {
        "iterations": args.iterations,
        "listening_at": listening_at,
        "finished_at": finished_at,
        "model_bytes": width * width * 4 * shards,
        "errors": [],
        "received": received,
    }
    print(json.dumps(summary), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    sub.add_parser("server", help="a PS or worker task (TF_CONFIG says which)")
    chief = sub.add_parser("chief", help="the coordinator")
    chief.add_argument("--iterations", type=int, default=20)
    chief.add_argument("--model-bytes", type=int, default=4_000_000)
    chief.add_argument("--compute", type=float, default=0.15, metavar="S")
    chief.add_argument(
        "--start-at", type=float, metavar="T", help="first iteration at CLOCK_MONOTONIC T"
    )
    args = parser.parse_args(argv)
    return run_server() if args.role == "server" else run_chief(args)


if __name__ == "__main__":
    sys.exit(main())
