"""The HPA's replica arithmetic for one External metric, as in kubernetes/kubernetes
pkg/controller/podautoscaler/replica_calculator.go. Used by the bundled KEDA-like client and the
simulator to show what a cluster would do with the scaler's answer."""

from __future__ import annotations

import math

DEFAULT_TOLERANCE = 0.1


def desired_replicas_average_value(
    current: int, metric_total: float, target_per_pod: float, tolerance: float = DEFAULT_TOLERANCE
) -> int:
    """AverageValue target: ratio = total / (target x current); inside the tolerance nothing
    changes, otherwise ceil(total / target). With target 1 the metric *is* the replica count,
    which is how the scaler commands an exact number; the default 10% tolerance then ignores
    every +-1 step above 10 replicas unless `behavior.scaleUp/scaleDown.tolerance` is lowered."""
    if current == 0:
        return math.ceil(metric_total / target_per_pod)
    ratio = metric_total / (target_per_pod * current)
    if abs(1.0 - ratio) <= tolerance:
        return current
    return math.ceil(metric_total / target_per_pod)
