"""Short-horizon demand forecasts for many workloads at once.

The scaler must start a GPU replica a cold start before the demand for it arrives, so it needs
the demand over that horizon and, above all, a high bound on it. The pieces:

- `models`: point forecasters (Naive, MovingAverage, SeasonalNaive, HoltDamped, SeasonalHolt)
  sharing one `Model` protocol: `update(y)` with one observation per series, `predict(h)` with
  shape (N, h), `fit(history)` with shape (N, T) to warm start. Pure and deterministic: time is
  the bin index, nothing reads a clock or does I/O.
- `intervals.ErrorQuantiles`: bounds from each model's own recent errors per horizon step. Empirical
  quantiles assume no distribution, which matters for bursty, skewed, zero-bounded demand.
- `select.ScalerForecaster`: runs all candidates side by side and uses, per series, the one with
  the lowest recent pinball loss of its upper bound. Pinball loss scores exactly the quantile the
  scaler scales on (not the mean), so the choice optimises what the policy consumes.

Everything is vectorised across series: one update is a few numpy operations on arrays of shape
(N, ...), never a Python loop over series, so 1,000 workloads update in milliseconds (each model
well under 1 ms; the forecaster with its five candidates and their intervals about 10 ms on a
small machine), and a missing value (NaN) only skips its series.
"""

from scaler.forecast.intervals import ErrorQuantiles
from scaler.forecast.models import (
    HoltDamped,
    Model,
    MovingAverage,
    Naive,
    SeasonalHolt,
    SeasonalNaive,
)
from scaler.forecast.select import ForecastResult, ScalerForecaster, pinball_loss

__all__ = [
    "ErrorQuantiles",
    "ForecastResult",
    "HoltDamped",
    "Model",
    "MovingAverage",
    "Naive",
    "ScalerForecaster",
    "SeasonalHolt",
    "SeasonalNaive",
    "pinball_loss",
]
