#!/usr/bin/env python3
"""How fast a pod change reaches the controller's Kubernetes source through its watch, against
the API emulator (tensorlights/testbed/kube_emulator.py; no real API server runs here).

--pods Kubeflow pods are listed once; then --changes times a pod is added or removed, and the
time from the change to the source's wake-up and to `jobs()` showing it is recorded.

    .venv/bin/python scripts/bench_kube_watch.py [--pods 1000] [--changes 200]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

from tensorlights.controller.kubernetes import KubernetesPods
from tensorlights.testbed.kube_emulator import KubeEmulator, kubeflow_pod


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=200)
    args = parser.parse_args()
    base = [kubeflow_pod("ml", f"job{i // 4}", "PS", i % 4, f"gpu{i}") for i in range(args.pods)]
    extra = kubeflow_pod("ml", "extra", "PS", 0, "gpu-extra")
    woken = threading.Event()
    with KubeEmulator() as api:
        api.pods = base
        source = KubernetesPods(api.url)
        source.subscribe(woken.set)
        start = time.perf_counter()
        jobs = len(source.jobs())
        listed = time.perf_counter() - start
        wake_ms, seen_ms = [], []
        for i in range(args.changes):
            adding = i % 2 == 0
            woken.clear()
            start = time.perf_counter()
            api.pods = [*base, extra] if adding else base
            if not woken.wait(5):
                raise RuntimeError("no watch event within 5 s")
            wake_ms.append((time.perf_counter() - start) * 1000)
            while ("ml/extra" in {job.name for job in source.jobs()}) != adding:
                time.sleep(0.0005)
            seen_ms.append((time.perf_counter() - start) * 1000)
        source.close()
    print(
        f"{args.pods} pods ({jobs} jobs) listed in {listed * 1000:.0f} ms; "
        f"relists: {source.relists}"
    )
    for name, values in (("wake-up", wake_ms), ("jobs() shows it", seen_ms)):
        values.sort()
        p99 = values[int(0.99 * (len(values) - 1))]
        print(f"{name}: median {statistics.median(values):.1f} ms, p99 {p99:.1f} ms")


if __name__ == "__main__":
    main()
