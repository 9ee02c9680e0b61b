"""The committed gRPC code is exactly what scripts/gen_proto.sh makes from proto/."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ROOT / "tensorlights" / "rpc" / "v1"


def test_regenerated_code_matches_the_committed_code(tmp_path: Path) -> None:
    subprocess.run(
        [str(ROOT / "scripts" / "gen_proto.sh"), str(tmp_path)],
        check=True,
        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"},
    )
    fresh = tmp_path / "tensorlights" / "rpc" / "v1"
    made = sorted(p.name for p in fresh.iterdir())
    assert made == sorted(p.name for p in GENERATED.iterdir() if p.name != "__init__.py")
    assert len(made) == 6
    for name in made:
        assert (fresh / name).read_bytes() == (GENERATED / name).read_bytes(), (
            f"{name} is stale: run scripts/gen_proto.sh and commit the result"
        )
