"""Signals -> a replica target. Pure and deterministic: the decision is a value, time an argument.

`decide(spec, signal, state, at, stale_s, faults, outlook, explain)` returns the new `Decision`
(None: no decision can be made, KEDA's fallback applies) and the next `PolicyState`;
it reads no clock and does no I/O, so the same inputs give the same answer on every scaler replica,
and tests drive time explicitly.

The rule, in the order `decide` applies it (each step names itself as the decision's reason):

1. need = the capacity model's replicas needed now (`gpu_queue_scaler.decision.capacity`). With a
   count of ready pods from the source, the queue is counted where a replica asked now would find
   it: the replicas asked for within the horizon and not yet ready, and the queue they will drain,
   are not asked for again (`fleet`, `capacity.Fleet`). S is the one at the operating point (a
   replica holding targetConcurrency requests), fitted against the batch from the servers' own
   counters (`operating_service_time`), not the S the fleet's current size produces (while a
   scale from zero waits for its first replica with no fit and no S, the mean S last seen); and the
   need's flow (not the drain of a backlog, a known quantity) carries a headroom set in closed
   loop on the attainment measured (`closed_loop_headroom`: the share of requests late past
   queueTimeSloSeconds, read from the queue time's mean and p99, against 1 - sloAttainment;
   what lateness taught while replicas were on their way fades once they serve);
2. current_need / stabilization: the target is ceil(need); it rises at once, and falls only to
   the highest need seen within scaleDownStabilizationSeconds;
3. forecast: with `forecast: on`, the target also covers the q90 forecast of demand within the
   horizon (coldStartSeconds + pollingIntervalSeconds) times the closed loop's headroom, as the
   need is (`gpu_queue_scaler.decision.outlook`);
4. panic: when the need reaches panicThreshold x the replicas asked (or outruns the q90 forecast
   by a replica), the target is the need at face value and does not fall for PANIC_HOLD_S;
5. active_floor / scale_to_zero: a workload with anything in flight or arriving within
   scaleToZeroIdleSeconds, or traffic forecast within the horizon, keeps at least one replica;
   only after the idle window AND with a q90 forecast below one request does it drop to 0;
6. scale_down_limit: at most scaleDownMaxPercent of the replicas removed per 60 s (not on the
   way to zero);
7. whole nodes: with replicasPerNode > 1 the target rounds up to a multiple of it (within
   maxReplicas): a node is billed whole, so the replicas that fill one already asked for are
   free headroom, and a scale-down that empties no node would save nothing; a node is
   released only when the replicas needed are under 90% of those left
   (`NODE_RELEASE_MARGIN`), so a need swinging around a node's edge does not release it and ask
   for it a cold start late on the next swing;
8. min_bound / max_bound: clamped to [minReplicas, maxReplicas];
9. hold (fail static): with no signal, or without a queue field the decision needs
   (`missing_queue_fields`: read as 0 it would lower the target), the last decision is held
   (never lowered) for stale_s seconds, then there is no decision at all, so KEDA's
   `fallback` takes over.

Every window the rule keeps is bounded (`policy_memory_s`), so a replica that warm-starts by
replaying that much history tick for tick decides exactly as one that ran all along (but for
the S a scale from zero after a long idle sizes from: `observe_service_time`).
"""

from __future__ import annotations

import hashlib
import math
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from gpu_queue_scaler.catalog import QUEUE_FIELDS, required_fields
from gpu_queue_scaler.decision import capacity
from gpu_queue_scaler.decision.outlook import Outlook
from gpu_queue_scaler.signals import Signal

if TYPE_CHECKING:  # annotations only: the decision imports no settings code at run time
    from gpu_queue_scaler.settings.spec import WorkloadSpec

