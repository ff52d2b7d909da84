"""Demand + placement + NodePool state -> what the companion wants for each NodePool. Pure and
deterministic: the plan is a value, time an argument, the memory between passes (`CompanionState`)
passed in and returned, so a pass can be logged, replayed and tested.

`plan(demands, placements, pools, config, state, now)` applies, per NodePool (sorted by name):

1. forecast GPUs = sum over the pool's workloads of
   min(max(replicas, ceil(forecast_replicas or 0)), max_replicas) x gpus_per_replica: the
   scaler's target covers now, its q90 forecast covers the horizon (cold start + polling), so
   both are capacity the pool must hold, up to the ScaledObject's maxReplicaCount (the HPA never
   creates more pods, so capacity above it would be bought for nothing). Several decisions of one
   workload (one per trigger) merge as KEDA does: the highest replicas and forecast, active if
   any is.
2. fail static: a workload with no decision, or one older than `stale_after_s`, is unknown; its
   pool is held: nothing is lowered on data the companion lacks. Placeholders do not fall
   (they may rise on the known workloads' forecast), a peak budget present stays, and a GPU
   limit guard stays only if it is on already and no known workload wants capacity.
3. placeholders = ceil((ahead + held lag) / placeholder_gpus), capped at `max_placeholders`;
   live GPUs = what the workloads' live pods (`Placement.live_pods`: Pending or Running, not
   terminating) hold or are getting, target GPUs = the scaler's targets (capped as in rule 1).
   A Pending GPU pod already makes Karpenter launch a node for it, so counting only Running pods
   would buy placeholders for GPUs already on order. `ahead` = forecast GPUs - max(target GPUs,
   live GPUs): capacity nobody has asked for, bought at once. The lag = target GPUs - live GPUs
   is the target the HPA has not applied yet; it is on order too (the HPA creates those pods at
   its next sync, at most 15 s away, and they make Karpenter launch their nodes), so only the
   held lag = min(target GPUs, last pass's target GPUs (`state.last_target_gpus`)) - live GPUs
   is pre-warmed: a target already asked for a pass ago that still has no pods (a scale-up the
   HPA's rate limits spread over several syncs), not the new rise of a target that keeps
   climbing. A placeholder bought for pods the HPA is
   creating at that moment is preempted by them, pends again and makes Karpenter launch a second
   node for the same GPUs: on the simulator every scale-up did that, buying an 8-GPU node that
   then held pods spread over one node more than the fleet needed. Placeholders are
   negative-priority pause pods pinned to the pool, so they stand for exactly the GPUs the
   workloads will need and have not asked for yet: where the ready nodes lack them, the pending
   placeholders make Karpenter launch nodes a horizon early; where free GPUs exist they keep
   those nodes from being consolidated; when a real replica comes, it preempts one.
4. scale to zero: every workload on the pool at replicas 0, not active, forecast 0 (or no
   forecast) and no live pod -> no placeholders and no peak budget, so Karpenter's WhenEmpty
   consolidation removes the nodes after consolidateAfter.
5. peak budget (`nodes: "0"` for Underutilized/Empty): present while forecast GPUs rise over the
   last pass's (by more than `peak_rise_fraction` x ready GPUs) or exceed the ready GPUs (the
   pool must grow), and `peak_hold_s` after that last held (`state.peak_until`); then removed.
   Consolidating a node mid-peak evicts a warm replica that takes a cold start to replace. A
   budget found on the pool with no hold remembered (the companion restarted) is held
   `peak_hold_s` from now rather than dropped mid-peak.
6. GPU limit guard (`active_hours_utc`): outside the hours, with every workload known, none
   active, forecast GPUs 0 and no GPU in use on the pool -> `gpu_limit = "0"`, so nothing can
   launch a GPU node by mistake overnight. Otherwise `gpu_limit = None`: the user's own limit
   (restored from PREVIOUS_LIMIT_ANNOTATION if the guard had set it), at once when a workload
   becomes active. Never below what runs: any GPU in use on the pool lifts the guard.
7. a pool with no workloads mapped to it: no placeholders, no budget, the guard per the hours
   (rule 6 with nothing to wait for); the caller passes only the NodePools the companion
   manages.

Reasons are short human strings, for logs and Events.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpu_queue_scaler.companion.model import (
    PEAK_BUDGET_REASONS,
    PREVIOUS_LIMIT_ANNOTATION,
    CompanionConfig,
    CompanionState,
    NodePoolPlan,
    NodePoolState,
    Placement,
    WorkloadDemand,
)

EPSILON = 1e-9  # a forecast of 2.0000000001 replicas is 2 replicas (float noise, not demand)
GUARD_LIMIT = "0"


@dataclass(frozen=True)
class _Workload:
    """One workload on a pool as this pass sees it: placement, plus demand when it is known."""

    placement: Placement
    demand: WorkloadDemand | None  # None: missing or stale (unknown)

    @property
    def live_gpus(self) -> int:
        """GPUs the workload's live pods (Pending or Running) hold or are getting."""
        return self.placement.live_pods * self.placement.gpus_per_replica

    def _within_cap(self, replicas: int) -> int:
        cap = self.placement.max_replicas
        return replicas if cap is None else min(replicas, cap)

    @property
    def _asked_replicas(self) -> int:
        """The scaler's target or its forecast, whichever is higher (not capped)."""
        assert self.demand is not None
        return max(self.demand.replicas, ceil_replicas(self.demand.forecast_replicas))

    @property
    def wanted_replicas(self) -> int:
        """The scaler's target or its forecast, whichever is higher, capped at maxReplicaCount."""
        return self._within_cap(self._asked_replicas)

    @property
    def capped(self) -> bool:
        """The forecast (or target) asked for more replicas than maxReplicaCount allows."""
        cap = self.placement.max_replicas
        return cap is not None and self._asked_replicas > cap

    @property
    def forecast_gpus(self) -> int:
        return self.wanted_replicas * self.placement.gpus_per_replica

    @property
    def target_gpus(self) -> int:
        """The GPUs of the scaler's current target (capped at maxReplicaCount): what the HPA
        will have asked for at its next sync."""
        assert self.demand is not None
        return max(0, self._within_cap(self.demand.replicas)) * self.placement.gpus_per_replica

    @property
    def quiet(self) -> bool:
        """Known, at zero, not active, nothing forecast, no live pod."""
        return (
            self.demand is not None
            and self.forecast_gpus == 0
            and not self.demand.active
            and self.placement.live_pods == 0
        )


