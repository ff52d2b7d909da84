"""The forecaster's numbers are those of its textbook form, bit for bit.

`Reference` is `ScalerForecaster` as first written: every step of the update as one numpy
expression over all experts, series and steps, in the original array layouts. The forecaster
computes the same arithmetic in place, in blocks, in other layouts, with masked updates undone
instead of np.where and shortcuts where a count no longer matters; none of that may change a
number. Compared with ==, after every update, on bursty series with missing values, zeros and
infinities, with and without a season, with other parameters, and through row operations.

The forecaster learns at a grid of steps (`step_grid`); at those steps its numbers are those of a
forecaster that learns at every step, also compared with ==.
"""

from __future__ import annotations

import itertools
from typing import Any, ClassVar

import numpy as np
import pytest
from numpy.typing import ArrayLike

from gpu_queue_scaler.forecast import ForecastResult, ScalerForecaster, select
from gpu_queue_scaler.forecast._arrays import State, observe
from gpu_queue_scaler.forecast.select import (
    _CALIBRATION_MEMORY,
    _LEVEL_ALPHA,
    _SCALED_ERROR_CAP,
    _VOL_ALPHA,
    _VOL_FLOOR,
    pinball_loss,
    spread_steps,
    top_experts,
)


class Reference(ScalerForecaster):
    """The original update, state layout and model-name lookup."""

    _ROWS: ClassVar[dict[str, int]] = {
        "_pending": 1,
        "_vol_issued": 0,
        "_issued": 1,
        "_point_issued": 0,
        "_upper_issued": 0,
        "_m": 1,
        "_s": 1,
        "_z": 1,
        "_n": 1,
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
        "_mae": 0,
        "_n_calibrated": 0,
        "_adjust": 0,
        "_best": 0,
        "_point": 0,
        "_upper": 0,
        "_lower": 0,
    }

    def _reset(self) -> None:
        self._models = self._candidates()
        c, n, h, g = len(self._models), self.n_series, self.horizon, self._steps.size
        e = 2 * c
        self._t = self.origin
        # Time bookkeeping (rings indexed by issue bin mod horizon), not learnt state:
        self._pending = np.full((c, n, h, g), np.nan)  # candidates' points awaiting actuals
        self._vol_issued = np.full((n, h), np.nan)  # volatility each forecast was issued with
        self._issued = np.full((e, n, self.eval_step), np.nan)  # experts' bounds at eval_step
        self._point_issued = np.full((n, h, g), np.nan)  # the combined point and bound
        self._upper_issued = np.full((n, h, g), np.nan)
        # Per expert, series and grid step: error mean, mean absolute deviation, z, count.
        self._m = np.zeros((e, n, g))
        self._s = np.zeros((e, n, g))
        self._z = np.full((e, n, g), self._z0)
        self._n = np.zeros((e, n, g), dtype=np.int64)
        self._loss = np.zeros((e, n))
        self._n_scored = np.zeros((e, n), dtype=np.int64)
        # Per series: level and volatility (scaled experts), mean one-step change (fallback).
        self._level = np.zeros(n)
        self._has_level = np.zeros(n, dtype=np.bool_)
        self._vol = np.zeros(n)
        self._has_vol = np.zeros(n, dtype=np.bool_)
        self._prev = np.zeros(n)
        self._has_prev = np.zeros(n, dtype=np.bool_)
        self._n_changes = np.zeros(n, dtype=np.int64)
        self._scale = np.zeros(n)
        # Calibration of the combined bound, per series and step.
        self._mae = np.zeros((n, g))
        self._n_calibrated = np.zeros((n, g), dtype=np.int64)
        self._adjust = np.zeros((n, g))
        # The current forecast at the grid steps.
        self._best = np.zeros(n, dtype=np.int64)
        self._point = np.zeros((n, g))
        self._upper = np.zeros((n, g))
        self._lower = np.zeros((n, g))

    def choice(self) -> tuple[str, ...]:
        """The best-ranked expert's point model for each series right now (for logs, `explain`)."""
        names = self.candidates
        c = len(names)
        return tuple(names[int(index) % c] for index in self._best)

    def predict(self, h: int) -> ForecastResult:
        """The (N, G) arrays spread over steps 1..h."""
        return ForecastResult(
            point=spread_steps(self._point.T, h, self._between).T.copy(),
            upper=spread_steps(self._upper.T, h, self._between).T.copy(),
            lower=spread_steps(self._lower.T, h, self._between).T.copy(),
            model=self.choice(),
        )

    def update(self, y: ArrayLike) -> None:
        values, ok = observe(y, self.n_series)
        t, h, q = self._t, self.horizon, self.quantile
        slots = (t - self._steps) % h
        column = values[:, None]
        present = ok[:, None]

        # 1. Errors of the forecasts made 1..h bins ago for this bin, per expert.
        due = self._pending[:, :, slots, self._at]  # (C, N, G)
        raw = column[None] - due
        scaled = np.clip(
            raw / self._vol_issued[None, :, slots], -_SCALED_ERROR_CAP, _SCALED_ERROR_CAP
        )
        err = np.concatenate([raw, scaled])
        valid = present[None] & np.isfinite(err)
        had = self._n > 0
        self._n += valid
        bound = self._m + self._z * self._s
        step = np.where(err > bound, q, q - 1.0) * self.z_rate
        self._z = np.where(valid & had, self._z + step, self._z)
        rate = np.maximum(1.0 / np.maximum(self._n, 1), 1.0 / self.window)
        mean = self._m + rate * (err - self._m)
        deviation = self._s + rate * (np.abs(err - mean) - self._s)
        self._m = np.where(valid, mean, self._m)
        self._s = np.where(valid, deviation, self._s)

        # 2. Score the experts' bounds issued eval_step bins ago.
        slot = t % self.eval_step
        issued = self._issued[:, :, slot]
        scored = ok[None] & np.isfinite(issued)
        self._n_scored += scored
        weight = np.maximum(1.0 / np.maximum(self._n_scored, 1), self._decay)
        loss = pinball_loss(values[None], np.where(scored, issued, 0.0), q)
        self._loss = np.where(scored, self._loss + weight * (loss - self._loss), self._loss)

        # 3. Calibrate the combined bound on its own hits and misses.
        point_due = self._point_issued[:, slots, self._at]
        upper_due = self._upper_issued[:, slots, self._at]
        hit = present & np.isfinite(point_due)
        self._n_calibrated += hit
        rate = np.maximum(1.0 / np.maximum(self._n_calibrated, 1), 1.0 / _CALIBRATION_MEMORY)
        mae = self._mae + rate * (np.abs(column - point_due) - self._mae)
        self._mae = np.where(hit, mae, self._mae)
        miss = (column > upper_due) - (1.0 - q)
        self._adjust = np.where(
            hit, self._adjust + self.calibration_rate * self._mae * miss, self._adjust
        )

        # 4. Series statistics: fallback scale, level and volatility.
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
        vol = np.where(vol > 0.0, vol, 1.0)

        # 5. New forecasts: every candidate, every expert's bound, the combination.
        given = np.where(ok, values, np.nan)
        points = np.empty((len(self._models), self.n_series, self._steps.size))
        ready = np.empty((len(self._models), self.n_series), dtype=np.bool_)
        for c, model in enumerate(self._models):
            model.update(given)
            points[c] = model.predict(h)[:, self._steps - 1]
            ready[c] = model.ready
        both = np.concatenate([points, points])
        ready_e = np.concatenate([ready, ready])
        trusted = self._n >= self.min_errors
        fallback = self._scale[:, None] * self._fallback[None, :]
        spread = self._z * self._s
        c1 = (len(self._models), self.n_series, 1)
        unit = np.concatenate([np.ones(c1), np.broadcast_to(vol[None, :, None], c1)])
        upper_e = both + np.maximum(np.where(trusted, (self._m + spread) * unit, fallback), 0.0)
        lower_e = both + np.minimum(np.where(trusted, (self._m - spread) * unit, -fallback), 0.0)
        self._issued[:, :, slot] = np.where(ready_e, upper_e[:, :, self._eval_at], np.nan)

        usable = ready_e & (self._n_scored >= self.min_errors)
        usable[0] = True  # Naive, raw bound: always
        order, pick = top_experts(self._loss, usable, self.top)
        pick /= pick.sum(axis=0)
        index = order[:, :, None]
        wide = pick[:, :, None]
        point = (np.take_along_axis(both, index, axis=0) * wide).sum(axis=0)
        upper = (np.take_along_axis(upper_e, index, axis=0) * wide).sum(axis=0)
        lower = (np.take_along_axis(lower_e, index, axis=0) * wide).sum(axis=0)
        upper = np.maximum(upper + self._adjust, point)

        now = t % h
        self._pending[:, :, now] = np.where(ready[:, :, None], points, np.nan)
        self._vol_issued[:, now] = vol
        self._point_issued[:, now] = point
        self._upper_issued[:, now] = upper
        self._best = order[0]
        self._point = point
        self._upper = upper
        self._lower = np.maximum(np.minimum(lower, point), 0.0)
        self._t += 1

    def state(self) -> State:
        """Copies of the learnt per-series state (first axis N), candidates' included. Forecasts
        still awaiting their actual are time bookkeeping, like the bin clock, and are not."""
        out: State = {
            "loss": self._loss.T.copy(),
            "n_scored": self._n_scored.T.copy(),
            "error_mean": np.moveaxis(self._m, 1, 0).copy(),
            "error_deviation": np.moveaxis(self._s, 1, 0).copy(),
            "z": np.moveaxis(self._z, 1, 0).copy(),
            "n_errors": np.moveaxis(self._n, 1, 0).copy(),
            "level": self._level.copy(),
            "vol": self._vol.copy(),
            "scale": self._scale.copy(),
            "prev": self._prev.copy(),
            "mae": self._mae.copy(),
            "adjust": self._adjust.copy(),
        }
        for model in self._models:
            out.update({f"{model.name}.{key}": value for key, value in model.state().items()})
        return out


