"""Forecast bench: how well each model predicts a trace's arrival rate, walking forward in time.

Method (``scaler bench forecast --trace FILE``):

* **Series.** The trace is binned with :func:`gpu_queue_scaler_bench.traces.binned` into
  ``y[0..T-1]``, mean req/s per bin: 10 s bins for request traces by default, the rate window (600 s
  for ServeGen) for rate traces. NaN marks a data gap.
* **Walk forward (rolling origin, one-step updates).** Each model is fed ``y[0], y[1], ...`` one bin
  at a time (``update``). At every origin ``t`` of the walk, having seen exactly ``y[0..t]``, it
  forecasts ``t+1..t+Hmax`` (``predict``). The walk covers the last ``max_origins`` origins after a
  warm-up of ``warmup_bins`` bins (at least one season when a season applies); bins before the walk
  are fed untimed. Default ``max_origins`` = :data:`MAX_ORIGINS` (576: every origin of the one-hour
  request traces, the last 4 of the 14 days of the ServeGen language traces) keeps one trace,
  AutoARIMA included, to about a minute of CPU on the shipped traces (the 14-day ServeGen ones,
  whose AutoARIMA fits are the slowest, longest; run times in bench/results/forecast.md).
* **Horizons.** A horizon of ``H`` bins is scored on the ``H``-step-ahead value: the forecast made
  at ``t`` for ``t+H`` against ``y[t+H]``, the demand when a replica started at ``t`` is ready.
  Defaults 30, 60, 120 and 300 s for request traces; 1, 2 and 3 windows for rate traces. Targets
  that are NaN are not scored.
* **Upper bound at q = 0.9.** The ``scaler`` model brings its own (``ForecastResult.upper``). Every
  other model gets the same empirical interval: point + the 0.9 quantile of *that model's own* past
  errors (actual - point) at *that horizon*, over the last :data:`ERROR_WINDOW` errors already
  observable at ``t`` (forecasts made at ``t' <= t - H``). So the baselines and statsforecast are
  compared on their point forecasts plus one identical interval method. Origins are scored once
  :data:`MIN_ERRORS` such errors can exist, the same origins for every model.
* **Metrics** per model and horizon: ``pinball_q90``, the mean pinball (quantile) loss of the upper
  bound at q = 0.9, in req/s; ``mase``, the mean absolute error of the point forecast divided by the
  mean absolute one-step change of the whole series (the in-sample naive one-step MAE; the same
  scale for every model and horizon, so a naive forecast on a random walk scores ~1 at one step and
  ~sqrt(H) at ``H`` steps); ``coverage_q90``, the share of actuals <= upper (nominal 0.9; the
  text output adds the scaler's with a 95% interval, :func:`coverage_interval`: misses come in
  runs);
  ``cpu_s_per_update``, :func:`time.process_time` summed around the model's ``update`` and
  ``predict`` calls over the walk, divided by the number of origins (for statsforecast this
  includes its refits, amortised; the text output also shows the CPU per refit). That is
  generous to statsforecast: a refit runs only every ``refit_every`` origins and the origins in
  between only re-apply the fitted parameters (``forward``), where the scaler learns at every
  update. For the ``scaler`` the text output adds two notes: its CPU per update + predict with one
  series per forecaster (a workload's own, as in its warm-start replay; the ``cpu ms/update``
  column), and per workload as the engine runs it: :data:`BATCH_SERIES` workloads (the trace
  scaled by 0.5-2x) each observing its value once per bin through one
  :class:`gpu_queue_scaler.decision.bank.ForecastBank`, whose first observation of a bin closes the
  last one for all rows (one update + predict), timed over the last :data:`BATCH_UPDATES` bins.
* **Models.** ``scaler``: :class:`gpu_queue_scaler.forecast.ScalerForecaster` with ``period`` = one
  season when the trace is long enough, built for the horizon it is scored at (it selects its model
  by the pinball loss at that step, as it would be deployed), so one instance per horizon.
  ``naive``, ``moving_average`` and ``seasonal_naive`` are the product's own models
  (:mod:`gpu_queue_scaler.forecast.models`, the scaler's candidates, with their defaults): the last
  observed value; the mean of the last 6 observations; the value one season (``season_s``, default
  one day) earlier, only when the trace spans at least two seasons, else skipped with a note.
  ``autoets`` / ``autoarima``: statsforecast's AutoETS / AutoARIMA (the optional ``bench`` extra,
  imported lazily; skipped with a note when missing), non-seasonal (a daily season is 144 windows:
  ETS accepts at most 24 and seasonal ARIMA at that length is far too slow). They are refit every
  ``refit_every`` origins (default :data:`REFIT_EVERY`; AutoARIMA's fits are the walk's main cost)
  on the last :data:`FIT_WINDOW` bins of ``y[0..t]`` (360: the whole of a one-hour request trace at
  10 s, 2.5 days of 600 s windows; longer fits cost AutoARIMA seconds each), and between refits
  re-applied with the fitted parameters to the same trailing window including the new bins
  (``forward``). Gaps are filled with the last value for them. One untimed fit on a toy series
  before the walk keeps one-off import and compile costs out of the measurement.

Gaps: models see NaN for a gap and handle it as the scaler does (a model skips the bin; seasonal
naive keeps the value of the season before); a forecast that is NaN anyway is left out of that
model's scores.
"""