EPSILON = 1e-9
TICK_TOLERANCE_S = 1e-3  # tick times closer than this are the same tick (evaluation >= 0.05 s)
PANIC_HOLD_S = 60.0  # panic lasts this long after demand last outran the ask (Knative: 60 s)
SCALE_DOWN_PERIOD_S = 60.0  # the period scaleDownMaxPercent applies to
# The queue's trend (capacity.Fleet.queue_trend) is read over distinct observations within this
# window at an unchanged ready count, once they span QUEUE_TREND_MIN_SPAN_S: long enough that a
# queue jittering by a request or two reads as flat, short enough to catch a load step quickly.
QUEUE_TREND_WINDOW_S = 30.0
QUEUE_TREND_MIN_SPAN_S = 5.0
# The offered load the forecaster learns is arrivals x the mean loaded S over this window (in
# buckets of SERVICE_TIME_BUCKET_S): under continuous batching a request's S grows with the batch,
# so S read tick by tick swings with the fleet (a short fleet batches more), and arrivals x that S
# would teach the forecaster the fleet's own swings as demand.
SERVICE_TIME_WINDOW_S = 600.0
SERVICE_TIME_BUCKET_S = 60.0
SERVICE_TIME_BUCKETS = round(SERVICE_TIME_WINDOW_S / SERVICE_TIME_BUCKET_S)
# The target sizes from S at the operating point: a line S = alpha + beta x b fitted over this
# window to the (running per ready replica b, loaded S) the servers report, evaluated at
# b = targetConcurrency. Continuous batching makes S grow about linearly with the batch (each
# decode step costs a fixed part plus a part per sequence), so a short fleet reads a long S and
# a large one a short S; sized from the S it reads, the fleet would chase its own size. Over ten
# minutes a fleet's batch moves enough to show the slope; with too little spread the ridge
# (FIT_RIDGE x the mean batch, as a spread of the batch) shrinks the slope toward the mean S.
SERVICE_FIT_WINDOW_S = 600.0
SERVICE_FIT_BUCKETS = round(SERVICE_FIT_WINDOW_S / SERVICE_TIME_BUCKET_S)
SERVICE_FIT_MIN_TICKS = 6
FIT_RIDGE = 0.02
# Headroom over the need, in closed loop on the attainment measured. Each tick estimates the
# share of requests that waited past queueTimeSloSeconds (`late_share`: from the queue time's
# mean and p99, the quantities vLLM's and Triton's queue-time metrics give) and moves
# log(headroom) by HEADROOM_GAIN_PER_S x (late share - allowed) / allowed per second, allowed =
# 1 - sloAttainment, at most HEADROOM_RISE_MAX_PER_S up: an integral controller, so the late
# share averaged over time settles at the allowed share. On time, an hour takes ~30% off; a
# minute with 30% of the requests late adds ~20%. Bounded to [1, HEADROOM_MAX]; a gap between
# ticks counts at most HEADROOM_MAX_DT_S.
# Requests that came while no replica served (a scale from zero) wait a cold start whatever the
# headroom: they are admitted once the first replicas serve, and their waits are in the
# queue-time rates for a rate window after. That lateness is the cold start's, not the sizing's,
# so the loop does not learn from it (`scaled_from_zero`); learnt, it held a burst-a-period
# workload at HEADROOM_MAX for hours (idle-bursts: 14 GPU-h against 11.7).
HEADROOM_GAIN_PER_S = 1e-4
HEADROOM_RISE_MAX_PER_S = 0.005
HEADROOM_MAX = 1.6
HEADROOM_MAX_DT_S = 60.0
# Lateness measured while replicas asked for are on their way, or within a rate window after
# (`catching_up`), is a ramp that outran the cold start. The loop learns it at the same pace (a
# burst that recurs soon finds the headroom: on bursty traffic the next one comes within
# minutes), but keeps it apart (`PolicyState.surge_log`) and, once the fleet has caught up, lets
# it fade with this time constant instead of the integral's hour: a single ramp otherwise held
# x1.6 for the next hour, on a fleet already sized (bench/results/decision.md).
SURGE_MEMORY_S = 900.0
# With replicasPerNode > 1, a scale-down that empties a node keeps it while the replicas needed
# are more than (1 - NODE_RELEASE_MARGIN) of those left: the need read tick by tick swings by
# 10-30% on steady traffic, so a node released at 99% of the fleet left is asked for again on
# the next swing, and comes back a cold start late (a whole node's replicas at once). Ten
# percent, as the HPA's own tolerance (it does not act on a ratio within 10% of one).
NODE_RELEASE_MARGIN = 0.1


class QueueSeen(NamedTuple):
    """One observation of the queue (`observe_queue`): when it was observed, the requests
    waiting and running, at how many ready replicas."""

    at: float
    waiting: float
    ready: int
    running: float


class Reason(StrEnum):
    """Which term set the target. A closed set: it is a label on /metrics."""

    CURRENT_NEED = "current_need"
    FORECAST = "forecast"
    STABILIZATION = "stabilization"
    ACTIVE_FLOOR = "active_floor"
    SCALE_TO_ZERO = "scale_to_zero"
    PANIC = "panic"
    SCALE_DOWN_LIMIT = "scale_down_limit"
    MIN_BOUND = "min_bound"
    MAX_BOUND = "max_bound"
    HOLD = "hold"


class Decision(NamedTuple):
    """What `decide` returned for one tick. A NamedTuple, not a frozen dataclass: one is built
    on every tick and every replayed one, and a frozen dataclass's __init__ (a guarded setattr
    per field) costs several times as much (`bench/decide_cpu.py`)."""

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
    offered: float | None = None  # replicas the arrivals need (capacity.offered), if known
    headroom: float = 1.0  # the closed loop's multiplier over the need's flow
    headroom_surge: float = 1.0  # the part of it learnt while replicas were on their way
    late_share: float | None = None  # requests late past queueTimeSloSeconds (estimated)

    @property
    def demand(self) -> float | None:
        """What the forecaster learns: the offered load, else the need."""
        return self.offered if self.offered is not None else self.need

    @property
    def decision_id(self) -> str:
        """Same workload and tick -> same id on every replica; used to join logs."""
        raw = f"{self.workload}|{self.metric_name}|{self.at:.3f}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


