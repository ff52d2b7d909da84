"""The main job from an installed package: `pip install` then `scaler demo` in any folder.

The wheel is built from a copy of the project (the shared tree gets no build/ or egg-info from
this), checked to carry the demo's trace and its license, then unpacked (a wheel is its installed
layout) and run from a folder outside the repository with only the unpacked wheel on the path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
TRACE = "gpu_queue_scaler_bench/data/AzureLLMInferenceTrace_conv.csv"
LICENSE = "gpu_queue_scaler_bench/data/AzureLLMInferenceTrace_conv.LICENSE"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(REPO / name, src / name)
    # tests/ too (a package of its own): the wheel must leave it out, and ship the two packages.
    for package in ("gpu_queue_scaler", "gpu_queue_scaler_bench", "tests"):
        shutil.copytree(
            REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    return build_wheel(src, tmp_path_factory.mktemp("wheel"))


def test_the_wheel_installs_the_product_and_the_measuring_package_only(wheel: Path) -> None:
    """Two top-level packages and the metadata; no `tests` in site-packages (an unrelated
    project's `tests` would collide with it), though the source tree it is built from has one."""
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {
        "gpu_queue_scaler",
        "gpu_queue_scaler_bench",
    }


def test_the_wheel_carries_the_demo_trace_and_its_license(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        assert TRACE in names and LICENSE in names
        assert archive.read(TRACE) == (REPO / TRACE).read_bytes()
        assert b"Attribution 4.0 International" in archive.read(LICENSE)


def test_the_demo_runs_from_the_installed_wheel_in_another_folder(
    wheel: Path, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def python(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """This interpreter in `elsewhere`, with only the unpacked wheel added to its path."""
        return subprocess.run(
            [sys.executable, *args],
            cwd=elsewhere,
            env={**os.environ, "PYTHONPATH": str(site)},
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    where = python(
        "-c",
        "import gpu_queue_scaler, gpu_queue_scaler_bench.demo; print(gpu_queue_scaler.__file__)",
        timeout_s=60,
    )
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(site)  # not the source tree
    demo = python(
        "-m",
        "gpu_queue_scaler",
        "demo",
        "--duration",
        "120",
        "--scale",
        "1",
        "--plots",
        "off",
        "--no-progress",
        timeout_s=300,
    )
    assert demo.returncode == 0, demo.stderr
    assert (
        "Replaying AzureLLMInferenceTrace_conv.csv (Azure LLM inference trace 2023" in demo.stdout
    )
    assert str(site / LICENSE) in demo.stdout
    assert "scaler " in demo.stdout  # the policies' table
