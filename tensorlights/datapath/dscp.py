"""Our own nftables tables, each kept equal to its plan: `inet tensorlights` (DSCP marks of
the PS ports) and `inet tensorlights_pods` (pods' forwarded PS traffic: HTB class and DSCP).

Full passes read a table back and replace it whole, in one transaction, when it differs
(repairs hand edits); rotations rewrite only the moved jobs' chains, also in one transaction.
No other table is ever read for writing, flushed or deleted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Generic, TypeVar

from tensorlights.datapath.nft import Nft
from tensorlights.errors import NetlinkRequestError
from tensorlights.policy import dscp_plan, pod_plan
from tensorlights.policy.dscp_plan import DscpLayout
from tensorlights.policy.pod_plan import PodLayout

L = TypeVar("L")


class OwnedTable(Generic[L]):
    """One nftables table of ours, `family name`, with its plan's parse and render."""

    def __init__(
        self,
        nft: Nft,
        family: str,
        name: str,
        parse: Callable[[Any], L | None],
        render_replace: Callable[[L], str],
        render_rotation: Callable[[L, L], str | None],
    ) -> None:
        self.nft = nft
        self.family, self.name = family, name
        self._parse, self._replace, self._rotation = parse, render_replace, render_rotation
        self._written: L | None = None

    def probe(self) -> None:
        """Fail now (UnsupportedKernelError) if this kernel or library cannot do it."""
        self.nft.run(f"add table {self.family} {self.name}", f"create nftables table {self}")

    def __str__(self) -> str:
        return f"{self.family} {self.name}"

    def table_exists(self) -> bool:
        listing = self.nft.run_json("list tables")
        return any(
            item.get("table", {}).get("name") == self.name
            and item.get("table", {}).get("family") == self.family
            for item in listing.get("nftables", [])
        )

    def read_actual(self) -> L | None:
        if not self.table_exists():
            return None
        return self._parse(self.nft.run_json(f"list table {self}"))

    def apply(self, layout: L) -> bool:
        """Make our table `layout`; True if it had to be (re)written."""
        self._written = None
        changed = self.read_actual() != layout
        if changed:
            self.nft.run(self._replace(layout), f"replace nftables table {self}")
        self._written = layout
        return changed

    def rotate(self, layout: L) -> bool:
        """Band changes only, against what we last wrote; a full apply otherwise."""
        if self._written is None:
            return self.apply(layout)
        commands = self._rotation(self._written, layout)
        if commands is None:
            return self.apply(layout)
        if commands:
            try:
                self.nft.run(commands, f"rotate nftables table {self}")
            except NetlinkRequestError:
                return self.apply(layout)  # edited behind our back: rewrite it whole
        self._written = layout
        return bool(commands)

    def cleanup(self) -> bool:
        """Delete our table (only ours); True if there was one."""
        self._written = None
        if not self.table_exists():
            return False
        self.nft.run(f"delete table {self}", f"delete nftables table {self}")
        return True

    def close(self) -> None:
        self.nft.close()


class DscpMarker(OwnedTable[DscpLayout]):
    """`inet tensorlights`: the DSCP of each PS port's band (policy/dscp_plan.py)."""

    def __init__(self, nft: Nft) -> None:
        super().__init__(
            nft,
            dscp_plan.FAMILY,
            dscp_plan.TABLE,
            dscp_plan.parse_table,
            dscp_plan.render_replace,
            dscp_plan.render_rotation,
        )


class PodClassifier(OwnedTable[PodLayout]):
    """`inet tensorlights_pods`: pods' forwarded PS traffic into its band's HTB class (and
    DSCP) before it leaves the host (policy/pod_plan.py)."""

    def __init__(self, nft: Nft) -> None:
        super().__init__(
            nft,
            pod_plan.FAMILY,
            pod_plan.TABLE,
            pod_plan.parse_table,
            pod_plan.render_replace,
            pod_plan.render_rotation,
        )
