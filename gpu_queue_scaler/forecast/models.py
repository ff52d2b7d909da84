"""Point forecasters for N demand series at once, one bin per update.

Every model holds arrays with one row per series and advances all of them with a few numpy
operations per update, so 1,000 workloads cost about as much as one Python call. Time is the
bin index (how many updates the model has seen); nothing here reads a clock.

Before its first observation a series forecasts 0. Missing data: a non-finite observation leaves
that series' state untouched. Non-seasonal models
simply skip the bin; seasonal models share one bin clock across series (the phase of the day does
not stop for a failed scrape), so the bin passes but the series learns nothing from it.

Parameters are fixed defaults from the usual textbook ranges rather than fitted per series: the
forecaster in `select.py` ranks and combines models per series instead, which is cheaper, robust
on short histories, and explains itself by name.

The update and forecast arithmetic lives in module-level functions (`*_step`, `*_forecast`) so a
compiled version can replace them without touching the classes.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Self, runtime_checkable

import numpy as np
from numpy.typing import ArrayLike

from gpu_queue_scaler.forecast._arrays import (
    BoolArray,
    FloatArray,
    IntArray,
    State,
    as_history,
    check_count,
    check_steps,
    check_unit,
    observe,
)
from gpu_queue_scaler.forecast._rows import RowState

__all__ = [
    "HoltDamped",
    "Model",
    "MovingAverage",
    "Naive",
    "SeasonalHolt",
    "SeasonalNaive",
    "SimpleExponential",
    "damped_sums",
    "holt_forecast",
    "holt_step",
    "holt_winters_forecast",
    "holt_winters_init",
    "holt_winters_step",
    "last_value_step",
    "moving_average_mean",
    "moving_average_step",
    "seasonal_naive_forecast",
    "seasonal_naive_step",
]


@runtime_checkable
class Model(Protocol):
    """What the selector, the contract test and callers rely on."""

    name: str
    n_series: int

    @property
    def ready(self) -> BoolArray:
        """Per series: has the model seen enough history to be trusted?"""
        ...

    def update(self, y: ArrayLike) -> None:
        """Take one observation per series, shape (N,); NaN = missing."""
        ...

    def predict(self, h: int) -> FloatArray:
        """Point forecasts for steps 1..h ahead, shape (N, h), finite and >= 0."""
        ...

    def fit(self, history: ArrayLike) -> Self:
        """Reset, then replay `history` (shape (N, T)) one column at a time: the warm start."""
        ...

    def state(self) -> State:
        """Copies of the per-series state arrays (first axis N), for tests and debugging."""
        ...


# --- hot paths ----------------------------------------------------------------------------------


def last_value_step(last: FloatArray, y: FloatArray, ok: BoolArray) -> FloatArray:
    """Naive: the last present observation."""
    return np.where(ok, y, last)


def moving_average_step(buf: FloatArray, n_obs: IntArray, y: FloatArray, ok: BoolArray) -> None:
    """Write each present observation into its series' ring (in place).

    Each series has its own write position (n_obs mod window) so a missing bin does not push
    an old value out: the mean stays over the last `window` *observations*.
    """
    rows = np.flatnonzero(ok)
    buf[rows, n_obs[rows] % buf.shape[1]] = y[rows]
    n_obs[rows] += 1


def moving_average_mean(buf: FloatArray, n_obs: IntArray) -> FloatArray:
    """Mean of the filled part of each ring (unfilled slots hold 0); 0 with no observation."""
    count = np.minimum(n_obs, buf.shape[1])
    return np.asarray(buf.sum(axis=1) / np.maximum(count, 1), dtype=np.float64)


def damped_sums(phi: float, h: int) -> FloatArray:
    """phi + phi^2 + ... + phi^k for k = 1..h: how much of the trend each step carries."""
    return np.cumsum(phi ** np.arange(1, h + 1, dtype=np.float64))


def holt_step(
    level: FloatArray,
    trend: FloatArray,
    n_obs: IntArray,
    y: FloatArray,
    ok: BoolArray,
    alpha: float,
    beta: float,
    phi: float,
) -> tuple[FloatArray, FloatArray]:
    """Gardner & McKenzie damped-trend recursions; the first observation sets the level.

    The trend starts at 0 rather than at the first difference: on bursty data one difference is
    mostly noise, and a zero trend is the conservative claim until the data shows one.
    """
    prior = level + phi * trend
    new_level = alpha * y + (1.0 - alpha) * prior
    new_trend = beta * (new_level - level) + (1.0 - beta) * phi * trend
    first = ok & (n_obs == 0)
    later = ok & (n_obs > 0)
    return np.where(first, y, np.where(later, new_level, level)), np.where(later, new_trend, trend)


def holt_forecast(level: FloatArray, trend: FloatArray, phi: float, h: int) -> FloatArray:
    """level + (phi + ... + phi^k) * trend for k = 1..h."""
    return level[:, None] + trend[:, None] * damped_sums(phi, h)[None, :]


def seasonal_naive_step(
    buf: FloatArray, seen: BoolArray, t: int, y: FloatArray, ok: BoolArray
) -> None:
    """Store the observation of bin t in its phase column (in place); missing keeps the old one."""
    p = t % buf.shape[1]
    buf[:, p] = np.where(ok, y, buf[:, p])
    seen[:, p] |= ok


def seasonal_naive_forecast(
    buf: FloatArray, seen: BoolArray, last: FloatArray, t: int, h: int
) -> FloatArray:
    """The latest observation at each target's phase; the last value where a phase is unseen."""
    phases = (t + np.arange(h)) % buf.shape[1]
    return np.where(seen[:, phases], buf[:, phases], last[:, None])


