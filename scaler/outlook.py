"""A workload's need, binned on the wall clock and forecast over the cold-start horizon.

The engine feeds each decision's need (replicas needed now) in; when a bin of
`forecastStepSeconds` closes, its mean goes to the forecaster (`scaler.forecast.ScalerForecaster`,
seasonal candidates when `seasonPeriodSeconds` spans at least two bins) and the next `Outlook` is
the highest point and upper-quantile forecast within the horizon. Bins are aligned to the wall
clock, so two scaler replicas fed the same signals (live or replayed history) hold the same outlook.
Deterministic, no I/O, no clock: time comes in as an argument.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from scaler.forecast import ScalerForecaster

MAX_GAP_BINS = 10_000  # a longer gap (scaler paused, workload unasked) restarts the series


@dataclass(frozen=True)
class Outlook:
    """Replicas the workload is forecast to need within the horizon."""

    point_max: float
    upper_max: float  # highest upper-quantile (q = 0.9) forecast within the horizon
    model: str
    horizon_s: float
    made_at: float  # the bin boundary it was made at

    def describe(self) -> str:
        return (
            f"forecast within {self.horizon_s:g}s: point<={self.point_max:.2f}, "
            f"q90<={self.upper_max:.2f} ({self.model})"
        )


class NeedForecast:
    def __init__(self, step_s: float, horizon_s: float, period_s: float | None) -> None:
        self.step_s = step_s
        self.horizon_s = horizon_s
        self.horizon = max(1, math.ceil(horizon_s / step_s))
        self.period_s = period_s
        period = round(period_s / step_s) if period_s else 0
        self.period = period if period >= 2 else None
        self._reset()

    def _reset(self) -> None:
        self.forecaster = ScalerForecaster(1, self.horizon, self.period)
        self.bin: int | None = None
        self.total = 0.0
        self.count = 0
        self.outlook: Outlook | None = None

    def observe(self, at: float, need: float | None) -> Outlook | None:
        """Add the need decided at `at` (None when there was no fresh signal)."""
        index = math.floor(at / self.step_s)
        if self.bin is None or index - self.bin > MAX_GAP_BINS:
            self._reset()
            self.bin = index
        closed = False
        while index > self.bin:
            mean = self.total / self.count if self.count else math.nan
            self.forecaster.update(np.array([mean]))
            self.bin += 1
            self.total, self.count = 0.0, 0
            closed = True
        if need is not None and math.isfinite(need):
            self.total += need
            self.count += 1
        if closed:
            result = self.forecaster.predict(self.horizon)
            self.outlook = Outlook(
                point_max=float(np.max(result.point[0])),
                upper_max=float(np.max(result.upper[0])),
                model=result.model[0],
                horizon_s=self.horizon_s,
                made_at=self.bin * self.step_s,
            )
        return self.outlook