class PolicyState(NamedTuple):
    """What `decide` carries from one tick to the next (a NamedTuple, as `Decision` is)."""

    # Sliding-window maximum of ceil(need) over the stabilization window, as a monotone queue:
    # (tick, value) pairs with strictly decreasing values; the first is the window's maximum.
    recent: tuple[tuple[float, int], ...] = ()
    # The same over final targets within SCALE_DOWN_PERIOD_S (the base of the scale-down step)
    # and within the horizon (what was asked for and may still be on its way).
    decided: tuple[tuple[float, int], ...] = ()
    asked: tuple[tuple[float, int], ...] = ()
    last_busy_at: float | None = None
    first_at: float | None = None  # first tick this state has seen (history included)
    last_good: Decision | None = None  # last decision made from a real signal
    raised_at: float | None = None  # when the target last rose: replicas asked from then on
    panic_until: float | None = None
    panic_peak: int = 0  # the highest target since panic began (0 outside panic)
    # Distinct observations of the queue (`QueueSeen`) within QUEUE_TREND_WINDOW_S, all at
    # the newest ready count.
    queue_seen: tuple[QueueSeen, ...] = ()
    # The loaded S seen per bucket within SERVICE_TIME_WINDOW_S: (bucket, sum, ticks).
    service_seen: tuple[tuple[int, float, int], ...] = ()
    # Sums for the fit of S against the batch per bucket within SERVICE_FIT_WINDOW_S:
    # (bucket, ticks, sum b, sum S, sum b^2, sum b x S).
    service_fit: tuple[tuple[int, int, float, float, float, float], ...] = ()
    # log(headroom) of the closed loop on measured attainment, and the tick it was last moved.
    headroom_log: float = 0.0
    surge_log: float = 0.0  # the part of headroom_log learnt while catching up (SURGE_MEMORY_S)
    headroom_at: float | None = None
    # The last tick whose stabilization window held no need (`forecast: wake` reads the
    # forecast from then until a horizon later).
    quiet_at: float | None = None
    unserved_at: float | None = None  # the last tick with no replica ready (a scale from zero)
    short_at: float | None = None  # the last tick with replicas asked for and not yet ready


def _within(t: float, start: float) -> bool:
    """t is after `start`, with a tolerance: tick times near 1.8e9 s carry float noise of ~1e-7 s
    (k x interval live, start + i x step replayed), and a window edge must fall the same way on
    every replica."""
    return t > start + TICK_TOLERANCE_S


def _expired(queue: tuple[tuple[float, int], ...], start: float) -> int:
    """How many entries at the front fell out of the window (ticks only grow, so they lead)."""
    first = 0
    while first < len(queue) and not _within(queue[first][0], start):
        first += 1
    return first


def _window_max(queue: tuple[tuple[float, int], ...], start: float) -> int:
    """The window's maximum: its first live entry, as the values of a monotone queue fall."""
    first = _expired(queue, start)
    return queue[first][1] if first < len(queue) else 0


def _window_max_push(
    queue: tuple[tuple[float, int], ...], at: float, value: int, window_start: float
) -> tuple[tuple[float, int], ...]:
    """Append (at, value) and drop what can no longer be the maximum: the expired entries at the
    front and those not above `value` at the back. O(1) amortised (each entry is dropped once;
    what stays is copied by a slice in C), so a replayed history of hundreds of ticks costs no
    more than live evaluation, and a falling need (which keeps the whole window) costs as little
    as a rising one."""
    first = _expired(queue, window_start)
    last = len(queue)
    while last > first and queue[last - 1][1] <= value:
        last -= 1
    return (*queue[first:last], (at, value))


def hold(state: PolicyState, at: float, stale_s: float, faults: tuple[str, ...]) -> Decision | None:
    """Fail static: repeat the last good decision (never lower) until it is `stale_s` old."""
    last = state.last_good
    if last is None or at - last.at > stale_s:
        return None
    detail = (
        f"signals missing for {at - last.at:.0f}s (limit {stale_s:.0f}s); holding "
        f"{last.replicas} replicas from {last.at:.0f}"
    )
    return last._replace(at=at, reason=Reason.HOLD, detail=detail, faults=faults, signal=None)


def missing_queue_fields(spec: WorkloadSpec, signal: Signal, state: PolicyState) -> tuple[str, ...]:
    """Faults naming each queue field the decision needs and this signal lacks (absent, NaN or
    infinite): the backend's gauges, the queue fields the user gave queries for, and any the
    last good signal had. Sized from what is left, a missing queue would read as 0 and lower the
    target on data the scaler lacks; the policy holds the last good target instead."""
    expected = required_fields(spec.trigger.backend, spec.queries)
    seen = state.last_good.signal if state.last_good is not None else None
    faults: list[str] = []
    for field in QUEUE_FIELDS:
        value = getattr(signal, field)
        if value is not None and math.isfinite(value):
            continue
        if field not in expected and (seen is None or getattr(seen, field) is None):
            continue
        why = next((r for r in signal.reasons if r.startswith(f"{field}:")), None)
        if why is None:
            why = f"{field}: not reported" if value is None else f"{field}: {value} is not finite"
        faults.append(f"{why}; the decision needs it, the last good target holds")
    return tuple(faults)