def ceil_replicas(forecast: float | None) -> int:
    """Whole replicas a forecast asks for (0 without one)."""
    if forecast is None:
        return 0
    return max(0, math.ceil(forecast - EPSILON))


def merge_demands(demands: Iterable[WorkloadDemand]) -> dict[str, WorkloadDemand]:
    """One demand per workload: a workload has one decision per trigger, and KEDA scales to the
    highest. The oldest `at` stands for the merge, so one stale trigger makes it stale."""
    merged: dict[str, WorkloadDemand] = {}
    for d in demands:
        seen = merged.get(d.workload)
        if seen is None:
            merged[d.workload] = d
            continue
        forecasts = [f for f in (seen.forecast_replicas, d.forecast_replicas) if f is not None]
        horizons = [h for h in (seen.horizon_s, d.horizon_s) if h is not None]
        merged[d.workload] = WorkloadDemand(
            workload=d.workload,
            at=min(seen.at, d.at),
            replicas=max(seen.replicas, d.replicas),
            active=seen.active or d.active,
            forecast_replicas=max(forecasts) if forecasts else None,
            horizon_s=max(horizons) if horizons else None,
        )
    return merged


def in_active_hours(hours: tuple[int, int] | None, now: float) -> bool:
    """Whether `now` is inside the UTC hours [start, end); a window may wrap midnight (22, 6).
    No hours, or start == end, means always: the guard must be asked for, never implied."""
    if hours is None or hours[0] % 24 == hours[1] % 24:
        return True
    start, end = hours[0] % 24, hours[1] % 24
    hour = time.gmtime(now).tm_hour
    return start <= hour < end if start < end else hour >= start or hour < end


