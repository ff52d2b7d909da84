"""`scaler bench forecast`: the JSON contract, metrics in range, and answers known in advance
(naive on a random walk, seasonal naive on a daily sine, a ramp forecast exactly). statsforecast is
never run here (too slow); its absence is simulated."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_queue_scaler import cli
from gpu_queue_scaler.forecast import Model, MovingAverage, Naive, SeasonalNaive
from gpu_queue_scaler_bench import forecast
from gpu_queue_scaler_bench.forecast import evaluate, parse_horizons, parse_models

TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces"
TOP_KEYS = {"trace", "bin_s", "results"}
ROW_KEYS = {"model", "horizon_s", "pinball_q90", "mase", "coverage_q90", "cpu_s_per_update"}


@pytest.fixture(autouse=True)
def small_bank_cpu_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    """The banked-CPU note's 1,000 workloads x 5 repeats per horizon took 30 s of a run whose
    numbers these tests do not read; 50 workloads, once, run the same code."""
    monkeypatch.setattr(forecast, "BATCH_SERIES", 50)
    monkeypatch.setattr(forecast, "BATCH_REPEATS", 1)


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = cli.main(["bench", "forecast", "--json", *args])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.strip().splitlines()
    assert len(lines) == 1  # exactly one object on stdout
    found: dict[str, Any] = json.loads(lines[0])
    return found


def check_contract(found: dict[str, Any]) -> None:
    assert set(found) == TOP_KEYS
    assert isinstance(found["trace"], str)
    assert isinstance(found["bin_s"], float) and found["bin_s"] > 0
    assert found["results"]
    for row in found["results"]:
        assert set(row) == ROW_KEYS
        assert row["model"] in forecast.DEFAULT_MODELS
        for key in ROW_KEYS - {"model"}:
            assert isinstance(row[key], float) and math.isfinite(row[key]), (key, row)
        assert row["horizon_s"] > 0
        assert row["pinball_q90"] >= 0
        assert row["mase"] >= 0
        assert 0.0 <= row["coverage_q90"] <= 1.0
        assert row["cpu_s_per_update"] >= 0


def by(found: dict[str, Any], model: str) -> dict[float, dict[str, Any]]:
    return {row["horizon_s"]: row for row in found["results"] if row["model"] == model}


def write_rates(path: Path, rates: np.ndarray, window: int = 600) -> Path:
    lines = ["ts,total_rate,active_clients,rate_weighted_cv"]
    lines += [f"{i * window},{rate:.6f},10,1.0" for i, rate in enumerate(rates)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_random_walk_naive_mase_is_one_at_one_step(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a random walk the naive forecast's error at one step IS the one-step change, so its
    MASE is ~1; at three steps the error is a sum of 3 changes, ~sqrt(3) x as large."""
    rng = np.random.default_rng(7)
    walk = 5000 + np.cumsum(rng.normal(0, 20, 700))
    path = write_rates(tmp_path / "walk.csv", walk)
    found = run_json(capsys, "--trace", str(path), "--models", "naive,moving_average")
    check_contract(found)
    assert found["bin_s"] == 600.0
    naive = by(found, "naive")
    assert sorted(naive) == [600.0, 1200.0, 1800.0]  # 1, 2 and 3 windows
    assert naive[600.0]["mase"] == pytest.approx(1.0, abs=0.08)
    assert naive[1800.0]["mase"] == pytest.approx(math.sqrt(3), rel=0.15)
    # a moving average lags a random walk: worse than naive
    assert by(found, "moving_average")[600.0]["mase"] > naive[600.0]["mase"]
    for row in found["results"]:  # the empirical bound is calibrated on a stationary process
        assert 0.8 <= row["coverage_q90"] <= 0.97


def test_daily_sine_seasonal_naive_beats_naive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(3)
    t = np.arange(144 * 4)  # four days of 600 s windows
    rates = 1000 + 500 * np.sin(2 * np.pi * t / 144) + rng.normal(0, 5, t.size)
    path = write_rates(tmp_path / "sine.csv", rates)
    found = run_json(capsys, "--trace", str(path), "--models", "naive,seasonal_naive")
    check_contract(found)
    naive, seasonal = by(found, "naive"), by(found, "seasonal_naive")
    assert sorted(seasonal) == sorted(naive) == [600.0, 1200.0, 1800.0]
    for h in naive:
        assert seasonal[h]["mase"] < naive[h]["mase"]
        assert seasonal[h]["pinball_q90"] < naive[h]["pinball_q90"]


