"""DSCP marking in our own nftables table (`inet tensorlights`), kept equal to the plan.

Full passes read the table back and replace it whole, in one transaction, when it differs
(repairs hand edits); rotations rewrite only the moved jobs' chains, also in one transaction.
No other table is ever read for writing, flushed or deleted."""

from __future__ import annotations

from tensorlights.datapath.nft import Nft
from tensorlights.errors import NetlinkRequestError
from tensorlights.policy.dscp_plan import (
    FAMILY,
    TABLE,
    DscpLayout,
    parse_table,
    render_replace,
    render_rotation,
)


class DscpMarker:
    def __init__(self, nft: Nft) -> None:
        self.nft = nft
        self._written: DscpLayout | None = None

    def probe(self) -> None:
        """Fail now (UnsupportedKernelError) if this kernel or library cannot do it."""
        self.nft.run(f"add table {FAMILY} {TABLE}", "create nftables table inet tensorlights")

    def table_exists(self) -> bool:
        listing = self.nft.run_json("list tables")
        return any(
            item.get("table", {}).get("name") == TABLE
            and item.get("table", {}).get("family") == FAMILY
            for item in listing.get("nftables", [])
        )

    def read_actual(self) -> DscpLayout | None:
        if not self.table_exists():
            return None
        return parse_table(self.nft.run_json(f"list table {FAMILY} {TABLE}"))

    def apply(self, layout: DscpLayout) -> bool:
        """Make our table `layout`; True if it had to be (re)written."""
        self._written = None
        changed = self.read_actual() != layout
        if changed:
            self.nft.run(render_replace(layout), "replace nftables table inet tensorlights")
        self._written = layout
        return changed

    def rotate(self, layout: DscpLayout) -> bool:
        """Band changes only, against what we last wrote; a full apply otherwise."""
        if self._written is None:
            return self.apply(layout)
        commands = render_rotation(self._written, layout)
        if commands is None:
            return self.apply(layout)
        if commands:
            try:
                self.nft.run(commands, "rotate DSCP marks")
            except NetlinkRequestError:
                return self.apply(layout)  # edited behind our back: rewrite it whole
        self._written = layout
        return bool(commands)

    def cleanup(self) -> bool:
        """Delete our table (only ours); True if there was one."""
        self._written = None
        if not self.table_exists():
            return False
        self.nft.run(f"delete table {FAMILY} {TABLE}", "delete nftables table inet tensorlights")
        return True

    def close(self) -> None:
        self.nft.close()
