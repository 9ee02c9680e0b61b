"""Emulated hosts: network namespaces joined by veth pairs, created and always removed.

Used by the tests, the demo and the benchmarks. Every name carries a random run id so runs can
overlap and never touch anything they did not create. Needs root and iproute2's `ip`.

A reaper process, started before the first namespace of a run, holds a pipe from the runner:
when the runner ends for any reason (SIGKILL, or a SIGTERM that skips pytest's teardown) the
pipe closes and the reaper removes the run's namespaces and what still runs in them.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

NS_PREFIX = "tl"


def run(args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(args), capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip()}")
    return result


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *args]


@dataclass
class Host:
    """One namespace with one address on its link."""

    ns: str
    ifname: str
    ipv4: str
    ipv6: str

    def exec_args(self, *args: str) -> list[str]:
        return in_ns(self.ns, *args)


@dataclass
class HostPair:
    """Two hosts on one veth link: `a` sends (its egress is what we shape), `b` receives."""

    run_id: str
    a: Host
    b: Host
    namespaces: list[str] = field(default_factory=list)
    reaper: subprocess.Popen[bytes] | None = None


def start_reaper(run_id: str) -> subprocess.Popen[bytes]:
    """From now on, whatever happens to us, the namespaces of `run_id` will be removed."""
    return subprocess.Popen(
        [sys.executable, "-m", "tensorlights.testbed.netns", "reap", "--run-id", run_id],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a signal to our process group must not kill it first
    )


def stop_reaper(reaper: subprocess.Popen[bytes] | None) -> None:
    """After a normal teardown: nothing is left for it, so it exits."""
    if reaper is not None:
        assert reaper.stdin is not None
        reaper.stdin.close()
        reaper.wait(timeout=30)


def reap(run_id: str) -> int:
    """The reaper: wait until the runner's end of the pipe closes, then remove its run."""
    sys.stdin.buffer.read()
    destroy(leftover_namespaces(run_id))
    return 0


def new_run_id() -> str:
    return secrets.token_hex(3)


def disable_offloads(ns: str, ifname: str) -> None:
    # Packet-accurate shaping: without this, veth hands HTB 64 KB GSO super-packets.
    run(in_ns(ns, "ethtool", "-K", ifname, "tso", "off", "gso", "off", "gro", "off"), check=False)


def create_pair(
    run_id: str | None = None, offloads_off: bool = True, congctl: str = "cubic", queues: int = 1
) -> HostPair:
    run_id = run_id or new_run_id()
    ns_a, ns_b = f"{NS_PREFIX}-{run_id}-a", f"{NS_PREFIX}-{run_id}-b"
    pair = HostPair(
        run_id,
        Host(ns_a, "veth-a", "10.77.0.1", "fd00:77::1"),
        Host(ns_b, "veth-b", "10.77.0.2", "fd00:77::2"),
        reaper=start_reaper(run_id),
    )
    try:
        for ns in (ns_a, ns_b):
            run(["ip", "netns", "add", ns])
            pair.namespaces.append(ns)
            run(in_ns(ns, "ip", "link", "set", "lo", "up"))
        link_pair(pair, offloads_off, congctl, queues)
    except BaseException:
        destroy_pair(pair)
        raise
    return pair


def destroy_pair(pair: HostPair) -> None:
    destroy(pair.namespaces)
    stop_reaper(pair.reaper)


def link_pair(
    pair: HostPair, offloads_off: bool = True, congctl: str = "cubic", queues: int = 1
) -> None:
    """(Re)create the veth link between the pair's namespaces, with addresses and routes;
    `queues` transmit and receive queues on each end (a multi-queue NIC's shape)."""
    multiqueue = ["numtxqueues", str(queues), "numrxqueues", str(queues)] if queues > 1 else []
    run(
        ["ip", "-n", pair.a.ns, "link", "add", "veth-a", *multiqueue,
         "type", "veth", "peer", "name", "veth-b", *multiqueue, "netns", pair.b.ns]
    )  # fmt: skip
    for host in (pair.a, pair.b):
        run(in_ns(host.ns, "ip", "addr", "add", f"{host.ipv4}/24", "dev", host.ifname))
        run(
            in_ns(
                host.ns,
                "ip",
                "-6",
                "addr",
                "add",
                f"{host.ipv6}/64",
                "dev",
                host.ifname,
                "nodad",
            )
        )
        run(in_ns(host.ns, "ip", "link", "set", host.ifname, "up"))
        if offloads_off:
            disable_offloads(host.ns, host.ifname)
        # net.ipv4.tcp_congestion_control cannot be set per netns here: set it per route.
        run(
            in_ns(
                host.ns,
                "ip",
                "route",
                "replace",
                "10.77.0.0/24",
                "dev",
                host.ifname,
                "congctl",
                congctl,
            )
        )
        run(
            in_ns(
                host.ns,
                "ip",
                "-6",
                "route",
                "replace",
                "fd00:77::/64",
                "dev",
                host.ifname,
                "congctl",
                congctl,
            )
        )


def fifo_bottleneck(ns: str, ifname: str, rate: str) -> None:
    """Make `ifname`'s egress a plain FIFO link of `rate` (tbf): the no-TensorLights baseline."""
    run(
        ["tc", "-n", ns, "qdisc", "replace", "dev", ifname, "root", "tbf", "rate", rate,
         "burst", "256kb", "latency", "50ms"]
    )  # fmt: skip


def destroy(namespaces: Sequence[str]) -> None:
    """Delete namespaces (their veths go with them); kill anything still running inside."""
    for ns in namespaces:
        pids = run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            run(["kill", "-9", pid], check=False)
        run(["ip", "netns", "del", ns], check=False)


def leftover_namespaces(run_id: str) -> list[str]:
    listing = run(["ip", "netns", "list"], check=False).stdout.split("\n")
    return [line.split()[0] for line in listing if line.startswith(f"{NS_PREFIX}-{run_id}-")]


@contextlib.contextmanager
def host_pair(
    offloads_off: bool = True, congctl: str = "cubic", queues: int = 1
) -> Iterator[HostPair]:
    pair = create_pair(offloads_off=offloads_off, congctl=congctl, queues=queues)
    try:
        yield pair
    finally:
        destroy_pair(pair)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    reaper = sub.add_parser("reap", help="(internal) remove a run's namespaces once it is gone")
    reaper.add_argument("--run-id", required=True)
    args = parser.parse_args(argv)
    return reap(args.run_id)


if __name__ == "__main__":
    sys.exit(main())