def policy_memory_s(spec: WorkloadSpec) -> float:
    """How far back the next decision depends on past ticks one by one (a warm start replays at
    least this much history at the evaluation interval, so replicas agree exactly)."""
    return max(
        spec.scale_down_stabilization_s,
        spec.horizon_s,  # replicas asked within the horizon count as on their way
        PANIC_HOLD_S,
        SCALE_DOWN_PERIOD_S,
        QUEUE_TREND_WINDOW_S,
        SERVICE_FIT_WINDOW_S,  # the operating point's S sizes the target
    )  # not SERVICE_TIME_WINDOW_S: see observe_service_time


Fit = tuple[tuple[int, int, float, float, float, float], ...]


def observe_service_fit(fit: Fit, signal: Signal, s: float | None, at: float) -> Fit:
    """Add this tick's (running per ready replica, loaded S) to its bucket, when both are known
    (a replica running at least one request); keep the buckets within SERVICE_FIT_WINDOW_S."""
    bucket = math.floor((at + TICK_TOLERANCE_S) / SERVICE_TIME_BUCKET_S)
    first = bucket - SERVICE_FIT_BUCKETS + 1
    kept = [b for b in fit if b[0] >= first]
    running, ready = signal.running, signal.ready_pods
    if s is not None and math.isfinite(s) and s > 0 and running is not None and ready:
        batch = running / ready
        if batch >= 1.0 and math.isfinite(batch * batch + batch * s):  # no overflow kept
            point = (1, batch, s, batch * batch, batch * s)
            if kept and kept[-1][0] == bucket:
                _, n, sb, ss, sbb, sbs = kept[-1]
                kept[-1] = (bucket, n + 1, sb + batch, ss + s, sbb + point[3], sbs + point[4])
            else:
                kept.append((bucket, *point))
    return tuple(kept)


def operating_service_time(fit: Fit, target_concurrency: float) -> float | None:
    """S at b = targetConcurrency from the fit, or None with fewer than SERVICE_FIT_MIN_TICKS
    points. The fit's slope (per request of batch) is kept within what a server can do:
    never negative (a larger batch never serves a request faster) and never above mean S / mean
    b (S proportional to the batch: a replica that gains no throughput from batching)."""
    n, sb, ss, sbb, sbs = 0, 0.0, 0.0, 0.0, 0.0
    for _bucket, b_n, b_sb, b_ss, b_sbb, b_sbs in fit:
        n += b_n
        sb += b_sb
        ss += b_ss
        sbb += b_sbb
        sbs += b_sbs
    if n < SERVICE_FIT_MIN_TICKS:
        return None
    mean_b, mean_s = sb / n, ss / n
    var_b = max(0.0, sbb / n - mean_b * mean_b)
    cov = sbs / n - mean_b * mean_s
    ridge = (FIT_RIDGE * mean_b) ** 2
    slope = min(max(0.0, cov / (var_b + ridge)), mean_s / mean_b)
    return mean_s + slope * (target_concurrency - mean_b)


def observe_service_time(
    seen: tuple[tuple[int, float, int], ...], s: float | None, at: float
) -> tuple[tuple[int, float, int], ...]:
    """Add this tick's loaded S (None: not known) to its bucket; keep the buckets within
    SERVICE_TIME_WINDOW_S, or the newest one while none is (see below). It feeds the offered
    load the forecaster learns, and the target only while no replica serves and the fit of S
    against the batch is empty (`decide`: a scale from zero after a long idle). So it is not in
    `policy_memory_s`: a warm start replays the rule's memory, and a replica that started less
    than this window ago learns from a mean over fewer minutes (the forecaster's own warm start
    is already approximate, `forecast` in docs/tuning.md); one that started while the workload
    sat at zero for longer than the replayed history knows no S, and sizes its first scale from
    zero from the concurrency term until its fit fills."""
    bucket = math.floor((at + TICK_TOLERANCE_S) / SERVICE_TIME_BUCKET_S)
    first = bucket - SERVICE_TIME_BUCKETS + 1
    kept = [b for b in seen if b[0] >= first]
    if s is not None and math.isfinite(s) and s > 0:
        if kept and kept[-1][0] == bucket:
            kept[-1] = (bucket, kept[-1][1] + s, kept[-1][2] + 1)
        else:
            kept.append((bucket, s, 1))
    elif not kept and seen:
        # Nothing served this window (scaled to zero): no server reports an S, yet requests
        # arrive and wait for a cold start. The last minute that knew S stands for it until one
        # does, or the offered load would read 0 through every scale from zero and the forecaster
        # would learn each burst a cold start late.
        kept = [seen[-1]]
    return tuple(kept)


