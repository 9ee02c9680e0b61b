"""Running the same code in fresh processes under several string-hash seeds: set order
follows the seed, and a simulation must not."""

from __future__ import annotations

import os
import subprocess
import sys


def outputs_under_hash_seeds(code: str, seeds: tuple[str, ...] = ("1", "2", "3")) -> set[str]:
    """The distinct standard outputs of `code` run under each PYTHONHASHSEED in `seeds`."""
    return {
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in seeds
    }  # fmt: skip
