"""The scaler's forecaster: run every candidate model, combine per series the few that have lately
been best at the bound the scaler acts on, and keep that bound calibrated.

Experts. Each candidate point model (Naive, two moving averages, simple exponential smoothing,
damped Holt; with a `period` also SeasonalNaive and SeasonalHolt) is paired with two interval
methods, so there are two experts per candidate:

- *raw*: the bound is point + an upper quantile of the model's own recent errors at that step;
- *scaled*: the same, on errors divided by the series' local volatility when the forecast was
  issued (exponentially weighted mean absolute deviation from a smoothed level), multiplied back
  by today's volatility. It widens the bound when demand turns volatile (a busy period of a
  Poisson-like load, a day's peak) and narrows it when calm, where the raw one reacts only after
  the misses. The volatility divided by is at least a share of the mean one-step change
  (`_VOL_FLOOR`), and a scaled error counts at most `_SCALED_ERROR_CAP` volatilities, so the
  calm before a burst cannot turn its first errors into a bound of millions.

Quantiles without sorting. Per expert, series and horizon step the errors e are summarised by an
exponentially weighted mean m and mean absolute deviation s (weight 1/n, at least 1/`window`),
and the bound's offset is m + z * s, where z is learnt by stochastic gradient on the pinball
loss: +q * `z_rate` after a miss (e > m + z * s), -(1 - q) * `z_rate` after a hit, so the hit
rate of the offset tracks q whatever the error distribution (skewed, heavy-tailed, bounded at 0),
and a change of scale is followed at once through s. O(1) state and work per (expert, series,
step): no windows are kept or sorted. Until `min_errors` errors are seen, a scale-based offset
stands in (the series' mean absolute one-step change, random-walk growth sqrt(k)).

Combination. The score of an expert is the exponentially weighted pinball loss at q of its
upper bound at `eval_step` (by default the horizon: the forecast for when a replica started now
would be ready), issued that many bins earlier. Pinball loss is minimised by the true q-quantile,
so it rewards a bound that is high enough and no higher than needed. The forecast is the
unweighted mean of the `top` best experts' points and bounds (per series) among those whose loss
is within `TOP_WITHIN` times the best's: averaging a few good forecasts cancels part of their
errors and does not flap between near-equal models as a hard choice does, and leaving out the
much worse keeps a seasonal model's forecast of a recurring burst whole. An expert competes
once it is ready and `min_errors` of its bounds were scored; Naive with the raw bound always
competes, so every series has a forecast.

Calibration. Finally, per series and step, an additive correction to the combined bound keeps its
own recent hit rate at q (adaptive conformal style): after each scored bound it moves by
`calibration_rate` * (mean absolute error of the combined point) * (miss - (1 - q)).

Steps. The forecaster learns at the steps of `step_grid(horizon, eval_step)`: 1, 2, 4, 8, 16, ...
below the horizon, the horizon and eval_step. Every statistic of a step depends on that step alone
(its errors, its z, its calibration; the experts are scored at eval_step), so the numbers at a
grid step are those of a forecaster that learns at every step, and the cost grows with the
logarithm of the horizon instead of the horizon (a 300 s horizon in 10 s bins: 6 steps instead of
30; 120 s: 5 instead of 12). Between two grid steps the forecast (point and bounds) is linear
between their values: a horizon's errors are smooth in the step, and the policy reads the highest
value within the horizon (`peaks`, the highest of that line up to h), not each step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, ClassVar, Self

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
from gpu_queue_scaler.forecast.models import (
    HoltDamped,
    Model,
    MovingAverage,
    Naive,
    SeasonalHolt,
    SeasonalNaive,
    SimpleExponential,
    _Base,
)

__all__ = ["ForecastResult", "ScalerForecaster", "pinball_loss", "top_experts"]

# Mean absolute change -> standard deviation, for normal increments (E|X| = sigma * sqrt(2/pi)).
_MAD_TO_SIGMA = math.sqrt(math.pi / 2.0)
_LEVEL_ALPHA = 0.3  # smoothed level the volatility is measured against
_VOL_ALPHA = 0.1  # volatility: exponentially weighted mean absolute deviation from that level
# The volatility the scaled experts divide by is at least this share of the series' mean one-step
# change: through an idle spell the volatility decays toward 0 (0.9 a bin), and a burst's errors
# divided by what is left of it read as millions of volatility units, so the next bound, scaled
# back by the burst's volatility, asked for millions of replicas.
_VOL_FLOOR = 0.5
# And a scaled error counts at most this many volatilities (NaN stays NaN): the first bins of a
# burst after a long calm are errors of hundreds of the calm's volatilities even above the floor.
_SCALED_ERROR_CAP = 50.0
_CALIBRATION_MEMORY = 50.0  # bins: the combined point's mean absolute error
TOP_WITHIN = 2.0  # an expert joins the combination with at most this multiple of the best's loss
_BLOCK_CELLS = 32768  # (expert, step, series) cells per block of the error statistics' update


@dataclass(frozen=True, eq=False)
class ForecastResult:
    """Forecasts for steps 1..h, each array of shape (N, h); `model` names the model per series
    (the best-ranked expert's point model)."""

    point: FloatArray
    upper: FloatArray
    lower: FloatArray
    model: tuple[str, ...]


def pinball_loss(y: FloatArray, bound: FloatArray, q: float) -> FloatArray:
    """Quantile loss of `bound` as a q-quantile of y: q * under-shoot, (1 - q) * over-shoot."""
    diff = y - bound
    return np.maximum(q * diff, (q - 1.0) * diff)


def top_experts(
    loss: FloatArray, usable: BoolArray, top: int, within: float | None = None
) -> tuple[IntArray, FloatArray]:
    """Per series (columns), the `top` usable experts (rows) with the least loss, best first,
    and their weights: 1 for a usable pick whose loss is at most `within` (default TOP_WITHIN)
    times the best's, else 0. Ties go to the earlier expert. Near-equal experts are averaged
    (their errors partly cancel); one several times worse is left out, or on a workload that
    bursts at a known phase the flat models (which read the idle minutes before a burst as
    more of the same) would pull the seasonal ones' forecast of the burst down to a fraction
    of it."""
    masked = np.where(usable, loss, np.inf)
    order = np.argsort(masked, axis=0, kind="stable")[:top]
    picked = np.take_along_axis(masked, order, axis=0)
    ratio = TOP_WITHIN if within is None else within
    weight = np.isfinite(picked) & (picked <= ratio * picked[:1])
    return order, weight.astype(np.float64)


def step_grid(horizon: int, eval_step: int) -> IntArray:
    """The steps learnt (see the module docstring): the powers of two below the horizon, the
    horizon and eval_step; ascending."""
    steps = {horizon, eval_step}
    power = 1
    while power < horizon:
        steps.add(power)
        power *= 2
    return np.array(sorted(k for k in steps if k <= horizon), dtype=np.int64)


def _between_steps(steps: IntArray) -> tuple[IntArray, IntArray, FloatArray]:
    """For each step 1..steps[-1]: the grid indices below and above it and its weight between
    them (0 at a grid step, whose value is taken as it is)."""
    every = np.arange(1, int(steps[-1]) + 1)
    upper = np.searchsorted(steps, every)  # the first grid step >= the step
    lower = np.where(steps[upper] == every, upper, upper - 1)
    span = (steps[upper] - steps[lower]).astype(np.float64)
    weight = np.divide(every - steps[lower], span, out=np.zeros(every.size), where=span > 0)
    return lower.astype(np.int64), upper.astype(np.int64), weight


def spread_steps(
    by_grid: FloatArray, h: int, between: tuple[IntArray, IntArray, FloatArray]
) -> FloatArray:
    """Values at the grid steps, shape (G, N) -> values at steps 1..h, shape (h, N): the grid
    steps' own values, linear in between."""
    lower, upper, weight = (part[:h] for part in between)
    out = by_grid[lower]
    inner = np.flatnonzero(weight > 0.0)
    if inner.size:
        low, high = by_grid[lower[inner]], by_grid[upper[inner]]
        out[inner] = low + weight[inner, None] * (high - low)
    return out


# The kernels below are the update's array math, module-level so they read as arithmetic on
# arrays: elementwise as in the textbook form, computed in place over all experts, steps and
# series at once; a masked update is computed everywhere and then undone where the mask is off
# (cheaper than np.where when the mask is mostly on), and a choice between two step sizes is a
# product with the 0/1 mask (exact: x * 1 = x, x * 0 + y = y).
ErrorStats = tuple[FloatArray, FloatArray, FloatArray, FloatArray]  # mean, deviation, z, count


def _error_statistics(
    err: FloatArray,
    valid: BoolArray,
    n: FloatArray,
    m: FloatArray,
    s: FloatArray,
    z: FloatArray,
    *,
    fewest: float,
    window: int,
    z_steps: tuple[float, float, float, bool],
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """Each valid cell's error `err`, shape (E, G, N), folded into its mean `m`, mean absolute
    deviation `s` and quantile offset `z` (pinball-loss gradient step), counted in `n` (in
    place): O(1) per cell, no windows kept or sorted. Returns the new (m, s, z). `fewest` is a
    lower bound of the counts of the cells with an error (skips the masks it makes constant);
    `z_steps` is z's step after a miss, after a hit, their difference, and whether hit + difference
    is exactly the miss step."""
    z_up, z_down, z_jump, z_exact = z_steps
    experts, g, n_series = err.shape
    all_valid = bool(valid.all())  # (the usual case: no mask to apply)
    rate: FloatArray | float = 1.0 / window
    mean = np.empty_like(m)
    deviation = np.empty_like(s)
    z_new = np.empty_like(z)
    # A few experts at a time, so the arrays a block works on stay in the CPU's cache.
    block = max(1, _BLOCK_CELLS // (g * n_series))
    step_buffer = np.empty((min(block, experts), g, n_series))
    for first in range(0, experts, block):
        part = slice(first, first + block)
        err_b, valid_b, n_b, z_b = err[part], valid[part], n[part], z[part]
        m_b, s_b = m[part], s[part]
        mean_b, deviation_b, z_new_b = mean[part], deviation[part], z_new[part]
        if all_valid:
            n_b += 1.0  # = + True, without the cast
        else:
            n_b += valid_b
        step = np.multiply(z_b, s_b, out=step_buffer[: z_b.shape[0]])
        step += m_b  # the bound: a miss is an error above it
        miss = np.greater(err_b, step)
        if z_exact:
            np.multiply(miss, z_jump, out=step)
            step += z_down
        else:
            step[...] = np.where(miss, z_up, z_down)
        if fewest < 1:  # z moves where an error follows an earlier one: step 0 elsewhere
            step *= valid_b & (n_b > 1)
        np.add(z_b, step, out=z_new_b)  # where no error comes, undone below
        if fewest < window:
            rate = np.maximum(n_b, 1.0)
            np.divide(1.0, rate, out=rate)
            np.maximum(rate, 1.0 / window, out=rate)
        np.subtract(err_b, m_b, out=mean_b)
        mean_b *= rate
        mean_b += m_b
        np.subtract(err_b, mean_b, out=deviation_b)
        np.abs(deviation_b, out=deviation_b)
        deviation_b -= s_b
        deviation_b *= rate
        deviation_b += s_b
        if all_valid:
            continue
        invalid = ~valid_b
        if invalid.any():
            np.copyto(mean_b, m_b, where=invalid)
            np.copyto(deviation_b, s_b, where=invalid)
            np.copyto(z_new_b, z_b, where=invalid)
    return mean, deviation, z_new


def _running_mean(
    mean: FloatArray, count: FloatArray, x: FloatArray, hit: BoolArray, floor: float
) -> FloatArray:
    """`x` folded into `mean` where `hit`, weight 1/count but at least `floor` (`hit` counted in
    `count`, in place; `x` is overwritten): the plain mean at first, then exponentially
    weighted, so a new row learns fast and an old one keeps following."""
    least = count.min(where=hit, initial=np.inf)
    count += hit
    weight: FloatArray | float
    if 1.0 / max(least, 1.0) <= floor:  # so is every 1 / count: all weigh floor
        weight = floor
    else:
        weight = np.maximum(1.0 / np.maximum(count, 1.0), floor)
    x -= mean
    x *= weight
    x += mean
    return np.where(hit, x, mean)


def _expert_bounds(
    points: FloatArray,
    stats: ErrorStats,
    vol: FloatArray,
    fallback: FloatArray,
    ready: BoolArray,
    min_errors: int,
) -> FloatArray:
    """Every expert's upper bound at one step, shape (E, N), from the candidates' `points` there
    (C, N) and the experts' error statistics at that step: what phase 2 scores them on later
    (NaN for a candidate not ready)."""
    m, s, z, n = stats
    c = points.shape[0]
    upper = np.multiply(z, s)
    upper += m
    upper[c:] *= vol
    upper = np.where(n >= min_errors, upper, fallback)
    np.maximum(upper, 0.0, out=upper)
    upper[:c] += points
    upper[c:] += points
    if not ready.all():
        upper[~ready] = np.nan
    return upper


def _combine(
    points: FloatArray,
    order: IntArray,
    weight: FloatArray,
    stats: ErrorStats,
    vol: FloatArray,
    fallback: FloatArray,
    new: IntArray | None,
    min_errors: int,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The weighted mean of the picked experts' points and bounds (`order`, `weight`: shape
    (top, N)), per grid step and series: point, upper and lower, shape (G, N) each, before the
    calibration. Averaging a few good forecasts cancels part of their errors and does not flap
    between near-equal models as a hard choice does. `new`: the series where some expert and
    step may still lack `min_errors` errors, whose bounds fall back to the scale-based ones."""
    m, s, z, n = stats
    c, g, n_series = points.shape
    wide = weight[:, None, :]
    cells = g * n_series
    base = np.arange(cells).reshape(g, n_series)
    at = order[:, None, :] * cells + base  # (top, G, N) flat positions of the picks
    point_at = (order % c)[:, None, :] * cells + base
    chosen = points.reshape(-1).take(point_at)  # take: the same gather, cheaper than []
    z_at = z.reshape(-1).take(at)
    s_at = s.reshape(-1).take(at)
    m_at = m.reshape(-1).take(at)
    unit = np.where(order >= c, vol, 1.0)[:, None, :]
    spread = np.multiply(z_at, s_at)
    up = np.add(m_at, spread)
    up *= unit
    down = np.subtract(m_at, spread)
    down *= unit
    # Bounds from the error statistics once `min_errors` were seen, else the scale-based
    # fallback: only in the series where some expert and step has not seen that many yet.
    if new is not None and new.size:
        trusted = n.reshape(-1)[at[:, :, new]] >= min_errors
        up[:, :, new] = np.where(trusted, up[:, :, new], fallback[:, new])
        down[:, :, new] = np.where(trusted, down[:, :, new], -fallback[:, new])
    np.maximum(up, 0.0, out=up)
    up += chosen
    np.minimum(down, 0.0, out=down)
    down += chosen
    chosen *= wide
    up *= wide
    down *= wide
    return chosen.sum(axis=0), up.sum(axis=0), down.sum(axis=0)


class ScalerForecaster(RowState):
    """Candidates Naive, MovingAverage (6 and 12 bins), SimpleExponential, HoltDamped, and with a
    `period` SeasonalNaive and SeasonalHolt, all updated with the same observations; two experts
    (raw and volatility-scaled bounds) per candidate; the mean of the `top` best experts (those
    within `TOP_WITHIN` times the best's loss), with a calibrated bound. See the module
    docstring.

    Defaults: `quantile` 0.9 (the bound the policy scales on); `eval_step` = `horizon`; error
    statistics over about `window` 100 bins (exponential weight at least 1/100), trusted after
    `min_errors` 10; z starts at the normal's 0.9 quantile in mean-absolute-deviation units
    (1.6) and learns at `z_rate` 0.01 per error; expert loss `halflife` 48 bins (recent enough to
    follow a change of regime, long enough that a few bursts do not decide); `top` 3 experts;
    `calibration_rate` 0.02. One configuration for every workload: nothing is tuned per series.

    Rows are independent (every operation is elementwise or per series), so one forecaster can
    carry many workloads: `add_rows`, `reset_rows` and `copy_rows`
    (`gpu_queue_scaler.forecast._rows`) manage them. `origin` is the index of the first bin it is
    updated with (default 0): ring positions and seasonal phases follow the bin index, so
    forecasters started at different bins of one grid hold a series' state identically and can
    exchange rows. It changes no forecast.
    """

    name = "scaler"
    _n_floor = 0.0  # a lower bound of every error count (`_n`), kept between updates
    _ROWS: ClassVar[dict[str, int]] = {
        "_pending": 3,
        "_vol_issued": 1,
        "_issued": 2,
        "_point_issued": 2,
        "_upper_issued": 2,
        "_m": 2,
        "_s": 2,
        "_z": 2,
        "_n": 2,
        "_loss": 1,
        "_n_scored": 1,
        "_level": 0,
        "_has_level": 0,
        "_vol": 0,
        "_has_vol": 0,
        "_prev": 0,
        "_has_prev": 0,
        "_n_changes": 0,
        "_scale": 0,
        "_mae": 1,
        "_n_calibrated": 1,
        "_adjust": 1,
        "_best": 0,
        "_point": 1,
        "_upper": 1,
        "_lower": 1,
    }

    def __init__(
        self,
        n_series: int,
        horizon: int,
        period: int | None = None,
        *,
        quantile: float = 0.9,
        eval_step: int | None = None,
        window: int = 100,
        min_errors: int = 10,
        halflife: float = 48.0,
        top: int = 3,
        z_rate: float = 0.01,
        calibration_rate: float = 0.02,
        origin: int = 0,
    ) -> None:
        self.n_series = check_count(n_series, "n_series")
        if isinstance(origin, bool) or not isinstance(origin, int | np.integer):
            raise ValueError(f"origin must be an integer bin index, got {origin!r}")
        self.origin = int(origin)
        self.horizon = check_count(horizon, "horizon")
        self.period = None if period is None else check_count(period, "period")
        self.quantile = float(quantile)
        if not 0.5 < self.quantile < 1.0:
            raise ValueError(f"quantile must be in (0.5, 1), got {quantile!r}")
        self.eval_step = self.horizon if eval_step is None else check_count(eval_step, "eval_step")
        if self.eval_step > self.horizon:
            raise ValueError(f"eval_step {eval_step} beyond horizon {horizon}")
        self.window = check_count(window, "window")
        self.min_errors = check_count(min_errors, "min_errors")
        if not halflife > 0:
            raise ValueError(f"halflife must be > 0, got {halflife!r}")
        self.halflife = float(halflife)
        self.top = check_count(top, "top")
        self.z_rate = check_unit(z_rate, "z_rate")
        self.calibration_rate = check_unit(calibration_rate, "calibration_rate", closed_low=True)
        z = NormalDist().inv_cdf(self.quantile)
        self._z0 = z * _MAD_TO_SIGMA  # the normal's q-quantile in mean-absolute-deviation units
        self._steps = step_grid(self.horizon, self.eval_step)  # the steps learnt (G)
        self._at = np.arange(self._steps.size)  # their positions on the step axis
        self._eval_at = int(np.searchsorted(self._steps, self.eval_step))
        self._between = _between_steps(self._steps)
        self._fallback = z * _MAD_TO_SIGMA * np.sqrt(self._steps.astype(np.float64))
        self._decay = 1.0 - 0.5 ** (1.0 / self.halflife)
        # z's step after a miss and after a hit, and their difference: a step is then
        # down + miss * jump, exactly the same number when that sum rounds back to `up`.
        self._z_up = self.quantile * self.z_rate
        self._z_down = (self.quantile - 1.0) * self.z_rate
        self._z_jump = self._z_up - self._z_down
        self._z_exact = self._z_down + self._z_jump == self._z_up
        self._reset()

    def _candidates(self) -> list[Model]:
        n = self.n_series
        long_average = MovingAverage(n, window=12)
        long_average.name = "moving_average_12"
        models: list[Model] = [
            Naive(n),
            MovingAverage(n),
            long_average,
            SimpleExponential(n),
            HoltDamped(n),
        ]
        if self.period is not None:
            models += [
                SeasonalNaive(n, self.period, origin=self.origin),
                SeasonalHolt(n, self.period, origin=self.origin),
            ]
        return models

    def _reset(self) -> None:
        self._models = self._candidates()
        c, n, h, g = len(self._models), self.n_series, self.horizon, self._steps.size
        e = 2 * c
        self._t = self.origin
        self._n_floor = 0.0  # counts only grow, but row operations may bring new ones
        # Time bookkeeping (rings indexed by issue bin mod horizon), not learnt state:
        # Layouts put the series last, so a step's or an issue bin's values are contiguous.
        self._pending = np.full((c, h, g, n), np.nan)  # candidates' points awaiting actuals
        self._vol_issued = np.full((h, n), np.nan)  # volatility each forecast was issued with
        self._issued = np.full((self.eval_step, e, n), np.nan)  # experts' bounds at eval_step
        self._point_issued = np.full((h, g, n), np.nan)  # the combined point and bound
        self._upper_issued = np.full((h, g, n), np.nan)
        # Per expert, step and series: error mean, mean absolute deviation, z, count (counts are
        # floats: exact to 2**53, and cheaper to mix with the others).
        self._m = np.zeros((e, g, n))
        self._s = np.zeros((e, g, n))
        self._z = np.full((e, g, n), self._z0)
        self._n = np.zeros((e, g, n))
        self._loss = np.zeros((e, n))
        self._n_scored = np.zeros((e, n))
        # Per series: level and volatility (scaled experts), mean one-step change (fallback).
        self._level = np.zeros(n)
        self._has_level = np.zeros(n, dtype=np.bool_)
        self._vol = np.zeros(n)
        self._has_vol = np.zeros(n, dtype=np.bool_)
        self._prev = np.zeros(n)
        self._has_prev = np.zeros(n, dtype=np.bool_)
        self._n_changes = np.zeros(n, dtype=np.int64)
        self._scale = np.zeros(n)
        # Calibration of the combined bound, per step and series.
        self._mae = np.zeros((g, n))
        self._n_calibrated = np.zeros((g, n))
        self._adjust = np.zeros((g, n))
        # The current forecast at the grid steps (G, N); `predict` spreads it over every step.
        self._best = np.zeros(n, dtype=np.int64)
        self._point = np.zeros((g, n))
        self._upper = np.zeros((g, n))
        self._lower = np.zeros((g, n))

    def _row_models(self) -> list[RowState]:
        models: list[RowState] = [m for m in self._models if isinstance(m, RowState)]
        if len(models) != len(self._models):
            raise TypeError("every candidate must support row operations")
        return models

    def _settings(self) -> dict[str, object]:
        settings = super()._settings()
        settings.pop("_n_floor", None)  # a cache, not a parameter
        return settings

    def _compatible(self, other: object) -> bool:
        return (
            isinstance(other, ScalerForecaster)
            and super()._compatible(other)
            and len(other._models) == len(self._models)
            and all(
                mine._compatible(theirs)
                for mine, theirs in zip(self._row_models(), other._row_models(), strict=True)
            )
        )

    def _extend(self, other: Self) -> None:
        super()._extend(other)
        self._n_floor = min(self._n_floor, other._n_floor)
        for mine, theirs in zip(self._row_models(), other._row_models(), strict=True):
            mine._extend(theirs)

    def _assign(self, rows: IntArray, other: Self, other_rows: IntArray) -> None:
        super()._assign(rows, other, other_rows)
        self._n_floor = min(self._n_floor, other._n_floor)
        for mine, theirs in zip(self._row_models(), other._row_models(), strict=True):
            mine._assign(rows, theirs, other_rows)

    @property
    def candidates(self) -> tuple[str, ...]:
        """The point models, in order."""
        return tuple(model.name for model in self._models)

    @property
    def experts(self) -> tuple[str, ...]:
        """Point model and interval method of each expert, in the order of `loss`'s columns."""
        names = self.candidates
        return tuple(f"{name}/raw" for name in names) + tuple(f"{name}/scaled" for name in names)

    @property
    def loss(self) -> FloatArray:
        """Recent pinball loss per series and expert, shape (N, experts)."""
        return self._loss.T.copy()

    def choice(self) -> tuple[str, ...]:
        """The best-ranked expert's point model for each series right now (for logs, `explain`)."""
        names = self.candidates
        c = len(names)
        return tuple([names[index] for index in (self._best % c).tolist()])

    def update(self, y: ArrayLike) -> None:
        """Learn from this bin's observations (`y`, shape (N,); NaN: missing), then forecast: the
        five phases below, in order, each reading what the earlier ones left."""
        values, ok = observe(y, self.n_series)
        slots = (self._t - self._steps) % self.horizon  # where each grid step's forecast was issued
        few = self._learn_errors(values, ok, slots)
        self._score_experts(values, ok)
        self._calibrate(values, ok, slots)
        vol = self._track_series(values, ok)
        self._forecast(values, ok, vol, few)
        self._t += 1

    def _learn_errors(
        self, values: FloatArray, ok: BoolArray, slots: IntArray
    ) -> FloatArray | None:
        """1. Each expert's error of its forecast for this bin, folded into its error statistics,
        so its bound learns from its misses. Returns the fewest errors per series while some
        expert and step are not yet trusted (else None), for the bounds' fallback in phase 5."""
        c, g = len(self._models), self._steps.size
        due = self._pending[:, slots, self._at]  # (C, G, N)
        err = np.empty((2 * c, g, self.n_series))
        np.subtract(values, due, out=err[:c])
        np.divide(err[:c], self._vol_issued[slots], out=err[c:])
        np.clip(err[c:], -_SCALED_ERROR_CAP, _SCALED_ERROR_CAP, out=err[c:])
        valid = np.isfinite(err)
        valid &= ok
        fewest, few = self._fewest_errors(ok, valid)
        self._m, self._s, self._z = _error_statistics(
            err,
            valid,
            self._n,
            self._m,
            self._s,
            self._z,
            fewest=fewest,
            window=self.window,
            z_steps=(self._z_up, self._z_down, self._z_jump, self._z_exact),
        )
        return few

    def _fewest_errors(self, ok: BoolArray, valid: BoolArray) -> tuple[float, FloatArray | None]:
        """The fewest errors so far (before this one) among the cells that get one, so that a rate
        or mask depending on the count is skipped once it is the same for all of them; and per
        series the fewest over experts and steps while some count is below trust (else None).

        Bounded below by the fewest in the series observed now (cheap); exact only if that is too
        small. Once every count is that large (`_n_floor`, kept between updates), it need not be
        looked at."""
        n = self._n
        trusted_all = max(self.window, self.min_errors)
        if self._n_floor >= trusted_all:
            fewest = self._n_floor
        else:
            fewest = self._n_floor = float(n.min())
        few = n.min(axis=(0, 1)) if fewest < trusted_all else None
        if few is not None and fewest < self.window:
            fewest = few[ok].min() if ok.any() else np.inf  # per series observed now
            if fewest < self.window:
                fewest = np.where(valid, n, np.inf).min()
        return fewest, few

    def _score_experts(self, values: FloatArray, ok: BoolArray) -> None:
        """2. Score the experts' bounds issued eval_step bins ago by pinball loss at q: the recent
        record the combination picks its experts by."""
        issued = self._issued[self._t % self.eval_step]
        hit = np.isfinite(issued)
        hit &= ok
        loss = pinball_loss(values, np.where(hit, issued, 0.0), self.quantile)
        self._loss = _running_mean(self._loss, self._n_scored, loss, hit, self._decay)

    def _calibrate(self, values: FloatArray, ok: BoolArray, slots: IntArray) -> None:
        """3. Move the combined bound's correction on its own hits and misses (per step and
        series), so its hit rate stays at q whichever experts are picked."""
        point_due = self._point_issued[slots, self._at]
        upper_due = self._upper_issued[slots, self._at]
        hit = np.isfinite(point_due)
        hit &= ok
        error = np.subtract(values, point_due)
        np.abs(error, out=error)
        self._mae = _running_mean(
            self._mae, self._n_calibrated, error, hit, 1.0 / _CALIBRATION_MEMORY
        )
        off = (values > upper_due) - (1.0 - self.quantile)
        move = self.calibration_rate * self._mae
        move *= off
        move += self._adjust
        self._adjust = np.where(hit, move, self._adjust)

    def _track_series(self, values: FloatArray, ok: BoolArray) -> FloatArray:
        """4. Series statistics: the mean one-step change (the bounds' fallback scale) and the
        level and volatility the scaled experts divide by. Returns the volatility (1 where 0)."""
        changed = ok & self._has_prev
        self._n_changes += changed
        change_rate = 1.0 / np.maximum(np.minimum(self._n_changes, self.window), 1)
        change = np.abs(values - self._prev)
        self._scale = np.where(
            changed, self._scale + change_rate * (change - self._scale), self._scale
        )
        self._prev = np.where(ok, values, self._prev)
        self._has_prev |= ok
        deviation_now = np.abs(values - self._level)
        self._vol = np.where(
            ok & self._has_vol,
            self._vol + _VOL_ALPHA * (deviation_now - self._vol),
            np.where(ok & self._has_level, deviation_now, self._vol),
        )
        self._has_vol |= ok & self._has_level
        self._level = np.where(
            ok,
            np.where(self._has_level, self._level + _LEVEL_ALPHA * (values - self._level), values),
            self._level,
        )
        self._has_level |= ok
        vol = np.maximum(self._vol, _VOL_FLOOR * self._scale)
        return np.where(vol > 0.0, vol, 1.0)

    def _forecast(
        self, values: FloatArray, ok: BoolArray, vol: FloatArray, few: FloatArray | None
    ) -> None:
        """5. New forecasts: every candidate's; every expert's bound at eval_step (to be scored in
        phase 2); the calibrated combination of the best experts, whose bounds alone are needed
        at every step."""
        points, ready = self._step_candidates(values, ok)
        ready_e = np.concatenate([ready, ready])
        fallback = self._fallback[:, None] * self._scale[None, :]  # (G, N)
        k = self._eval_at
        self._issued[self._t % self.eval_step] = _expert_bounds(
            points[:, k],
            (self._m[:, k], self._s[:, k], self._z[:, k], self._n[:, k]),
            vol,
            fallback[k],
            ready_e,
            self.min_errors,
        )
        usable = ready_e & (self._n_scored >= self.min_errors)
        usable[0] = True  # Naive, raw bound: always
        order, pick = top_experts(self._loss, usable, self.top)
        pick /= pick.sum(axis=0)
        # Series where some expert and step had fewer (before this bin's error: a superset).
        new = None if few is None else np.flatnonzero(few < self.min_errors)
        point, upper, lower = _combine(
            points,
            order,
            pick,
            (self._m, self._s, self._z, self._n),
            vol,
            fallback,
            new,
            self.min_errors,
        )
        upper += self._adjust
        np.maximum(upper, point, out=upper)
        np.minimum(lower, point, out=lower)
        np.maximum(lower, 0.0, out=lower)
        self._remember(points, ready, vol, order[0], (point, upper, lower))

    def _remember(
        self,
        points: FloatArray,
        ready: BoolArray,
        vol: FloatArray,
        best: IntArray,
        forecast: tuple[FloatArray, FloatArray, FloatArray],
    ) -> None:
        """Keep this bin's forecasts: the candidates' points, their volatility and the combination
        await their actuals (phases 1 and 3); the combination is what `predict` reads."""
        point, upper, lower = forecast
        now = self._t % self.horizon
        pending = self._pending[:, now]
        pending[...] = points
        if not ready.all():
            np.copyto(pending, np.nan, where=~ready[:, None, :])
        self._vol_issued[now] = vol
        self._point_issued[now] = point
        self._upper_issued[now] = upper
        self._best = best
        self._point = point
        self._upper = upper
        self._lower = lower

    def _step_candidates(self, values: FloatArray, ok: BoolArray) -> tuple[FloatArray, BoolArray]:
        """Every candidate updated with this bin: its points at the grid steps, shape (C, G, N),
        and whether it is ready, shape (C, N)."""
        c, g = len(self._models), self._steps.size
        given = np.where(ok, values, np.nan)
        points = np.empty((c, g, self.n_series))  # at the grid steps
        ready = np.empty((c, self.n_series), dtype=np.bool_)
        for i, model in enumerate(self._models):
            if isinstance(model, _Base):
                model._step(values, ok)  # what update(given) does after checking its input
                model.predict_steps(points[i], self._steps)
            else:
                model.update(given)
                points[i] = model.predict(self.horizon).T[self._steps - 1]
            ready[i] = model.ready
        return points, ready

    def predict(self, h: int) -> ForecastResult:
        """Point, upper (quantile) and lower bounds of each series' combined forecast."""
        h = check_steps(h)
        if h > self.horizon:
            raise ValueError(f"h {h} beyond horizon {self.horizon}")
        return ForecastResult(
            point=spread_steps(self._point, h, self._between).T.copy(),
            upper=spread_steps(self._upper, h, self._between).T.copy(),
            lower=spread_steps(self._lower, h, self._between).T.copy(),
            model=self.choice(),
        )

    def peaks(self, h: int) -> tuple[FloatArray, FloatArray]:
        """Per series, the highest point and upper forecast over steps 1..h, shape (N,) each:
        `predict(h)`'s point and upper maxed over the steps, without building them."""
        h = check_steps(h)
        if h > self.horizon:
            raise ValueError(f"h {h} beyond horizon {self.horizon}")
        return (
            spread_steps(self._point, h, self._between).max(axis=0),
            spread_steps(self._upper, h, self._between).max(axis=0),
        )

    def fit(self, history: ArrayLike) -> Self:
        """Reset, then replay `history` (shape (N, T)) one column at a time: the warm start."""
        values = as_history(history, self.n_series)
        self._reset()
        for column in values.T:
            self.update(column)
        return self

    @classmethod
    def forecast(
        cls, history: ArrayLike, h: int, horizon: int | None = None, **params: Any
    ) -> ForecastResult:
        """`cls(N, horizon or h, **params).fit(history).predict(h)` in one call."""
        values = np.asarray(history, dtype=np.float64)
        if values.ndim != 2:
            raise ValueError(f"expected shape (N, T), got {values.shape}")
        return (
            cls(values.shape[0], h if horizon is None else horizon, **params).fit(values).predict(h)
        )

    def state(self) -> State:
        """Copies of the learnt per-series state (first axis N), candidates' included. Forecasts
        still awaiting their actual are time bookkeeping, like the bin clock, and are not."""
        out: State = {
            "loss": self._loss.T.copy(),
            "n_scored": self._n_scored.T.astype(np.int64),
            "error_mean": self._m.transpose(2, 0, 1).copy(),
            "error_deviation": self._s.transpose(2, 0, 1).copy(),
            "z": self._z.transpose(2, 0, 1).copy(),
            "n_errors": self._n.transpose(2, 0, 1).astype(np.int64),
            "level": self._level.copy(),
            "vol": self._vol.copy(),
            "scale": self._scale.copy(),
            "prev": self._prev.copy(),
            "mae": self._mae.T.copy(),
            "adjust": self._adjust.T.copy(),
        }
        for model in self._models:
            out.update({f"{model.name}.{key}": value for key, value in model.state().items()})
        return out
