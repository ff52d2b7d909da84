"""Empirical forecast intervals: the model's own recent errors, per series and per horizon.

No distribution is assumed: request rates are bursty, skewed and bounded below by 0, so a
Gaussian interval would be wrong in the tail the scaler cares about. Instead each series keeps,
for each horizon step k, a ring of its last `window` errors e = y[t+k] - yhat[t+k | t], and the
interval is the point forecast plus an empirical quantile of those errors. Until a series has
`min_errors` errors at a horizon, a scale-based interval stands in (see `fallback_offset`), so an
interval is never absent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np
from numpy.typing import ArrayLike

from scaler.forecast._arrays import (
    BoolArray,
    FloatArray,
    IntArray,
    State,
    check_count,
    check_steps,
    observe,
)

__all__ = [
    "ErrorQuantiles",
    "due_forecasts",
    "empirical_quantile",
    "fallback_offset",
    "record_errors",
]

# Mean absolute change -> standard deviation, for normal increments (E|X| = sigma * sqrt(2/pi)).
_MAD_TO_SIGMA = math.sqrt(math.pi / 2.0)


def due_forecasts(pending: FloatArray, t: int) -> FloatArray:
    """The forecasts of bin t made k bins earlier, k = 1..H: shape (N, H), NaN if never made.

    pending has shape (N, H, H): (series, slot = issue bin mod H, horizon step - 1).
    """
    horizon = pending.shape[1]
    steps = np.arange(1, horizon + 1)
    return pending[:, (t - steps) % horizon, steps - 1]


def record_errors(errors: FloatArray, count: IntArray, e: FloatArray, ok: BoolArray) -> None:
    """Write the present errors into each (series, horizon) ring (in place).

    Dense: the slot at every ring's write position is rewritten (with its old value where there
    is no error), through a flat view of the C-contiguous buffer: about 3x cheaper than
    scattering to the present ones only.
    """
    if not errors.flags.c_contiguous:
        raise ValueError("errors must be C-contiguous")
    n, h, window = errors.shape
    flat = errors.reshape(-1)
    index = (np.arange(n * h).reshape(n, h) * window) + count % window
    flat[index] = np.where(ok, e, flat[index])
    count += ok


def empirical_quantile(sorted_errors: FloatArray, n: IntArray, q: float) -> FloatArray:
    """Linear-interpolation quantile of the first n values of each sorted row (NaN if n == 0).

    Rows hold different numbers of errors, so np.quantile (one count for all) does not apply;
    sorting puts the unfilled NaN slots last and the quantile reads the first n.
    """
    pos = q * (n - 1)
    lo = np.maximum(np.floor(pos).astype(np.int64), 0)
    hi = np.minimum(lo + 1, np.maximum(n - 1, 0))
    rows = sorted_errors.reshape(-1, sorted_errors.shape[-1])
    index = np.arange(rows.shape[0])
    a = rows[index, lo.reshape(-1)].reshape(lo.shape)
    b = rows[index, hi.reshape(-1)].reshape(hi.shape)
    return np.asarray(a + (pos - lo) * (b - a), dtype=np.float64)


def fallback_offset(scale: FloatArray, z: float, steps: FloatArray) -> FloatArray:
    """z * sigma * sqrt(k), with sigma from the mean absolute one-step change of the series.

    The random-walk growth sqrt(k) is deliberately wide: it only covers the first few bins.
    """
    return np.asarray(z * _MAD_TO_SIGMA * scale[:, None] * np.sqrt(steps)[None, :])


class ErrorQuantiles:
    """Per series and horizon step, a ring of recent forecast errors and quantiles of it.

    Call `update(y, forecast)` once per bin with the new actual and the forecast made after it
    (shape (N, horizon); a NaN row means no forecast was made for that series); errors of
    earlier forecasts whose target is this bin are recorded first.
    `quantiles` lists the levels served (their fallback z-scores are computed once).
    """

    def __init__(
        self,
        n_series: int,
        horizon: int,
        window: int = 100,
        quantiles: Sequence[float] = (0.1, 0.9),
        min_errors: int = 10,
    ) -> None:
        self.n_series = check_count(n_series, "n_series")
        self.horizon = check_count(horizon, "horizon")
        self.window = check_count(window, "window")
        self.min_errors = check_count(min_errors, "min_errors")
        if self.min_errors > self.window:
            raise ValueError(f"min_errors {min_errors} exceeds window {window}")
        levels = tuple(float(q) for q in quantiles)
        if not levels or not all(0.0 < q < 1.0 for q in levels):
            raise ValueError(f"quantiles must be in (0, 1), got {quantiles!r}")
        self.quantiles = levels
        self._z = {q: NormalDist().inv_cdf(q) for q in levels}
        self._reset()

    def _reset(self) -> None:
        n, h = self.n_series, self.horizon
        self._t = 0
        self._pending = np.full((n, h, h), np.nan)
        self._errors = np.full((n, h, self.window), np.nan)
        self._count = np.zeros((n, h), dtype=np.int64)
        self._prev = np.zeros(n)
        self._has_prev = np.zeros(n, dtype=np.bool_)
        self._n_changes = np.zeros(n, dtype=np.int64)
        self._scale = np.zeros(n)
        self._sorted: dict[tuple[int, int, bytes | None], FloatArray] = {}

    @property
    def counts(self) -> IntArray:
        """Errors held per (series, horizon step), at most `window`."""
        return np.minimum(self._count, self.window)

    def update(self, y: ArrayLike, forecast: ArrayLike) -> None:
        values, ok = observe(y, self.n_series)
        made = np.asarray(forecast, dtype=np.float64)
        if made.shape != (self.n_series, self.horizon):
            raise ValueError(f"expected forecast shape {(self.n_series, self.horizon)}")
        e = values[:, None] - due_forecasts(self._pending, self._t)
        record_errors(self._errors, self._count, e, ok[:, None] & np.isfinite(e))
        # Scale for the fallback: mean absolute change between consecutive observations,
        # exponentially weighted once `window` changes have been seen.
        step = ok & self._has_prev
        self._n_changes = self._n_changes + step
        weight = 1.0 / np.maximum(np.minimum(self._n_changes, self.window), 1)
        change = np.abs(values - self._prev)
        self._scale = np.where(step, self._scale + weight * (change - self._scale), self._scale)
        self._prev = np.where(ok, values, self._prev)
        self._has_prev |= ok
        self._pending[:, self._t % self.horizon, :] = made
        self._t += 1
        self._sorted.clear()

    def quantile(
        self, q: float, step: int | None = None, rows: ArrayLike | None = None
    ) -> FloatArray:
        """Error quantile at level q: shape (n, horizon), or (n,) at one horizon step (1-based);
        n is N, or len(rows) for a subset of series (only those are sorted)."""
        if step is None:
            return self._offsets(q, 1, self.horizon, rows)
        if check_steps(step) > self.horizon:
            raise ValueError(f"step {step} beyond horizon {self.horizon}")
        return self._offsets(q, step, step, rows)[:, 0]

    def upper(self, point: ArrayLike, q: float, rows: ArrayLike | None = None) -> FloatArray:
        """point + the q error quantile, never below the point (a high bound, for scaling up).

        point has shape (n, h), h <= horizon, for all series or for `rows`."""
        values = self._points(point, rows)
        return values + np.maximum(self._offsets(q, 1, values.shape[1], rows), 0.0)

    def lower(self, point: ArrayLike, q: float, rows: ArrayLike | None = None) -> FloatArray:
        """point + the q error quantile (q < 0.5 for a low bound), within [0, point]."""
        values = self._points(point, rows)
        offset = np.minimum(self._offsets(q, 1, values.shape[1], rows), 0.0)
        return np.maximum(values + offset, 0.0)

    def _offsets(self, q: float, first: int, last: int, rows: ArrayLike | None) -> FloatArray:
        """Quantile offsets for horizon steps first..last; the sort is cached until the next
        update, so upper and lower (or repeated calls) share it."""
        if q not in self._z:
            raise ValueError(f"quantile {q} not configured (have {self.quantiles})")
        index: slice | IntArray = slice(None)
        key: tuple[int, int, bytes | None] = (first, last, None)
        if rows is not None:
            index = np.asarray(rows, dtype=np.int64)
            key = (first, last, index.tobytes())
        ordered = self._sorted.get(key)
        if ordered is None:
            ordered = np.sort(self._errors[index, first - 1 : last], axis=-1)
            self._sorted[key] = ordered
        n = self.counts[index, first - 1 : last]
        steps = np.arange(first, last + 1, dtype=np.float64)
        fallback = fallback_offset(self._scale[index], self._z[q], steps)
        return np.where(n >= self.min_errors, empirical_quantile(ordered, n, q), fallback)

    def _points(self, point: ArrayLike, rows: ArrayLike | None) -> FloatArray:
        values = np.asarray(point, dtype=np.float64)
        n = self.n_series if rows is None else np.asarray(rows).shape[0]
        if values.ndim != 2 or values.shape[0] != n or not 1 <= values.shape[1] <= self.horizon:
            raise ValueError(f"expected point shape ({n}, h <= {self.horizon}), got {values.shape}")
        return values

    def state(self) -> State:
        """What the intervals are learnt from. Forecasts still awaiting their actual are time
        bookkeeping, like the bin clock, and are not included."""
        return {
            "errors": self._errors.copy(),
            "count": self._count.copy(),
            "prev": self._prev.copy(),
            "has_prev": self._has_prev.copy(),
            "n_changes": self._n_changes.copy(),
            "scale": self._scale.copy(),
        }