def is_peak_budget(budget: object) -> bool:
    """The companion's budget: nodes "0" for exactly PEAK_BUDGET_REASONS, no schedule."""
    return (
        isinstance(budget, dict)
        and budget.get("nodes") == "0"
        and isinstance(budget.get("reasons"), list)
        and sorted(budget["reasons"]) == sorted(PEAK_BUDGET_REASONS)
        and "schedule" not in budget
        and "duration" not in budget
    )


def is_guarded(pool: NodePoolState) -> bool:
    """The guard is on: the limit is 0 and the companion set it (it recorded the user's)."""
    return pool.gpu_limit == GUARD_LIMIT and PREVIOUS_LIMIT_ANNOTATION in pool.annotations


def _fmt(gpus: float) -> str:
    return f"{gpus:g}"


def _plan_pool(
    pool: NodePoolState,
    workloads: list[_Workload],
    config: CompanionConfig,
    state: CompanionState,
    now: float,
    stale_notes: list[str],
) -> tuple[NodePoolPlan, float | None, tuple[float, float] | None]:
    """One pool's plan, its peak hold (None: none remembered), and the (forecast, target) GPUs
    to remember (None: keep last pass's, because this pass's is partial)."""
    reasons: list[str] = []
    known = [w for w in workloads if w.demand is not None]
    held = len(known) < len(workloads)
    forecast_gpus = sum(w.forecast_gpus for w in known)
    live_gpus = sum(w.live_gpus for w in known)
    budget_now = any(is_peak_budget(b) for b in pool.budgets)
    outside_hours = not in_active_hours(config.active_hours_utc, now)

    # Rules 1, 3: placeholders for the gap between the forecast and what runs or is on order;
    # the target the HPA has not applied yet only when it was missing at the last pass too.
    target_gpus = sum(w.target_gpus for w in known)
    ahead = max(0, forecast_gpus - max(target_gpus, live_gpus))
    lag = max(0, target_gpus - live_gpus)
    asked_before = min(target_gpus, state.last_target_gpus.get(pool.name, 0.0))
    held_lag = max(0.0, asked_before - live_gpus)
    gap = ahead + held_lag
    wanted = math.ceil(gap / max(1, config.placeholder_gpus))
    placeholders = min(config.max_placeholders, wanted)
    idle = not held and all(w.quiet for w in workloads)
    if not workloads:
        reasons.append("no workloads mapped to this NodePool")
    elif idle:
        reasons.append("idle: every workload at zero with nothing forecast; scale to zero")
    else:
        capped = f" (capped at {config.max_placeholders})" if wanted > placeholders else ""
        reasons.append(
            f"forecast {_fmt(forecast_gpus)} GPUs, {live_gpus} running or pending: "
            f"{placeholders} placeholder(s){capped}"
        )
        if lag > held_lag:
            reasons.append(
                f"{_fmt(lag - held_lag)} GPU(s) of the target not created yet: on order "
                "(the HPA's next sync), pre-warmed only if still missing at the next pass"
            )
        for w in known:
            if w.capped:
                reasons.append(
                    f"{w.placement.workload}: forecast capped at maxReplicaCount "
                    f"{w.placement.max_replicas}"
                )
    if held:
        reasons.extend(stale_notes)
        current = pool.placeholders or 0
        if current > placeholders:
            placeholders = min(config.max_placeholders, current)
            reasons.append(f"demand unknown: holding {placeholders} placeholder(s)")

    # Rule 5: peak budget.
    until = state.peak_until.get(pool.name)
    if until is None and budget_now:
        until = now + config.peak_hold_s
        reasons.append("peak budget found with no hold remembered: holding it")
    last = state.last_forecast_gpus.get(pool.name)
    rising = last is not None and forecast_gpus > last + config.peak_rise_fraction * pool.ready_gpus
    grow = forecast_gpus > pool.ready_gpus
    if idle or not workloads:
        peak = False
        until = None if until is None else min(until, now)
    else:
        if rising or grow:
            until = now + config.peak_hold_s
            why = (
                f"rising {_fmt(last or 0)} -> {_fmt(forecast_gpus)} GPUs"
                if rising
                else (f"forecast {_fmt(forecast_gpus)} > {pool.ready_gpus} ready GPUs")
            )
            reasons.append(f"peak: {why}; budget held {config.peak_hold_s:g}s")
        peak = until is not None and now < until
        if held and budget_now and not peak:
            peak = True
            reasons.append("demand unknown: keeping the peak budget")
        elif budget_now and not peak:
            reasons.append("peak over: removing the budget")

    # Rule 6: GPU limit guard.
    guard = False
    if outside_hours:
        busy = [w.placement.workload for w in known if not w.quiet]
        if pool.running_gpus > 0:
            reasons.append(f"outside active hours but {pool.running_gpus} GPU(s) in use: no guard")
        elif busy:
            reasons.append(f"outside active hours but {busy[0]} wants capacity: no guard")
        elif held:
            guard = is_guarded(pool)
            if guard:
                reasons.append("demand unknown: keeping the GPU limit guard")
        else:
            guard = True
            reasons.append("outside active hours and idle: GPU limit 0")
    if is_guarded(pool) and not guard:
        reasons.append("lifting the GPU limit guard: restoring the user's limit")
    nodepool_plan = NodePoolPlan(
        nodepool=pool.name,
        placeholders=placeholders,
        peak_budget=peak,
        gpu_limit=GUARD_LIMIT if guard else None,
        forecast_gpus=float(forecast_gpus),
        reasons=tuple(reasons),
        held=held,
    )
    remembered = None if held else (float(forecast_gpus), float(target_gpus))
    return nodepool_plan, until, remembered


