"""`scripts/gpu_bench.sh bundle`: a run's status traces packed into one file, since the lent
GPU machine sends back at most 8 files (the c1/c2 runs of 2026-12-04 lost 27 of 32)."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.sh"


def bundle(folder: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), "bundle", str(folder)], capture_output=True, text=True, timeout=60
    )


def test_bundle_packs_every_trace_and_leaves_the_rest(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.mkdir()
    hosts = ("ps", "w1", "w2", "w3")
    traces = {
        f"c2-pack-{rep}-{host}.jsonl": f'{{"rep": {rep}}}\n' for rep in range(8) for host in hosts
    }
    for name, text in traces.items():
        (status / name).write_text(text)
    (tmp_path / "trials.jsonl").write_text("{}\n")

    result = bundle(tmp_path)

    assert result.returncode == 0, result.stderr
    assert not status.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.tar.gz", "trials.jsonl"]
    with tarfile.open(tmp_path / "status.tar.gz") as archive:
        archive.extractall(tmp_path, filter="data")
    assert {p.name: p.read_text() for p in status.iterdir()} == traces


def test_bundle_without_traces_says_so(tmp_path: Path) -> None:
    result = bundle(tmp_path)
    assert result.returncode == 2
    assert "--status-traces" in result.stderr
    assert not (tmp_path / "status.tar.gz").exists()
