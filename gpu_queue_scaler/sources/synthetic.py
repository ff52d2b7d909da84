"""A built-in generator of queue signals with a documented shape (quickstart, tests, demos).

The signal is a pure function of the trigger and the wall-clock time, so every scaler replica,
and a restarted one, sees exactly the same series. With period P, peak rate R, service time S and
phase x = (t mod P) / P:

    arrival rate r(t):  wave      R * sin(2 pi x) for x < 1/2, else 0   (burst, then idle)
                        sine      R * (0.55 + 0.45 sin(2 pi x))         (10% .. 100% of R)
                        constant  R
                        zero      0
    running   = r * S                       (Little's law: requests in service; S is reported)
    queue time = S / 4 * (r / R)^2           (grows with load, 0 when idle)
    waiting   = r * queue time              (Little's law again: requests in the queue)
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from gpu_queue_scaler.settings.fields import BY_KEY
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.signals import Signal


def synthetic_rate(pattern: str, peak: float, period: float, at: float) -> float:
    x = (at % period) / period
    if pattern == "wave":
        return peak * math.sin(2 * math.pi * x) if x < 0.5 else 0.0
    if pattern == "sine":
        return peak * (0.55 + 0.45 * math.sin(2 * math.pi * x))
    if pattern == "constant":
        return peak
    return 0.0


class Shape(NamedTuple):
    """The trigger's synthetic settings, read once per read or history (not once per point)."""

    pattern: str
    peak: float
    service: float
    period: float


def shape_of(spec: WorkloadSpec) -> Shape:
    def setting(key: str) -> Any:
        return spec.trigger.values.get(key, BY_KEY[key].default)

    return Shape(
        str(setting("syntheticPattern")),
        float(setting("syntheticPeakRps")),
        float(setting("syntheticServiceSeconds")),
        float(setting("syntheticPeriodSeconds")),
    )


def synthetic_signal(spec: WorkloadSpec, at: float) -> Signal:
    return shaped_signal(shape_of(spec), at)


def shaped_signal(shape: Shape, at: float) -> Signal:
    pattern, peak, service, period = shape
    rate = max(synthetic_rate(pattern, peak, period, at), 0.0)
    queue_time = service / 4 * (rate / peak) ** 2 if peak > 0 else 0.0
    return Signal(
        at=at,
        source="synthetic",
        waiting=rate * queue_time,
        running=rate * service,
        arrival_rate=rate,
        queue_time_mean_s=queue_time,
        service_time_s=service if rate > 0 else None,
        age_s=0.0,
    )


class SyntheticSource:
    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        return synthetic_signal(spec, at)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        count = max(0, math.ceil((end - start) / step - 1e-9))  # the grid never reaches `end`
        shape = shape_of(spec)
        return [shaped_signal(shape, start + i * step) for i in range(count)]