def plan(
    demands: Sequence[WorkloadDemand],
    placements: Sequence[Placement],
    pools: Sequence[NodePoolState],
    config: CompanionConfig,
    state: CompanionState,
    now: float,
) -> tuple[list[NodePoolPlan], CompanionState]:
    """One plan per NodePool in `pools`, sorted by name, and the state for the next pass.

    Placements on a NodePool not in `pools` are ignored (the caller already reported them);
    demands of workloads with no placement are ignored (nothing to place).
    """
    merged = merge_demands(demands)
    last_demand_at = {w: at for w, at in state.last_demand_at.items()}
    by_pool: dict[str, list[_Workload]] = {}
    notes: dict[str, list[str]] = {}
    for p in sorted(placements, key=lambda p: p.workload):
        demand = merged.get(p.workload)
        note = None
        if demand is None:
            seen = last_demand_at.get(p.workload)
            ago = "never seen" if seen is None else f"last seen {now - seen:.0f}s ago"
            note = f"no decision for {p.workload} ({ago}): holding"
        elif now - demand.at > config.stale_after_s:
            note = (
                f"decision for {p.workload} is {now - demand.at:.0f}s old "
                f"(limit {config.stale_after_s:g}s): holding"
            )
            demand = None
        else:
            last_demand_at[p.workload] = demand.at
        by_pool.setdefault(p.nodepool, []).append(_Workload(p, demand))
        if note is not None:
            notes.setdefault(p.nodepool, []).append(note)

    plans: list[NodePoolPlan] = []
    peak_until: dict[str, float] = {}
    last_forecast: dict[str, float] = {}
    last_target: dict[str, float] = {}
    for pool in sorted(pools, key=lambda p: p.name):
        pool_plan, until, remembered = _plan_pool(
            pool, by_pool.get(pool.name, []), config, state, now, notes.get(pool.name, [])
        )
        plans.append(pool_plan)
        if until is not None:
            peak_until[pool.name] = until
        if remembered is not None:
            last_forecast[pool.name], last_target[pool.name] = remembered
        else:  # a partial pass: keep what the last full one saw
            if pool.name in state.last_forecast_gpus:
                last_forecast[pool.name] = state.last_forecast_gpus[pool.name]
            if pool.name in state.last_target_gpus:
                last_target[pool.name] = state.last_target_gpus[pool.name]
    placed = {p.workload for p in placements}
    next_state = CompanionState(
        peak_until=peak_until,
        last_forecast_gpus=last_forecast,
        last_demand_at={w: at for w, at in sorted(last_demand_at.items()) if w in placed},
        last_target_gpus=last_target,
    )
    return plans, next_state
