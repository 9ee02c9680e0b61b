"""The package as users install it: `python -m build` makes a wheel and an sdist with the
right metadata, and the wheel installs into a clean virtualenv (its dependencies from the
package index, as `pip install` gets them) whose entry points run."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).parents[2]


def run(*args: str | Path, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [str(arg) for arg in args], capture_output=True, text=True, timeout=600, cwd=cwd
    )
    assert result.returncode == 0, f"{args}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
    return result.stdout


def test_wheel_and_sdist_build_and_the_wheel_installs_and_runs(tmp_path: Path) -> None:
    # No build isolation: the build backend is the one the test extra installed (no second
    # download of setuptools per run).
    run(sys.executable, "-m", "build", "--no-isolation", "--outdir", tmp_path / "dist", ROOT)
    (wheel,) = (tmp_path / "dist").glob("tensorlights-*.whl")
    (sdist,) = (tmp_path / "dist").glob("tensorlights-*.tar.gz")

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(info).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert "\nLicense: " not in metadata  # the old table form, deprecated
    assert {"tensorlights/py.typed", "tensorlights/rpc/v1/agent_link_pb2.pyi"} <= names
    with tarfile.open(sdist) as archive:
        members = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {
        "proto/tensorlights/rpc/v1/agent_link.proto",
        "systemd/tensorlights-agent.service",
        "systemd/agent.toml",
        "deploy/prometheus/tensorlights-alerts.yml",
        "deploy/slurm/tensorlights_spank.c",
        "deploy/slurm/Makefile",
        "dashboards/tensorlights-host.json",
    } <= members

    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)
    # Away from the checkout, so that only the installed copy can be imported.
    for command in ("tensorlights-agent", "tensorlights-controller", "tlctl"):
        assert "Usage:" in run(venv / "bin" / command, "--help", cwd=tmp_path)
    where = run(
        venv / "bin" / "python", "-c", "import tensorlights; print(tensorlights.__file__)",
        cwd=tmp_path,
    )  # fmt: skip
    assert where.startswith(str(venv))
    assert "htb: supported" in run(venv / "bin" / "tensorlights-agent", "backends", cwd=tmp_path)