def test_synthetic_request_trace_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(11)
    stamps = np.sort(rng.uniform(0, 1800, 5400))  # ~3 req/s for 30 min, seconds
    path = tmp_path / "requests.csv"
    path.write_text(
        "timestamp,input_tokens,output_tokens\n" + "".join(f"{s:.4f},100,10\n" for s in stamps),
        encoding="utf-8",
    )
    found = run_json(capsys, "--trace", str(path), "--models", "naive", "moving_average")
    check_contract(found)
    assert found["trace"] == "requests"
    assert found["bin_s"] == 10.0
    assert sorted(by(found, "naive")) == [30.0, 60.0, 120.0, 300.0]
    assert [row["model"] for row in found["results"]] == ["naive"] * 4 + ["moving_average"] * 4
    # Poisson counts: averaging 6 bins beats the last bin
    assert by(found, "moving_average")[30.0]["mase"] < by(found, "naive")[30.0]["mase"]


def test_shipped_trace_with_fast_baselines(capsys: pytest.CaptureFixture[str]) -> None:
    trace = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
    found = run_json(capsys, "--trace", str(trace), "--models", "naive,moving_average")
    check_contract(found)
    assert found["trace"] == "AzureLLMInferenceTrace_conv"
    assert {row["model"] for row in found["results"]} == {"naive", "moving_average"}
    assert len(found["results"]) == 8
    for row in found["results"]:
        assert 0.5 < row["mase"] < 3  # a smooth ramp: near the naive scale
        assert 0.75 < row["coverage_q90"] < 1.0


def test_shipped_rate_trace_with_gaps(capsys: pytest.CaptureFixture[str]) -> None:
    trace = TRACES / "servegen" / "aggregate_rate_language_m-small.csv"
    found = run_json(
        capsys, "--trace", str(trace), "--models", "naive,seasonal_naive", "--max-origins", "1500"
    )
    check_contract(found)
    assert {row["model"] for row in found["results"]} == {"naive", "seasonal_naive"}


def test_scaler_forecaster_runs_per_horizon(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = np.random.default_rng(5)
    walk = 800 + np.cumsum(rng.normal(0, 10, 300))
    path = write_rates(tmp_path / "walk.csv", walk)
    found = run_json(capsys, "--trace", str(path), "--models", "scaler,naive")
    check_contract(found)
    scaler = by(found, "scaler")
    assert sorted(scaler) == [600.0, 1200.0, 1800.0]
    assert scaler[600.0]["mase"] < 2


def test_text_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rates = 100 + 10 * np.sin(np.arange(200) / 5.0)
    path = write_rates(tmp_path / "s.csv", rates)
    assert cli.main(["bench", "forecast", "--trace", str(path), "--models", "naive"]) == 0
    out = capsys.readouterr().out
    assert "| model | pinball 10m | pinball 20m | pinball 30m | MASE 10m" in out
    assert "| naive |" in out
    assert "seasonal_naive" not in out  # not asked for: no note either


def test_seasonal_naive_skipped_on_short_traces_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_rates(tmp_path / "day.csv", 100 + np.arange(144) % 7)
    args = ["--trace", str(path), "--models", "naive,seasonal_naive", "--json"]
    assert cli.main(["bench", "forecast", *args]) == 0
    captured = capsys.readouterr()
    found = json.loads(captured.out)
    assert {row["model"] for row in found["results"]} == {"naive"}
    assert "seasonal_naive skipped" in captured.err


def test_missing_statsforecast_skips_with_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forecast, "_statsforecast_factories", lambda: None)
    y = 50 + np.cumsum(np.random.default_rng(1).normal(0, 1, 120))
    result = evaluate(y, 10.0, models=["naive", "autoets", "autoarima"], horizons_s=[10.0])
    assert [row.model for row in result.rows] == ["naive"]
    assert any("statsforecast is not installed" in note for note in result.notes)


def test_ramp_is_forecast_exactly_by_the_empirical_bound() -> None:
    """y = t: naive is always short by exactly h, so its error quantile is h and the bound hits
    every actual: pinball 0, coverage 1, MASE = h (the one-step change is 1)."""
    y = np.arange(200, dtype=np.float64)
    result = evaluate(y, 10.0, models=["naive"], horizons_s=[10.0, 30.0])
    rows = {row.horizon_s: row for row in result.rows}
    for h_s, steps in ((10.0, 1), (30.0, 3)):
        assert rows[h_s].pinball_q90 == 0.0
        assert rows[h_s].coverage_q90 == 1.0
        assert rows[h_s].mase == pytest.approx(steps)


