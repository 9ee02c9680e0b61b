"""An emulated cluster on one machine: hosts as network namespaces joined through a bridge that
lives in a namespace of its own, always torn down -- even when the runner is SIGKILLed.

    with cluster(["ps0", "w0", "w1"]) as c:
        c.hosts["ps0"].exec_args("python", ...)        # run something on a host
        c.hosts["w0"].ipv4                              # 10.78.0.2

Each host has one interface, `eth0`, on the bridge, with 10.78.0.N/24 and fd00:78::N/64;
offloads are off on both ends of every veth (packet-accurate shaping) and TCP congestion
control is set per route (the sysctl cannot be set inside a namespace). Names carry a random
run id. Its reaper (netns.start_reaper) removes the cluster even when the runner is killed.

    python -m tensorlights.testbed.cluster gc     # remove clusters whose runner is gone
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from tensorlights.testbed.netns import (
    NS_PREFIX,
    Host,
    destroy,
    disable_offloads,
    in_ns,
    new_run_id,
    run,
    start_reaper,
    stop_reaper,
)
from tensorlights.testbed.netns import leftover_namespaces as cluster_namespaces

BRIDGE = "br0"
IFNAME = "eth0"
SUBNET4 = "10.78.0"
SUBNET6 = "fd00:78:"
MAX_HOSTS = 200


@dataclass
class Cluster:
    run_id: str
    bridge_ns: str
    hosts: dict[str, Host] = field(default_factory=dict)
    namespaces: list[str] = field(default_factory=list)
    reaper: subprocess.Popen[bytes] | None = None


def create_cluster(
    names: Sequence[str], offloads_off: bool = True, congctl: str = "cubic"
) -> Cluster:
    if not 1 <= len(names) <= MAX_HOSTS or len(set(names)) != len(names):
        raise ValueError(f"give 1-{MAX_HOSTS} distinct host names")
    run_id = new_run_id()
    cluster = Cluster(run_id, f"{NS_PREFIX}-{run_id}-br")
    cluster.reaper = start_reaper(run_id)  # first: from here on, it cleans up
    try:
        _add_namespace(cluster, cluster.bridge_ns)
        run(in_ns(cluster.bridge_ns, "ip", "link", "add", BRIDGE, "type", "bridge"))
        run(in_ns(cluster.bridge_ns, "ip", "link", "set", BRIDGE, "up"))
        for index, name in enumerate(names, start=1):
            ns = f"{NS_PREFIX}-{run_id}-h{index}"
            _add_namespace(cluster, ns)
            host = Host(ns, IFNAME, f"{SUBNET4}.{index}", f"{SUBNET6}:{index:x}")
            port = f"vh{index}"
            run(
                ["ip", "-n", ns, "link", "add", IFNAME, "type", "veth", "peer", "name", port,
                 "netns", cluster.bridge_ns]
            )  # fmt: skip
            run(in_ns(cluster.bridge_ns, "ip", "link", "set", port, "master", BRIDGE, "up"))
            run(in_ns(ns, "ip", "addr", "add", f"{host.ipv4}/24", "dev", IFNAME))
            run(in_ns(ns, "ip", "-6", "addr", "add", f"{host.ipv6}/64", "dev", IFNAME, "nodad"))
            run(in_ns(ns, "ip", "link", "set", IFNAME, "up"))
            if offloads_off:
                disable_offloads(ns, IFNAME)
                disable_offloads(cluster.bridge_ns, port)
            run(in_ns(ns, "ip", "route", "replace", f"{SUBNET4}.0/24", "dev", IFNAME,
                      "congctl", congctl))  # fmt: skip
            run(in_ns(ns, "ip", "-6", "route", "replace", f"{SUBNET6}:/64", "dev", IFNAME,
                      "congctl", congctl))  # fmt: skip
            cluster.hosts[name] = host
    except BaseException:
        destroy_cluster(cluster)
        raise
    return cluster


def _add_namespace(cluster: Cluster, ns: str) -> None:
    run(["ip", "netns", "add", ns])
    cluster.namespaces.append(ns)
    run(in_ns(ns, "ip", "link", "set", "lo", "up"))


def destroy_cluster(cluster: Cluster) -> None:
    destroy(cluster.namespaces)
    stop_reaper(cluster.reaper)


@contextlib.contextmanager
def cluster(
    names: Sequence[str], offloads_off: bool = True, congctl: str = "cubic"
) -> Iterator[Cluster]:
    created = create_cluster(names, offloads_off, congctl)
    try:
        yield created
    finally:
        destroy_cluster(created)


def _gc() -> int:
    """Runs (clusters and host pairs) whose reaper is gone too (e.g. the machine rebooted
    mid-run): remove them."""
    listing = run(["ip", "netns", "list"], check=False).stdout.splitlines()
    run_ids = {
        line.split()[0].split("-")[1] for line in listing if line.startswith(f"{NS_PREFIX}-")
    }
    reapers = run(["pgrep", "-f", "tensorlights.testbed.netns reap"], check=False).stdout
    alive = {
        run_id for pid in reapers.split() for run_id in run_ids if run_id in _cmdline(int(pid))
    }
    for run_id in sorted(run_ids - alive):
        print(f"removing run {run_id}")
        destroy(cluster_namespaces(run_id))
    return 0


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("gc", help="remove runs whose runner and reaper are both gone")
    parser.parse_args(argv)
    return _gc()


if __name__ == "__main__":
    sys.exit(main())