def steady_service_time(seen: tuple[tuple[int, float, int], ...]) -> float | None:
    """The mean loaded S over the window's ticks, or None if none knew it."""
    total, ticks = 0.0, 0
    for _bucket, s_sum, s_ticks in seen:  # one pass, no generators: it runs on every decision
        total += s_sum
        ticks += s_ticks
    return total / ticks if ticks else None


def _root(mean_s: float, p99_s: float, lo: float, hi: float) -> float:
    """theta in [lo, hi] with (mean / theta) exp(-p99 / theta) = 0.01, the function monotone
    there (rising below theta = p99, falling above): bisection."""
    rising = hi <= p99_s
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        below = (mean_s / mid) * math.exp(-p99_s / mid) < 0.01
        if below == rising:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def late_share(mean_s: float, p99_s: float, slo_s: float) -> float:
    """The share of requests that waited longer than `slo_s`, from the queue time's mean and
    p99 (what both backends' queue metrics give): a share pi of requests wait, their waits
    exponential with mean theta (pi theta = mean, pi exp(-p99 / theta) = 0.01), so
    pi exp(-slo / theta) wait past the SLO. Exactly 1% at slo = p99. Two (pi, theta) can fit
    one (mean, p99); the larger late share is taken (more headroom, not less)."""
    if mean_s <= 0.0 or p99_s <= 0.0:
        return 0.0
    if math.exp(-p99_s / mean_s) >= 0.01:  # everyone waits: exponential with mean `mean_s`
        return math.exp(-slo_s / mean_s)
    peak = (mean_s / p99_s) * math.exp(-1.0)  # the largest (mean / theta) exp(-p99 / theta)
    if peak < 0.01:  # a tail heavier than exponential: the theta closest to fitting
        thetas = [p99_s]
    else:
        thetas = [_root(mean_s, p99_s, mean_s, p99_s), _root(mean_s, p99_s, p99_s, 100 * mean_s)]
    return min(1.0, max((mean_s / t) * math.exp(-slo_s / t) for t in thetas))


def closed_loop_headroom(
    spec: WorkloadSpec, signal: Signal, state: PolicyState, at: float, short_at: float | None
) -> tuple[float, float, float | None]:
    """The next log(headroom), the part of it learnt while catching up (`PolicyState.surge_log`),
    and this tick's estimated late share (None: not measured: no queueTimeSloSeconds, or no
    queue-time mean and p99). See HEADROOM_GAIN_PER_S and SURGE_MEMORY_S. It moves slowly and
    is not replayed tick for tick (not in `policy_memory_s`): a replica that just started holds
    the headroom it learns from then on, as with the forecaster's warm start."""
    slo = spec.capacity.queue_time_slo_s
    mean, p99 = signal.queue_time_mean_s, signal.queue_time_p99_s
    if slo is None or mean is None or p99 is None or not math.isfinite(mean + p99):
        return state.headroom_log, state.surge_log, None
    late = late_share(mean, p99, slo)
    if scaled_from_zero(spec, state, at):
        return state.headroom_log, state.surge_log, late
    last = state.headroom_at
    dt = max(0.0, min(HEADROOM_MAX_DT_S, at - last)) if last is not None else 0.0
    allowed = 1.0 - spec.capacity.slo_attainment
    moved = dt * min(HEADROOM_RISE_MAX_PER_S, HEADROOM_GAIN_PER_S * (late - allowed) / allowed)
    steady, surge = state.headroom_log - state.surge_log, state.surge_log
    if catching_up(spec, short_at, at):
        surge = max(0.0, surge + moved)
    else:
        steady = max(0.0, steady + moved)
        surge *= math.exp(-dt / SURGE_MEMORY_S)
    total = min(math.log(HEADROOM_MAX), steady + surge)
    return total, min(surge, total), late


def scaled_from_zero(spec: WorkloadSpec, state: PolicyState, at: float) -> bool:
    """No replica served within a cold start and a rate window before `at`: the queue time
    measured now is a scale from zero's (see HEADROOM_GAIN_PER_S)."""
    since = state.unserved_at
    return since is not None and at - since < spec.horizon_s + spec.rate_window_s


def catching_up(spec: WorkloadSpec, short_at: float | None, at: float) -> bool:
    """Replicas asked for were on their way within a rate window before `at` (`short_at`: the
    last tick they were, this one included): the queue time measured now is the cold start's."""
    return short_at is not None and at - short_at < spec.rate_window_s


def observe_queue(seen: tuple[QueueSeen, ...], signal: Signal, at: float) -> tuple[QueueSeen, ...]:
    """Add this signal's queue observation if it is a new one (a sample the source had not
    shown before: observed at `at - age_s`), keep those within QUEUE_TREND_WINDOW_S, and start
    over when the ready count changes (a different fleet drains at a different pace)."""
    if signal.waiting is None or signal.ready_pods is None:
        return seen
    observed_at = at - (signal.age_s or 0.0)
    if seen and seen[-1].ready != signal.ready_pods:
        seen = ()
    if seen and observed_at <= seen[-1].at + TICK_TOLERANCE_S:
        return seen
    kept = tuple(p for p in seen if _within(p.at, observed_at - QUEUE_TREND_WINDOW_S))
    here = QueueSeen(observed_at, signal.waiting, signal.ready_pods, signal.running or 0.0)
    return (*kept, here)


