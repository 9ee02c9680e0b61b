"""A Kubernetes node as a CNI wires it, emulated with namespaces: pods in their own network
namespaces behind the node, whose NIC (`nic`, egress shaped) leads to a peer node.

    with pod_node("vxlan", pods=2) as node:
        node.pods[0].ns, node.pods[0].ipv4      # a pod, 10.244.1.2
        node.node_ns, node.nic                  # where the agent runs and what it shapes

Modes, as CNIs do it:
- `routed` (Calico without encapsulation, kube-router, the bridge/ptp plugins with host
  routes): each pod has a veth into the node and a /32 route there; the peer routes the pod
  subnet via the node's NIC address. Pod packets leave the NIC as they are.
- `vxlan` (flannel's vxlan backend, Calico or Cilium in VXLAN mode): the same pod veths, but
  the pod subnet is reached across a VXLAN device on each node (`tos inherit` on ours, so the
  outer header carries the inner DSCP). Pod packets leave the NIC inside UDP/4789: their TCP
  ports are hidden from filters on the NIC.

TCP congestion control is set per route, as the other testbeds set it (cubic, the kernel's
default; this machine's global default is BBR, which cannot be changed per namespace): the
pods' default routes and the peer's route back to them.

Every namespace carries the run id (testbed/netns.py) and is removed on exit, with a reaper
in case we are killed. Needs root, iproute2.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Literal

from tensorlights.testbed.netns import (
    NS_PREFIX,
    destroy,
    disable_offloads,
    in_ns,
    new_run_id,
    run,
    start_reaper,
    stop_reaper,
)

Mode = Literal["routed", "vxlan"]
NODE_IP, PEER_IP = "10.78.0.1", "10.78.0.2"
OVERLAY_NODE_IP, OVERLAY_PEER_IP = "10.79.0.1", "10.79.0.2"
POD_SUBNET = "10.244.1.0/24"
VXLAN_PORT = 4789
VXLAN_MTU = 1450


@dataclass(frozen=True)
class Pod:
    ns: str
    ipv4: str


@dataclass
class PodNode:
    mode: Mode
    node_ns: str
    peer_ns: str
    nic: str = "nic"
    pods: list[Pod] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)

    @property
    def peer_ip(self) -> str:
        """Where pods send to: the peer across the NIC (routed) or the overlay (vxlan)."""
        return PEER_IP if self.mode == "routed" else OVERLAY_PEER_IP


def connection_rto_ms(ns: str, port: int) -> float | None:
    """The retransmission timeout (`ss`) of the connection from local `port` in namespace
    `ns` (the first, if several); None: none there."""
    found = re.search(r"\brto:([\d.]+)", run(in_ns(ns, "ss", "-tin", f"sport = :{port}")).stdout)
    return float(found.group(1)) if found else None


def _ns(run_id: str, name: str, node: PodNode) -> str:
    ns = f"{NS_PREFIX}-{run_id}-{name}"
    run(["ip", "netns", "add", ns])
    node.namespaces.append(ns)
    run(in_ns(ns, "ip", "link", "set", "lo", "up"))
    return ns


@contextlib.contextmanager
def pod_node(mode: Mode, pods: int = 2, congctl: str = "cubic") -> Iterator[PodNode]:
    run_id = new_run_id()
    reaper = start_reaper(run_id)
    node = PodNode(mode, f"{NS_PREFIX}-{run_id}-node", f"{NS_PREFIX}-{run_id}-peer")
    try:
        _ns(run_id, "node", node)
        _ns(run_id, "peer", node)
        _wire_nic(node)
        for index in range(pods):
            ns = _ns(run_id, f"pod{index}", node)
            _add_pod(node, ns, f"10.244.1.{index + 2}", index, congctl)
        gateway = OVERLAY_NODE_IP if mode == "vxlan" else NODE_IP
        if mode == "vxlan":
            _wire_overlay(node)
        run(in_ns(node.peer_ns, "ip", "route", "add", POD_SUBNET, "via", gateway,
                  "congctl", congctl))  # fmt: skip
        yield node
    finally:
        destroy(node.namespaces)
        stop_reaper(reaper)


def _wire_nic(node: PodNode) -> None:
    run(["ip", "-n", node.node_ns, "link", "add", node.nic, "type", "veth",
         "peer", "name", node.nic, "netns", node.peer_ns])  # fmt: skip
    for ns, address in ((node.node_ns, NODE_IP), (node.peer_ns, PEER_IP)):
        run(in_ns(ns, "ip", "addr", "add", f"{address}/24", "dev", node.nic))
        run(in_ns(ns, "ip", "link", "set", node.nic, "up"))
        disable_offloads(ns, node.nic)  # packet-accurate shaping, as everywhere in the testbed
    run(in_ns(node.node_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"))
    # The node's own default route: what lets proxy ARP answer the pods' gateway address.
    run(in_ns(node.node_ns, "ip", "route", "add", "default", "via", PEER_IP))


def _add_pod(node: PodNode, ns: str, address: str, index: int, congctl: str) -> None:
    host_side = f"cali{index}"  # named as Calico names them; any name does
    run(["ip", "-n", ns, "link", "add", "eth0", "type", "veth",
         "peer", "name", host_side, "netns", node.node_ns])  # fmt: skip
    run(in_ns(ns, "ip", "addr", "add", f"{address}/32", "dev", "eth0"))
    run(in_ns(ns, "ip", "link", "set", "eth0", "up"))
    # The CNI way: a link-local gateway on the pod side, a /32 route to the pod on the node.
    run(in_ns(ns, "ip", "route", "add", "169.254.1.1", "dev", "eth0"))
    run(in_ns(ns, "ip", "route", "add", "default", "via", "169.254.1.1", "dev", "eth0",
              "congctl", congctl))  # fmt: skip
    run(in_ns(node.node_ns, "ip", "link", "set", host_side, "up"))
    run(in_ns(node.node_ns, "sysctl", "-qw", f"net.ipv4.conf.{host_side}.proxy_arp=1"))
    run(in_ns(node.node_ns, "ip", "route", "add", f"{address}/32", "dev", host_side))
    disable_offloads(ns, "eth0")
    disable_offloads(node.node_ns, host_side)
    node.pods.append(Pod(ns, address))


def _wire_overlay(node: PodNode) -> None:
    for ns, local, remote, overlay in (
        (node.node_ns, NODE_IP, PEER_IP, OVERLAY_NODE_IP),
        (node.peer_ns, PEER_IP, NODE_IP, OVERLAY_PEER_IP),
    ):
        run(in_ns(ns, "ip", "link", "add", "vxlan0", "type", "vxlan", "id", "1",
                  "local", local, "remote", remote, "dev", node.nic,
                  "dstport", str(VXLAN_PORT), "tos", "inherit"))  # fmt: skip
        run(in_ns(ns, "ip", "addr", "add", f"{overlay}/24", "dev", "vxlan0"))
        run(in_ns(ns, "ip", "link", "set", "vxlan0", "up"))
        disable_offloads(ns, "vxlan0")
    # As VXLAN CNIs configure pods: the NIC's MTU less the 50 bytes of encapsulation, so
    # nothing is fragmented.
    for index, pod in enumerate(node.pods):
        run(in_ns(pod.ns, "ip", "link", "set", "eth0", "mtu", str(VXLAN_MTU)))
        run(in_ns(node.node_ns, "ip", "link", "set", f"cali{index}", "mtu", str(VXLAN_MTU)))
