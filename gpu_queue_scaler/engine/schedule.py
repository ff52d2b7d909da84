"""Where a workload's ticks fall: its phase, the tick grid, and the history a warm start replays.

Pure arithmetic on time as an argument (no clock, no asyncio), so every replica and every
restart computes the same instants.

Phases. A workload's ticks are offset from the wall-clock grid by its phase, a fixed fraction of
the interval taken from a hash of its key (namespace, name, metric; crc32, so the same in every
replica and every restart), below PHASE_SPREAD of the interval. With one shared grid, a thousand
workloads evaluate at the same instant and hold the event loop, and every RPC waiting on it, for
the whole burst (the p99 of `scaler bench load`); with phases, their evaluations are spread over
PHASE_SPREAD of every interval, in PHASE_SLOTS instants (a timed wake-up of the event loop costs
CPU, and a long burst at one instant costs the RPCs' p99: see `phase_of`) where the workloads of
a slot take turns, one evaluation per loop iteration (`gpu_queue_scaler.engine.turns.Turnstile`).
The trade-off, latency-wise: none for the decisions KEDA reads. A workload still evaluates once per
interval, so a decision is never older than one interval (plus its read) and recovery still
comes within one evaluation; its first decision still comes at once (on the last tick of its grid
at or before now); KEDA polls at arbitrary instants, so the mean age of the decision it reads is
unchanged. What moves is where in the interval each workload's tick falls: up to PHASE_SPREAD x
interval later than the shared grid (and, for a given workload, always by the same amount).
Why not the whole interval: a forecast bin closes at the first observation in the next bin
(gpu_queue_scaler.decision.bank), so a tick's read must end before any workload's first tick of the
next bin; the unused part of the interval keeps that margin (half an interval, 2.5 s at the default
5 s, instead of a whole one on a shared grid).
"""

from __future__ import annotations

import math
import zlib
from typing import NamedTuple

from gpu_queue_scaler.decision.policy import policy_memory_s
from gpu_queue_scaler.settings.spec import WorkloadSpec

HISTORY_MAX_POINTS = 2400  # per range query; Prometheus allows 11,000
FORECAST_MEMORY_BINS = 120  # the forecaster's error memory (weights down to 1/100) and warm-up
FORECAST_WARMUP_MAX_S = 6 * 3600.0
# The season's history is recalled on a grid this coarse at least: the period search reads minute
# means, and the wake's outlook the highest demand within a horizon (several minutes).
SEASON_RECALL_STEP_S = 60.0
PHASE_SPREAD = 0.5  # phases cover [0, PHASE_SPREAD) of the interval (see the module docstring)
PHASE_SLOTS = 500  # phases take one of this many values (see phase_of)
WorkloadKey = tuple[str, str, str]


def key_fraction(key: WorkloadKey) -> float:
    """A stable hash of the key (crc32, not Python's salted hash) as a fraction in [0, 1)."""
    return zlib.crc32("\x00".join(key).encode("utf-8", "surrogatepass")) / 2**32


def phase_of(key: WorkloadKey) -> float:
    """The workload's phase as a fraction of the interval, in [0, PHASE_SPREAD): from a stable
    hash of its key, so every replica and every restart puts its ticks at the same instants.

    Phases come in PHASE_SLOTS steps (5 ms apart at the default 5 s), not continuously: each
    distinct instant is a wake-up of the event loop from a timed wait, which costs CPU (fewer
    slots, less of it: `bench/loop_wakeups.py`). Workloads sharing a slot wake together and then
    take turns (`Turnstile`), one evaluation per loop iteration, so RPCs still interleave between
    any two of them; but an RPC takes a few loop iterations (request, handler, response), and each
    iteration of a slot's burst carries one evaluation, so an RPC that lands in a burst waits for
    up to that many evaluations. So 500 slots, two workloads an instant at 1,000: shorter bursts
    than an RPC, for a little more server CPU than 50 (the figures: docs/bench.md, "1,000
    ScaledObjects polled like KEDA")."""
    return PHASE_SPREAD * math.floor(key_fraction(key) * PHASE_SLOTS) / PHASE_SLOTS


def tick_at_or_before(now: float, interval: float, phase: float) -> float:
    """The last tick k x interval + phase x interval at or before `now`."""
    offset = phase * interval
    return math.floor((now - offset) / interval) * interval + offset


def tick_after(last: float, interval: float, phase: float) -> float:
    """The first tick of the grid strictly after `last` (the grid may have changed since)."""
    offset = phase * interval
    k = math.floor((last - offset) / interval) + 1
    while k * interval + offset <= last:  # rounding put `last` just below its own grid point
        k += 1
    return k * interval + offset


def next_tick(now: float, last: float | None, interval: float, phase: float) -> float:
    """The tick to evaluate next: the latest of the grid at or before `now` (a loop that stalled
    past ticks skips them), or, if that one is done already (`last`), the one after it."""
    tick = tick_at_or_before(now, interval, phase)
    if last is not None and tick <= last:
        tick = tick_after(last, interval, phase)
    return tick


class Segment(NamedTuple):
    """A tick-aligned grid of history: start, start + step, ... < end."""

    start: float
    end: float
    step: float


def _segment(
    end: float, span: float, interval: float, min_step: float = 0.0, cover: bool = True
) -> Segment:
    """A tick-aligned grid ending at `end`, on steps of at least `min_step`, in at most
    HISTORY_MAX_POINTS points: it covers `span` (cover), or lies within it."""
    step = interval * max(
        1,
        math.ceil(min_step / interval - 1e-9),
        math.ceil(span / interval / HISTORY_MAX_POINTS),
    )
    points = math.ceil(span / step) if cover else math.floor(span / step + 1e-9)
    return Segment(end - points * step, end, step)


def history_segments(spec: WorkloadSpec, end: float, interval: float) -> tuple[Segment, Segment]:
    """What a warm start replays up to the tick `end`, older part first. The fine part, tick for
    tick, covers all the policy remembers exactly: the stabilization window, replicas asked
    within the horizon, and panic's windows. The older part, on a coarser grid, covers the idle
    window and, with `forecast: on`, the forecaster's memory (its error window plus a horizon
    of bins), so a late replica's outlook matches."""
    fine = _segment(end, policy_memory_s(spec), interval)
    memory = spec.scale_to_zero_idle_s
    if spec.forecast and not spec.forecast_wakes_only:  # `wake`: see Decider.outlook
        bins = FORECAST_MEMORY_BINS + math.ceil(spec.horizon_s / spec.forecast_step_s)
        memory = max(memory, min(FORECAST_WARMUP_MAX_S, bins * spec.forecast_step_s))
    return _segment(fine.start, max(0.0, memory - (end - fine.start)), interval), fine


def recall_segment(missing: tuple[float, float] | None, interval: float) -> Segment | None:
    """The grid a warm start reads the season's missing history on (`Decider.missing`): ending
    where the season's own history begins, on steps of at least SEASON_RECALL_STEP_S (and of
    at most HISTORY_MAX_POINTS points). None when nothing is missing."""
    if missing is None:
        return None
    start, end = missing
    segment = _segment(end, end - start, interval, SEASON_RECALL_STEP_S, cover=False)
    return segment if segment.start < end else None