def series(seed: int, n: int, bins: int, period: int | None) -> np.ndarray:
    """Gamma-sized noisy demand (a wave with a season), bursts, zeros, NaN, +inf; one series
    never observed, one that starts late, one all zeros, one with a long gap."""
    rng = np.random.default_rng(seed)
    size = rng.gamma(2.0, 3.0, size=(n, 1))
    y = size * (1.0 + 0.3 * rng.standard_normal((n, bins)))
    if period:
        y += 2.0 * size * np.sin(2.0 * np.pi * np.arange(bins) / period)[None, :]
    burst = rng.random((n, bins)) < 0.03
    y[burst] *= rng.uniform(3.0, 10.0, size=int(burst.sum()))
    y = np.maximum(y, 0.0)
    y[rng.random((n, bins)) < 0.1] = 0.0
    y[rng.random((n, bins)) < 0.08] = np.nan
    y[rng.random((n, bins)) < 0.005] = np.inf
    y[0] = np.nan
    y[1, : bins // 2] = np.nan
    y[2] = 0.0
    y[3, 40:90] = np.nan
    return y


CASES: list[tuple[int, int | None, dict[str, Any]]] = [
    (12, None, {}),
    (12, 6, {}),
    (5, None, {"eval_step": 3, "top": 2}),
    (1, 3, {}),
    (6, 4, {"origin": 13, "top": 5, "min_errors": 3, "window": 5}),  # counts pass the window
    (4, None, {"window": 4, "min_errors": 8, "halflife": 3.0}),  # trusted after the window
    (3, None, {"quantile": 0.7, "z_rate": 0.05}),  # z's two steps do not differ by a sum
]


def same(mine: ScalerForecaster, reference: Reference) -> None:
    a, b = mine.predict(mine.horizon), reference.predict(reference.horizon)
    for x, y in ((a.point, b.point), (a.upper, b.upper), (a.lower, b.lower)):
        assert x.flags.c_contiguous
        assert np.array_equal(x, y, equal_nan=True)
    assert a.model == b.model
    for h in {1, mine.horizon}:  # the peaks over the first h steps, as the forecast bank reads
        point_max, upper_max = mine.peaks(h)
        b = reference.predict(h)
        assert np.array_equal(point_max, np.max(b.point, axis=1), equal_nan=True)
        assert np.array_equal(upper_max, np.max(b.upper, axis=1), equal_nan=True)


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_numbers_are_the_reference_numbers(case: int) -> None:
    horizon, period, params = CASES[case]
    n, bins = 12, 160
    y = series(case, n, bins, period)
    mine = ScalerForecaster(n, horizon, period, **params)
    reference = Reference(n, horizon, period, **params)
    for k in range(bins):
        if k == 70:  # row operations: forget two rows, load two from a forecaster fed otherwise
            mine.reset_rows([5, 7])
            reference.reset_rows([5, 7])
            other, other_reference = (
                ScalerForecaster(n, horizon, period, **params),
                Reference(n, horizon, period, **params),
            )
            for j in range(70):
                other.update(1.5 * y[:, j])
                other_reference.update(1.5 * y[:, j])
            mine.copy_rows([9, 10], other, [3, 4])
            reference.copy_rows([9, 10], other_reference, [3, 4])
        if k == 100:
            mine.add_rows(2)
            reference.add_rows(2)
        column = y[:, k] if k < 100 else np.concatenate([y[:, k], y[:2, k - 100]])
        mine.update(column)
        reference.update(column)
        same(mine, reference)
    mine_state, reference_state = mine.state(), reference.state()
    assert mine_state.keys() == reference_state.keys()
    for key, value in reference_state.items():
        assert np.array_equal(mine_state[key], value, equal_nan=True), key
        assert mine_state[key].dtype == value.dtype, key
    assert np.array_equal(mine.loss, reference.loss)


def test_many_rows_equal_the_reference() -> None:
    """Large enough that the statistics are updated in several blocks of experts."""
    n, bins = 1500, 40
    y = series(99, n, bins, None)
    mine, reference = (
        ScalerForecaster(n, 12, min_errors=2, window=3),
        Reference(n, 12, min_errors=2, window=3),
    )
    for k in range(bins):
        mine.update(y[:, k])
        reference.update(y[:, k])
    same(mine, reference)


@pytest.mark.parametrize(("horizon", "period"), [(12, None), (30, 8), (9, None)])
def test_grid_steps_are_those_of_a_forecaster_that_learns_every_step(
    horizon: int, period: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    n, bins = 10, 150
    y = series(7, n, bins, period)
    mine = ScalerForecaster(n, horizon, period)
    steps = mine._steps
    assert steps.size < horizon  # the grid skips steps
    monkeypatch.setattr(select, "step_grid", lambda h, eval_step: np.arange(1, h + 1))
    every = ScalerForecaster(n, horizon, period)
    assert every._steps.size == horizon
    for k in range(bins):
        mine.update(y[:, k])
        every.update(y[:, k])
        a, b = mine.predict(horizon), every.predict(horizon)
        for x, z in ((a.point, b.point), (a.upper, b.upper), (a.lower, b.lower)):
            assert np.array_equal(x[:, steps - 1], z[:, steps - 1], equal_nan=True)
        assert a.model == b.model
    # Between grid steps the forecast is linear: here the upper bound at every step lies within
    # its two grid neighbours', where the every-step forecaster's need not.
    upper = mine.predict(horizon).upper
    for low, high in itertools.pairwise(steps):
        inner = upper[:, low : high - 1]
        assert np.all(inner >= np.minimum(upper[:, [low - 1]], upper[:, [high - 1]]) - 1e-9)
        assert np.all(inner <= np.maximum(upper[:, [low - 1]], upper[:, [high - 1]]) + 1e-9)