from __future__ import annotations

import importlib
import math
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler.decision.bank import ForecastBank
from gpu_queue_scaler.forecast import MovingAverage, Naive, ScalerForecaster, SeasonalNaive
from gpu_queue_scaler.forecast.models import Model
from gpu_queue_scaler_bench.traces import Trace, binned, default_bin_s

__all__ = [
    "DEFAULT_MODELS",
    "BenchResult",
    "Row",
    "evaluate",
    "parse_horizons",
    "parse_models",
    "run_bench",
]

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]

DEFAULT_MODELS = ("scaler", "naive", "moving_average", "seasonal_naive", "autoets", "autoarima")
REQUEST_HORIZONS_S = (30.0, 60.0, 120.0, 300.0)
RATE_HORIZON_WINDOWS = (1, 2, 3)
QUANTILE = 0.9
WARMUP_BINS = 24
MIN_ERRORS = 20
ERROR_WINDOW = 200
REFIT_EVERY = 12
MAX_ORIGINS = 576
BATCH_SERIES = 1000
BATCH_UPDATES = 60
BATCH_REPEATS = 5  # fresh banks on the same bins; the median is reported (CPU time is noisy)
SEASON_S = 86400.0
STATSFORECAST_MIN_FIT = 10
FIT_WINDOW = 360
COVERAGE_RESAMPLES = 2000  # of the coverage's block bootstrap (seeded: the same every run)


@dataclass(frozen=True)
class Row:
    model: str
    horizon_s: float
    pinball_q90: float
    mase: float
    coverage_q90: float
    cpu_s_per_update: float
    # A 95% interval for coverage_q90 (coverage_interval), for the text output; not in --json.
    coverage_ci95: tuple[float, float] | None = None


