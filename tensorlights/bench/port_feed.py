"""Feeds the `tc` baselines the ports discovery finds (run inside the PS host's namespace).

The prototype's launcher fixed each PS's port; real frameworks (gloo, TensorPipe, TF's gRPC)
send from ephemeral ports. So that the baselines classify the same traffic TensorLights does,
this process scans the host with TensorLights' discovery every --interval and prints one JSON
line {"job": ID, "ports": [...]} whenever a job's local ports change (listening and connected).

    python -m tensorlights.bench.port_feed [--interval 0.25] [--torch-ps-ranks 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.trust import TRUST_ANY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between scans")
    parser.add_argument(
        "--torch-ps-ranks", type=int, nargs="*", default=[0], help="torchrun ranks that are PS"
    )
    args = parser.parse_args(argv)
    # One tenant (root runs every job), as the agent in the benchmark is told.
    rules = DiscoveryRules(torch_ps_ranks=frozenset(args.torch_ps_ranks), trust=TRUST_ANY)
    known: dict[str, frozenset[int]] = {}
    with Scanner(rules) as scanner:
        while True:
            ports: dict[str, frozenset[int]] = {}
            for task in scanner.scan().tasks:
                ports[task.job] = ports.get(task.job, frozenset()) | task.local_ports
            for job, now in ports.items():
                if now - known.get(job, frozenset()):
                    known[job] = known.get(job, frozenset()) | now
                    print(json.dumps({"job": job, "ports": sorted(known[job])}), flush=True)
            time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
