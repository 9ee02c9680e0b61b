"""What `tlctl jobs` prints of what orders the jobs: their demand and their work left."""

from __future__ import annotations

from typing import Any

from rich.console import Console

from tensorlights.cli.tlctl import jobs_table


def _job(job: str, demand: float | None, remaining_s: float | None) -> dict[str, Any]:
    return {
        "job": job, "kind": "ps", "name": "", "sources": ["agent"], "ps_hosts": ["ps1"],
        "green_share": 0.5, "demand": demand, "remaining_s": remaining_s, "spread_s": 0.004,
        "period_s": 0.47, "state": "RUNNING",
    }  # fmt: skip


def test_jobs_show_their_demand_and_declared_work_left_and_a_dash_where_unknown() -> None:
    console = Console(record=True, width=200, color_system=None, force_terminal=False)
    console.print(jobs_table([_job("torch/short", 0.466, 12.34), _job("torch/new", None, None)]))
    lines = console.export_text().splitlines()
    header = next(line for line in lines if "JOB" in line)
    assert header.index("GREEN") < header.index("DEMAND") < header.index("LEFT")
    short = next(line for line in lines if "torch/short" in line)
    new = next(line for line in lines if "torch/new" in line)
    assert "0.47" in short and "12.3 s" in short
    cells = [cell.strip() for cell in new.split("│")]
    assert cells[cells.index("50%") + 1 : cells.index("50%") + 3] == ["-", "-"]