def test_the_baselines_are_the_products_own_models() -> None:
    """naive, moving_average and seasonal_naive score `gpu_queue_scaler.forecast.models` themselves,
    gaps handled as the scaler handles them (the moving average over the last 6 observations, not 6
    bins; a seasonal gap keeps the season before): each row's MASE is that of the product's model
    walked over the same origins."""
    rng = np.random.default_rng(4)
    y = 500 + 100 * np.sin(2 * np.pi * np.arange(400) / 144) + rng.normal(0, 5, 400)
    y[200:208] = np.nan  # longer than the moving average's window
    y[300:303] = np.nan  # one season after some of the gap: seasonal naive reaches back past it
    models = ["naive", "moving_average", "seasonal_naive"]
    result = evaluate(y, 600.0, models=models, horizons_s=[600.0, 1200.0, 1800.0])
    scale = np.nanmean(np.abs(np.diff(y)))
    first = result.first_origin
    products: list[Model] = [Naive(1), MovingAverage(1), SeasonalNaive(1, period=144)]
    for product in products:
        rows = {row.horizon_s: row for row in result.rows if row.model == product.name}
        assert sorted(rows) == [600.0, 1200.0, 1800.0]
        points = []
        for t, value in enumerate(y[:-1]):
            product.update([value])
            if t >= first:
                points.append(product.predict(3)[0])
        forecasts = np.array(points)
        for h in (1, 2, 3):
            usable = forecasts.shape[0] - h
            actual = y[first + h : first + h + usable]
            scored = (np.arange(usable) >= forecast.MIN_ERRORS + h - 1) & np.isfinite(actual)
            error = np.abs(actual - forecasts[:usable, h - 1])[scored]
            assert rows[h * 600.0].mase == pytest.approx(error.mean() / scale, rel=1e-9)


def test_no_future_leaks_into_the_walk() -> None:
    """A jump at the last bin cannot change any forecast made before it."""
    rng = np.random.default_rng(2)
    y = 100 + rng.normal(0, 1, 150)
    jumped = y.copy()
    jumped[-1] = 1e6
    for model in ("naive", "moving_average"):
        a = evaluate(y[:-1], 10.0, models=[model], horizons_s=[10.0], max_origins=100)
        b = evaluate(jumped[:-1], 10.0, models=[model], horizons_s=[10.0], max_origins=100)
        assert a.rows[0].mase == b.rows[0].mase


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--models", "prophet"], "unknown model"),
        (["--horizons", "45"], "not a whole number of 10 s bins"),
        (["--horizons", "-5"], "positive"),
        (["--bin-s", "0"], "bin_s"),
    ],
)
def test_bad_arguments_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    path = tmp_path / "r.csv"
    path.write_text("timestamp\n" + "".join(f"{i * 0.5}\n" for i in range(2000)), encoding="utf-8")
    assert cli.main(["bench", "forecast", "--trace", str(path), *args]) == 2
    assert message in capsys.readouterr().err


def test_malformed_trace_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("what,ever\n1,2\n", encoding="utf-8")
    assert cli.main(["bench", "forecast", "--trace", str(path), "--json"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert str(path) in captured.err and "accepted formats" in captured.err


def test_parsers() -> None:
    assert parse_models(None) == list(forecast.DEFAULT_MODELS)
    assert parse_models(["naive,moving_average", "naive"]) == ["naive", "moving_average"]
    assert parse_horizons(None) is None
    assert parse_horizons(["30,60", "120"]) == [30.0, 60.0, 120.0]
    with pytest.raises(ValueError, match="not a number"):
        parse_horizons(["soon"])


def test_coverage_interval_exact_when_nothing_varies_and_wider_when_misses_come_in_runs() -> None:
    assert forecast.coverage_interval(np.ones(120, dtype=bool), 3) == (1.0, 1.0)
    # 10% misses, evenly spread vs in runs of 12 (a level shift missed by a 3-window forecast
    # for a few windows in a row): the same share, but runs are far less sure of it.
    spread = np.ones(240, dtype=bool)
    spread[::10] = False
    runs = np.ones(240, dtype=bool)
    for start in range(0, 240, 120):
        runs[start : start + 12] = False
    assert spread.mean() == runs.mean() == 0.9
    low_s, high_s = forecast.coverage_interval(spread, 1)
    low_r, high_r = forecast.coverage_interval(runs, 3)
    assert low_s <= 0.9 <= high_s and low_r <= 0.9 <= high_r
    assert high_r - low_r > 2 * (high_s - low_s)
    assert forecast.coverage_interval(runs, 3) == (low_r, high_r)  # seeded: the same every run


def test_the_scaler_rows_carry_a_coverage_interval_in_the_text_only() -> None:
    rng = np.random.default_rng(3)
    y = 20 + 5 * np.sin(np.arange(400) / 30) + rng.normal(0, 1, 400)
    result = evaluate(y, 10.0, models=["scaler", "naive"], horizons_s=[30.0])
    scaler_row = next(r for r in result.rows if r.model == "scaler")
    assert scaler_row.coverage_ci95 is not None
    low, high = scaler_row.coverage_ci95
    assert low <= scaler_row.coverage_q90 <= high
    assert any("95% interval" in note and f"{low:.2f}" in note for note in result.notes)
    assert "coverage_ci95" not in json.dumps(result.to_json())  # --json keeps its documented keys
