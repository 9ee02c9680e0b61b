"""What `tlctl jobs` prints of what orders the jobs: their demand and their work left."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Console
from rich.table import Table

from tensorlights.cli.tlctl import jobs_table


def _job(job: str, demand: float | None, remaining_s: float | None) -> dict[str, Any]:
    return {
        "job": job, "kind": "ps", "name": "", "sources": ["agent"], "ps_hosts": ["ps1"],
        "green_share": 0.5, "demand": demand, "remaining_s": remaining_s, "spread_s": 0.004,
        "period_s": 0.47, "state": "RUNNING",
    }  # fmt: skip


def _lines(table: Table, width: int) -> list[str]:
    console = Console(record=True, width=width, color_system=None, force_terminal=False)
    console.print(table)
    return console.export_text().splitlines()


def test_jobs_show_their_demand_and_declared_work_left_and_a_dash_where_unknown() -> None:
    lines = _lines(
        jobs_table([_job("torch/short", 0.466, 12.34), _job("torch/new", None, None)]), 200
    )
    header = next(line for line in lines if "JOB" in line)
    assert header.index("GREEN") < header.index("DEMAND") < header.index("LEFT")
    short = next(line for line in lines if "torch/short" in line)
    new = next(line for line in lines if "torch/new" in line)
    assert "0.47" in short and "12.3s" in short
    cells = re.split(r"\s{2,}", new.strip())  # columns are two spaces apart or more
    assert cells[cells.index("50%") + 1 : cells.index("50%") + 3] == ["-", "-"]


def test_the_jobs_table_fits_80_columns_whole_and_wide_adds_kind_name_and_sources() -> None:
    jobs = [_job("slurm/48213", 0.466, 12.34), _job("torch/a3f9c2e1d0", None, None)]
    lines = _lines(jobs_table(jobs), 80)
    assert all(len(line.rstrip()) <= 80 for line in lines)
    assert any("slurm/48213" in line for line in lines)  # job ids whole, not cut short
    assert any("torch/a3f9c2e1d0" in line for line in lines)
    assert not any("…" in line for line in lines)
    header = next(line for line in lines if "JOB" in line)
    assert "NAME" not in header and "SOURCES" not in header
    wide = next(line for line in _lines(jobs_table(jobs, wide=True), 200) if "JOB" in line)
    assert wide.index("JOB") < wide.index("KIND") < wide.index("NAME") < wide.index("SOURCES")