def queue_trend(seen: tuple[QueueSeen, ...]) -> float | None:
    """Requests per second arrivals added to the queue over the observations, once they span
    enough time: the waiting count's growth, less what running requests fell by meanwhile. A
    server whose KV cache is full preempts running requests back into its queue (vLLM counts
    them as waiting), which grows the queue by no arrival at all; read as arrivals, it sizes
    for a surge that is not there. Running requests that grow are not counted either: a batch
    whose requests slow down as it grows holds more of them at the same arrivals."""
    if len(seen) < 2 or seen[-1].at - seen[0].at < QUEUE_TREND_MIN_SPAN_S:
        return None
    first, last = seen[0], seen[-1]
    added = last.waiting - first.waiting + min(0.0, last.running - first.running)
    return added / (last.at - first.at)


def new_small_queue(seen: tuple[QueueSeen, ...]) -> bool:
    """The newest observation's queue was not there on the one before (at this ready count), and
    holds fewer requests than there are ready replicas: some server has nothing waiting, so the
    fleet is not at its servers' batch limit, whatever they run (`capacity.Fleet.queue_held`)."""
    if len(seen) < 2:
        return False
    now = seen[-1]
    return seen[-2].waiting < 1.0 <= now.waiting < now.ready


def fleet(
    spec: WorkloadSpec,
    signal: Signal,
    state: PolicyState,
    at: float,
    seen: tuple[QueueSeen, ...],
) -> capacity.Fleet:
    """Replicas asked for within the horizon and not yet ready (the highest target this scaler
    returned within the horizon, less the ready pods the signal counts), and when they are
    expected to serve (a horizon after the target last rose). Without a count of ready pods from
    the source there is no fleet to reason about (`capacity.need` keeps the concurrency term):
    assuming the HPA followed the target at once would feed each target back into the next.
    `seen`: the queue's observations with this signal's (`observe_queue`), for its trend and
    whether the queue was there on the observation before (`capacity.Fleet.queue_held`)."""
    ready = signal.ready_pods
    asked = _window_max(state.asked, at - spec.horizon_s)
    pending, pending_in = 0.0, 0.0
    if ready is not None and state.raised_at is not None:
        age = at - state.raised_at
        if asked > ready and age < spec.horizon_s - TICK_TOLERANCE_S:
            pending, pending_in = float(asked - ready), spec.horizon_s - age
    return capacity.Fleet(
        horizon_s=spec.horizon_s,
        ready=ready,
        pending=pending,
        pending_in_s=pending_in,
        asked=asked,
        queue_trend=queue_trend(seen),
        queue_held=not new_small_queue(seen),
    )


