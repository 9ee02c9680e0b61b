#!/usr/bin/env python3
"""Discovery cost and detection latency, with real processes holding real loopback sockets.

For 100, 1,000 and 5,000 TCP sockets on the host (a quarter held by 8 PS processes identified
by TF_CONFIG, the rest by 8 plain processes) it measures:
  * scan, nothing new: the steady state between refreshes (descriptor counts unchanged,
    socket dump skipped);
  * scan re-reading every socket: what a scan costs once per socket_refresh_s (1 s), or
    whenever a PS opens a socket: every PS descriptor read, one inet_diag dump per family;
  * sweep scan: a scan that also re-checks every process (once per full_sweep_s, 5 s default);
  * first scan: a fresh scanner that inspects every process;
  * for reference, pyroute2's DiagSocket dumping the same namespace's TCP sockets.
Then the detection latency: a scanner polling every --interval while new PS processes start;
latency = first snapshot holding the PS's listening port - the moment it called listen().

    .venv/bin/python scripts/bench_discovery.py [--scans 200] [--interval 0.25]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable

from pyroute2 import DiagSocket

from tensorlights.discovery.rules import DiscoveryRules
from tensorlights.discovery.scanner import Scanner
from tensorlights.discovery.sockdiag import TRAFFIC_STATES, SockDiag
from tensorlights.discovery.trust import TRUST_ANY
from tensorlights.model import DiscoverySnapshot
from tensorlights.testbed.socket_holder import Holder, start_holder

TRAFFIC_MASK = sum(1 << state for state in TRAFFIC_STATES)
PS_PROCESSES = 8
BELIEVE_ALL = DiscoveryRules(trust=TRUST_ANY)
"""The holders are root's processes naming their own jobs (one tenant)."""
OTHER_PROCESSES = 8


def tf_env(job: int) -> dict[str, str]:
    cluster = {"ps": [f"ps{job}:1"], "worker": [f"w{job}:1"]}
    return {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})}


def start_fleet(sockets: int) -> list[Holder]:
    """Processes holding about `sockets` TCP sockets, a quarter of them in PS processes."""
    fleet: list[Holder] = []
    ps_share = sockets // 4
    for count, total, env_of in (
        (PS_PROCESSES, ps_share, tf_env),
        (OTHER_PROCESSES, sockets - ps_share, lambda _: {}),
    ):
        for i in range(count):
            per_process = total // count
            connections = max(0, (per_process - 1) // 2)  # 1 listener + 2 ends per connection
            fleet.append(start_holder(env_of(i), "--connections", str(connections)))
    return fleet


def millis(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered) * 1e3:.2f} / {p99 * 1e3:.2f}"


def timed(action: Callable[[], object], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return samples


def tcp_socket_count() -> int:
    diag = SockDiag()
    try:
        return len(diag.tcp_sockets())
    finally:
        diag.close()


def measure_scans(sockets: int, scans: int) -> list[str]:
    fleet = start_fleet(sockets)
    try:
        present = tcp_socket_count()
        first = []
        for _ in range(5):
            with Scanner(BELIEVE_ALL) as fresh:
                start = time.perf_counter()
                snapshot = fresh.scan()
                first.append(time.perf_counter() - start)
        found = sum(len(t.connections) + len(t.listen_ports) for t in snapshot.tasks)
        with Scanner(BELIEVE_ALL, full_sweep_s=3600) as scanner:
            scanner.scan()
            incremental = timed(scanner.scan, scans)
        with Scanner(
            BELIEVE_ALL, full_sweep_s=3600, socket_refresh_s=0, dump_refresh_s=0
        ) as refresher:
            refresher.scan()
            refreshing = timed(refresher.scan, scans)
        with Scanner(BELIEVE_ALL, full_sweep_s=0) as sweeper:
            sweeper.scan()
            sweep = timed(sweeper.scan, max(20, scans // 10))
        diag = DiagSocket()
        diag.bind()
        try:
            reference = timed(
                lambda: [
                    list(diag.get_sock_stats(family=family, states=TRAFFIC_MASK))
                    for family in (socket.AF_INET, socket.AF_INET6)
                ],
                20,
            )
        finally:
            diag.close()
        return [
            f"{present}",
            f"{len(snapshot.tasks)} / {found}",
            millis(incremental),
            millis(refreshing),
            millis(sweep),
            millis(first),
            millis(reference),
        ]
    finally:
        for holder in fleet:
            holder.stop()


def measure_detection(interval: float, trials: int) -> list[float]:
    latencies: list[float] = []
    seen: dict[int, float] = {}
    stop = threading.Event()

    def poll() -> None:
        with Scanner(BELIEVE_ALL) as scanner:
            while not stop.is_set():
                snapshot: DiscoverySnapshot = scanner.scan()
                now = time.monotonic()
                for task in snapshot.tasks:
                    for port in task.listen_ports:
                        seen.setdefault(port, now)
                stop.wait(interval)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        for trial in range(trials):
            holder = start_holder(tf_env(1000 + trial))
            try:
                port = holder.report["listen_port"]
                deadline = time.monotonic() + 5
                while port not in seen and time.monotonic() < deadline:
                    time.sleep(0.005)
                latencies.append(seen.get(port, float("inf")) - holder.report["listened_at"])
            finally:
                holder.stop()
            seen.clear()
    finally:
        stop.set()
        poller.join()
    return latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scans", type=int, default=200)
    parser.add_argument("--sockets", default="100,1000,5000")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--trials", type=int, default=20)
    args = parser.parse_args()

    print(
        "| TCP sockets on host | PS tasks / PS sockets found | scan, nothing new: median / p99 ms"
        " | scan re-reading every socket (once per 1 s): median / p99 ms"
        " | 5 s sweep scan median / p99 ms | first scan median / p99 ms"
        " | pyroute2 DiagSocket dump alone: median / p99 ms |"
    )
    print("|---|---|---|---|---|---|---|")
    for sockets in (int(n) for n in args.sockets.split(",")):
        print("| " + " | ".join(measure_scans(sockets, args.scans)) + " |", flush=True)
    latencies = measure_detection(args.interval, args.trials)
    print(
        f"\nDetection latency, listen() -> port known, scanning every {args.interval * 1e3:.0f} ms"
        f" ({len(latencies)} PS starts): median {statistics.median(latencies) * 1e3:.0f} ms, "
        f"max {max(latencies) * 1e3:.0f} ms"
    )


if __name__ == "__main__":
    main()
