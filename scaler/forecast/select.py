"""The scaler's forecaster: run every candidate model, use per series the one that has lately
been best at the bound the scaler acts on.

A workload with a daily cycle ends up on a seasonal model once two periods are seen; a bursty one
on whichever simple model's 0.9 bound has been tightest without being beaten by the demand. The
score is the pinball loss at q of each candidate's upper bound at the evaluation step, issued
that many bins earlier: pinball loss is minimised by the true q-quantile, so it rewards a bound
that is both high enough and no higher than needed. It is an exponentially weighted mean, so the
choice follows regime changes, and a challenger must beat the current choice by `margin`
(relative) so the choice does not flap between near-equal models.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import numpy as np
from numpy.typing import ArrayLike

from scaler.forecast._arrays import (
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
from scaler.forecast.intervals import ErrorQuantiles
from scaler.forecast.models import (
    HoltDamped,
    Model,
    MovingAverage,
    Naive,
    SeasonalHolt,
    SeasonalNaive,
)

__all__ = ["ForecastResult", "ScalerForecaster", "choose", "pinball_loss"]


@dataclass(frozen=True, eq=False)
class ForecastResult:
    """Forecasts for steps 1..h, each array of shape (N, h); `model` names the model per series."""

    point: FloatArray
    upper: FloatArray
    lower: FloatArray
    model: tuple[str, ...]


def pinball_loss(y: FloatArray, bound: FloatArray, q: float) -> FloatArray:
    """Quantile loss of `bound` as a q-quantile of y: q * under-shoot, (1 - q) * over-shoot."""
    diff = y - bound
    return np.maximum(q * diff, (q - 1.0) * diff)


def choose(loss: FloatArray, usable: BoolArray, current: IntArray, margin: float) -> IntArray:
    """Per series (columns), the usable candidate (rows) with the least loss, keeping the current
    one unless the best beats it by the relative `margin`. Ties go to the earlier candidate."""
    masked = np.where(usable, loss, np.inf)
    best = np.argmin(masked, axis=0)
    columns = np.arange(loss.shape[1])
    switch = masked[best, columns] < masked[current, columns] * (1.0 - margin)
    return np.where(switch | ~usable[current, columns], best, current)


class ScalerForecaster:
    """Candidates: Naive, MovingAverage, HoltDamped, and with a `period` SeasonalNaive and
    SeasonalHolt, all updated with the same observations, each with its own ErrorQuantiles.

    A candidate competes for a series once it is `ready` there and `min_errors` of its bounds
    have been scored; until then (and on ties) the series uses Naive, the first candidate.

    Defaults: `quantile` 0.9 (the bound the policy scales on); `eval_step` = `horizon` (the
    forecast that matters is the one for when a replica started now would be ready); error
    `window` 100 bins with at least `min_errors` 10 before trusting the empirical quantile;
    loss `halflife` 48 bins (recent enough to follow a change of regime, long enough that a few
    bursts do not decide); switching `margin` 5%.
    """

    name = "scaler"

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
        margin: float = 0.05,
    ) -> None:
        self.n_series = check_count(n_series, "n_series")
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
        self.margin = check_unit(margin, "margin", closed_low=True)
        self._reset()

    def _candidates(self) -> list[Model]:
        n = self.n_series
        models: list[Model] = [Naive(n), MovingAverage(n), HoltDamped(n)]
        if self.period is not None:
            models += [SeasonalNaive(n, self.period), SeasonalHolt(n, self.period)]
        return models

    def _reset(self) -> None:
        self._models = self._candidates()
        self._errors = [
            ErrorQuantiles(
                self.n_series,
                self.horizon,
                self.window,
                (1.0 - self.quantile, self.quantile),
                self.min_errors,
            )
            for _ in self._models
        ]
        c, n = len(self._models), self.n_series
        self._t = 0
        self._issued = np.full((c, n, self.eval_step), np.nan)  # upper bounds awaiting actuals
        self._loss = np.zeros((c, n))
        self._n_scored = np.zeros((c, n), dtype=np.int64)
        self._choice = np.zeros(n, dtype=np.int64)

    @property
    def candidates(self) -> tuple[str, ...]:
        return tuple(model.name for model in self._models)

    @property
    def loss(self) -> FloatArray:
        """Recent pinball loss per series and candidate, shape (N, candidates)."""
        return self._loss.T.copy()

    def choice(self) -> tuple[str, ...]:
        """The model used for each series right now (for logs and `explain`)."""
        names = np.array(self.candidates)
        return tuple(str(name) for name in names[self._choice])

    def update(self, y: ArrayLike) -> None:
        values, ok = observe(y, self.n_series)
        given = np.where(ok, values, np.nan)
        k, q = self.eval_step, self.quantile
        slot = self._t % k
        due = self._issued[:, :, slot].copy()  # the bounds issued k bins ago for this bin
        ready = np.empty((len(self._models), self.n_series), dtype=np.bool_)
        for c, (model, errors) in enumerate(zip(self._models, self._errors, strict=True)):
            model.update(given)
            ready[c] = model.ready
            point = model.predict(self.horizon)
            # Only forecasts made while ready are scored: a seasonal model's warm-up (where it
            # is Naive) would otherwise inflate its intervals and loss for a whole window.
            errors.update(given, np.where(ready[c][:, None], point, np.nan))
            bound = point[:, k - 1] + np.maximum(errors.quantile(q, k), 0.0)
            self._issued[c, :, slot] = np.where(ready[c], bound, np.nan)
        scored = ok[None, :] & np.isfinite(due)
        self._n_scored = self._n_scored + scored
        decay = 1.0 - 0.5 ** (1.0 / self.halflife)
        weight = np.maximum(1.0 / np.maximum(self._n_scored, 1), decay)
        loss = pinball_loss(values[None, :], np.where(scored, due, 0.0), q)
        self._loss = np.where(scored, self._loss + weight * (loss - self._loss), self._loss)
        # A candidate competes once `min_errors` of its bounds were scored; the first one (Naive)
        # always may, so every series has a choice.
        usable = ready & (self._n_scored >= self.min_errors)
        usable[0] = True
        self._choice = choose(self._loss, usable, self._choice, self.margin)
        self._t += 1

    def predict(self, h: int) -> ForecastResult:
        """Point, upper (quantile) and lower (1 - quantile) bounds of each series' chosen model."""
        h = check_steps(h)
        if h > self.horizon:
            raise ValueError(f"h {h} beyond horizon {self.horizon}")
        point = np.zeros((self.n_series, h))
        upper = np.zeros((self.n_series, h))
        lower = np.zeros((self.n_series, h))
        for c, (model, errors) in enumerate(zip(self._models, self._errors, strict=True)):
            rows = np.flatnonzero(self._choice == c)
            if rows.size:
                p = model.predict(h)[rows]
                point[rows] = p
                upper[rows] = errors.upper(p, self.quantile, rows)
                lower[rows] = errors.lower(p, 1.0 - self.quantile, rows)
        return ForecastResult(point=point, upper=upper, lower=lower, model=self.choice())

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
        """Copies of the learnt per-series state (first axis N), candidates' included."""
        out: State = {
            "loss": self._loss.T.copy(),
            "n_scored": self._n_scored.T.copy(),
            "choice": self._choice.copy(),
        }
        for model, errors in zip(self._models, self._errors, strict=True):
            out.update({f"{model.name}.{key}": value for key, value in model.state().items()})
            out.update(
                {f"{model.name}.errors.{key}": value for key, value in errors.state().items()}
            )
        return out
