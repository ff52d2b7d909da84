"""KEDA's polling and activation and the HPA's replica arithmetic, as documented upstream.

Why emulate them rather than apply a policy's number directly: every autoscaler in the bench
reaches the Deployment through the same machinery a cluster runs, and that machinery changes the
outcome (the HPA's 10% tolerance drops +-1 steps above 10 replicas; its 300 s scale-down window
holds replicas; KEDA only turns 0 -> 1 on its polling interval and 1 -> 0 after cooldownPeriod).

Sources: kubernetes/kubernetes pkg/controller/podautoscaler (horizontal.go: stabilization over
recommendations, rate-limit policies with selectPolicy Max; replica_calculator.go: AverageValue
and per-pod metrics, unready/missing pods); KEDA docs (scaledobject-spec: pollingInterval 30 s,
cooldownPeriod 300 s, minReplicaCount 0; the HPA is created with minReplicas max(1, min)).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler_bench.emulators.hpa import desired_replicas_average_value

FloatArray = NDArray[np.float64]

HPA_SYNC_S = 15.0  # --horizontal-pod-autoscaler-sync-period
HPA_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
KEDA_POLLING_S = 30.0
KEDA_COOLDOWN_S = 300.0


@dataclass(frozen=True)
class HpaBehavior:
    """`spec.behavior` of an autoscaling/v2 HPA; the defaults are Kubernetes' defaults."""

    scale_up_window_s: float = 0.0
    scale_down_window_s: float = 300.0
    tolerance: float = HPA_TOLERANCE
    scale_up_percent: float = 100.0  # policies: max(100%, 4 pods) per 15 s, selectPolicy Max
    scale_up_pods: int = 4
    scale_up_period_s: float = 15.0
    scale_down_percent: float = 100.0  # 100% per 15 s
    scale_down_period_s: float = 15.0


# What the project's ScaledObject examples (and docs) set for this scaler: the scaler
# stabilizes, so the HPA neither tolerates nor holds.
SCALER_BEHAVIOR = HpaBehavior(scale_up_window_s=0.0, scale_down_window_s=0.0, tolerance=0.0)


def pods_metric_replicas(
    current: int, values: FloatArray, unready: int, target: float, tolerance: float
) -> int:
    """A Pods metric with an AverageValue target (replica_calculator.go, calcPlainMetricReplicas):
    `values` from the pods that report, `unready` pods still Pending. Unready pods count as 0
    when the ratio says scale up; a change the recomputed ratio reverses is dropped."""
    if values.size == 0:
        return current
    ratio = float(values.mean()) / target
    if not (unready > 0 and ratio > 1.0):
        if abs(1.0 - ratio) <= tolerance:
            return current
        return math.ceil(ratio * values.size)
    new_ratio = float(values.sum()) / (target * (values.size + unready))
    if abs(1.0 - new_ratio) <= tolerance or new_ratio < 1.0:
        return current
    new = math.ceil(new_ratio * (values.size + unready))
    return current if new < current else new


def average_value_replicas(current: int, total: float, target: float, tolerance: float) -> int:
    """An External metric with an AverageValue target: `gpu_queue_scaler_bench.emulators.hpa`'s
    arithmetic."""
    return desired_replicas_average_value(current, total, target, tolerance)


class Hpa:
    """One HPA: every `sync_s` turn a proposal into the Deployment's new replica count."""

    def __init__(
        self,
        min_replicas: int,
        max_replicas: int,
        behavior: HpaBehavior = HpaBehavior(),
        sync_s: float = HPA_SYNC_S,
    ) -> None:
        self.min_replicas = min_replicas
        self.max_replicas = max_replicas
        self.behavior = behavior
        self.sync_s = sync_s
        self.next_sync = -math.inf
        self.recommendations: deque[tuple[float, int]] = deque()
        self.events: deque[tuple[float, int]] = deque()  # (time, replicas added; < 0 removed)
        self.started = False

    def due(self, at: float) -> bool:
        if at + 1e-9 < self.next_sync:
            return False
        self.next_sync = at + self.sync_s
        return True

    def normalize(self, at: float, current: int, proposal: int) -> int:
        """Stabilization windows, rate-limit policies and min/max, as horizontal.go applies them."""
        b = self.behavior
        if not self.started:
            # A warm start: the HPA has been running at the current count (a new HPA would
            # have no history and drop at once to its first recommendation).
            self.started = True
            self.recommendations.append((at, current))
        longest = max(b.scale_up_window_s, b.scale_down_window_s)
        while self.recommendations and self.recommendations[0][0] <= at - longest:
            self.recommendations.popleft()
        up = down = proposal
        for stamp, value in self.recommendations:
            if stamp > at - b.scale_up_window_s:
                up = min(up, value)
            if stamp > at - b.scale_down_window_s:
                down = max(down, value)
        self.recommendations.append((at, proposal))
        wanted = current
        wanted = max(wanted, up)
        wanted = min(wanted, down)
        period = max(b.scale_up_period_s, b.scale_down_period_s)
        while self.events and self.events[0][0] <= at - period:
            self.events.popleft()
        if wanted > current:
            added = sum(n for s, n in self.events if n > 0 and s > at - b.scale_up_period_s)
            start = current - added
            limit = max(
                start + b.scale_up_pods, math.ceil(start * (1.0 + b.scale_up_percent / 100.0))
            )
            wanted = min(wanted, max(limit, current))
        elif wanted < current:
            removed = -sum(n for s, n in self.events if n < 0 and s > at - b.scale_down_period_s)
            start = current + removed
            limit = math.floor(start * (1.0 - b.scale_down_percent / 100.0))
            wanted = max(wanted, min(limit, current))
        wanted = min(max(wanted, self.min_replicas), self.max_replicas)
        if wanted != current:
            self.events.append((at, wanted - current))
        return wanted


class Keda:
    """KEDA's scale loop for one ScaledObject: 0 -> 1 when active on a poll, 1 -> 0 once
    inactive for cooldownPeriod; between, the HPA it created scales."""

    def __init__(
        self,
        min_replicas: int = 0,
        polling_s: float = KEDA_POLLING_S,
        cooldown_s: float = KEDA_COOLDOWN_S,
    ) -> None:
        self.min_replicas = min_replicas
        self.polling_s = polling_s
        self.cooldown_s = cooldown_s
        self.next_poll = -math.inf
        self.last_active = -math.inf

    def due(self, at: float) -> bool:
        if at + 1e-9 < self.next_poll:
            return False
        self.next_poll = at + self.polling_s
        return True

    def poll(self, at: float, current: int, active: bool) -> int:
        """The replica count after this poll's activation step."""
        if self.last_active == -math.inf:  # KEDA starts the cooldown clock at its first poll
            self.last_active = at
        if active:
            self.last_active = at
            if current == 0:
                return max(1, self.min_replicas)
            return current
        if current > self.min_replicas and at - self.last_active >= self.cooldown_s:
            return self.min_replicas
        return current
