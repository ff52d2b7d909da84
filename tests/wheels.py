"""Building the project's wheel in a test, as the image's build stage and `pip install` do."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def build_wheel(src: Path, out: Path) -> Path:
    """The wheel of the project copied to `src`, built into `out` offline: the venv's setuptools
    (as the image uses the locked one), no download, no dependencies."""
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--quiet",
            "--wheel-dir",
            str(out),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    [found] = out.glob("gpu_queue_scaler-*.whl")
    return found
