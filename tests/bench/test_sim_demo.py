"""`scaler demo` (what `./dev demo` runs): a bundled real trace under the five policies, the
table and the plots. A short slice here; the full default run is timed in the README."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_queue_scaler import cli
from gpu_queue_scaler_bench.demo import DEMO_TRACE
from gpu_queue_scaler_bench.sim.policies import NAMES


def test_the_demo_prints_five_policies_and_writes_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert DEMO_TRACE.is_file()
    code = cli.main(
        ["demo", "--duration", "180", "--scale", "2", "--plots", str(tmp_path), "--no-progress"]
    )
    assert code == 0
    out = capsys.readouterr().out
    rows = [
        line.split()[0]
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in NAMES
    ]
    assert rows == list(NAMES)
    assert "AzureLLMInferenceTrace_conv" in out
    for name in ("fleet.png", "queue_wait.png"):
        assert (tmp_path / name).stat().st_size > 0
        assert f"plot: {tmp_path / name}" in out


def test_the_demo_needs_its_trace(tmp_path: Path) -> None:
    assert cli.main(["demo", "--trace", str(tmp_path / "missing.csv"), "--plots", "off"]) == 2
