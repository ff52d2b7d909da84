"""`scaler bench load`: the real server and the floor server as processes on loopback, polled
like KEDA by a short run. Figures are printed, never asserted against a time budget."""

from __future__ import annotations

import json
import os

import pytest

from gpu_queue_scaler.cli import main
from gpu_queue_scaler.decision.policy import policy_memory_s
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import resolve
from gpu_queue_scaler.settings.trigger import TriggerCache
from gpu_queue_scaler_bench.load.polls import trigger_metadata
from tests.conftest import run_bench

SUMMARY_KEYS = {"p50_ms", "p99_ms", "calls_per_s", "errors", "server_cpu_s"}
FAST = ["--polling-interval", "1", "--hpa-interval", "0.5", "--sample-interval", "1"]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone too (the bench waits for its children, so none should remain)
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_short_run_against_both_servers(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["bench", "load", "--objects", "50", "--duration", "10", *FAST, "--json"])
    out = capsys.readouterr().out
    result = json.loads(out)
    assert code == 0, out
    assert result["objects"] == 50
    assert isinstance(result["duration_s"], float) and result["duration_s"] >= 10
    for kind in ("scaler", "floor"):
        figures = result[kind]
        assert figures.keys() >= SUMMARY_KEYS
        assert isinstance(figures["errors"], int) and figures["errors"] == 0, figures
        for key in SUMMARY_KEYS - {"errors"}:
            assert isinstance(figures[key], float), (kind, key)
        assert figures["calls_per_s"] > 0
        assert figures["server_cpu_s"] > 0
        assert figures["p99_ms"] >= figures["p50_ms"] > 0
        # Every object's first GetMetrics is counted once, whatever it waited for.
        assert figures["first_calls"] == 50, figures
        assert figures["first_p99_ms"] >= figures["first_p50_ms"] > 0
        assert figures["exit_code"] == 0  # each server stopped cleanly on SIGTERM
        assert not alive(figures["pid"]), f"{kind} server {figures['pid']} still running"
    assert result["ratio"]["p99"] is not None
    print(json.dumps({k: result[k] for k in ("scaler", "floor", "ratio")}))


def test_rounds_pool_the_calls_of_alternated_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """--rounds 2 runs each server twice, in the order scaler, floor, floor, scaler: the pooled
    figures hold both runs' calls (each object's first call once per run, since every run is a
    fresh server), and each round's own ratio is kept."""
    args = ["bench", "load", "--objects", "20", "--duration", "4", *FAST, "--rounds", "2"]
    code = main([*args, "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["rounds"] == 2
    for kind in ("scaler", "floor"):
        figures = result[kind]
        assert figures["first_calls"] == 40, figures  # 20 objects x 2 fresh servers
        assert figures["errors"] == 0 and figures["exit_code"] == 0
        assert not alive(figures["pid"])
    assert result["duration_s"] >= 8  # two runs of 4 s pooled
    by_round = result["ratio"]["by_round"]
    assert len(by_round) == 2 and all(r["steady_p99"] is not None for r in by_round), by_round
    assert main(["bench", "load", "--soak", "--rounds", "2", "--duration", "1"]) == 2
    assert "--rounds" in capsys.readouterr().err


def test_soak_prints_rss_and_fds(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "load", "--soak", "--objects", "30", "--duration", "8", "--warmup", "3", *FAST]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "soak: RSS" in out and "MiB after 3 s warm-up" in out and "growth" in out
    assert "soak: open fds" in out
    assert not any(line.split()[:1] == ["floor"] for line in out.splitlines())  # scaler alone
    print(out)


def test_soak_json_figures(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "bench",
            "load",
            "--soak",
            "--objects",
            "10",
            "--duration",
            "6",
            "--warmup",
            "2",
            *FAST,
            "--json",
        ]
    )
    result = json.loads(capsys.readouterr().out)
    assert code == 0
    assert result["floor"] is None
    soak = result["soak"]
    assert soak["samples"] >= 5
    assert soak["rss_after_warmup_kib"] > 0 and soak["rss_end_kib"] > 0
    assert isinstance(soak["rss_growth_pct"], float)
    assert soak["fds_start"] > 0 and soak["fds_end"] > 0
    assert not alive(result["scaler"]["pid"])


def test_bad_input_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "load", "--objects", "0", "--duration", "1"]) == 2
    assert "--objects" in capsys.readouterr().err


def test_warm_start_burst_bench_prints_both_runs() -> None:
    """bench/warm_start_burst.py (figures in the docs) runs and prints both rows and the
    ratios; the figures themselves are for the docs, not asserted."""
    lines = run_bench("warm_start_burst.py", "--workloads", "40")
    assert lines[0].startswith("40 new workloads at once")
    rows = {line.split()[0] + line.split()[1]: line.split()[2:] for line in lines[2:4]}
    assert set(rows) == {"atonce", "inorder"}
    assert all(int(row[0]) <= 40 for row in rows.values())  # first decisions within 2 s
    assert lines[4].startswith("in order / at once: p50 ")


def test_decide_cpu_bench_prints_its_ratios() -> None:
    """bench/decide_cpu.py (figures in the docs) runs and prints every row and both ratios;
    the figures themselves are for the docs, not asserted (this machine is noisy)."""
    lines = run_bench("decide_cpu.py", "--workloads", "20", "--repeats", "3")
    # A warm start replays the policy's whole memory, one tick per evaluation interval.
    spec = resolve(TriggerCache().parse("bench-0", "so-00000", trigger_metadata(0)), Config())
    ticks = round(policy_memory_s(spec) / 5.0)
    assert lines[0] == f"20 warm starts, {ticks} ticks, best of 3"
    rows = {line[:30].strip(): float(line[30:].split()[0]) for line in lines[1:]}
    assert list(rows) == [
        "history (synthetic)",
        "replay, detail",
        "replay, quiet",
        "ratio quiet / detail",
        "season history (synthetic)",
        "recall",
        "ratio recall / replay, quiet",
        "Decision, NamedTuple",
        "Decision, frozen dataclass",
        "ratio NamedTuple / frozen",
    ]
    assert rows["ratio quiet / detail"] == pytest.approx(
        rows["replay, quiet"] / rows["replay, detail"], abs=0.01
    )
    assert rows["ratio recall / replay, quiet"] == pytest.approx(
        rows["recall"] / rows["replay, quiet"], abs=0.01
    )
    assert "(350 points)" in next(line for line in lines if "season history" in line)
    assert all(value > 0 for value in rows.values())
