"""The companion's planner: explicit times, hand-built pools, whole plans."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from gpu_queue_scaler.companion.model import (
    PREVIOUS_BUDGETS_ANNOTATION,
    PREVIOUS_LIMIT_ANNOTATION,
    CompanionConfig,
    CompanionState,
    NodePoolPlan,
    NodePoolState,
    Placement,
    WorkloadDemand,
)
from gpu_queue_scaler.companion.plan import in_active_hours, plan

DAY = 1_699_920_000.0  # 2023-11-14 00:00 UTC
NOON = DAY + 12 * 3600
NIGHT = DAY + 23 * 3600
OURS = {"nodes": "0", "reasons": ["Underutilized", "Empty"]}
CONFIG = CompanionConfig(placeholder_gpus=1, max_placeholders=16, peak_hold_s=600.0)


def pool(
    name: str = "gpu",
    ready: int = 0,
    running: int = 0,
    limit: str | None = "64",
    budgets: tuple[dict[str, object], ...] = ({"nodes": "10%"},),
    annotations: dict[str, str] | None = None,
    placeholders: int | None = None,
) -> NodePoolState:
    return NodePoolState(
        name=name,
        ready_gpus=ready,
        running_gpus=running,
        gpu_limit=limit,
        budgets=budgets,
        annotations=annotations or {},
        placeholders=placeholders,
    )


def placed(
    workload: str = "team-a/llama",
    nodepool: str = "gpu",
    gpus: int = 2,
    running: int = 0,
    max_replicas: int | None = None,
) -> Placement:
    """`running`: the workload's live pods (Pending or Running, Placement.live_pods)."""
    return Placement(workload, nodepool, gpus, running, "nodeSelector", max_replicas)


def demand(
    at: float,
    replicas: int,
    forecast: float | None,
    active: bool | None = None,
    workload: str = "team-a/llama",
) -> WorkloadDemand:
    return WorkloadDemand(
        workload=workload,
        at=at,
        replicas=replicas,
        active=replicas > 0 if active is None else active,
        forecast_replicas=forecast,
        horizon_s=None if forecast is None else 90.0,
    )


def one(
    demands: list[WorkloadDemand],
    placements: list[Placement],
    np: NodePoolState,
    now: float,
    state: CompanionState | None = None,
    config: CompanionConfig = CONFIG,
) -> tuple[NodePoolPlan, CompanionState]:
    plans, next_state = plan(demands, placements, [np], config, state or CompanionState(), now)
    assert len(plans) == 1
    return plans[0], next_state


# --- pre-warm -------------------------------------------------------------------------------------