@dataclass(frozen=True)
class BenchResult:
    trace: str
    bin_s: float
    rows: list[Row]
    horizons_s: list[float]
    models: list[str]
    bins: int = 0
    origins: int = 0
    first_origin: int = 0
    scale: float = math.nan
    period_bins: int | None = None
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """``{"trace", "bin_s", "results": [{model, horizon_s, pinball_q90, mase, ...}]}``."""
        return {
            "trace": self.trace,
            "bin_s": self.bin_s,
            "results": [
                {
                    "model": row.model,
                    "horizon_s": row.horizon_s,
                    "pinball_q90": row.pinball_q90,
                    "mase": row.mase,
                    "coverage_q90": row.coverage_q90,
                    "cpu_s_per_update": row.cpu_s_per_update,
                }
                for row in self.rows
            ],
        }

    def table(self) -> str:
        """Model x horizon, side by side per metric, as a Markdown pipe table.

        pinball: q = 0.9 pinball loss of the upper bound (req/s); MASE of the point forecast;
        cover: share of actuals <= upper bound (nominal 0.90); cpu: mean over the horizons.
        """
        labels = [_horizon_label(h) for h in self.horizons_s]
        season = f"{self.period_bins} bins" if self.period_bins else "none"
        lines = [
            f"**{self.trace}**: bin {self.bin_s:g} s, {self.bins} bins, {self.origins} origins "
            f"(from bin {self.first_origin}), season {season}, MASE scale {self.scale:.4g} req/s",
            "",
        ]
        header = ["model"]
        for metric in ("pinball", "MASE", "cover"):
            header += [f"{metric} {label}" for label in labels]
        header.append("cpu ms/update")
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "|".join(["---"] + ["--:"] * (len(header) - 1)) + "|")
        by_key = {(row.model, row.horizon_s): row for row in self.rows}
        for model in self.models:
            rows = [by_key.get((model, h)) for h in self.horizons_s]
            if not any(rows):
                continue
            cells = [model]
            cells += [_fmt(r.pinball_q90 if r else None, ".3g") for r in rows]
            cells += [_fmt(r.mase if r else None, ".2f") for r in rows]
            cells += [_fmt(r.coverage_q90 if r else None, ".2f") for r in rows]
            cpu = float(np.mean([r.cpu_s_per_update for r in rows if r]))
            cells.append(_fmt(cpu * 1000, ".3g"))
            lines.append("| " + " | ".join(cells) + " |")
        if self.notes:
            lines.append("")
            lines += [f"- {note}" for note in self.notes]
        return "\n".join(lines)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _horizon_label(seconds: float) -> str:
    if seconds >= 600 and seconds % 60 == 0:
        return f"{seconds / 60:g}m"
    return f"{seconds:g}s"


# ---- parsing helpers for the CLI -------------------------------------------------------------


def parse_models(values: Sequence[str] | None) -> list[str]:
    """``["naive,moving_average", "autoets"]`` -> names, checked against :data:`DEFAULT_MODELS`."""
    if not values:
        return list(DEFAULT_MODELS)
    names = [name.strip() for value in values for name in value.split(",") if name.strip()]
    unknown = [name for name in names if name not in DEFAULT_MODELS]
    if unknown:
        raise ValueError(
            f"unknown model(s) {', '.join(unknown)}; known: {', '.join(DEFAULT_MODELS)}"
        )
    return list(dict.fromkeys(names))


def parse_horizons(values: Sequence[str] | None) -> list[float] | None:
    """``["30,60", "120"]`` -> seconds; None when not given (the trace's defaults apply)."""
    if not values:
        return None
    out: list[float] = []
    for value in values:
        for part in value.split(","):
            if not part.strip():
                continue
            try:
                seconds = float(part)
            except ValueError:
                raise ValueError(f"horizon {part!r} is not a number of seconds") from None
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(f"horizon {part!r} must be a positive number of seconds")
            out.append(seconds)
    return out


# ---- models ----------------------------------------------------------------------------------


class _Model(Protocol):
    name: str

    def update(self, value: float) -> None: ...

    def predict(self, h: int) -> tuple[FloatArray, FloatArray | None]:
        """Point forecast for t+1..t+h and the model's own 0.9 upper bound, or None."""
        ...


