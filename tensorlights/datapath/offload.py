"""Whether the interface offers tc hardware offload (ethtool's `hw-tc-offload` feature), and
which datapath the agent's HTB tree runs on: always the kernel's software HTB today.

Why not offloaded even where the NIC offers it (ConnectX-6 Dx and later: `htb offload`): the
kernel's offloaded HTB refuses a class `prio` and `quantum` ("HTB offload doesn't support the
prio parameter", net/sched/sch_htb.c), and the bands are strict priorities; and offloaded HTB
does not run the root's filters, so each packet's class must come from skb->priority (set
e.g. by an nftables `meta priority set` rule) instead of our u32 filters. Both need a NIC that
offers it to build and test against; these machines have none (veth, virtio). So the agent
reports the NIC's offer, and the path it uses, in its status and metrics.
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from pyroute2.ethtool.ioctl import IoctlEthtool, NoSuchDevice, NotSupportedError

FEATURE = "hw-tc-offload"


@dataclass(frozen=True)
class HwTcOffload:
    offered: bool
    """The driver can turn hw-tc-offload on (ethtool -k: not "off [fixed]")."""
    enabled: bool


def read_hw_tc_offload(interface: str) -> HwTcOffload | None:
    """The interface's hw-tc-offload feature (in this thread's network namespace); None when
    the driver answers no ethtool feature query or the interface is gone."""
    try:
        ethtool = IoctlEthtool(interface)
    except (NoSuchDevice, OSError):
        return None
    try:
        features = ethtool.get_features()
    except (NoSuchDevice, NotSupportedError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ENODEV, errno.EOPNOTSUPP, errno.ENOTSUP):
            return None
        raise
    finally:
        ethtool.sock.close()
    if FEATURE not in features:
        return None  # a kernel older than the feature (4.6)
    return HwTcOffload(features.is_available(FEATURE), features.is_active(FEATURE))


def datapath_path(interface: str, offload: HwTcOffload | None) -> str:
    """The path the HTB tree runs on and what the NIC offers, in words (for the status)."""
    if offload is None:
        offer = f"{interface} answers no hw-tc-offload query"
    elif offload.enabled:
        offer = f"{interface} has hw-tc-offload on, not used (see docs/design.md)"
    elif offload.offered:
        offer = f"{interface} offers hw-tc-offload (off), not used (see docs/design.md)"
    else:
        offer = f"{interface} offers no hw-tc-offload"
    return f"software HTB ({offer})"
