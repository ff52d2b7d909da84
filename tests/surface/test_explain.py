"""`scaler explain NAMESPACE/NAME` against a real `scaler serve` process."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from gpu_queue_scaler_bench.emulators.keda import KedaLikeClient
from tests.conftest import ref, synthetic
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.slow


def explain(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_queue_scaler", "explain", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


async def test_explain_prints_the_decision_with_its_reason():
    server = ServeProcess("--metrics-address", "127.0.0.1:0")
    client = KedaLikeClient(f"127.0.0.1:{server.port}")
    try:
        await client.evaluate(ref("llama", synthetic()))
        metrics_port = next(
            int(line["metrics_port"]) for line in server.lines() if line.get("event") == "serving"
        )
        address = f"http://127.0.0.1:{metrics_port}"
        shown = await asyncio.to_thread(explain, "team-a/llama", "--address", address)
        assert shown.returncode == 0, shown.stderr
        assert "team-a/llama [synthetic-llama] -> 2 replicas, active" in shown.stdout
        assert "reason: current_need: need=1.88 from concurrency" in shown.stdout
        # No queue times from the synthetic source: nothing learnt, nothing read.
        closed_loop = (
            "closed loop: headroom x1.00 (x1.00 of it from a surge), late share not measured"
        )
        assert closed_loop in shown.stdout
        as_json = await asyncio.to_thread(explain, "team-a/llama", "--address", address, "--json")
        [answer] = json.loads(as_json.stdout)
        assert answer["replicas"] == 2
        assert (answer["headroom"], answer["late_share"]) == (1.0, None)
        unknown = await asyncio.to_thread(explain, "team-a/other", "--address", address)
        assert unknown.returncode == 1 and "no decision" in unknown.stdout
    finally:
        await client.close()
        server.stop()


def test_explain_reports_an_unreachable_scaler():
    shown = explain("team-a/llama", "--address", "http://127.0.0.1:9", "--timeout", "2")
    assert shown.returncode == 1
    assert "cannot read http://127.0.0.1:9/decisions" in shown.stderr
    assert explain("no-slash").returncode == 2
