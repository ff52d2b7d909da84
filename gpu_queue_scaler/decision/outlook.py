"""A workload's demand, binned on the wall clock and forecast over the cold-start horizon.

The engine feeds each decision's demand in (`Decision.demand`: the offered load in replicas, else
the need); when a bin of
`forecastStepSeconds` closes, its mean goes to the forecaster
(`gpu_queue_scaler.forecast.ScalerForecaster`, seasonal candidates when `seasonPeriodSeconds` spans
at least two bins) and the next `Outlook` is the highest point and upper-quantile forecast within
the horizon. Bins are aligned to the wall clock, so two scaler replicas fed the same signals (live
or replayed history) hold the same outlook; the forecaster's bin clock is the wall-clock bin index
too (its `origin`), so ring positions and seasonal phases are the same whenever the series started,
and a series' state can move into the engine's shared forecaster (`gpu_queue_scaler.decision.bank`)
unchanged. Deterministic, no I/O, no clock: time comes in as an argument.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from gpu_queue_scaler.forecast import ScalerForecaster

MAX_GAP_BINS = 10_000  # a longer gap (scaler paused, workload unasked) restarts the series
SEASON_MODEL = "SeasonalMax"  # the model name of the season's own outlook (`forecast: wake`)


class Outlook(NamedTuple):
    """Replicas the workload is forecast to need within the horizon.

    A NamedTuple rather than a frozen dataclass: the forecast bank builds one per workload and
    bin, and a tuple is built in C, at a third of the cost (`gpu_queue_scaler.decision.bank`)."""

    point_max: float
    # highest upper-quantile (q = 0.9) forecast within the horizon (the season's outlook: the
    # highest demand within the horizon one or two periods ago)
    upper_max: float
    model: str
    horizon_s: float
    made_at: float  # the bin boundary it was made at

    def describe(self) -> str:
        """For `scaler explain`: what the two numbers are, which differs by who made them."""
        if self.model == SEASON_MODEL:  # `Season.outlook`: the demand itself, not a quantile
            return (
                f"forecast within {self.horizon_s:g}s: a period ago<={self.point_max:.2f}, "
                f"one or two periods ago<={self.upper_max:.2f} ({self.model})"
            )
        return (
            f"forecast within {self.horizon_s:g}s: point<={self.point_max:.2f}, "
            f"q90<={self.upper_max:.2f} ({self.model})"
        )


def horizon_bins(step_s: float, horizon_s: float) -> int:
    """Bins the forecaster looks ahead: the horizon, rounded up to whole bins."""
    return max(1, math.ceil(horizon_s / step_s))


def period_bins(step_s: float, period_s: float | None) -> int | None:
    """The season in bins, or None when there is none or it spans fewer than two bins."""
    period = round(period_s / step_s) if period_s else 0
    return period if period >= 2 else None


def bin_index(at: float, step_s: float) -> int:
    """The wall-clock bin `at` falls in."""
    return math.floor(at / step_s)


class NeedForecast:
    """One workload's need forecast, on a forecaster of its own. The engine runs workloads on a
    shared `gpu_queue_scaler.decision.bank.ForecastBank` instead (same numbers, one update for all);
    this is the reference it is tested against and where a workload's history is replayed."""

    def __init__(self, step_s: float, horizon_s: float, period_s: float | None) -> None:
        self.step_s = step_s
        self.horizon_s = horizon_s
        self.horizon = horizon_bins(step_s, horizon_s)
        self.period_s = period_s
        self.period = period_bins(step_s, period_s)
        self._reset(0)

    def _reset(self, origin: int) -> None:
        self.forecaster = ScalerForecaster(1, self.horizon, self.period, origin=origin)
        self.bin: int | None = None
        self.total = 0.0
        self.count = 0
        self.outlook: Outlook | None = None

    def observe(self, at: float, need: float | None) -> Outlook | None:
        """Add the need decided at `at` (None when there was no fresh signal)."""
        self.advance(bin_index(at, self.step_s))
        if need is not None and math.isfinite(need):
            self.total += need
            self.count += 1
        return self.outlook

    def resume(self, index: int, total: float, count: int) -> None:
        """Move to bin `index` and take `total` over `count` needs as what that open bin has
        been fed so far: a replay of history that ends inside a bin (`Season.replay_into`)."""
        self.advance(index)
        self.total, self.count = total, count

    def advance(self, index: int) -> None:
        """Move to bin `index`: close the bins before it (a bin with no need is missing, NaN)
        and forecast from there. A gap over MAX_GAP_BINS restarts the series at `index`."""
        if self.bin is None or index - self.bin > MAX_GAP_BINS:
            self._reset(index)
            self.bin = index
        closed = False
        while index > self.bin:
            mean = self.total / self.count if self.count else math.nan
            self.forecaster.update(np.array([mean]))
            self.bin += 1
            self.total, self.count = 0.0, 0
            closed = True
        if closed:
            result = self.forecaster.predict(self.horizon)
            self.outlook = Outlook(
                point_max=float(np.max(result.point[0])),
                upper_max=float(np.max(result.upper[0])),
                model=result.model[0],
                horizon_s=self.horizon_s,
                made_at=self.bin * self.step_s,
            )
