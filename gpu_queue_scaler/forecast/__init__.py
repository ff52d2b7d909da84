"""Short-horizon demand forecasts for many workloads at once.

The scaler must start a GPU replica a cold start before the demand for it arrives, so it needs
the demand over that horizon and, above all, a high bound on it. The pieces:

- `models`: point forecasters (Naive, MovingAverage, SimpleExponential, SeasonalNaive, HoltDamped,
  SeasonalHolt) sharing one `Model` protocol: `update(y)` with one observation per series,
  `predict(h)` with shape (N, h), `fit(history)` with shape (N, T) to warm start. Pure and
  deterministic: time is the bin index, nothing reads a clock or does I/O.
- `select.ScalerForecaster`: runs all candidates side by side, two experts per candidate (a bound
  from its raw errors, one from its errors scaled by the series' volatility), and forecasts per
  series the mean of the few experts with the lowest recent pinball loss of their upper bound,
  with that bound calibrated on its own hit rate. Pinball loss scores exactly the quantile the
  scaler scales on (not the mean), so the choice optimises what the policy consumes. Error
  quantiles are learnt online (O(1) per expert, series and step; no windows to sort).

Everything is vectorised across series: one update is a fixed number of numpy operations on
arrays of shape (experts, steps, N), never a Python loop over series, so a thousand workloads cost
little more than one, and a missing value (NaN) only skips its series. A single series pays
numpy's per-call overhead for the same operations (`scaler bench forecast` prints both costs;
bench/results/forecast.md), so the engine puts every workload with the same bins
on one forecaster, a row each (`gpu_queue_scaler.decision.bank`), using the row operations
`add_rows`, `reset_rows` and `copy_rows` (`_rows`) and the bin clock's `origin`, none of which
changes a forecast.
"""

from gpu_queue_scaler.forecast.models import (
    HoltDamped,
    Model,
    MovingAverage,
    Naive,
    SeasonalHolt,
    SeasonalNaive,
    SimpleExponential,
)
from gpu_queue_scaler.forecast.select import ForecastResult, ScalerForecaster, pinball_loss

__all__ = [
    "ForecastResult",
    "HoltDamped",
    "Model",
    "MovingAverage",
    "Naive",
    "ScalerForecaster",
    "SeasonalHolt",
    "SeasonalNaive",
    "SimpleExponential",
    "pinball_loss",
]
