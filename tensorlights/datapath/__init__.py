"""Kernel side: the only package that writes tc (netlink) and nftables. `open_datapath` opens
the tc writer of a backend (HTB); `dataplane.Dataplane` is what the agent writes through: tc,
then the DSCP marks, for one interface."""

from __future__ import annotations

from pathlib import Path

from tensorlights.datapath.htb import HtbDatapath
from tensorlights.datapath.kernel_features import require_qdisc
from tensorlights.datapath.netlink import RtnlSocket
from tensorlights.datapath.root_record import RootQdiscRecords
from tensorlights.errors import ConfigError, UnsupportedKernelError

BACKENDS = ("htb", "prio")


def open_datapath(
    backend: str,
    state_dir: Path,
    netns: str | None = None,
    take_over_foreign: bool = False,
    kernel_root: Path = Path("/"),
) -> HtbDatapath:
    """The datapath for `backend`, after checking that this kernel can run it."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend {backend!r} is not one of {', '.join(BACKENDS)}")
    require_qdisc(backend, kernel_root)
    if backend == "prio":
        # sch_prio is present, but strict prio without a guaranteed share would starve
        # unmanaged traffic, and no machine we test on has it: refuse rather than guess.
        raise UnsupportedKernelError(
            "this kernel has sch_prio, but the prio backend is not available in this release; "
            'use backend = "htb"'
        )
    sock = RtnlSocket(netns)
    return HtbDatapath(
        sock, RootQdiscRecords(state_dir, netns), take_over_foreign=take_over_foreign
    )
