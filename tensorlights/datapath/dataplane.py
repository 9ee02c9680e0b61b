"""One interface's egress as one object: the HTB tree (tc), the DSCP marks (nftables) and,
with pod shaping on, the classification of pods' forwarded PS traffic (nftables).

The reconciler asks for a spec; this object owns how it reaches the kernel: tc first, then the
marks, then the pods' table, with the job -> u32 table hand-off between them, and the "marks
off, warn" mode. A job's packets can carry the DSCP of another band than the one they queue
in only between the writes of one call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from tensorlights.datapath.dscp import DscpMarker, OwnedTable, PodClassifier
from tensorlights.datapath.htb import ApplyResult, HtbDatapath, LinkInfo, PlannedChange
from tensorlights.datapath.nft import Nft
from tensorlights.datapath.offload import HwTcOffload, read_hw_tc_offload
from tensorlights.errors import TensorLightsError, UnsupportedKernelError
from tensorlights.model import DatapathSpec
from tensorlights.policy.dscp_plan import desired_dscp
from tensorlights.policy.pod_plan import desired_pods

log = logging.getLogger("tensorlights.datapath")


@dataclass(frozen=True)
class Marking:
    """DSCP marking as configured."""

    bands: tuple[int, ...]
    """DSCP of bands 0..6 (0 = green)."""
    required: bool = True
    """False: where this kernel cannot mark, run unmarked with a loud warning."""


class Dataplane:
    def __init__(
        self,
        tc: HtbDatapath,
        netns: str | None = None,
        marking: Marking | None = None,
        pods: bool = False,
    ) -> None:
        self.tc = tc
        self._netns = netns
        self._marks: DscpMarker | None = None
        self._bands: tuple[int, ...] = ()
        self._pods: PodClassifier | None = None
        self.set_marking(marking)
        self.set_pods(pods)

    @property
    def marking(self) -> bool:
        """Whether packets are being marked (False: off by config, or by `required = False`)."""
        return self._marks is not None

    def set_marking(self, marking: Marking | None) -> None:
        """Turn marking on, off or to other code points; the next `apply` writes the table.
        UnsupportedKernelError when it is required and this kernel cannot do it."""
        if marking is None:
            _drop(self._marks)
            self._marks = None
            return
        self._bands = marking.bands
        if self._marks is not None:
            return
        try:
            marks = _probed(DscpMarker(Nft(self._netns)))
        except UnsupportedKernelError as exc:
            if marking.required:
                raise
            log.warning("DSCP MARKING IS OFF (dscp.on_unsupported = warn): %s", exc)
            return
        self._marks = marks

    def set_pods(self, on: bool) -> None:
        """Classify pods' forwarded PS traffic (the spec's pod endpoints) or stop doing it;
        UnsupportedKernelError where nftables cannot (no silent fallback: configured pods
        would go unshaped)."""
        if not on:
            _drop(self._pods)
            self._pods = None
        elif self._pods is None:
            self._pods = _probed(PodClassifier(Nft(self._netns)))

    def link(self, interface: str) -> LinkInfo:
        return self.tc.link(interface)

    def apply(self, spec: DatapathSpec) -> int:
        """Read the kernel back and make it `spec` (repairs drift); kernel writes made."""
        return self._mark(spec, self.tc.apply(spec), full=True)

    def rotate(self, spec: DatapathSpec) -> int:
        """Band changes against what was last written (the fast path); a full apply when
        jobs or ports changed. Kernel writes made."""
        return self._mark(spec, self.tc.rotate(spec), full=False)

    def _mark(self, spec: DatapathSpec, written: ApplyResult, full: bool) -> int:
        ops = len(written.ops)
        if self._marks is not None:
            layout = desired_dscp(spec, written.job_table, self._bands)
            changed = self._marks.apply(layout) if full else self._marks.rotate(layout)
            ops += changed
        if self._pods is not None:
            bands = self._bands if self._marks is not None else None
            pods = desired_pods(spec, written.job_table, self.tc.major, bands)
            ops += self._pods.apply(pods) if full else self._pods.rotate(pods)
        return ops

    def plan(self, spec: DatapathSpec) -> PlannedChange:
        """What `apply(spec)` would change in tc now, touching nothing."""
        return self.tc.plan(spec)

    def class_counters(self, interface: str) -> dict[int, tuple[int, int, int]]:
        return self.tc.class_counters(interface)

    def hw_offload(self, interface: str) -> HwTcOffload | None:
        """The interface's hw-tc-offload feature (offload.py: why the tree stays software)."""
        return read_hw_tc_offload(interface)

    def cleanup(self, interface: str) -> str:
        """Remove our qdisc (restoring the one before) and our nftables table; what was done.
        Only ours is touched, and every step runs whatever an earlier one raised."""
        marks, pods = self._marks, self._pods
        return "; ".join(
            every_step(
                lambda: self.tc.cleanup(interface),
                lambda: (
                    "removed nftables table inet tensorlights"
                    if marks is not None and marks.cleanup()
                    else None
                ),
                lambda: (
                    "removed nftables table inet tensorlights_pods"
                    if pods is not None and pods.cleanup()
                    else None
                ),
            )
        )

    def close(self) -> None:
        self.tc.sock.close()
        for table in (self._marks, self._pods):
            if table is not None:
                table.close()


T = TypeVar("T", bound=OwnedTable[Any])


def _probed(table: T) -> T:
    """`table`, once this kernel has shown it can hold it (else closed, and raised)."""
    try:
        table.probe()
    except UnsupportedKernelError:
        table.close()
        raise
    return table


def _drop(table: OwnedTable[Any] | None) -> None:
    if table is not None:
        table.cleanup()
        table.close()


def every_step(*steps: Callable[[], str | None]) -> list[str]:
    """Run every cleanup step whatever an earlier one raised (marks left behind would keep
    marking packets with no agent running); what they did, then the first error, if any."""
    done: list[str] = []
    errors: list[TensorLightsError] = []
    for step in steps:
        try:
            if outcome := step():
                done.append(outcome)
        except TensorLightsError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]
    return done


def remove_everything(tc: HtbDatapath, interface: str, netns: str | None = None) -> list[str]:
    """`tensorlights-agent cleanup`: our qdisc and our nftables tables, whatever a config says
    about marking and pods; what was done, a line each."""
    marks, pods = DscpMarker(Nft(netns)), PodClassifier(Nft(netns))
    try:
        return every_step(
            lambda: tc.cleanup(interface),
            lambda: (
                "removed nftables table inet tensorlights (DSCP marks)" if marks.cleanup() else None
            ),
            lambda: (
                "removed nftables table inet tensorlights_pods (pods' traffic)"
                if pods.cleanup()
                else None
            ),
        )
    finally:
        marks.close()
        pods.close()