def test_prewarm_on_a_forecast_ramp_sizes_placeholders_to_the_gap() -> None:
    """2 GPUs per replica, 2 replicas running; the q90 forecast ramps 2 -> 3.2 -> 6 replicas:
    the placeholders are the GPUs the forecast needs beyond what the running pods hold."""
    ramp = [(2.0, 0), (3.2, 4), (6.0, 8)]  # forecast replicas -> placeholders (1 GPU each)
    state = CompanionState()
    for i, (forecast, want) in enumerate(ramp):
        now = NOON + 30 * i
        got, state = one([demand(now, 2, forecast)], [placed(running=2)], pool(ready=4), now, state)
        assert got.placeholders == want, (forecast, got.reasons)
        assert got.forecast_gpus == max(2, -(-forecast // 1)) * 2


def test_placeholders_in_pods_of_several_gpus_round_up_and_are_capped() -> None:
    cfg = replace(CONFIG, placeholder_gpus=4, max_placeholders=3)
    got, _ = one([demand(NOON, 1, 3.0)], [placed(running=1)], pool(), NOON, config=cfg)
    assert got.placeholders == 1  # 6 GPUs forecast - 2 running = 4: one 4-GPU placeholder
    got, _ = one([demand(NOON, 1, 10.0)], [placed(running=1)], pool(), NOON, config=cfg)
    assert got.placeholders == 3  # 20 - 2 = 18 GPUs -> 5 placeholders, capped at 3
    assert "capped at 3" in got.reasons[0]


def test_pending_pods_are_capacity_on_order_not_a_gap() -> None:
    """6 replicas forecast, 2 running and 3 pending (live_pods 5): one placeholder, for the one
    replica nobody has asked for yet; the 3 pending pods already make Karpenter buy nodes."""
    got, _ = one([demand(NOON, 5, 6.0)], [placed(gpus=1, running=5)], pool(ready=2), NOON)
    assert (got.forecast_gpus, got.placeholders) == (6.0, 1)
    assert "5 running or pending" in got.reasons[0]


def test_the_forecast_is_capped_at_max_replica_count() -> None:
    """The q90 forecast says 63 replicas, the ScaledObject allows 40: the HPA can never create
    the other 23, so no placeholder stands for them."""
    cfg = replace(CONFIG, max_placeholders=100)
    capped = placed(gpus=1, running=10, max_replicas=40)
    got, _ = one([demand(NOON, 12, 63.0)], [capped], pool(ready=16), NOON, config=cfg)
    # 40 - 12 (the target's 2 pods not created yet are on order: the HPA's next sync)
    assert (got.forecast_gpus, got.placeholders) == (40.0, 28)
    assert any("capped at maxReplicaCount 40" in r for r in got.reasons)
    uncapped, _ = one(
        [demand(NOON, 12, 63.0)], [placed(gpus=1, running=10)], pool(), NOON, config=cfg
    )
    assert (uncapped.forecast_gpus, uncapped.placeholders) == (63.0, 51)
    # maxReplicaCount 0: nothing to pre-warm, whatever the forecast.
    zero = placed(gpus=1, max_replicas=0)
    got, _ = one([demand(NOON, 0, 5.0, active=False)], [zero], pool(), NOON, config=cfg)
    assert (got.forecast_gpus, got.placeholders) == (0.0, 0)


def test_a_target_the_hpa_has_not_applied_is_prewarmed_only_if_it_outlasts_a_pass() -> None:
    """Target 5 replicas (2 GPUs each), 2 live: the HPA creates the other 3 at its next sync and
    those pods make Karpenter launch their nodes, so a placeholder bought now would be preempted
    by them and pend again (a second node for the same GPUs). Still missing at the next pass (the
    HPA's rate limits spread the scale-up), the 6 GPUs are pre-warmed."""
    for forecast in (1.0, None):
        got, state = one([demand(NOON, 5, forecast)], [placed(running=2)], pool(), NOON)
        assert (got.forecast_gpus, got.placeholders) == (10.0, 0), got.reasons
        assert any("6 GPU(s) of the target not created yet" in r for r in got.reasons)
        assert state.last_target_gpus == {"gpu": 10.0}
        later = NOON + 15
        got, state = one([demand(later, 5, forecast)], [placed(running=2)], pool(), later, state)
        assert (got.forecast_gpus, got.placeholders) == (10.0, 6), got.reasons
        # The HPA caught up but for one pod: only what is still missing stays.
        got, _ = one([demand(later, 5, forecast)], [placed(running=4)], pool(), later + 15, state)
        assert got.placeholders == 2
    # A target that keeps climbing: the HPA applied the last pass's 4 replicas, the rise to 6 is
    # new (its pods are created at this sync), so nothing is pre-warmed for it.
    climbing = CompanionState(last_target_gpus={"gpu": 8.0})
    got, _ = one([demand(NOON, 6, None)], [placed(running=4)], pool(), NOON, climbing)
    assert got.placeholders == 0, got.reasons


def test_workloads_on_a_pool_add_up_and_other_pools_are_separate() -> None:
    demands = [
        demand(NOON, 1, 2.0),
        demand(NOON, 1, 1.0, workload="team-b/mistral"),
        demand(NOON, 3, 3.0, workload="team-c/h100"),
    ]
    placements = [
        placed(running=1),
        placed("team-b/mistral", gpus=1, running=1),
        placed("team-c/h100", nodepool="big", gpus=8, running=3),
    ]
    plans, _ = plan(demands, placements, [pool("gpu"), pool("big")], CONFIG, CompanionState(), NOON)
    assert [(p.nodepool, p.forecast_gpus, p.placeholders) for p in plans] == [
        ("big", 24.0, 0),
        ("gpu", 5.0, 2),
    ]


def test_several_triggers_of_one_workload_merge_to_the_highest() -> None:
    demands = [demand(NOON, 1, 4.0), demand(NOON, 3, 1.0), demand(NOON, 0, None, active=True)]
    got, _ = one(demands, [placed(running=0)], pool(), NOON)
    assert got.forecast_gpus == 8.0


# --- scale to zero --------------------------------------------------------------------------------


def test_idle_pool_scales_to_zero_and_drops_the_budget_at_once() -> None:
    state = CompanionState(peak_until={"gpu": NOON + 500}, last_forecast_gpus={"gpu": 8.0})
    np = pool(ready=8, budgets=({"nodes": "10%"}, OURS), placeholders=4)
    got, after = one([demand(NOON, 0, 0.0, active=False)], [placed()], np, NOON, state)
    assert (got.placeholders, got.peak_budget, got.gpu_limit, got.held) == (0, False, None, False)
    assert got.reasons[0].startswith("idle")
    assert after.peak_until["gpu"] <= NOON  # a later rise starts a fresh hold


@pytest.mark.parametrize(
    ("d", "running", "why"),
    [
        (demand(NOON, 0, 0.0, active=False), 1, "a pod still runs"),
        (demand(NOON, 0, 0.4, active=False), 0, "the forecast expects traffic"),
        (demand(NOON, 0, None, active=True), 0, "the scaler sees activity"),
        (demand(NOON, 1, 0.0), 0, "the target is a replica"),
    ],
)
def test_no_scale_to_zero_while_anything_runs_or_is_expected(
    d: WorkloadDemand, running: int, why: str
) -> None:
    state = CompanionState(peak_until={"gpu": NOON + 300}, last_forecast_gpus={"gpu": 2.0})
    np = pool(ready=2, budgets=({"nodes": "10%"}, OURS))
    got, _ = one([d], [placed(running=running)], np, NOON, state)
    assert got.peak_budget, why  # warm replicas stay protected within the hold
    assert not got.reasons[0].startswith("idle"), why


def test_forecast_traffic_keeps_a_warm_placeholder_at_zero_replicas() -> None:
    got, _ = one([demand(NOON, 0, 0.4, active=False)], [placed(gpus=1)], pool(), NOON)
    assert got.placeholders == 1


# --- peak budget ----------------------------------------------------------------------------------


def test_peak_budget_added_on_rise_and_removed_after_the_hold() -> None:
    np = pool(ready=8)
    state = CompanionState()
    budget: list[tuple[float, bool]] = []
    # forecast replicas (2 GPUs each) per pass, 60 s apart: steady, rise, steady...
    for i, forecast in enumerate([2.0, 2.0, 3.0, 3.0, 3.0, 2.0]):
        now = NOON + 60 * i
        got, state = one([demand(now, 2, forecast)], [placed(running=2)], np, now, state)
        budget.append((now - NOON, got.peak_budget))
    assert budget == [(0, False), (60, False), (120, True), (180, True), (240, True), (300, True)]
    # Rose at +120: held 600 s, so present at +719 and gone at +720.
    got, state2 = one([demand(NOON + 719, 2, 2.0)], [placed(running=2)], np, NOON + 719, state)
    assert got.peak_budget
    got, _ = one([demand(NOON + 720, 2, 2.0)], [placed(running=2)], np, NOON + 720, state2)
    assert not got.peak_budget


def test_peak_budget_while_the_pool_must_grow() -> None:
    got, _ = one([demand(NOON, 2, 5.0)], [placed(running=2)], pool(ready=4), NOON)
    assert got.peak_budget  # 10 GPUs forecast on 4 ready: no rise seen yet, but a peak
    got, _ = one([demand(NOON, 2, 2.0)], [placed(running=2)], pool(ready=4), NOON)
    assert not got.peak_budget


def test_rise_smaller_than_the_configured_fraction_is_not_a_peak() -> None:
    cfg = replace(CONFIG, peak_rise_fraction=0.5)
    state = CompanionState(last_forecast_gpus={"gpu": 4.0})
    got, _ = one([demand(NOON, 3, 3.0)], [placed(running=3)], pool(ready=10), NOON, state, cfg)
    assert not got.peak_budget  # 4 -> 6 GPUs: a rise of 2, not over 0.5 x 10 ready
    got, _ = one([demand(NOON, 5, 5.0)], [placed(running=3)], pool(ready=10), NOON, state, cfg)
    assert got.peak_budget  # 4 -> 10: a rise of 6 (and not above the 10 ready GPUs)


def test_budget_found_after_a_restart_is_held_not_dropped() -> None:
    np = pool(ready=8, budgets=({"nodes": "10%"}, OURS))
    got, state = one([demand(NOON, 2, 2.0)], [placed(running=2)], np, NOON)
    assert got.peak_budget
    got, _ = one([demand(NOON + 600, 2, 2.0)], [placed(running=2)], np, NOON + 600, state)
    assert not got.peak_budget


# --- fail static ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("demands", "note"),
    [
        ([], "no decision for team-a/llama"),
        ([demand(NIGHT - 121, 0, 0.0, active=False)], "team-a/llama is 121s old"),
    ],
)
def test_unknown_demand_holds_the_pool(demands: list[WorkloadDemand], note: str) -> None:
    """Missing or stale data must not look like idle: placeholders, budget and guard stay."""
    cfg = replace(CONFIG, active_hours_utc=(8, 20), stale_after_s=120.0)
    np = pool(
        ready=8,
        limit="0",
        budgets=({"nodes": "10%"}, OURS),
        annotations={PREVIOUS_LIMIT_ANNOTATION: '"64"', PREVIOUS_BUDGETS_ANNOTATION: "[]"},
        placeholders=5,
    )
    state = CompanionState(peak_until={"gpu": NIGHT - 1}, last_forecast_gpus={"gpu": 6.0})
    got, after = one(demands, [placed()], np, NIGHT, state, cfg)
    assert (got.placeholders, got.peak_budget, got.gpu_limit, got.held) == (5, True, "0", True)
    assert any(note in r for r in got.reasons), got.reasons
    assert after.last_forecast_gpus["gpu"] == 6.0  # a partial sum is not remembered


def test_held_pool_may_still_grow_on_what_is_known() -> None:
    demands = [demand(NOON, 4, 8.0, workload="team-b/fresh")]
    placements = [placed(), placed("team-b/fresh", gpus=1)]
    state = CompanionState(last_target_gpus={"gpu": 4.0})  # asked for at the last pass too
    got, _ = one(demands, placements, pool(placeholders=3), NOON, state)
    assert got.held
    assert got.placeholders == 8  # up from 3 on the known workload; never down


def test_held_pool_lifts_the_guard_when_a_known_workload_is_active() -> None:
    cfg = replace(CONFIG, active_hours_utc=(8, 20))
    np = pool(limit="0", annotations={PREVIOUS_LIMIT_ANNOTATION: "null"})
    demands = [demand(NIGHT, 1, 1.0, workload="team-b/fresh")]
    got, _ = one(demands, [placed(), placed("team-b/fresh")], np, NIGHT, config=cfg)
    assert got.held and got.gpu_limit is None


def test_demand_returning_releases_the_hold() -> None:
    np = pool(placeholders=5)
    got, state = one([], [placed()], np, NOON)
    assert got.placeholders == 5
    got, state = one([demand(NOON + 30, 0, 0.0, active=False)], [placed()], np, NOON + 30, state)
    assert (got.placeholders, got.held) == (0, False)
    assert state.last_demand_at == {"team-a/llama": NOON + 30}


# --- GPU limit guard ------------------------------------------------------------------------------

GUARD = replace(CONFIG, active_hours_utc=(8, 20))


def test_guard_outside_hours_when_idle() -> None:
    idle = [demand(NIGHT, 0, 0.0, active=False)]
    got, _ = one(idle, [placed()], pool(), NIGHT, config=GUARD)
    assert got.gpu_limit == "0"
    got, _ = one(idle, [placed()], pool(), NOON, config=GUARD)
    assert got.gpu_limit is None
    got, _ = one(idle, [placed()], pool(), NIGHT, config=CONFIG)  # no hours: no guard
    assert got.gpu_limit is None


def test_guard_lifted_the_moment_a_workload_is_active() -> None:
    guarded = pool(limit="0", annotations={PREVIOUS_LIMIT_ANNOTATION: '"64"'})
    got, _ = one([demand(NIGHT, 0, None, active=True)], [placed()], guarded, NIGHT, config=GUARD)
    assert got.gpu_limit is None
    assert any("restoring" in r for r in got.reasons)


@pytest.mark.parametrize(("pool_running", "pods"), [(1, 0), (0, 1)])
def test_guard_never_below_what_runs(pool_running: int, pods: int) -> None:
    idle = [demand(NIGHT, 0, 0.0, active=False)]
    got, _ = one(idle, [placed(running=pods)], pool(running=pool_running), NIGHT, config=GUARD)
    assert got.gpu_limit is None


def test_pool_with_no_workloads() -> None:
    np = pool(ready=8, budgets=(OURS,), placeholders=2)
    state = CompanionState(peak_until={"gpu": NIGHT + 100})
    got, _ = one([], [], np, NIGHT, state, GUARD)
    assert (got.placeholders, got.peak_budget, got.gpu_limit, got.held) == (0, False, "0", False)
    got, _ = one([], [], np, NOON, state, GUARD)
    assert got.gpu_limit is None
    got, _ = one([], [], pool(running=2), NIGHT, state, GUARD)
    assert got.gpu_limit is None


@pytest.mark.parametrize(
    ("hours", "hour", "inside"),
    [
        ((8, 20), 8, True),
        ((8, 20), 19, True),
        ((8, 20), 20, False),
        ((8, 20), 3, False),
        ((22, 6), 23, True),
        ((22, 6), 5, True),
        ((22, 6), 6, False),
        ((9, 9), 3, True),
        (None, 3, True),
    ],
)
def test_active_hours(hours: tuple[int, int] | None, hour: int, inside: bool) -> None:
    assert in_active_hours(hours, DAY + hour * 3600 + 1799) is inside


# --- determinism ----------------------------------------------------------------------------------


def test_same_inputs_any_order_same_plans() -> None:
    demands = [
        demand(NOON, 2, 3.5, workload=f"team-{i}/w") if i % 3 else demand(NOON - 500, 1, 1.0)
        for i in range(9)
    ]
    placements = [placed(f"team-{i}/w", nodepool=f"pool-{i % 4}", running=1) for i in range(9)]
    pools = [pool(f"pool-{i}", ready=2 * i) for i in range(4)]
    state = CompanionState(last_forecast_gpus={"pool-1": 3.0})
    expected = plan(demands, placements, pools, GUARD, state, NOON)
    assert [p.nodepool for p in expected[0]] == ["pool-0", "pool-1", "pool-2", "pool-3"]
    rng = random.Random(7)
    for _ in range(5):
        rng.shuffle(demands)
        rng.shuffle(placements)
        rng.shuffle(pools)
        assert plan(demands, placements, pools, GUARD, state, NOON) == expected
