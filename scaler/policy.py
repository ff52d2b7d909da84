"""Signals -> a replica target. Pure and deterministic: the decision is a value, time an argument.

`decide(spec, signal, state, at, stale_s)` returns the new `Decision` and the next `PolicyState`;
it reads no clock and does no I/O, so the same inputs give the same answer on every scaler replica,
and tests drive time explicitly.

This release's rule (the forecast issue adds forecast, panic and cold-start terms on top):

1. need = the capacity model's replicas needed now (`scaler.capacity`: concurrency, Little's law,
   queue-time SLO and KV-cache terms, the largest wins)
2. the target is ceil(need); it rises at once, and falls only to the highest need seen within
   scaleDownStabilizationSeconds (a removed GPU replica takes a cold start to come back);
3. with `forecast: on`, the target also covers the q90 forecast of need within the horizon
   (coldStartSeconds + pollingIntervalSeconds), up and down (`scaler.outlook`);
4. a workload with anything in flight or arriving in the last scaleToZeroIdleSeconds, or with
   traffic forecast within the horizon, is active and keeps at least one replica; only after the
   idle window AND with a q90 forecast below one request does the target drop to 0;
5. the target is clamped to [minReplicas, maxReplicas];
6. fail static: with no signal, the last decision is held (never lowered) for stale_s seconds,
   then there is no decision at all, so KEDA's `fallback` takes over.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from enum import StrEnum

from scaler import capacity
from scaler.outlook import Outlook
from scaler.signals import Signal
from scaler.workload import WorkloadSpec

EPSILON = 1e-9


class Reason(StrEnum):
    """Which term set the target. A closed set: it is a label on /metrics."""

    CURRENT_NEED = "current_need"
    FORECAST = "forecast"
    STABILIZATION = "stabilization"
    ACTIVE_FLOOR = "active_floor"
    SCALE_TO_ZERO = "scale_to_zero"
    MIN_BOUND = "min_bound"
    MAX_BOUND = "max_bound"
    HOLD = "hold"


@dataclass(frozen=True)
class Decision:
    workload: str  # namespace/name
    metric_name: str
    at: float  # the evaluation tick (wall-clock seconds)
    replicas: int
    active: bool
    reason: Reason
    need: float | None  # replicas needed now, fractional
    in_flight: float | None
    arrival_rate: float | None
    detail: str  # the numbers behind `reason`, for logs and `explain`
    faults: tuple[str, ...] = ()  # what is missing or wrong right now
    signal: Signal | None = None  # what the decision was made from (None when held)
    outlook: Outlook | None = None  # the forecast it considered (None with forecasting off)

    @property
    def decision_id(self) -> str:
        """Same workload and tick -> same id on every replica; used to join logs."""
        raw = f"{self.workload}|{self.metric_name}|{self.at:.3f}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PolicyState:
    # Sliding-window maximum of ceil(need) over the stabilization window, as a monotone queue:
    # (tick, value) pairs with strictly decreasing values; the first is the window's maximum.
    recent: tuple[tuple[float, int], ...] = ()
    last_busy_at: float | None = None
    first_at: float | None = None  # first tick this state has seen (history included)
    last_good: Decision | None = None  # last decision made from a real signal


def _window_max_push(
    queue: tuple[tuple[float, int], ...], at: float, value: int, window_start: float
) -> tuple[tuple[float, int], ...]:
    """Append (at, value) and drop what can no longer be the maximum: O(1) amortised, so a
    replayed history of hundreds of ticks costs no more than live evaluation."""
    kept = [p for p in queue if p[0] > window_start and p[1] > value]
    return (*kept, (at, value))


def hold(state: PolicyState, at: float, stale_s: float, faults: tuple[str, ...]) -> Decision | None:
    """Fail static: repeat the last good decision (never lower) until it is `stale_s` old."""
    last = state.last_good
    if last is None or at - last.at > stale_s:
        return None
    detail = (
        f"signals missing for {at - last.at:.0f}s (limit {stale_s:.0f}s); holding "
        f"{last.replicas} replicas from {last.at:.0f}"
    )
    return replace(last, at=at, reason=Reason.HOLD, detail=detail, faults=faults, signal=None)


def decide(
    spec: WorkloadSpec,
    signal: Signal | None,
    state: PolicyState,
    at: float,
    stale_s: float,
    faults: tuple[str, ...] = (),
    outlook: Outlook | None = None,
) -> tuple[Decision | None, PolicyState]:
    required = capacity.need(signal, spec.capacity) if signal is not None else None
    if signal is None or required is None:
        reasons = faults + (signal.reasons if signal is not None else ())
        return hold(state, at, stale_s, reasons or ("no in-flight or arrival signal",)), state

    in_flight = signal.in_flight
    need = required.replicas
    now_replicas = max(0, math.ceil(need - EPSILON))
    recent = _window_max_push(state.recent, at, now_replicas, at - spec.scale_down_stabilization_s)
    busy = bool(signal.busy)
    last_busy = at if busy else state.last_busy_at
    first_at = state.first_at if state.first_at is not None else at
    # Unknown history counts as busy: a scaler that just started never scales to zero at once.
    idle_since = last_busy if last_busy is not None else first_at
    ahead = outlook if spec.forecast else None
    # Traffic expected within the horizon (the q90 forecast holds a request or more) keeps a
    # workload active, and activates an idle one before its ramp: scale from zero takes a
    # cold start, so it has to begin a horizon early.
    expected = ahead is not None and ahead.upper_max * spec.target_concurrency >= 1.0
    idle = not busy and not expected and at - idle_since >= spec.scale_to_zero_idle_s

    target = recent[0][1]
    reason = Reason.CURRENT_NEED if target == now_replicas else Reason.STABILIZATION
    detail = f"{required.describe()} -> {now_replicas}"
    if reason is Reason.STABILIZATION:
        detail += f"; held at {target}, the highest in {spec.scale_down_stabilization_s:g}s"
    if ahead is not None:
        # Scale up to the upper forecast within the horizon: what is asked now serves then.
        # Never scale below it either: a replica removed now takes a horizon to come back.
        covered = max(0, math.ceil(ahead.upper_max - EPSILON))
        detail += f"; {ahead.describe()} -> {covered}"
        if covered > target:
            target, reason = covered, Reason.FORECAST
    if idle:
        target, reason = 0, Reason.SCALE_TO_ZERO
        detail = f"idle for {at - idle_since:.0f}s >= scaleToZeroIdleSeconds"
    elif target < 1:
        target, reason = 1, Reason.FORECAST if expected and not busy else Reason.ACTIVE_FLOOR
        detail += f"; active within scaleToZeroIdleSeconds={spec.scale_to_zero_idle_s:g}"
    if target < spec.min_replicas:
        target, reason = spec.min_replicas, Reason.MIN_BOUND
        detail += f"; raised to minReplicas={spec.min_replicas}"
    elif target > spec.max_replicas:
        target, reason = spec.max_replicas, Reason.MAX_BOUND
        detail += f"; capped at maxReplicas={spec.max_replicas}"

    decision = Decision(
        workload=spec.workload,
        metric_name=spec.trigger.metric_name,
        at=at,
        replicas=target,
        active=target > 0,  # IsActive agrees with the metric: a minReplicas floor stays active
        reason=reason,
        need=need,
        in_flight=in_flight,
        arrival_rate=signal.arrival_rate,
        detail=detail,
        faults=faults + signal.reasons,
        signal=signal,
        outlook=ahead,
    )
    return decision, PolicyState(
        recent=recent, last_busy_at=last_busy, first_at=first_at, last_good=decision
    )