def decide(
    spec: WorkloadSpec,
    signal: Signal | None,
    state: PolicyState,
    at: float,
    stale_s: float,
    faults: tuple[str, ...] = (),
    outlook: Outlook | None = None,
    explain: bool = True,
) -> tuple[Decision | None, PolicyState]:
    """The decision for tick `at` and the state for the next one. `explain=False` leaves the
    decision's `detail` empty and is otherwise the same decision: a warm start's replay, whose
    decisions nobody reads but the next tick, skips formatting them (a sizeable share of the
    replay's CPU: `bench/decide_cpu.py`)."""
    if signal is None:
        return hold(state, at, stale_s, faults or ("no in-flight or arrival signal",)), state
    gone = missing_queue_fields(spec, signal, state)
    if gone:
        if signal.in_flight is None and signal.reasons:  # nothing of the queue: the source said why
            return hold(state, at, stale_s, faults + signal.reasons), state
        named = tuple(r for r in signal.reasons if not any(g.startswith(r) for g in gone))
        return hold(state, at, stale_s, faults + gone + named), state
    seen = observe_queue(state.queue_seen, signal, at)
    ahead_of = fleet(spec, signal, state, at, seen)
    service_fit = observe_service_fit(
        state.service_fit, signal, capacity.measured_service_time(signal), at
    )
    operating = operating_service_time(service_fit, spec.target_concurrency)
    if (
        operating is None
        and signal.ready_pods == 0
        and capacity.loaded_service_time(signal, spec.capacity) is None
    ):
        # No replica serves, no fit and no S from the servers (a scale from zero after an idle
        # longer than the fit's window): the last S they showed stands for it
        # (`observe_service_time` keeps it through the idle). Without one, the queue that builds
        # during the cold start counts as slots needed now, and a scale from zero asks for
        # maxReplicas.
        operating = steady_service_time(state.service_seen)
    required = capacity.need(signal, spec.capacity, ahead_of, operating)
    if required is None:
        reasons = faults + signal.reasons
        return hold(state, at, stale_s, reasons or ("no in-flight or arrival signal",)), state

    short_at = at if ahead_of.pending > 0 else state.short_at
    headroom_log, surge_log, late = closed_loop_headroom(spec, signal, state, at, short_at)
    headroom = math.exp(headroom_log)
    # The headroom covers the flow, what is uncertain; the replicas that drain today's backlog
    # (known) count once, and those on their way the queue keeps are a floor as they are
    # (`capacity.Need.floor`).
    demand = required.demand if required.demand is not None else required.replicas
    flow = min(required.steady, demand)
    need = max(flow * headroom + (demand - flow), required.floor)
    now_replicas = max(0, math.ceil(need - EPSILON))
    # The S that stood in is kept too: it carries the mean through the cold start, so the first
    # few completions of the replicas that come up (the short requests end first) do not set it.
    service_seen = observe_service_time(state.service_seen, required.loaded_s, at)
    # The window remembers the steady need (without a backlog's drain), so the replicas a
    # drain keeps busy go once the queue is gone, not a whole window later.
    lasting = max(0, math.ceil(required.steady * headroom - EPSILON))
    recent = state.recent
    if state.first_at is None and signal.ready_pods:
        # A fresh state has no window behind it: like the HPA, which seeds its recommendation
        # window with the current replicas, it holds the fleet it finds for one window instead
        # of scaling a warm fleet down on its first tick (a restart without history).
        recent = ((at, signal.ready_pods),)
    recent = _window_max_push(recent, at, lasting, at - spec.scale_down_stabilization_s)
    busy = bool(signal.busy)
    last_busy = at if busy else state.last_busy_at
    first_at = state.first_at if state.first_at is not None else at
    # Unknown history counts as busy: a scaler that just started never scales to zero at once.
    idle_since = last_busy if last_busy is not None else first_at
    ahead = outlook if spec.forecast else None
    quiet_at = at if recent[0][1] < 1 else state.quiet_at
    if (
        ahead is not None
        and spec.forecast_wakes_only
        and (quiet_at is None or at - quiet_at >= spec.horizon_s - TICK_TOLERANCE_S)
    ):
        # `forecast: wake`: the forecast speaks only for a workload that needed nothing for a
        # whole stabilization window (it wakes it, or keeps it, ahead of a recurring ramp), and
        # for a horizon after, while the replicas it woke are on their way and the ramp it
        # foresaw arrives; a busy one is sized by its need.
        ahead = None
    # Traffic expected within the horizon (the q90 forecast holds a request or more) keeps a
    # workload active, and activates an idle one before its ramp: scale from zero takes a
    # cold start, so it has to begin a horizon early.
    expected = ahead is not None and ahead.upper_max * spec.target_concurrency >= 1.0
    idle = not busy and not expected and at - idle_since >= spec.scale_to_zero_idle_s
    last = state.last_good

    # 1. Current need, held for the stabilization window (a removed replica takes a cold
    #    start to come back).
    target = max(recent[0][1], now_replicas)
    reason = Reason.CURRENT_NEED if target == now_replicas else Reason.STABILIZATION
    detail = ""
    if explain:
        detail = required.describe()
        if headroom_log > 0.0 or late:
            measured = "late share not measured now" if late is None else f"{late:.1%} late"
            if late and scaled_from_zero(spec, state, at):
                measured += ", a scale from zero's: not learnt"
            if surge_log > 0.005:
                measured += (
                    f"; x{math.exp(surge_log):.2f} of it learnt while replicas were on their way, "
                    f"fading over {SURGE_MEMORY_S:g}s once they serve"
                )
            detail += (
                f" x headroom {headroom:.2f} ({measured}; allowed "
                f"{1.0 - spec.capacity.slo_attainment:.1%} by sloAttainment)"
            )
        detail += f" -> {now_replicas}"
        if ahead_of.pending:
            detail += f" ({ahead_of.pending:g} asked, serving in {ahead_of.pending_in_s:.0f}s)"
        if reason is Reason.STABILIZATION:
            detail += f"; held at {target}, the highest in {spec.scale_down_stabilization_s:g}s"
    # 2. The forecast: scale up to the upper forecast within the horizon (what is asked now
    #    serves then), with the headroom the need carries, and never below it either.
    if ahead is not None:
        covered = max(0, math.ceil(ahead.upper_max * headroom - EPSILON))
        if explain:
            detail += f"; {ahead.describe()}"
            if headroom_log > 0.0:
                detail += f" x headroom {headroom:.2f}"
            detail += f" -> {covered}"
        if covered > target:
            target, reason = covered, Reason.FORECAST
    # 3. Panic: demand outran what was asked for (panicThreshold x the replicas asked within
    #    the horizon) or, with forecasting, the forecast's q90 by more than a replica. Like
    #    Knative's panic mode, the target is the need at face value and never falls while panic
    #    lasts (PANIC_HOLD_S after demand last outran). Unlike a reactive queue metric it does
    #    not flood the cluster: the need already counts the replicas on their way and the queue
    #    they will drain, so what is in flight is not asked for twice.
    asked = ahead_of.asked
    outran = last is not None and need >= 1.0 and need >= spec.panic_threshold * max(asked, 1)
    if ahead is not None and need > ahead.upper_max + 1.0:
        outran = True
    panic_until = at + PANIC_HOLD_S if outran else state.panic_until
    if panic_until is not None and (not _within(panic_until, at) or idle):
        panic_until = None
    if panic_until is not None:
        floor = max(now_replicas, state.panic_peak)
        if floor > target or outran:
            target, reason = max(target, floor), Reason.PANIC
            if explain:
                detail += f"; panic (need {need:.2f} vs {asked} asked"
                detail += f", q90 {ahead.upper_max:.2f})" if ahead is not None else ")"
                detail += f" -> {target}"
    # 4. Activity.
    if idle:
        target, reason = 0, Reason.SCALE_TO_ZERO
        if explain:
            detail = f"idle for {at - idle_since:.0f}s >= scaleToZeroIdleSeconds"
    elif target < 1:
        target, reason = 1, Reason.FORECAST if expected and not busy else Reason.ACTIVE_FLOOR
        if explain:
            detail += f"; active within scaleToZeroIdleSeconds={spec.scale_to_zero_idle_s:g}"
    # 5. Scale down at most scaleDownMaxPercent of the replicas per SCALE_DOWN_PERIOD_S.
    # (after the floor of one, before the bounds, so an idle workload still goes to zero)
    live = state.decided[_expired(state.decided, at - SCALE_DOWN_PERIOD_S) :]
    base = live[0][1] if live else last.replicas if last is not None else 0
    if not idle and base:
        step_floor = math.ceil(base * (1.0 - spec.scale_down_max_percent / 100.0) - EPSILON)
        if target < step_floor:
            target, reason = step_floor, Reason.SCALE_DOWN_LIMIT
            if explain:
                detail += (
                    f"; at most {spec.scale_down_max_percent:g}% of {base} removed per "
                    f"{SCALE_DOWN_PERIOD_S:g}s -> {step_floor}"
                )
    held = target
    # 6. Whole nodes: a node is billed whole, so what fills one already asked for is free, and a
    #    scale-down that empties no node saves nothing (`replicasPerNode`).
    per_node = spec.replicas_per_node
    if per_node > 1 and target % per_node:
        whole = min(spec.max_replicas, -(-target // per_node) * per_node)
        if whole > target:
            target = whole
            if explain:
                detail += f"; rounded up to whole nodes of {per_node} -> {target}"
    if per_node > 1 and not idle and last is not None and target < last.replicas:
        # A node is released only when the fleet left keeps NODE_RELEASE_MARGIN spare: a node
        # emptied at a need within a few percent of what is left comes back a cold start late
        # on the next swing of the need (see NODE_RELEASE_MARGIN).
        kept = min(last.replicas, spec.max_replicas, target + per_node)
        if held > target * (1.0 - NODE_RELEASE_MARGIN) and kept > target:
            if explain:
                detail += (
                    f"; a node kept: the {target} left would be over "
                    f"{1.0 - NODE_RELEASE_MARGIN:.0%} full ({held} needed) -> {kept}"
                )
            target = kept
    # 7. Bounds.
    if target < spec.min_replicas:
        target, reason = spec.min_replicas, Reason.MIN_BOUND
        if explain:
            detail += f"; raised to minReplicas={spec.min_replicas}"
    elif target > spec.max_replicas:
        target, reason = spec.max_replicas, Reason.MAX_BOUND
        if explain:
            detail += f"; capped at maxReplicas={spec.max_replicas}"

    decision = Decision(
        workload=spec.workload,
        metric_name=spec.trigger.metric_name,
        at=at,
        replicas=target,
        active=target > 0,  # IsActive agrees with the metric: a minReplicas floor stays active
        reason=reason,
        need=need,
        in_flight=signal.in_flight,
        arrival_rate=signal.arrival_rate,
        detail=detail,
        faults=faults + signal.reasons,
        signal=signal,
        outlook=ahead,
        offered=capacity.offered(
            signal,
            spec.capacity,
            required.loaded_s if operating is not None else steady_service_time(service_seen),
        ),
        headroom=headroom,
        headroom_surge=math.exp(surge_log),
        late_share=late,
    )
    raised = last is None or target > last.replicas
    return decision, PolicyState(
        recent=recent,
        decided=_window_max_push(state.decided, at, target, at - SCALE_DOWN_PERIOD_S),
        asked=_window_max_push(state.asked, at, target, at - spec.horizon_s),
        last_busy_at=last_busy,
        first_at=first_at,
        last_good=decision,
        raised_at=at if raised else state.raised_at,
        panic_until=panic_until,
        panic_peak=max(state.panic_peak, target) if panic_until is not None else 0,
        queue_seen=seen,
        service_seen=service_seen,
        service_fit=service_fit,
        headroom_log=headroom_log,
        surge_log=surge_log,
        headroom_at=at if late is not None else state.headroom_at,
        quiet_at=quiet_at,
        unserved_at=at if signal.ready_pods == 0 else state.unserved_at,  # None: unknown
        short_at=short_at,
    )