def holt_winters_init(
    hist: FloatArray, start: IntArray, period: int
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Level, trend and seasonal indices from two periods of history.

    hist has shape (n, 2, period): cycle (first/second period after the series' first
    observation) by absolute phase (bin mod period), NaN where missing. The classic decomposition:
    trend from the difference of the two cycle means, seasonal index = mean over cycles of the
    detrended value at that phase (0 for a phase never seen), centred to sum to 0; the level is
    the second cycle's mean carried to its last bin.
    """
    m = period
    ok = np.isfinite(hist)
    values = np.where(ok, hist, 0.0)
    count = ok.sum(axis=2)
    mean = values.sum(axis=2) / np.maximum(count, 1)
    has_second = count[:, 1] > 0
    mean0 = mean[:, 0]
    mean1 = np.where(has_second, mean[:, 1], mean0)
    trend = np.where(has_second, (mean1 - mean0) / m, 0.0)
    position = (np.arange(m)[None, :] - start[:, None]) % m  # bin within its cycle, per phase
    ramp = (position - (m - 1) / 2.0) * trend[:, None]
    centre = np.stack([mean0, mean1], axis=1)
    detrended = np.where(ok, hist - centre[:, :, None] - ramp[:, None, :], 0.0)
    season = detrended.sum(axis=1) / np.maximum(ok.sum(axis=1), 1)
    season = season - season.mean(axis=1, keepdims=True)
    level = mean1 + (m - 1) / 2.0 * trend
    return level, trend, season


def holt_winters_step(
    level: FloatArray,
    trend: FloatArray,
    season_now: FloatArray,
    y: FloatArray,
    alpha: float,
    beta: float,
    gamma: float,
    phi: float,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Additive Holt-Winters with damped trend (error-correction form)."""
    prior = level + phi * trend
    new_level = alpha * (y - season_now) + (1.0 - alpha) * prior
    new_trend = beta * (new_level - level) + (1.0 - beta) * phi * trend
    new_season = gamma * (y - prior) + (1.0 - gamma) * season_now
    return new_level, new_trend, new_season


def holt_winters_forecast(
    level: FloatArray, trend: FloatArray, season_at_targets: FloatArray, phi: float
) -> FloatArray:
    """level + damped trend + the seasonal index of each target bin (shape (n, h))."""
    h = season_at_targets.shape[1]
    return holt_forecast(level, trend, phi, h) + season_at_targets


# --- models -------------------------------------------------------------------------------------


def _check_origin(origin: int) -> int:
    """A bin index: any integer (the wall-clock bin of the first update, or 0)."""
    if isinstance(origin, bool) or not isinstance(origin, int | np.integer):
        raise ValueError(f"origin must be an integer bin index, got {origin!r}")
    return int(origin)


class _Base(RowState):
    """Shared plumbing: input checks, warm start, the >= 0 clamp (demand is never negative), row
    operations (`gpu_queue_scaler.forecast._rows`)."""

    name: str = "model"

    def __init__(self, n_series: int) -> None:
        self.n_series = check_count(n_series, "n_series")
        self._reset()

    def _reset(self) -> None:
        raise NotImplementedError

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        raise NotImplementedError

    def _predict(self, h: int) -> FloatArray:
        raise NotImplementedError

    def state(self) -> State:
        raise NotImplementedError

    @property
    def ready(self) -> BoolArray:
        """These models are usable from the first observation (before it they forecast 0)."""
        return np.ones(self.n_series, dtype=np.bool_)

    def update(self, y: ArrayLike) -> None:
        values, ok = observe(y, self.n_series)
        self._step(values, ok)

    def predict(self, h: int) -> FloatArray:
        return np.maximum(self._predict(check_steps(h)), 0.0)

    def predict_steps(self, out: FloatArray, steps: IntArray) -> None:
        """`predict`'s values at `steps` (1-based, ascending) into `out` (shape (len(steps), N)):
        the same numbers laid out step by step, as `ScalerForecaster` keeps them."""
        out[...] = self.predict(int(steps[-1])).T[steps - 1]

    def _flat_steps(self, value: FloatArray, out: FloatArray) -> None:
        """A flat forecast: every step is `value`, clamped at 0 as `predict` does."""
        np.maximum(value, 0.0, out=out[0])
        out[1:] = out[0]

    def fit(self, history: ArrayLike) -> Self:
        values = as_history(history, self.n_series)
        self._reset()
        for column in values.T:
            self.update(column)
        return self

    @classmethod
    def forecast(cls, history: ArrayLike, h: int, **params: Any) -> FloatArray:
        """`cls(N, **params).fit(history).predict(h)` in one call."""
        values = np.asarray(history, dtype=np.float64)
        if values.ndim != 2:
            raise ValueError(f"expected shape (N, T), got {values.shape}")
        return cls(values.shape[0], **params).fit(values).predict(h)


class Naive(_Base):
    """Last observed value: the baseline every other model must beat, and the most robust."""

    name = "naive"
    _ROWS: ClassVar[dict[str, int]] = {"_last": 0, "_n_obs": 0}

    def _reset(self) -> None:
        self._last = np.zeros(self.n_series)
        self._n_obs = np.zeros(self.n_series, dtype=np.int64)

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        self._last = last_value_step(self._last, y, ok)
        self._n_obs = self._n_obs + ok

    def _predict(self, h: int) -> FloatArray:
        return np.repeat(self._last[:, None], h, axis=1)

    def predict_steps(self, out: FloatArray, steps: IntArray) -> None:
        self._flat_steps(self._last, out)

    def state(self) -> State:
        return {"last": self._last.copy(), "n_obs": self._n_obs.copy()}


class MovingAverage(_Base):
    """Mean of the last `window` observations: trades a lag for less noise on bursty series.

    Default window 6: short enough to follow a step within a few bins, long enough to cut the
    variance of white noise about six-fold.
    """

    name = "moving_average"
    _ROWS: ClassVar[dict[str, int]] = {"_buf": 0, "_n_obs": 0}

    def __init__(self, n_series: int, window: int = 6) -> None:
        self.window = check_count(window, "window")
        super().__init__(n_series)

    def _reset(self) -> None:
        self._buf = np.zeros((self.n_series, self.window))
        self._n_obs = np.zeros(self.n_series, dtype=np.int64)

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        moving_average_step(self._buf, self._n_obs, y, ok)

    def _predict(self, h: int) -> FloatArray:
        return np.repeat(moving_average_mean(self._buf, self._n_obs)[:, None], h, axis=1)

    def predict_steps(self, out: FloatArray, steps: IntArray) -> None:
        self._flat_steps(moving_average_mean(self._buf, self._n_obs), out)

    def state(self) -> State:
        return {"buf": self._buf.copy(), "n_obs": self._n_obs.copy()}


class SeasonalNaive(_Base):
    """The value one period before each target bin (e.g. same time yesterday).

    Where a phase has not been observed yet it falls back to the last value (Naive), so it
    forecasts sensibly from the start; `ready` once a full period has passed since the series'
    first observation. A missing bin keeps the value from the period before. Memory:
    O(N * period).

    `origin` is the index of the first bin it is updated with (default 0): the phase of bin t is
    t mod period, so forecasters started at different bins of one grid agree on phases and can
    exchange rows (`copy_rows`).
    """

    name = "seasonal_naive"
    _ROWS: ClassVar[dict[str, int]] = {"_start": 0, "_buf": 0, "_seen": 0, "_last": 0}

    def __init__(self, n_series: int, period: int, *, origin: int = 0) -> None:
        self.period = check_count(period, "period")
        self.origin = _check_origin(origin)
        super().__init__(n_series)

    def _reset(self) -> None:
        self._t = self.origin
        self._start = np.full(self.n_series, -1, dtype=np.int64)  # bin of the first observation
        self._buf = np.zeros((self.n_series, self.period))
        self._seen = np.zeros((self.n_series, self.period), dtype=np.bool_)
        self._last = np.zeros(self.n_series)

    @property
    def ready(self) -> BoolArray:
        """A full period has passed since the series' first observation."""
        return np.asarray((self._start >= 0) & (self._t - self._start >= self.period))

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        self._start = np.where(ok & (self._start < 0), self._t, self._start)
        seasonal_naive_step(self._buf, self._seen, self._t, y, ok)
        self._last = last_value_step(self._last, y, ok)
        self._t += 1

    def _predict(self, h: int) -> FloatArray:
        return seasonal_naive_forecast(self._buf, self._seen, self._last, self._t, h)

    def state(self) -> State:
        return {
            "start": self._start.copy(),
            "buf": self._buf.copy(),
            "seen": self._seen.copy(),
            "last": self._last.copy(),
        }


class SimpleExponential(_Base):
    """Simple exponential smoothing (a flat forecast at an exponentially weighted level).

    Default alpha=0.3: between Naive (alpha 1) and a long moving average; the level forgets
    half of an old observation in about two bins, so a step is followed within ~10 bins.
    """

    name = "ses"
    _ROWS: ClassVar[dict[str, int]] = {"_level": 0, "_n_obs": 0}

    def __init__(self, n_series: int, alpha: float = 0.3) -> None:
        self.alpha = check_unit(alpha, "alpha")
        super().__init__(n_series)

    def _reset(self) -> None:
        self._level = np.zeros(self.n_series)
        self._n_obs = np.zeros(self.n_series, dtype=np.int64)

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        new = np.where(self._n_obs > 0, self._level + self.alpha * (y - self._level), y)
        self._level = np.where(ok, new, self._level)
        self._n_obs = self._n_obs + ok

    def _predict(self, h: int) -> FloatArray:
        return np.repeat(self._level[:, None], h, axis=1)

    def predict_steps(self, out: FloatArray, steps: IntArray) -> None:
        self._flat_steps(self._level, out)

    def state(self) -> State:
        return {"level": self._level.copy(), "n_obs": self._n_obs.copy()}


class HoltDamped(_Base):
    """Additive damped trend (Gardner & McKenzie): follows ramps without extrapolating forever.

    Defaults alpha=0.5 (the level follows half of each surprise: responsive, as queue demand
    moves fast), beta=0.1 (the trend needs several bins of evidence), phi=0.9 (the trend's total
    contribution is bounded by phi / (1 - phi) = 9 bins of slope, however long the horizon).
    """

    name = "holt_damped"
    _ROWS: ClassVar[dict[str, int]] = {"_level": 0, "_trend": 0, "_n_obs": 0}

    def __init__(
        self, n_series: int, alpha: float = 0.5, beta: float = 0.1, phi: float = 0.9
    ) -> None:
        self.alpha = check_unit(alpha, "alpha")
        self.beta = check_unit(beta, "beta", closed_low=True)
        self.phi = check_unit(phi, "phi", closed_low=True)
        super().__init__(n_series)

    def _reset(self) -> None:
        self._level = np.zeros(self.n_series)
        self._trend = np.zeros(self.n_series)
        self._n_obs = np.zeros(self.n_series, dtype=np.int64)

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        self._level, self._trend = holt_step(
            self._level, self._trend, self._n_obs, y, ok, self.alpha, self.beta, self.phi
        )
        self._n_obs = self._n_obs + ok

    def _predict(self, h: int) -> FloatArray:
        return holt_forecast(self._level, self._trend, self.phi, h)

    def predict_steps(self, out: FloatArray, steps: IntArray) -> None:
        # holt_forecast's level + trend * damped sum, per element, in (steps, N) layout.
        sums = damped_sums(self.phi, int(steps[-1]))[steps - 1]
        np.multiply(self._trend[None, :], sums[:, None], out=out)
        out += self._level
        np.maximum(out, 0.0, out=out)

    def state(self) -> State:
        return {
            "level": self._level.copy(),
            "trend": self._trend.copy(),
            "n_obs": self._n_obs.copy(),
        }


class SeasonalHolt(_Base):
    """Additive Holt-Winters with damped trend, for workloads with a daily (or other) cycle.

    A series is `ready` once two periods have passed since its first observation: the seasonal
    indices are then initialised from those two periods (see `holt_winters_init`) and the
    recursions run from there. Before that it forecasts like SeasonalNaive from what it has seen.

    Defaults alpha=0.3, beta=0.05, gamma=0.2, phi=0.9: the level smooths more than HoltDamped's
    because the seasonal indices already explain the regular movement; the seasonal indices adapt
    over about five periods; the trend is damped as in HoltDamped. Memory: O(N * period).
    `origin`: as in SeasonalNaive.
    """

    name = "seasonal_holt"
    _ROWS: ClassVar[dict[str, int]] = {
        "_start": 0,
        "_last": 0,
        "_hist": 0,
        "_live": 0,
        "_level": 0,
        "_trend": 0,
        "_season": 0,
    }

    def __init__(
        self,
        n_series: int,
        period: int,
        alpha: float = 0.3,
        beta: float = 0.05,
        gamma: float = 0.2,
        phi: float = 0.9,
        *,
        origin: int = 0,
    ) -> None:
        self.period = check_count(period, "period")
        self.origin = _check_origin(origin)
        self.alpha = check_unit(alpha, "alpha")
        self.beta = check_unit(beta, "beta", closed_low=True)
        self.gamma = check_unit(gamma, "gamma", closed_low=True)
        self.phi = check_unit(phi, "phi", closed_low=True)
        super().__init__(n_series)

    def _reset(self) -> None:
        n, m = self.n_series, self.period
        self._t = self.origin
        self._start = np.full(n, -1, dtype=np.int64)  # bin of the first observation
        self._last = np.zeros(n)
        self._hist = np.full((n, 2, m), np.nan)  # the first two periods, for the initialisation
        self._live = np.zeros(n, dtype=np.bool_)  # recursions running
        self._level = np.zeros(n)
        self._trend = np.zeros(n)
        self._season = np.zeros((n, m))

    @property
    def ready(self) -> BoolArray:
        """Two full periods have passed since the series' first observation."""
        return np.asarray((self._start >= 0) & (self._t - self._start >= 2 * self.period))

    def _step(self, y: FloatArray, ok: BoolArray) -> None:
        t, m = self._t, self.period
        p = t % m
        self._start = np.where(ok & (self._start < 0), t, self._start)
        age = t - self._start
        warm = np.flatnonzero(ok & (age < 2 * m))
        self._hist[warm, age[warm] // m, p] = y[warm]
        run = ok & (age >= 2 * m)
        # The initialisation is due when two periods have passed, but is done at the series' next
        # observation, so a missing bin changes nothing (predict computes it on the fly meanwhile).
        due = np.flatnonzero(run & ~self._live)
        if due.size:
            level, trend, season = holt_winters_init(self._hist[due], self._start[due], m)
            self._level[due], self._trend[due], self._season[due] = level, trend, season
            self._live[due] = True
        if run.any():
            level, trend, season_now = holt_winters_step(
                self._level,
                self._trend,
                self._season[:, p],
                y,
                self.alpha,
                self.beta,
                self.gamma,
                self.phi,
            )
            self._level = np.where(run, level, self._level)
            self._trend = np.where(run, trend, self._trend)
            self._season[:, p] = np.where(run, season_now, self._season[:, p])
        self._last = last_value_step(self._last, y, ok)
        self._t += 1

    def _predict(self, h: int) -> FloatArray:
        phases = (self._t + np.arange(h)) % self.period
        recent, older = self._hist[:, 1, phases], self._hist[:, 0, phases]
        out = np.where(
            np.isfinite(recent),
            recent,
            np.where(np.isfinite(older), older, self._last[:, None]),
        )
        ready = self.ready
        live = np.flatnonzero(ready & self._live)
        if live.size:
            out[live] = holt_winters_forecast(
                self._level[live],
                self._trend[live],
                self._season[live[:, None], phases[None, :]],
                self.phi,
            )
        pending = np.flatnonzero(ready & ~self._live)
        if pending.size:
            level, trend, season = holt_winters_init(
                self._hist[pending], self._start[pending], self.period
            )
            out[pending] = holt_winters_forecast(level, trend, season[:, phases], self.phi)
        return out

    def state(self) -> State:
        return {
            "start": self._start.copy(),
            "last": self._last.copy(),
            "hist": self._hist.copy(),
            "live": self._live.copy(),
            "level": self._level.copy(),
            "trend": self._trend.copy(),
            "season": self._season.copy(),
        }