class _Baseline:
    """One of the product's point forecasters (`gpu_queue_scaler.forecast.models`) on one series:
    the baselines scored are the very models the scaler's forecaster runs as candidates, with no
    bound of their own (they get the empirical one, :func:`_score`)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.name = model.name

    def update(self, value: float) -> None:
        self.model.update(np.array([value], dtype=np.float64))

    def predict(self, h: int) -> tuple[FloatArray, FloatArray | None]:
        return self.model.predict(h)[0], None


class _Scaler:
    name = "scaler"

    def __init__(self, period: int | None, horizon: int) -> None:
        self.forecaster = ScalerForecaster(n_series=1, period=period, horizon=horizon)

    def update(self, value: float) -> None:
        self.forecaster.update(np.array([value], dtype=np.float64))

    def predict(self, h: int) -> tuple[FloatArray, FloatArray | None]:
        result = self.forecaster.predict(h)
        point = np.asarray(result.point, dtype=np.float64).reshape(-1, h)[0]
        upper = np.asarray(result.upper, dtype=np.float64).reshape(-1, h)[0]
        return point, upper


class _StatsForecast:
    """AutoETS / AutoARIMA refit every ``refit_every`` origins, ``forward`` in between."""

    def __init__(self, name: str, factory: Callable[[], Any], refit_every: int) -> None:
        self.name = name
        self.factory = factory
        self.refit_every = refit_every
        self.values: list[float] = []
        self.last = math.nan
        self.model: Any = None
        self.since_fit = 0
        self.fits = 0
        self.fit_cpu_s = 0.0
        self.failures = 0

    def update(self, value: float) -> None:
        if math.isfinite(value):
            self.last = value
        if math.isfinite(self.last):  # forward-fill gaps; leading gaps are dropped
            self.values.append(self.last)
            if len(self.values) > 2 * FIT_WINDOW:
                del self.values[:-FIT_WINDOW]

    def predict(self, h: int) -> tuple[FloatArray, FloatArray | None]:
        if len(self.values) < STATSFORECAST_MIN_FIT:
            return np.full(h, self.last), None
        y = np.asarray(self.values[-FIT_WINDOW:], dtype=np.float64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if self.model is None or self.since_fit >= self.refit_every:
                start = time.process_time()
                try:
                    model = self.factory()
                    model.fit(y)
                    self.model, self.since_fit = model, 0
                except Exception:  # a failed refit keeps the previous fit (or naive, if none)
                    self.failures += 1
                finally:
                    self.fits += 1
                    self.fit_cpu_s += time.process_time() - start
            self.since_fit += 1
            if self.model is None:
                return np.full(h, self.last), None
            try:
                if self.since_fit == 1:
                    mean = self.model.predict(h)["mean"]
                else:
                    mean = self.model.forward(y, h)["mean"]
            except Exception:
                self.failures += 1
                return np.full(h, self.last), None
        return np.asarray(mean, dtype=np.float64)[:h], None


def _statsforecast_factories() -> dict[str, Callable[[], Any]] | None:
    try:
        models = importlib.import_module("statsforecast.models")
    except ImportError:
        return None
    factories: dict[str, Callable[[], Any]] = {
        "autoets": lambda: models.AutoETS(season_length=1),
        "autoarima": lambda: models.AutoARIMA(season_length=1),
    }
    toy = 10 + np.sin(np.arange(60) / 3.0) + np.arange(60) * 0.05
    with warnings.catch_warnings():  # one-off import/compile costs, outside the timing
        warnings.simplefilter("ignore")
        for make in factories.values():
            try:
                fitted = make()
                fitted.fit(toy)
                fitted.predict(3)
                fitted.forward(toy, 3)
            except Exception:  # noqa: S112 - the real fit reports failures
                continue
    return factories


# ---- the bench -------------------------------------------------------------------------------


def run_bench(
    trace: Trace,
    *,
    bin_s: float | None = None,
    models: Sequence[str] = DEFAULT_MODELS,
    horizons_s: Sequence[float] | None = None,
    max_origins: int = MAX_ORIGINS,
    refit_every: int = REFIT_EVERY,
    season_s: float = SEASON_S,
    warmup_bins: int = WARMUP_BINS,
) -> BenchResult:
    """Bin ``trace`` and :func:`evaluate` the models on it (defaults: module docstring)."""
    width = default_bin_s(trace) if bin_s is None else float(bin_s)
    series = binned(trace, width)
    if horizons_s is None:
        if trace.kind == "rates":
            horizons_s = [k * width for k in RATE_HORIZON_WINDOWS]
        else:
            horizons_s = list(REQUEST_HORIZONS_S)
    return evaluate(
        series,
        width,
        name=trace.name,
        models=models,
        horizons_s=horizons_s,
        max_origins=max_origins,
        refit_every=refit_every,
        season_s=season_s,
        warmup_bins=warmup_bins,
    )


def evaluate(
    y: FloatArray,
    bin_s: float,
    *,
    name: str = "series",
    models: Sequence[str] = DEFAULT_MODELS,
    horizons_s: Sequence[float] = REQUEST_HORIZONS_S,
    max_origins: int = MAX_ORIGINS,
    refit_every: int = REFIT_EVERY,
    season_s: float = SEASON_S,
    warmup_bins: int = WARMUP_BINS,
) -> BenchResult:
    """Walk forward over ``y`` (req/s per bin of ``bin_s`` s) and score each model per horizon."""
    series = np.asarray(y, dtype=np.float64)
    if series.ndim != 1:
        raise ValueError("the series must be one-dimensional")
    if max_origins < 1 or refit_every < 1 or warmup_bins < 1:
        raise ValueError("max_origins, refit_every and warmup_bins must be >= 1")
    steps = _horizon_steps(horizons_s, bin_s)
    n = series.size
    changes = np.abs(np.diff(series))
    changes = changes[np.isfinite(changes)]
    scale = float(changes.mean()) if changes.size else math.nan
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(
            f"{name}: the series has no finite one-step change (constant or too short); "
            "MASE is undefined"
        )

    notes: list[str] = []
    period: int | None = None
    season_bins = season_s / bin_s
    whole = abs(season_bins - round(season_bins)) < 1e-9 and round(season_bins) >= 2
    if whole and n >= 2 * round(season_bins):
        period = round(season_bins)
    if period is None and "seasonal_naive" in models:
        notes.append(
            f"seasonal_naive skipped: the series ({n} bins of {bin_s:g} s) is shorter than two "
            f"seasons of {season_s:g} s"
        )
    warmup = max(warmup_bins, period or 0)
    first = max(warmup - 1, n - 1 - max_origins)
    origins = n - 1 - first
    if origins < 1:
        raise ValueError(
            f"{name}: {n} bins leave no origin after a warm-up of {warmup} bins; "
            "use a longer trace or smaller bins"
        )

    runs = _build_runs(models, period, refit_every, steps, notes)
    rows: list[Row] = []
    cpu_by_run: dict[int, float] = {}
    for model, scored_steps in runs:
        h_max = max(scored_steps)
        points, uppers, cpu = _walk(model, series, first, h_max)
        cpu_per_update = cpu / origins
        cpu_by_run[id(model)] = cpu_per_update
        if isinstance(model, _StatsForecast):
            per_fit = model.fit_cpu_s / model.fits if model.fits else math.nan
            note = (
                f"{model.name}: {model.fits} refits (every {refit_every} origins, on the last "
                f"{FIT_WINDOW} bins at most), {per_fit * 1000:.0f} ms CPU per refit, "
                f"{cpu_per_update * 1000:.1f} ms per update amortised"
            )
            if model.failures:
                note += f", {model.failures} failed fits/forecasts (previous fit or naive used)"
            notes.append(note)
        for h in scored_steps:
            row = _score(model.name, series, first, points, uppers, h, bin_s, scale, cpu_per_update)
            if row is None:
                notes.append(f"{model.name} at {h * bin_s:g} s: no scorable origin")
            else:
                rows.append(row)
    scaler_runs = [(model, h) for model, hs in runs if isinstance(model, _Scaler) for h in hs]
    if scaler_runs:
        single = ", ".join(
            f"{_horizon_label(h * bin_s)} {cpu_by_run[id(model)] * 1000:.3g} ms"
            for model, h in scaler_runs
        )
        banked = ", ".join(
            f"{_horizon_label(h * bin_s)} {_bank_cpu(model, series, bin_s) * 1e6:.3g} us"
            for model, h in scaler_runs
        )
        notes.append(
            f"scaler CPU per update + predict, one series per forecaster (a workload on its "
            f"own): {single}"
        )
        notes.append(
            f"scaler CPU per workload and update + predict as the engine runs it, "
            f"{BATCH_SERIES} workloads in one ForecastBank ({BATCH_UPDATES} timed bins, median "
            f"of {BATCH_REPEATS} runs): "
            f"{banked}"
        )
    intervals = ", ".join(
        f"{_horizon_label(row.horizon_s)} {row.coverage_q90:.2f} "
        f"[{row.coverage_ci95[0]:.2f}, {row.coverage_ci95[1]:.2f}]"
        for row in rows
        if row.model == "scaler" and row.coverage_ci95 is not None
    )
    if intervals:
        notes.append(
            "scaler coverage with its 95% interval (moving-block bootstrap over the scored "
            f"origins; misses come in runs): {intervals}"
        )
    names = list(dict.fromkeys(model.name for model, _ in runs))
    order = {name: i for i, name in enumerate(names)}
    rows.sort(key=lambda row: (order[row.model], row.horizon_s))

    return BenchResult(
        trace=name,
        bin_s=float(bin_s),
        rows=rows,
        horizons_s=[h * bin_s for h in steps],
        models=names,
        bins=n,
        origins=origins,
        first_origin=first,
        scale=scale,
        period_bins=period,
        notes=notes,
    )


def _horizon_steps(horizons_s: Sequence[float], bin_s: float) -> list[int]:
    if not (math.isfinite(bin_s) and bin_s > 0):
        raise ValueError(f"bin_s must be a positive number of seconds, got {bin_s!r}")
    if not horizons_s:
        raise ValueError("at least one horizon is needed")
    steps: list[int] = []
    for seconds in horizons_s:
        ratio = seconds / bin_s
        k = round(ratio)
        if k < 1 or abs(ratio - k) > 1e-6 * max(1.0, ratio):
            raise ValueError(f"horizon {seconds:g} s is not a whole number of {bin_s:g} s bins")
        if k not in steps:
            steps.append(k)
    return steps


def _walk(
    model: _Model, series: FloatArray, first: int, h_max: int
) -> tuple[FloatArray, FloatArray | None, float]:
    """Feed ``series[:first]`` untimed, then at each origin update + predict ``h_max`` steps."""
    n = series.size
    origins = n - 1 - first
    points = np.full((origins, h_max), np.nan)
    uppers: FloatArray | None = None
    for t in range(first):
        model.update(float(series[t]))
    cpu = 0.0
    for i, t in enumerate(range(first, n - 1)):
        start = time.process_time()
        model.update(float(series[t]))
        point, upper = model.predict(h_max)
        cpu += time.process_time() - start
        points[i] = point
        if upper is not None:
            if uppers is None:
                uppers = np.full((origins, h_max), np.nan)
            uppers[i] = upper
    return points, uppers, cpu


def _bank_cpu(model: _Scaler, series: FloatArray, bin_s: float) -> float:
    """CPU per workload of one bin through the engine's path: :data:`BATCH_SERIES` rows of one
    :class:`gpu_queue_scaler.decision.bank.ForecastBank` (the trace scaled by a factor per row,
    0.5-2), each observing its value once per bin, mid-bin; the first observation of a bin closes
    the previous one for every row (one update + predict) and each row's outlook is read. The last
    :data:`BATCH_UPDATES` bins are timed after the ones before them (at most 3x as many); the
    median of :data:`BATCH_REPEATS` fresh banks on the same bins."""
    forecaster = model.forecaster
    factors = np.linspace(0.5, 2.0, BATCH_SERIES)
    tail = series[-min(series.size, 4 * BATCH_UPDATES) :]
    timed = min(BATCH_UPDATES, tail.size)
    values = (factors[:, None] * tail[None, :]).T.tolist()  # per bin, per row

    def once() -> float:
        bank = ForecastBank(bin_s, forecaster.horizon, forecaster.period)
        rows = [bank.add(forecaster.horizon * bin_s) for _ in range(BATCH_SERIES)]

        def run(bins: range) -> None:
            for k in bins:
                at = (k + 0.5) * bin_s
                for row, value in zip(rows, values[k], strict=True):
                    bank.observe(row, at, value)

        run(range(tail.size - timed))
        start = time.process_time()
        run(range(tail.size - timed, tail.size))  # each bin's first observation closes the last
        return (time.process_time() - start) / timed / BATCH_SERIES

    return float(np.median([once() for _ in range(BATCH_REPEATS)]))


def _build_runs(
    names: Sequence[str],
    period: int | None,
    refit_every: int,
    steps: Sequence[int],
    notes: list[str],
) -> list[tuple[_Model, list[int]]]:
    """Model instances and the horizons (bins) each one is scored at.

    The scaler's forecaster is built for one horizon (it picks its model by the pinball loss at
    that step, as deployed for a workload), so it runs once per horizon; the others forecast all
    horizons from one run.
    """
    runs: list[tuple[_Model, list[int]]] = []
    factories: dict[str, Callable[[], Any]] | None = None
    statsforecast_checked = False
    for name in names:
        if name == "scaler":
            runs += [(_Scaler(period, h), [h]) for h in steps]
        elif name == "naive":
            runs.append((_Baseline(Naive(1)), list(steps)))
        elif name == "moving_average":
            runs.append((_Baseline(MovingAverage(1)), list(steps)))
        elif name == "seasonal_naive":
            if period is not None:
                runs.append((_Baseline(SeasonalNaive(1, period)), list(steps)))
        elif name in ("autoets", "autoarima"):
            if not statsforecast_checked:
                statsforecast_checked = True
                factories = _statsforecast_factories()
                if factories is None:
                    notes.append(
                        "autoets/autoarima skipped: statsforecast is not installed "
                        "(the optional 'bench' extra: pip install '.[bench]')"
                    )
            if factories is not None:
                runs.append((_StatsForecast(name, factories[name], refit_every), list(steps)))
        else:
            raise ValueError(f"unknown model {name!r}; known: {', '.join(DEFAULT_MODELS)}")
    return runs


def _score(
    model: str,
    series: FloatArray,
    first: int,
    points: FloatArray,
    uppers: FloatArray | None,
    h: int,
    bin_s: float,
    scale: float,
    cpu_per_update: float,
) -> Row | None:
    origins = points.shape[0]
    usable = origins - h  # origin i targets t = first + i + h, which must be <= n - 1
    if usable <= 0:
        return None
    point = points[:usable, h - 1]
    actual = series[first + h : first + h + usable]
    error = actual - point
    if uppers is not None:
        upper = uppers[:usable, h - 1]
    else:
        upper = np.full(usable, np.nan)
        for i in range(usable):
            seen = error[max(0, i - h + 1 - ERROR_WINDOW) : max(0, i - h + 1)]
            seen = seen[np.isfinite(seen)]
            if seen.size >= MIN_ERRORS // 2:
                upper[i] = point[i] + float(np.quantile(seen, QUANTILE))
    scored = np.zeros(usable, dtype=bool)
    scored[MIN_ERRORS + h - 1 :] = True  # the same origins for every model
    scored &= np.isfinite(actual) & np.isfinite(point) & np.isfinite(upper)
    if not scored.any():
        return None
    a, p, u = actual[scored], point[scored], upper[scored]
    miss = a - u
    pinball = np.maximum(QUANTILE * miss, (QUANTILE - 1) * miss)
    return Row(
        model=model,
        horizon_s=h * bin_s,
        pinball_q90=float(pinball.mean()),
        mase=float(np.abs(a - p).mean() / scale),
        coverage_q90=float(np.mean(a <= u)),
        cpu_s_per_update=cpu_per_update,
        coverage_ci95=coverage_interval(a <= u, h),
    )


def coverage_interval(hits: BoolArray, h: int, level: float = 0.95) -> tuple[float, float]:
    """A `level` interval for the share of hits, by a moving-block bootstrap.

    Why: a coverage figure is a share of a few hundred origins, and its misses come in runs (an
    h-step forecast issued before a level shift misses for the h origins that straddle it; a
    regime lasts many bins), so a binomial interval would be far too narrow. Resampling blocks of
    L = max(h, n^(1/3)) consecutive origins keeps those runs whole (Kunsch 1989; the n^(1/3)
    block length of Hall, Horowitz and Jing 1995). On a rate trace of a few hundred windows the
    interval spans tens of points (per trace: bench/results/forecast.md), so a coverage some
    points off nominal there cannot be told from nominal."""
    n = hits.size
    block = min(n, max(h, math.ceil(n ** (1 / 3))))
    starts = n - block + 1
    rng = np.random.default_rng(0)
    picks = rng.integers(0, starts, size=(COVERAGE_RESAMPLES, math.ceil(n / block)))
    sums = np.cumsum(np.concatenate(([0], hits.astype(np.float64))))
    per_block = sums[picks + block] - sums[picks]  # hits in each drawn block
    shares = per_block.sum(axis=1) / (picks.shape[1] * block)
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(shares, [tail, 1.0 - tail])
    return float(low), float(high)
