"""Real Flame v0.6.0 in tests: FLAME_BIN_DIR names a folder with its two binaries, built by hand outside the
repo; without them, the tests that need them skip and say why. `CLUSTERS` parametrizes a test over the CPU
stand-in and real Flame, so one test body covers both."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from parity.flame.cluster import BINARIES


def bin_dir() -> str | None:
    """$FLAME_BIN_DIR when it holds both binaries, executable; else None."""
    folder = os.environ.get("FLAME_BIN_DIR")
    ok = folder and all(os.access(Path(folder) / name, os.X_OK) for name in BINARIES)
    return folder if ok else None


real_flame = pytest.mark.skipif(bin_dir() is None, reason=f"needs FLAME_BIN_DIR naming a folder with Flame v0.6.0's "
                                                          f"{' and '.join(BINARIES)} (built by hand outside the repo)")
CLUSTERS = ["standin", pytest.param("flame", marks=real_flame)]  # parity.paths.flame.cluster's kinds
