"""decide() and hold(): explicit times, hand-built signals, whole outcomes."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gpu_queue_scaler.decision.outlook import Outlook
from gpu_queue_scaler.decision.policy import (
    Decision,
    PolicyState,
    QueueSeen,
    Reason,
    decide,
    hold,
    queue_trend,
)
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from tests.conftest import PROPERTIES

STALE = 600.0
T0 = 1_700_000_000.0


def make_spec(name: str = "llama", **tuning: object) -> WorkloadSpec:
    metadata = {
        "backend": "synthetic",
        "targetConcurrency": "8",
        "minReplicas": "0",
        "maxReplicas": "100",
        "scaleDownStabilizationSeconds": "300",
        "scaleToZeroIdleSeconds": "600",
        # Panic and the scale-down step off unless a test turns them on: each rule alone.
        "panicThreshold": "100",
        "scaleDownMaxPercent": "100",
    }
    metadata.update({key: str(value) for key, value in tuning.items()})
    return resolve(parse_trigger("team-a", name, metadata), Config())


def sig(
    at: float, running: float | None, waiting: float | None = 0.0, arrival: float | None = None
) -> Signal:
    return Signal(at=at, source="test", waiting=waiting, running=running, arrival_rate=arrival)


def outcome(decision: Decision | None) -> tuple[int, bool, Reason] | None:
    return None if decision is None else (decision.replicas, decision.active, decision.reason)


class Driver:
    """Feeds decide() a sequence of ticks, carrying the state like the engine does."""

    def __init__(self, spec: WorkloadSpec, state: PolicyState | None = None) -> None:
        self.spec = spec
        self.state = state or PolicyState()

    def tick(
        self,
        at: float,
        in_flight: float | None,
        arrival: float | None = None,
        faults: tuple[str, ...] = (),
    ) -> Decision | None:
        signal = None if in_flight is None else sig(at, in_flight, 0.0, arrival)
        decision, self.state = decide(self.spec, signal, self.state, at, STALE, faults)
        return decision

    def outcome(self, at: float, in_flight: float | None, arrival: float | None = None) -> object:
        return outcome(self.tick(at, in_flight, arrival))


# --- current need -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("running", "waiting", "target", "replicas"),
    [
        (10.0, 7.0, 8, 3),  # 17 / 8 -> 2.125 -> 3
        (10.0, 6.0, 8, 2),  # exactly 16 / 8 -> 2, not 3
        (24.0, 0.0, 8, 3),
        (0.0, 24.0, 8, 3),  # waiting counts like running
        (8.0, 0.0, 8, 1),
        (8.01, 0.0, 8, 2),
        (0.1, 0.2, 0.1, 3),  # 0.30000000000000004 / 0.1 must not become 4
        (7.0, 0.0, 0.7, 10),  # 7 / 0.7 = 10.000000000000002
        (3.0, 0.0, 2.5, 2),
    ],
)
def test_need_is_in_flight_over_target_rounded_up(
    running: float, waiting: float, target: float, replicas: int
) -> None:
    spec = make_spec(targetConcurrency=target)
    decision, _ = decide(spec, sig(T0, running, waiting), PolicyState(), T0, STALE)
    assert outcome(decision) == (replicas, True, Reason.CURRENT_NEED)
    assert decision is not None
    assert decision.need == pytest.approx((running + waiting) / target)
    assert decision.in_flight == pytest.approx(running + waiting)
    assert decision.workload == "team-a/llama"
    assert decision.metric_name == "synthetic-llama"
    assert decision.at == T0
    assert decision.faults == ()


@pytest.mark.parametrize("stabilization", ["300", "0"])
@pytest.mark.parametrize(
    ("waiting", "reasons", "named"),
    [
        (None, ("waiting: no pod reports vllm:num_requests_waiting",), "no pod reports"),
        (None, (), "waiting: not reported"),  # the line is absent and the source said nothing
        (float("nan"), (), "waiting: nan is not finite"),
        (float("inf"), (), "waiting: inf is not finite"),
    ],
)
def test_a_missing_queue_field_holds_the_last_good_target(
    stabilization: str, waiting: float | None, reasons: tuple[str, ...], named: str
) -> None:
    """vLLM reports running and waiting; with waiting gone the need from running alone is too
    low by the whole queue, so the last good target holds and a fault names the field."""
    spec = make_spec(
        backend="vllm",
        scrapeTargets="10.0.0.1:8000",
        scaleDownStabilizationSeconds=stabilization,
    )
    full = Signal(at=T0, source="t", running=18.0, waiting=14.0)
    decision, state = decide(spec, full, PolicyState(), T0, STALE)
    assert outcome(decision) == (4, True, Reason.CURRENT_NEED)
    for k in range(1, 40):  # 390 s of ticks: past the stabilization window
        at = T0 + 10 * k
        partial = Signal(at=at, source="t", running=18.0, waiting=waiting, reasons=reasons)
        decision, state = decide(spec, partial, state, at, STALE)
        assert outcome(decision) == (4, True, Reason.HOLD)
        assert decision is not None
        assert any(f.startswith("waiting: ") and named in f for f in decision.faults)
    # Past stale_s there is no decision at all (KEDA's fallback), never a lower one.
    late = Signal(at=T0 + STALE + 20, source="t", running=18.0, waiting=waiting)
    assert decide(spec, late, state, T0 + STALE + 20, STALE)[0] is None


def test_a_missing_queue_field_at_first_sight_gives_no_decision() -> None:
    spec = make_spec(backend="vllm", scrapeTargets="10.0.0.1:8000")
    running_only = Signal(at=T0, source="t", running=17.0)
    assert decide(spec, running_only, PolicyState(), T0, STALE)[0] is None


def test_a_field_the_last_signal_had_is_needed_too() -> None:
    """Whatever the backend, a queue field that was reported and is gone is missing, not 0."""
    spec = make_spec()  # synthetic: no catalog of required fields
    decision, state = decide(spec, sig(T0, 10.0, 30.0), PolicyState(), T0, STALE)
    assert outcome(decision) == (5, True, Reason.CURRENT_NEED)
    decision, _ = decide(spec, sig(T0 + 10, 10.0, None), state, T0 + 10, STALE)
    assert outcome(decision) == (5, True, Reason.HOLD)


def test_a_custom_backend_with_only_a_waiting_query_decides_from_it() -> None:
    """A custom backend reports what the user gave queries for: waiting alone is its signal."""
    spec = make_spec(backend="custom", serverAddress="http://prom:9090", waitingQuery="sum(q)")
    decision, _ = decide(spec, Signal(at=T0, source="t", waiting=17.0), PolicyState(), T0, STALE)
    assert outcome(decision) == (3, True, Reason.CURRENT_NEED)


def test_rises_immediately() -> None:
    drive = Driver(make_spec())
    assert drive.outcome(T0, 8.0) == (1, True, Reason.CURRENT_NEED)
    assert drive.outcome(T0 + 5, 40.0) == (5, True, Reason.CURRENT_NEED)
    assert drive.outcome(T0 + 10, 800.0) == (100, True, Reason.CURRENT_NEED)


def test_falls_only_after_the_stabilization_window() -> None:
    drive = Driver(make_spec(scaleDownStabilizationSeconds=300))
    assert drive.outcome(T0, 40.0) == (5, True, Reason.CURRENT_NEED)
    assert drive.outcome(T0 + 100, 24.0) == (5, True, Reason.STABILIZATION)
    held = drive.tick(T0 + 200, 8.0)
    assert outcome(held) == (5, True, Reason.STABILIZATION)
    assert held is not None
    assert "held at 5" in held.detail
    # The 5 from T0 has left the window: hold the highest still in it (3 from T0+100), not 1.
    assert drive.outcome(T0 + 300, 8.0) == (3, True, Reason.STABILIZATION)
    # Now only 1s remain in the window.
    assert drive.outcome(T0 + 400, 8.0) == (1, True, Reason.CURRENT_NEED)


def gap_run(spec: WorkloadSpec, gap_s: float) -> list[tuple[float, int]]:
    """Three replicas of load, then one for `gap_s`, then three again: (second, target)."""
    driver, seen = Driver(spec), []
    for second in range(0, int(120 + gap_s + 60), 10):
        in_gap = 120 <= second < 120 + gap_s
        decision = driver.tick(T0 + second, 8.0 if in_gap else 24.0)
        assert decision is not None
        seen.append((second, decision.replicas))
    return seen


@pytest.mark.parametrize("cold_start", [180, 600])
def test_scale_down_keeps_a_replica_through_a_gap_shorter_than_a_cold_start(
    cold_start: int,
) -> None:
    # A replica released in a gap comes back a cold start after it is asked for again: through
    # a gap shorter than that, releasing it only makes the load that returns wait. Left to its
    # default, the scale-down window is at least the horizon (coldStartSeconds +
    # pollingIntervalSeconds), so a 600 s model load keeps its replicas through a 450 s gap
    # (the plain 300 s window let them go at 300 s). Through a longer gap they go.
    metadata = {
        "backend": "synthetic",
        "targetConcurrency": "8",
        "minReplicas": "0",
        "maxReplicas": "100",
        "coldStartSeconds": str(cold_start),
        "pollingIntervalSeconds": "30",
        "panicThreshold": "100",
        "scaleDownMaxPercent": "100",
    }
    spec = resolve(parse_trigger("team-a", "llama", metadata), Config())
    short = gap_run(spec, gap_s=0.75 * cold_start)
    assert all(n == 3 for _, n in short), short
    long = gap_run(spec, gap_s=cold_start + 30 + 300 + 300)
    in_gap = [n for second, n in long if 120 <= second < 120 + cold_start + 630]
    assert in_gap[0] == 3 and in_gap[-1] == 1, long  # released before the load returns
    assert long[-1][1] == 3


def test_a_scale_down_window_the_user_sets_is_kept() -> None:
    # scaleDownStabilizationSeconds given (here shorter than the horizon) is the user's choice.
    spec = make_spec(coldStartSeconds=600, scaleDownStabilizationSeconds=120)
    assert spec.scale_down_stabilization_s == 120
    released = gap_run(spec, gap_s=450)
    assert any(n == 1 for _, n in released)


def test_zero_stabilization_falls_at_once() -> None:
    drive = Driver(make_spec(scaleDownStabilizationSeconds=0))
    assert drive.outcome(T0, 40.0) == (5, True, Reason.CURRENT_NEED)
    assert drive.outcome(T0 + 1, 8.0) == (1, True, Reason.CURRENT_NEED)


def test_a_rise_inside_the_window_is_current_need() -> None:
    drive = Driver(make_spec())
    drive.tick(T0, 40.0)
    drive.tick(T0 + 10, 8.0)
    assert drive.outcome(T0 + 20, 48.0) == (6, True, Reason.CURRENT_NEED)


# --- active floor and scale to zero -------------------------------------------------------------


def test_tiny_load_keeps_one_replica_active() -> None:
    decision, _ = decide(make_spec(), sig(T0, 0.1), PolicyState(), T0, STALE)
    assert outcome(decision) == (1, True, Reason.CURRENT_NEED)  # ceil(0.0125) is already 1
    floor, _ = decide(make_spec(), sig(T0, 1e-12, 0.0, 0.0), PolicyState(), T0, STALE)
    assert outcome(floor) == (1, True, Reason.ACTIVE_FLOOR)  # need rounds to 0, still active


def test_scale_to_zero_only_after_the_idle_window() -> None:
    drive = Driver(make_spec(scaleDownStabilizationSeconds=0, scaleToZeroIdleSeconds=600))
    assert drive.outcome(T0, 8.0, arrival=1.0) == (1, True, Reason.CURRENT_NEED)
    assert drive.outcome(T0 + 10, 0.0, arrival=0.0) == (1, True, Reason.ACTIVE_FLOOR)
    assert drive.outcome(T0 + 599, 0.0, arrival=0.0) == (1, True, Reason.ACTIVE_FLOOR)
    assert drive.outcome(T0 + 600, 0.0, arrival=0.0) == (0, False, Reason.SCALE_TO_ZERO)
    assert drive.outcome(T0 + 900, 0.0) == (0, False, Reason.SCALE_TO_ZERO)
    # Any load wakes it at once.
    assert drive.outcome(T0 + 905, 0.5) == (1, True, Reason.CURRENT_NEED)


def test_idle_window_restarts_with_each_busy_tick() -> None:
    drive = Driver(make_spec(scaleDownStabilizationSeconds=0, scaleToZeroIdleSeconds=600))
    drive.tick(T0, 8.0)
    drive.tick(T0 + 500, 0.0, arrival=0.2)  # a trickle of arrivals, nothing in flight
    assert drive.outcome(T0 + 700, 0.0, arrival=0.0) == (1, True, Reason.ACTIVE_FLOOR)
    assert drive.outcome(T0 + 1100, 0.0, arrival=0.0) == (0, False, Reason.SCALE_TO_ZERO)


def test_arrivals_with_nothing_in_flight_stay_active() -> None:
    drive = Driver(make_spec(scaleDownStabilizationSeconds=0, scaleToZeroIdleSeconds=60))
    for at in range(0, 2000, 30):
        assert drive.outcome(T0 + at, 0.0, arrival=0.5) == (1, True, Reason.ACTIVE_FLOOR)


def test_fresh_state_with_no_load_waits_the_idle_window_from_the_first_tick() -> None:
    drive = Driver(make_spec(scaleToZeroIdleSeconds=600))
    assert drive.outcome(T0, 0.0, arrival=0.0) == (1, True, Reason.ACTIVE_FLOOR)
    assert drive.outcome(T0 + 599.9, 0.0, arrival=0.0) == (1, True, Reason.ACTIVE_FLOOR)
    assert drive.outcome(T0 + 600, 0.0, arrival=0.0) == (0, False, Reason.SCALE_TO_ZERO)


def test_zero_idle_window_scales_to_zero_on_the_first_idle_tick() -> None:
    drive = Driver(make_spec(scaleToZeroIdleSeconds=0))
    assert drive.outcome(T0, 0.0, arrival=0.0) == (0, False, Reason.SCALE_TO_ZERO)


# --- bounds -----------------------------------------------------------------------------------


def test_min_replicas_floor() -> None:
    decision, _ = decide(make_spec(minReplicas=3), sig(T0, 8.0), PolicyState(), T0, STALE)
    assert outcome(decision) == (3, True, Reason.MIN_BOUND)


def test_min_replicas_floor_when_idle() -> None:
    drive = Driver(make_spec(minReplicas=2, scaleToZeroIdleSeconds=60))
    for at in (T0, T0 + 120):  # before and after the idle window
        decision = drive.tick(at, 0.0, arrival=0.0)
        assert decision is not None
        assert (decision.replicas, decision.reason) == (2, Reason.MIN_BOUND)


def test_min_replicas_above_zero_keeps_the_workload_active() -> None:
    # minReplicas is documented as "0 allows scale to zero": with minReplicas 2 an idle workload
    # must not report IsActive false, or KEDA scales it to its own minReplicaCount (often 0).
    drive = Driver(make_spec(minReplicas=2, scaleToZeroIdleSeconds=60))
    drive.tick(T0, 0.0, arrival=0.0)
    assert drive.outcome(T0 + 120, 0.0, arrival=0.0) == (2, True, Reason.MIN_BOUND)


def test_max_replicas_cap() -> None:
    decision, _ = decide(make_spec(maxReplicas=4), sig(T0, 100.0), PolicyState(), T0, STALE)
    assert outcome(decision) == (4, True, Reason.MAX_BOUND)
    assert decision is not None
    assert decision.need == 12.5


def test_max_replicas_cap_applies_to_a_stabilized_value() -> None:
    drive = Driver(make_spec(maxReplicas=4))
    drive.tick(T0, 100.0)
    assert drive.outcome(T0 + 10, 8.0) == (4, True, Reason.MAX_BOUND)


# --- fail static ------------------------------------------------------------------------------

MISSING = [
    pytest.param(None, (), ("no in-flight or arrival signal",), id="no-signal"),
    pytest.param(None, ("prometheus: timeout",), ("prometheus: timeout",), id="no-signal-fault"),
    pytest.param(
        Signal(
            at=T0, source="test", arrival_rate=3.0, reasons=("vllm:num_requests_running missing",)
        ),
        (),
        ("vllm:num_requests_running missing",),
        id="signal-without-in-flight",
    ),
    pytest.param(
        Signal(at=T0, source="test", reasons=("no series",)),
        ("scrape failed",),
        ("scrape failed", "no series"),
        id="both-faults",
    ),
]


@pytest.mark.parametrize(("missing", "faults", "listed"), MISSING)
def test_missing_signal_holds_the_last_good_decision(
    missing: Signal | None, faults: tuple[str, ...], listed: tuple[str, ...]
) -> None:
    spec = make_spec(scaleDownStabilizationSeconds=0, scaleToZeroIdleSeconds=0)
    good, state = decide(spec, sig(T0, 24.0), PolicyState(), T0, STALE)
    assert outcome(good) == (3, True, Reason.CURRENT_NEED)
    for delay in (1.0, 300.0, STALE):
        held, after = decide(spec, missing, state, T0 + delay, STALE, faults)
        assert after is state
        assert outcome(held) == (3, True, Reason.HOLD)
        assert held is not None
        assert held.at == T0 + delay
        assert held.faults == listed
        assert held.need == good.need  # type: ignore[union-attr]
    late, after = decide(spec, missing, state, T0 + STALE + 0.001, STALE, faults)
    assert late is None
    assert after is state


def test_hold_never_refreshes_the_staleness_clock() -> None:
    drive = Driver(make_spec())
    drive.tick(T0, 24.0)
    state = drive.state
    assert outcome(drive.tick(T0 + 300, None)) == (3, True, Reason.HOLD)
    assert drive.state is state
    assert outcome(drive.tick(T0 + STALE, None)) == (3, True, Reason.HOLD)
    assert drive.tick(T0 + STALE + 1, None) is None
    # A good signal decides again; the old 3 has left the stabilization window.
    assert drive.outcome(T0 + STALE + 2, 8.0) == (1, True, Reason.CURRENT_NEED)


def test_hold_keeps_a_scaled_to_zero_decision_inactive() -> None:
    drive = Driver(make_spec(scaleToZeroIdleSeconds=0))
    assert drive.outcome(T0, 0.0, arrival=0.0) == (0, False, Reason.SCALE_TO_ZERO)
    assert drive.outcome(T0 + 10, None) == (0, False, Reason.HOLD)


def test_no_prior_good_decision_means_no_decision() -> None:
    state = PolicyState()
    decision, after = decide(make_spec(), None, state, T0, STALE)
    assert decision is None
    assert after is state
    assert hold(state, T0, STALE, ("x",)) is None
    empty = Signal(at=T0, source="test")
    assert empty.in_flight is None
    assert decide(make_spec(), empty, state, T0, STALE) == (None, state)


# --- decision ids -----------------------------------------------------------------------------


def test_decision_id_is_stable_per_workload_and_tick() -> None:
    spec = make_spec()
    first, _ = decide(spec, sig(T0, 8.0), PolicyState(), T0, STALE)
    again, _ = decide(make_spec(), sig(T0, 30.0), PolicyState(), T0, STALE)
    later, _ = decide(spec, sig(T0 + 5, 8.0), PolicyState(), T0 + 5, STALE)
    other, _ = decide(make_spec(name="other"), sig(T0, 8.0), PolicyState(), T0, STALE)
    assert first is not None
    assert again is not None
    assert later is not None
    assert other is not None
    assert first.decision_id == again.decision_id
    assert len(first.decision_id) == 16
    assert later.decision_id != first.decision_id
    assert other.decision_id != first.decision_id


# --- properties -------------------------------------------------------------------------------

BOUNDS = st.integers(0, 20).flatmap(lambda lo: st.tuples(st.just(lo), st.integers(max(lo, 1), 40)))
TARGETS = st.sampled_from((0.1, 0.5, 1.0, 2.5, 8.0, 16.0))
LOAD = st.floats(0, 500, allow_nan=False)
STEPS = st.lists(
    st.tuples(LOAD, st.floats(0, 50, allow_nan=False), st.floats(0.5, 400, allow_nan=False)),
    max_size=25,
)


def spec_for(bounds: tuple[int, int], target: float, stab: float, idle: float) -> WorkloadSpec:
    lo, hi = bounds
    return make_spec(
        minReplicas=lo,
        maxReplicas=hi,
        targetConcurrency=target,
        scaleDownStabilizationSeconds=stab,
        scaleToZeroIdleSeconds=idle,
        panicThreshold=2,  # the whole rule, as shipped
        scaleDownMaxPercent=50,
    )


@settings(PROPERTIES, max_examples=500)
@given(BOUNDS, TARGETS, st.sampled_from((0, 30, 300)), st.sampled_from((0, 60, 600)), STEPS)
def test_replicas_always_within_bounds(
    bounds: tuple[int, int],
    target: float,
    stab: float,
    idle: float,
    steps: list[tuple[float, float, float]],
) -> None:
    spec = spec_for(bounds, target, stab, idle)
    state, at = PolicyState(), T0
    for in_flight, arrival, dt in steps:
        at += dt
        decision, state = decide(spec, sig(at, in_flight, 0.0, arrival), state, at, STALE)
        assert decision is not None
        assert type(decision.replicas) is int
        assert bounds[0] <= decision.replicas <= bounds[1]
        assert decision.replicas >= 0
        assert decision.active or decision.replicas == bounds[0]


@settings(PROPERTIES, max_examples=500)
@given(
    BOUNDS,
    TARGETS,
    st.sampled_from((0, 30, 300)),
    st.sampled_from((0, 60, 600)),
    STEPS,
    st.floats(0.5, 400, allow_nan=False),
    LOAD,
    LOAD,
    st.floats(0, 50, allow_nan=False),
)
def test_more_in_flight_never_gives_fewer_replicas(
    bounds: tuple[int, int],
    target: float,
    stab: float,
    idle: float,
    steps: list[tuple[float, float, float]],
    dt: float,
    load_a: float,
    load_b: float,
    arrival: float,
) -> None:
    spec = spec_for(bounds, target, stab, idle)
    state, at = PolicyState(), T0
    for in_flight, rate, step in steps:
        at += step
        _, state = decide(spec, sig(at, in_flight, 0.0, rate), state, at, STALE)
    at += dt
    low, high = sorted((load_a, load_b))
    fewer, _ = decide(spec, sig(at, low, 0.0, arrival), state, at, STALE)
    more, _ = decide(spec, sig(at, high, 0.0, arrival), state, at, STALE)
    assert fewer is not None
    assert more is not None
    assert fewer.replicas <= more.replicas


# --- replicas on their way, panic, scale-down step ---------------------------------------------


def fluid_run(spec: WorkloadSpec, arrivals: list[float], service_s: float, dt: float = 5.0):
    """A fluid fleet at 5 s ticks: replicas become ready coldStartSeconds after they are asked
    for; each serves targetConcurrency / S req/s; the queue holds what they cannot. Yields
    (decision, reactive_need) where reactive_need is (running + waiting) / targetConcurrency."""
    c = spec.target_concurrency
    state, queue, at = PolicyState(), 0.0, T0
    ready, asked_at = 1, []  # (ready time, replicas) of outstanding asks
    target = 1
    for rate in arrivals:
        at += dt
        ready = max([ready] + [n for t, n in asked_at if t <= at])
        capacity = ready * c / service_s
        queue = max(0.0, queue + (rate - capacity) * dt)
        running = min(ready * c, rate * service_s + queue)
        waiting = max(0.0, queue - max(0.0, ready * c - rate * service_s))
        signal = Signal(
            at=at,
            source="fluid",
            running=running,
            waiting=waiting,
            arrival_rate=rate,
            ready_pods=ready,
            service_time_s=service_s,  # as Triton and vLLM report it
        )
        decision, state = decide(spec, signal, state, at, STALE)
        assert decision is not None
        if decision.replicas > target:
            asked_at.append((at + spec.cold_start_s, decision.replicas))
        target = decision.replicas
        yield decision, (running + waiting) / c


def test_a_cold_start_queue_is_not_asked_for_twice() -> None:
    # 4 req/s with S = 2 s (1 replica at 8 slots), then a step to 40 req/s (10 replicas) with a
    # 180 s cold start. A reactive queue metric climbs with the queue that builds while the
    # replicas load (dozens of replicas); the scaler asks for the flow plus what drains the
    # cold-start backlog within a horizon, and does not climb with the queue.
    spec = make_spec(
        coldStartSeconds=180, pollingIntervalSeconds=30, scaleDownStabilizationSeconds=300
    )
    arrivals = [4.0] * 24 + [40.0] * 120
    run = list(fluid_run(spec, arrivals, service_s=2.0))
    targets = [d.replicas for d, _ in run]
    reactive_peak = max(n for _, n in run)
    assert reactive_peak > 30  # the sawtooth a reactive queue metric would ask for
    # 10 for the flow, the 5 s of queue seen at the step drained within S, the backlog that
    # builds while replicas start drained over one more horizon: 42, asked once.
    assert max(targets) <= 45
    # It keeps those while they drain the queue, and lets them go when it is gone, not a
    # stabilization window later (the window remembers the flow, not the drain).
    drained = next(i for i, (_, n) in enumerate(run) if i > 60 and n <= 10.0)
    assert all(d.replicas == max(targets) for d, _ in run[24 : drained - 1])
    assert all(d.replicas == 10 for d, _ in run[drained:])
    queue_terms = [d for d, _ in run if "from queue" in d.detail]
    assert queue_terms, "the queue term (with replicas on their way) set the need"


def test_a_scale_from_zero_after_a_long_idle_sizes_its_queue_from_the_s_it_last_saw() -> None:
    # 2 req/s with S = 10 s on 3 replicas (2.5 needed at 8 slots), then half an hour at zero
    # (longer than the fit of S against the batch remembers), then the same 2 req/s again,
    # queueing for the 180 s cold start. Sized from the S last seen, the queue term asks for the
    # flow and the backlog a replica asked now would meet, once, and keeps the replicas on
    # their way. A state that never saw an S can only count the queue as slots needed now: it
    # climbs with every request that waits, to 45 replicas for a flow that needs 3.
    spec = make_spec(coldStartSeconds=180, pollingIntervalSeconds=30)

    def burst(state: PolicyState, start: float) -> list[Decision]:
        seen = []
        for second in range(0, 180, 5):
            at = start + second
            signal = Signal(
                at=at, source="t", running=0.0, waiting=2.0 * second, arrival_rate=2.0,
                ready_pods=0,
            )  # fmt: skip
            decision, state = decide(spec, signal, state, at, STALE)
            assert decision is not None
            seen.append(decision)
        return seen

    state = PolicyState()
    for second in range(0, 600, 5):
        at = T0 + second
        signal = Signal(
            at=at, source="t", running=20.0, waiting=0.0, arrival_rate=2.0, ready_pods=3,
            service_time_s=10.0,
        )  # fmt: skip
        _, state = decide(spec, signal, state, at, STALE)
    idle_from = T0 + 600
    for second in range(0, 1800, 5):
        at = idle_from + second
        signal = Signal(at=at, source="t", running=0.0, waiting=0.0, arrival_rate=0.0, ready_pods=0)
        decision, state = decide(spec, signal, state, at, STALE)
    assert decision is not None and decision.replicas == 0  # scaled to zero
    assert not state.service_fit  # the fit's window holds nothing of the served minutes
    remembered = burst(state, idle_from + 1800)
    blind = burst(PolicyState(), idle_from + 1800)
    asked = [d.replicas for d in remembered]
    assert max(asked) <= 10, asked
    assert asked[-1] == max(asked), asked  # asked once, kept while they start
    assert all("from queue" in d.detail for d in remembered[1:])
    assert max(d.replicas for d in blind) >= 40  # the whole queue as slots: the climb avoided


def queue_spec() -> WorkloadSpec:
    """A workload whose queue term is computed: a 3.5-minute horizon, a 2 s SLO, a known S."""
    return make_spec(
        coldStartSeconds=180,
        pollingIntervalSeconds=30,
        queueTimeSloSeconds=2,
        maxReplicas=500,
        serviceTimeSeconds=5,
    )


def test_the_headroom_does_not_compound_on_the_replicas_already_on_their_way() -> None:
    # A queue waits on 24 ready replicas while more are on their way, with a learned headroom
    # of x1.5. The replicas on their way are a floor the queue term keeps, not demand: with the
    # headroom multiplied onto that floor, each tick's target became the next tick's floor and
    # grew x1.5 a tick, to maxReplicas within seconds (seen on a bursty trace). The target is
    # max(demand x headroom, floor): the same on every tick of a steady signal.
    spec = queue_spec()

    def run(headroom: float) -> list[int]:
        state, targets = PolicyState(headroom_log=math.log(headroom)), []
        for i in range(12):
            at = T0 + 5.0 * i
            signal = Signal(
                at=at, source="t", running=200.0, waiting=90.0, arrival_rate=70.0, ready_pods=24
            )
            decision, state = decide(spec, signal, state, at, STALE)
            assert decision is not None
            targets.append(decision.replicas)
        return targets

    plain, held = run(1.0), run(1.5)
    assert len(set(plain)) == 1, plain  # without headroom the ask is steady
    assert all(n <= math.ceil(1.5 * plain[0]) for n in held), (plain[0], held)
    assert len(set(held)) == 1, held  # the ask settles, it does not climb


def test_a_fresh_state_holds_the_fleet_it_finds_for_one_window() -> None:
    # A scaler restarted without history finds 29 ready replicas and a light load. Like the HPA,
    # which seeds its window with the current replicas, it keeps them for one stabilization
    # window instead of dropping a warm fleet to 1 on its first tick; then the window decides.
    spec = make_spec(scaleDownStabilizationSeconds=300)
    state, targets = PolicyState(), {}
    for second in range(0, 400, 10):
        at = T0 + second
        signal = Signal(at=at, source="t", running=6.0, waiting=0.0, ready_pods=29)
        decision, state = decide(spec, signal, state, at, STALE)
        assert decision is not None
        targets[second] = decision.replicas
    assert targets[0] == 29 and targets[290] == 29
    assert targets[310] == 1  # 6 in flight / 8 per replica
    # Without a ready count there is nothing to hold: the need alone.
    blind, _ = decide(spec, sig(T0, 6.0), PolicyState(), T0, STALE)
    assert blind is not None and blind.replicas == 1


def test_a_queue_that_does_not_shrink_is_not_read_as_draining_on_a_lagging_rate() -> None:
    # 16 closed-loop clients on one replica whose server batches 2 (S = 0.47 s): 2 run, 14 wait,
    # and it completes 4.3 req/s. The arrival counter's rate is a minute's average, so for a
    # minute after the load starts it reads far below 4.3 and, trusted alone, says one replica
    # drains the queue. The queue, flat, says otherwise: the scaler asks for 16 / 4 = 4 as soon as
    # the trend spans enough time, while the counter still reads low.
    spec = make_spec(targetConcurrency=4, coldStartSeconds=60, pollingIntervalSeconds=15)
    service_s, completes = 0.4666, 2 / 0.4666
    state, targets, rates = PolicyState(), [], []
    for second in range(1, 21):
        at = T0 + second
        lagging = completes * second / 60.0  # rate(...[60s]) since the load began
        signal = Signal(
            at=at,
            source="prometheus",
            running=2.0,
            waiting=14.0,
            arrival_rate=lagging,
            ready_pods=1,
            service_time_s=service_s,
        )
        decision, state = decide(spec, signal, state, at, STALE)
        assert decision is not None
        targets.append(decision.replicas)
        rates.append(lagging)
    assert targets[0] == 1  # no evidence yet: the counter stands
    risen = next(i for i, n in enumerate(targets) if n >= 4)
    assert rates[risen] < completes / 2  # well before the counter caught up
    assert all(n == 4 for n in targets[risen:])


def test_a_queue_seen_to_drain_at_the_modelled_pace_is_draining() -> None:
    # The same fleet after the clients slow to 2 req/s (the counter agrees): it completes 4.3, so
    # its queue of 14 falls by 2.3 a second and is gone in 6 s; it needs no more replicas.
    spec = make_spec(targetConcurrency=4, coldStartSeconds=60, pollingIntervalSeconds=15)
    state, waiting, targets = PolicyState(), 14.0, []
    for second in range(1, 7):
        at = T0 + second
        signal = Signal(
            at=at,
            source="prometheus",
            running=2.0,
            waiting=waiting,
            arrival_rate=2.0,
            ready_pods=1,
            service_time_s=0.4666,
        )
        decision, state = decide(spec, signal, state, at, STALE)
        assert decision is not None
        targets.append(decision.replicas)
        waiting = max(0.0, waiting - (2 / 0.4666 - 2.0))
    assert targets == [1] * 6


def test_requests_preempted_into_the_queue_are_not_read_as_arrivals() -> None:
    """A server whose KV cache fills preempts running requests back into its queue (vLLM counts
    them as waiting): the queue grows by what running lost, which no arrival added; read as
    arrivals it would size for a surge. The same growth with running unchanged is arrivals, and
    running requests that grow (a batch slowing down holds more) are not counted either."""

    def trend(moves: list[tuple[float, float]]) -> float | None:
        return queue_trend(
            tuple(
                QueueSeen(T0 + 5 * i, waiting, 40, running)
                for i, (running, waiting) in enumerate(moves)
            )
        )

    assert trend([(3400.0, 4.0), (3300.0, 104.0), (3200.0, 204.0)]) == pytest.approx(0.0)
    assert trend([(3400.0, 4.0), (3400.0, 104.0), (3400.0, 204.0)]) == pytest.approx(20.0)
    assert trend([(3400.0, 4.0), (3600.0, 4.0), (3800.0, 54.0)]) == pytest.approx(5.0)
    assert trend([(3400.0, 4.0)]) is None  # one observation spans no time


def test_panic_enters_when_need_outruns_what_was_asked_and_holds_60s() -> None:
    drive = Driver(make_spec(panicThreshold=2, scaleDownStabilizationSeconds=0))
    drive.tick(T0, 48.0)  # 6 replicas
    surge = drive.tick(T0 + 5, 200.0)  # 25 needed, 6 asked: panic
    assert surge is not None and (surge.replicas, surge.reason) == (25, Reason.PANIC)
    assert "panic (need 25.00 vs 6 asked)" in surge.detail
    held = drive.tick(T0 + 40, 8.0)  # demand gone at once: panic holds the peak
    assert held is not None and (held.replicas, held.reason) == (25, Reason.PANIC)
    calm = drive.tick(T0 + 66, 8.0)  # 61 s after demand last outran: panic over
    assert calm is not None and (calm.replicas, calm.reason) == (1, Reason.CURRENT_NEED)
    assert drive.state.panic_until is None and drive.state.panic_peak == 0


def test_a_step_panics_without_overshooting() -> None:
    drive = Driver(make_spec(panicThreshold=2, scaleDownStabilizationSeconds=0))
    drive.tick(T0, 8.0)
    step = drive.tick(T0 + 5, 40.0)
    assert step is not None and (step.replicas, step.reason) == (5, Reason.PANIC)
    for at in range(10, 60, 5):
        again = drive.tick(T0 + at, 40.0)
        assert again is not None and again.replicas == 5  # the need, never more


def test_panic_off_below_the_threshold() -> None:
    drive = Driver(make_spec(panicThreshold=2))
    drive.tick(T0, 32.0)
    up = drive.tick(T0 + 5, 56.0)  # 7 vs 4 asked: below 2x
    assert up is not None and (up.replicas, up.reason) == (7, Reason.CURRENT_NEED)


def test_the_forecast_is_scaled_by_the_headroom_the_closed_loop_learnt() -> None:
    """The forecast is of demand, the need is demand x headroom: a workload whose measured
    lateness raised its headroom to 1.5 pre-warms for 1.5 x the forecast of its next ramp too,
    or every forecast ramp would start a headroom short and be late again."""
    spec = make_spec(forecast="on", scaleDownStabilizationSeconds=0)
    q90 = Outlook(point_max=3.0, upper_max=4.0, model="test", horizon_s=210.0, made_at=T0)
    for headroom, expected in ((1.0, 4), (1.5, 6)):
        state = PolicyState(headroom_log=math.log(headroom))
        decision, _ = decide(spec, sig(T0, 8.0), state, T0, STALE, outlook=q90)
        assert decision is not None
        assert (decision.replicas, decision.reason) == (expected, Reason.FORECAST)
    assert "q90<=4.00 (test) x headroom 1.50 -> 6" in decision.detail


def test_panic_enters_when_need_outruns_the_forecast_interval() -> None:
    """With forecasting, a need more than a replica above the q90 forecast is panic too, however
    little it is against what was asked (the threshold is off here): the queue outran what the
    model expected, so its forecast cannot be trusted to hold the target for the next minute."""
    spec = make_spec(forecast="on", scaleDownStabilizationSeconds=0)
    state = PolicyState()
    q90 = Outlook(point_max=2.0, upper_max=3.0, model="test", horizon_s=210.0, made_at=T0)
    calm, state = decide(spec, sig(T0, 24.0), state, T0, STALE, outlook=q90)
    assert calm is not None and (calm.replicas, calm.reason) == (3, Reason.CURRENT_NEED)
    surge, state = decide(spec, sig(T0 + 5, 48.0), state, T0 + 5, STALE, outlook=q90)
    assert surge is not None and (surge.replicas, surge.reason) == (6, Reason.PANIC)
    assert "panic (need 6.00 vs 3 asked, q90 3.00)" in surge.detail
    # Demand back under the forecast at once: panic holds the peak, not the forecast's 3.
    held, state = decide(spec, sig(T0 + 40, 16.0), state, T0 + 40, STALE, outlook=q90)
    assert held is not None and (held.replicas, held.reason) == (6, Reason.PANIC)


def test_scale_down_removes_at_most_the_step_per_minute() -> None:
    spec = make_spec(scaleDownStabilizationSeconds=0, scaleDownMaxPercent=50)
    drive = Driver(spec)
    assert drive.outcome(T0, 160.0) == (20, True, Reason.CURRENT_NEED)
    assert drive.outcome(T0 + 5, 8.0) == (10, True, Reason.SCALE_DOWN_LIMIT)
    assert drive.outcome(T0 + 30, 8.0) == (10, True, Reason.SCALE_DOWN_LIMIT)
    assert drive.outcome(T0 + 61, 8.0) == (5, True, Reason.SCALE_DOWN_LIMIT)
    assert drive.outcome(T0 + 122, 8.0) == (3, True, Reason.SCALE_DOWN_LIMIT)
    assert drive.outcome(T0 + 183, 8.0) == (2, True, Reason.SCALE_DOWN_LIMIT)
    assert drive.outcome(T0 + 244, 8.0) == (1, True, Reason.CURRENT_NEED)


def test_scale_to_zero_is_not_held_by_the_step() -> None:
    spec = make_spec(
        scaleDownStabilizationSeconds=0, scaleDownMaxPercent=10, scaleToZeroIdleSeconds=60
    )
    drive = Driver(spec)
    drive.tick(T0, 160.0, arrival=1.0)
    assert drive.outcome(T0 + 61, 0.0, arrival=0.0) == (0, False, Reason.SCALE_TO_ZERO)


@pytest.mark.parametrize(("waiting", "ready"), [(0.0, 0), (0.5, 1)])
def test_a_request_waiting_without_a_loaded_service_time_never_lowers_the_need(
    waiting: float, ready: int
) -> None:
    # Found by the property below: with no service time reported or configured, Little's law's
    # S is only trusted while less than a request waits, so at one waiting request the queue
    # term used to vanish (and the replicas on its way with it): 3 -> 2. The queue term on that
    # S is now a floor under the concurrency term.
    spec = make_spec(panicThreshold=2, scaleDownMaxPercent=50)
    at = T0 + 5.0
    first = Signal(at=at, source="t", running=9.0, waiting=0.0, arrival_rate=1.0, ready_pods=0)
    _, state = decide(spec, first, PolicyState(), at, STALE)
    at += 5.0
    replicas = []
    for queued in (waiting, 1.0):
        signal = Signal(
            at=at, source="t", running=8.0, waiting=queued, arrival_rate=1.0, ready_pods=ready
        )
        decision, _ = decide(spec, signal, state, at, STALE)
        assert decision is not None
        replicas.append(decision.replicas)
    assert replicas[0] <= replicas[1]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    st.lists(
        st.tuples(LOAD, LOAD, st.floats(0, 50, allow_nan=False), st.integers(0, 30)),
        max_size=20,
    ),
    LOAD,
    LOAD,
    st.floats(0, 50, allow_nan=False),
    st.integers(0, 30),
    st.sampled_from((None, 0.5, 4.0)),
)
def test_more_waiting_never_gives_fewer_replicas_with_replicas_on_their_way(
    steps: list[tuple[float, float, float, int]],
    waiting_a: float,
    waiting_b: float,
    arrival: float,
    ready: int,
    service_s: float | None,
) -> None:
    tuning: dict[str, object] = {"panicThreshold": 2, "scaleDownMaxPercent": 50}
    if service_s is not None:
        tuning["serviceTimeSeconds"] = service_s
    spec = make_spec(**tuning)
    state, at = PolicyState(), T0
    for running, waiting, rate, pods in steps:
        at += 5.0
        signal = Signal(
            at=at,
            source="t",
            running=running,
            waiting=waiting,
            arrival_rate=rate,
            ready_pods=pods,
        )
        _, state = decide(spec, signal, state, at, STALE)
    at += 5.0
    results = []
    for waiting in sorted((waiting_a, waiting_b)):
        signal = Signal(
            at=at,
            source="t",
            running=8.0,
            waiting=waiting,
            arrival_rate=arrival,
            ready_pods=ready,
        )
        decision, _ = decide(spec, signal, state, at, STALE)
        assert decision is not None and 0 <= decision.replicas <= 100
        results.append(decision.replicas)
    assert results[0] <= results[1]


def test_the_forecast_learns_arrivals_times_the_service_time_of_minutes_not_of_the_tick() -> None:
    """Under continuous batching S grows with the batch: a fleet that shrinks and grows every
    minute reads S of 10 s, then 30 s. arrivals x that S would swing 5 <-> 15 replicas of
    "demand" with the fleet; the offered load uses the mean S over SERVICE_TIME_WINDOW_S."""
    spec = make_spec(targetConcurrency=10)
    state = PolicyState()
    offered = []
    for i in range(240):  # 20 minutes of 5 s ticks
        at = T0 + 5.0 * i
        s = 10.0 if (i // 12) % 2 == 0 else 30.0
        signal = Signal(
            at=at, source="test", waiting=0.0, running=5.0 * s, arrival_rate=5.0, service_time_s=s
        )
        decision, state = decide(spec, signal, state, at, STALE)
        assert decision is not None
        offered.append(decision.offered)
        assert decision.need == pytest.approx(5.0 * s / 10)  # the need still reads S now
    # Once the window is full: arrivals x the mean S (20 s) / 10, within a minute's swing.
    assert min(offered[120:]) >= 9.0 and max(offered[120:]) <= 11.0
    assert offered[0] == pytest.approx(5.0)  # the first tick knows only its own S


def test_a_scale_from_zero_offers_the_load_of_the_service_time_last_known() -> None:
    """Scaled to zero for longer than the S window, no server reports S, yet the next burst's
    requests arrive and wait a cold start. The offered load the forecaster learns is arrivals x
    the S last known, not 0 (it was 0 for the whole cold start: each burst learnt that late)."""
    spec = make_spec(targetConcurrency=10)
    state = PolicyState()
    at = T0
    for _ in range(60):  # five minutes serving: S 20 s, 5 arrivals/s
        signal = Signal(
            at=at, source="test", waiting=0.0, running=100.0, arrival_rate=5.0, service_time_s=20.0
        )
        _, state = decide(spec, signal, state, at, STALE)
        at += 5.0
    for _ in range(360):  # half an hour idle, nothing served
        _, state = decide(
            spec, Signal(at=at, source="test", waiting=0.0, running=0.0), state, at, STALE
        )
        at += 5.0
    waiting = Signal(at=at, source="test", waiting=20.0, running=0.0, arrival_rate=2.0)
    decision, _ = decide(spec, waiting, state, at, STALE)
    assert decision is not None
    assert decision.offered == pytest.approx(2.0 * 20.0 / 10)


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=120),
    window=st.sampled_from([5.0, 60.0, 300.0]),
    step=st.sampled_from([1.0, 5.0, 7.5]),
)
def test_the_monotone_window_gives_the_maximum_of_every_tick_within_it(
    values: list[int], window: float, step: float
) -> None:
    """The O(1) window (slices off the front and back) equals the definition: the highest value
    of the ticks within the window, for rising, falling and jagged needs alike."""
    from gpu_queue_scaler.decision.policy import _window_max, _window_max_push

    start_at = 1.8e9 + 0.1
    queue: tuple[tuple[float, int], ...] = ()
    for i, value in enumerate(values):
        at = start_at + i * step
        queue = _window_max_push(queue, at, value, at - window)
        within = [
            v for j, v in enumerate(values[: i + 1]) if start_at + j * step > at - window + 1e-3
        ]
        assert _window_max(queue, at - window) == max(within)
        # What the next tick reads (one step on) is the maximum of what is still inside then.
        later = at + step
        inside = [
            v for j, v in enumerate(values[: i + 1]) if start_at + j * step > later - window + 1e-3
        ]
        assert _window_max(queue, later - window) == max(inside, default=0)


FULL_TICKS = st.lists(
    st.tuples(
        st.one_of(st.none(), LOAD),  # running (None with waiting None: a missing signal)
        st.one_of(st.none(), st.floats(0, 200, allow_nan=False)),  # waiting
        st.one_of(st.none(), st.floats(0, 50, allow_nan=False)),  # arrivals
        st.one_of(st.none(), st.integers(0, 40)),  # ready pods
        st.one_of(st.none(), st.floats(0, 60, allow_nan=False)),  # forecast q90, in replicas
        st.sampled_from((5.0, 5.0, 30.0, 200.0)),  # seconds to this tick
    ),
    max_size=40,
)


@settings(PROPERTIES, max_examples=300)
@given(BOUNDS, TARGETS, FULL_TICKS)
def test_a_quiet_decision_is_the_same_decision_without_its_detail(
    bounds: tuple[int, int],
    target: float,
    ticks: list[tuple[float | None, float | None, float | None, int | None, float | None, float]],
) -> None:
    """A warm start replays with explain=False: its state must be the one a running replica
    built with explain=True, or the replica that just started decides differently."""
    spec = make_spec(
        minReplicas=bounds[0],
        maxReplicas=bounds[1],
        targetConcurrency=target,
        panicThreshold=2,
        scaleDownMaxPercent=50,
        scaleToZeroIdleSeconds=60,
        forecast="on",
    )
    loud, quiet, at = PolicyState(), PolicyState(), T0
    for running, waiting, arrival, ready, q90, dt in ticks:
        at += dt
        signal = None
        if running is not None or waiting is not None:
            signal = Signal(
                at=at,
                source="test",
                running=running,
                waiting=waiting,
                arrival_rate=arrival,
                ready_pods=ready,
                service_time_s=2.0 if arrival else None,
            )
        ahead = None if q90 is None else outlook_of(q90)
        said, loud = decide(spec, signal, loud, at, STALE, outlook=ahead)
        kept, quiet = decide(spec, signal, quiet, at, STALE, outlook=ahead, explain=False)
        if said is None or said.reason is Reason.HOLD:
            assert kept == said  # a held decision repeats the last good one, detail and all
        else:
            assert said.detail
            assert kept == said._replace(detail="")
        assert without_detail(quiet) == without_detail(loud)


def outlook_of(q90: float) -> Outlook:
    return Outlook(point_max=q90, upper_max=q90, model="test", horizon_s=210.0, made_at=T0)


def without_detail(state: PolicyState) -> PolicyState:
    last = state.last_good
    return state._replace(last_good=None if last is None else last._replace(detail=""))


# --- the need at the operating point ------------------------------------------------------------


def batched(at: float, arrival: float, alpha: float, beta: float, ready: int) -> Signal:
    """What a fleet of `ready` replicas shows in steady state under continuous batching, where a
    request holds a slot S(b) = alpha + beta x b at b requests per replica: b = arrival x S(b) /
    ready, so b = arrival x alpha / (ready - arrival x beta)."""
    batch = arrival * alpha / (ready - arrival * beta)
    return Signal(
        at=at,
        source="t",
        waiting=0.0,
        running=batch * ready,
        arrival_rate=arrival,
        ready_pods=ready,
        service_time_s=alpha + beta * batch,
    )


NEED_TOLERANCE = 0.05  # the ridge shrinks the slope by var / (var + ridge): a few percent here


@settings(PROPERTIES, max_examples=30)
@given(
    alpha=st.floats(2.0, 20.0),
    growth=st.floats(0.2, 3.0),  # S at the operating point over S of a lone request, less one
    arrival=st.floats(10.0, 60.0),
    sizes=st.lists(st.floats(1.15, 3.0), min_size=2, max_size=6, unique=True),
    last=st.tuples(st.floats(1.15, 3.0), st.floats(1.15, 3.0)),
)
def test_the_same_offered_load_read_from_fleets_of_any_size_gives_the_same_need(
    alpha: float,
    growth: float,
    arrival: float,
    sizes: list[float],
    last: tuple[float, float],
) -> None:
    """A short fleet batches more, so each request holds its slot longer: sized from the S it
    reads, the need would move with the fleet's own size. Sized from S at the operating point
    (fitted against the batch), fleets of 1.15x to 3x the need read the same need."""
    target = 40.0
    beta = growth * alpha / target
    expected = arrival * (alpha + beta * target) / target
    spec = make_spec(targetConcurrency=target, scaleDownStabilizationSeconds=0)

    def fleet_of(share: float) -> int:
        return max(1, math.ceil(share * expected + arrival * beta))

    assume(max(sizes) - min(sizes) >= 0.5 and expected >= 4.0)
    state = PolicyState()
    for i in range(60):  # ten minutes of 10 s ticks, the fleet's size moving every minute
        at = T0 + 10.0 * i
        size = fleet_of(sizes[(i // 6) % len(sizes)])
        _, state = decide(spec, batched(at, arrival, alpha, beta, size), state, at, STALE)
    needs = []
    for share in last:
        at = T0 + 600.0
        signal = batched(at, arrival, alpha, beta, fleet_of(share))
        decision, _ = decide(spec, signal, state, at, STALE)
        assert decision is not None and decision.need is not None
        needs.append(decision.need)
    assert needs[0] == pytest.approx(needs[1], rel=NEED_TOLERANCE)
    assert needs[0] == pytest.approx(expected, rel=NEED_TOLERANCE)


@settings(PROPERTIES, max_examples=30)
@given(
    alpha=st.floats(2.0, 20.0),
    growth=st.floats(0.2, 3.0),
    arrival=st.floats(10.0, 60.0),
    share=st.floats(1.15, 3.0),
    prompt=st.floats(50.0, 4000.0),  # tokens per request
    output=st.floats(10.0, 1000.0),
)
def test_with_token_capacities_any_fleet_reads_the_same_need_from_its_first_tick(
    alpha: float, growth: float, arrival: float, share: float, prompt: float, output: float
) -> None:
    """With token capacities configured and nothing waiting, the token counters are the flow: a
    fleet of any size serves the same tokens per second, so its need is the token work exactly,
    on a fresh state's first tick, before any fit of S against the batch (where arrival x the S
    this fleet shows would move with the fleet's size)."""
    target = 40.0
    beta = growth * alpha / target
    prefill, decode = 20_000.0, 4_000.0  # per replica at the target load
    work = arrival * prompt / prefill + arrival * output / decode
    spec = make_spec(
        targetConcurrency=target,
        prefillTokensPerSecond=prefill,
        decodeTokensPerSecond=decode,
        scaleDownStabilizationSeconds=0,
    )
    expected_s = alpha + beta * target
    ready = max(1, math.ceil(share * arrival * expected_s / target + arrival * beta))
    signal = batched(T0, arrival, alpha, beta, ready)._replace(
        prompt_tokens_rate=arrival * prompt, generation_tokens_rate=arrival * output
    )
    decision, _ = decide(spec, signal, PolicyState(), T0, STALE)
    assert decision is not None and decision.need is not None
    assert "littles_law" not in decision.detail
    # The queue term's backlog model compares the same work against the ready replicas, who
    # keep up with it here: no backlog is added whatever S this fleet shows.
    if work <= ready:
        assert decision.need == pytest.approx(work, rel=1e-9)
    else:
        assert decision.need >= work - 1e-9


def queue_seen(
    at: float, waiting: float, running: float, arrival_rate: float, ready: int
) -> Signal:
    """A fleet's signal at `at` with `waiting` queued (the queue tests' servers)."""
    queue = {"waiting": waiting, "running": running, "arrival_rate": arrival_rate}
    return Signal(at=at, source="t", ready_pods=ready, **queue)


def unqueued(spec: WorkloadSpec, shows: Callable[[float, float], Signal]) -> PolicyState:
    """The state after six observations 5 s apart from T0 with nothing waiting."""
    state = PolicyState()
    for i in range(6):
        _, state = decide(spec, shows(T0 + 5.0 * i, 0.0), state, T0 + 5.0 * i, STALE)
    return state


def test_a_request_waiting_a_moment_does_not_read_the_fleet_as_saturated() -> None:
    """A queue on servers running fewer than targetConcurrency means their own batch limit is
    reached: throughput is then what they run, and the backlog of a horizon at arrivals above it
    is asked for. A request that waits for one observation on a fleet running a third of its
    slots (a prefill scheduled behind another) is not that: read so, the long-context replay
    trace asked for a fifth node every few minutes that was gone before it served. A queue seen
    on two observations in a row still is, and so is a new one of a request per replica."""
    spec = make_spec(targetConcurrency=8, serviceTimeSeconds=10, scaleDownStabilizationSeconds=0)
    fleet_shows = functools.partial(queue_seen, running=91.0, arrival_rate=12.0, ready=32)
    state = unqueued(spec, fleet_shows)
    flow = 12.0 * 10.0 / 8.0  # 15 replicas
    before_queue = state
    moment, state = decide(spec, fleet_shows(T0 + 30.0, 1.0), state, T0 + 30.0, STALE)
    assert moment is not None and moment.need is not None
    assert moment.need < flow + 0.5  # the flow and the one request's drain, no backlog
    held, _ = decide(spec, fleet_shows(T0 + 35.0, 2.0), state, T0 + 35.0, STALE)
    assert held is not None and held.need is not None
    # 91 running complete 9.1/s against 12 arriving: 2.9/s x the horizon queue up
    assert held.need > flow + 3.0
    # A new queue of a request per ready replica or more is read as saturation at first sight
    # (every server may have one waiting): a surge is not met an observation late.
    deep, _ = decide(spec, fleet_shows(T0 + 30.0, 32.0), before_queue, T0 + 30.0, STALE)
    assert deep is not None and deep.need is not None and deep.need > flow + 3.0


def test_a_new_small_queue_on_a_fleet_at_its_target_asks_for_no_replica_more() -> None:
    """A fleet running at its targetConcurrency keeps its busy replicas while a queue drains,
    and the queue's growth says arrivals outrun it; a request or two that wait a moment on a
    KV-full fleet are neither. Read so, one waiting request on 40 replicas at 87 running each
    (target 86) asked for a 41st replica, a whole node of 8, on the demo trace. A queue seen
    twice is read as before: the busy replicas stay a floor under it."""
    spec = make_spec(targetConcurrency=86, serviceTimeSeconds=26, scaleDownStabilizationSeconds=0)
    fleet_shows = functools.partial(queue_seen, running=3489.0, arrival_rate=112.7, ready=40)
    state = unqueued(spec, fleet_shows)
    flow = 112.7 * 26.0 / 86.0  # 34.07 replicas
    moment, state = decide(spec, fleet_shows(T0 + 30.0, 2.0), state, T0 + 30.0, STALE)
    assert moment is not None and moment.need == pytest.approx(flow)
    assert moment.replicas == math.ceil(flow)
    held, _ = decide(spec, fleet_shows(T0 + 35.0, 5.0), state, T0 + 35.0, STALE)
    assert held is not None and held.need is not None and held.need >= 40.0


def test_the_token_counters_stay_the_flow_through_a_moments_queue() -> None:
    """With token capacities configured the counters are the flow while nothing waits; a queue
    brings arrivals x S back, since a short fleet serves less than arrives. A request or two
    waiting a moment on 48 replicas is not a short fleet: the counters still show what arrives.
    Read as arrivals x S (17% above the counters on the demo trace), one waiting request asked
    for a seventh node and held it for the stabilization window."""
    capacities = {"prefillTokensPerSecond": 20_000, "decodeTokensPerSecond": 4_000}
    spec = make_spec(targetConcurrency=86, serviceTimeSeconds=26, **capacities)
    tokens = {"prompt_tokens_rate": 160_000.0, "generation_tokens_rate": 132_000.0}  # 8 + 33

    def fleet_shows(at: float, waiting: float) -> Signal:
        plain = queue_seen(at, waiting, running=3895.0, arrival_rate=159.3, ready=48)
        return plain._replace(**tokens)

    state = unqueued(spec, fleet_shows)
    moment, state = decide(spec, fleet_shows(T0 + 30.0, 1.0), state, T0 + 30.0, STALE)
    assert moment is not None and moment.need == pytest.approx(41.0)
    held, _ = decide(spec, fleet_shows(T0 + 35.0, 3.0), state, T0 + 35.0, STALE)
    assert held is not None and held.need is not None
    assert held.need >= 159.3 * 26 / 86  # arrivals x S: 48.2


# --- headroom in closed loop on measured attainment ---------------------------------------------


WAIT_MEAN_S = 4.0  # the plant's waits: exponential with this mean for the requests that wait


def plant_queue_times(waiting_share: float) -> tuple[float, float]:
    """(mean, p99) of queue times when `waiting_share` of the requests wait, exponentially."""
    p99 = WAIT_MEAN_S * math.log(100.0 * waiting_share) if waiting_share > 0.01 else 0.0
    return waiting_share * WAIT_MEAN_S, p99


@pytest.mark.parametrize("share", [0.97, 0.99])
def test_closed_loop_attainment_converges_to_its_target(share: float) -> None:
    """A synthetic trace with a known answer: the servers show a steady need of 10 replicas, but
    the demand each window meets is uniform in 6-14 replicas; what exceeds the target the scaler
    set before it waits (the overflow's share of the requests, waits exponential with a 4 s
    mean), so the share of requests past the 2 s SLO is known in every window. Without headroom
    ~4.7% of the requests are late. The closed loop is an integral controller on the late share,
    so over a long run (its bounds not reached) the late share averages 1 - share."""
    import random

    spec = make_spec(
        queueTimeSloSeconds=2,
        sloAttainment=share,
        scaleDownStabilizationSeconds=0,
        scaleToZeroIdleSeconds=86400,
    )
    draw = random.Random(7)
    state, target, late_total, windows = PolicyState(), 10, 0.0, 0
    for i in range(30_000):  # ~3.5 days of 10 s ticks
        at = T0 + 10.0 * i
        demand = draw.uniform(6.0, 14.0)
        waiting = max(0.0, (demand - target) / demand)
        if i >= 3_000:  # after the loop has found its level
            windows += 1
            late_total += waiting * math.exp(-2.0 / WAIT_MEAN_S)
        mean, p99 = plant_queue_times(waiting)
        signal = Signal(
            at=at,
            source="t",
            running=80.0,
            waiting=0.0,
            queue_time_mean_s=mean,
            queue_time_p99_s=p99,
        )
        decision, state = decide(spec, signal, state, at, STALE, explain=False)
        assert decision is not None
        target = decision.replicas
    assert late_total / windows == pytest.approx(1.0 - share, abs=0.1 * (1.0 - share))
    assert 1.0 < math.exp(state.headroom_log) <= 1.4  # 11-14 replicas, never the bound
    explained, _ = decide(spec, signal, state, at + 10.0, STALE)
    assert explained is not None and "headroom" in explained.detail


def test_the_waits_of_a_scale_from_zero_are_not_learnt_as_headroom() -> None:
    """Requests that came while no replica served wait a cold start whatever the headroom. The
    minutes after the first replicas serve show those waits (every request late): the loop
    learns nothing from them, and the next burst is sized by its need alone. The same waits on
    a fleet that kept serving raise the headroom."""
    spec = make_spec(queueTimeSloSeconds=2, scaleToZeroIdleSeconds=60)
    mean, p99 = WAIT_MEAN_S, WAIT_MEAN_S * math.log(100.0)  # everyone waited, 4 s on average

    def run(from_zero: bool) -> tuple[float, str]:
        state, made = PolicyState(), None
        for i in range(12):  # a minute at zero, or serving, before the burst
            at = T0 + 5.0 * i
            ready = 0 if from_zero else 2
            signal = Signal(at, "t", running=0.0 if from_zero else 16.0, waiting=40.0,
                            arrival_rate=4.0, ready_pods=ready)  # fmt: skip
            made, state = decide(spec, signal, state, at, STALE)
        for i in range(12, 36):  # two minutes serving, the queue times showing the waits
            at = T0 + 5.0 * i
            signal = Signal(at, "t", running=16.0, waiting=0.0, arrival_rate=4.0, ready_pods=2,
                            queue_time_mean_s=mean, queue_time_p99_s=p99)  # fmt: skip
            made, state = decide(spec, signal, state, at, STALE)
        assert made is not None
        return math.exp(state.headroom_log), made.detail

    headroom, detail = run(from_zero=True)
    assert headroom == 1.0
    assert "a scale from zero's: not learnt" in detail
    served, _ = run(from_zero=False)
    assert served > 1.1


def test_a_surges_lateness_is_forgotten_once_the_fleet_catches_up_and_steady_lateness_is_not() -> (
    None
):
    """Two minutes of the same lateness (30% of requests past the SLO), then thirty on time with
    the fleet at its size. Late while replicas asked for were on their way (a ramp outran the
    cold start), the loop learns as much, so a burst that recurs soon finds the headroom; but
    that part fades over SURGE_MEMORY_S once the fleet has caught up: a single ramp does not
    hold x1.4 for the next hour. Late on a fleet at the size asked (the need is read short),
    the headroom stays, unlearnt only by the integral's slow pace."""
    spec = make_spec(
        queueTimeSloSeconds=2, coldStartSeconds=180, pollingIntervalSeconds=30, maxReplicas=40
    )
    late_times, on_time = plant_queue_times(0.5), plant_queue_times(0.0)

    def run(ready_while_late: int) -> tuple[float, float, str]:
        state, made = PolicyState(), None
        for i in range(192):
            at = T0 + 10.0 * i
            mean, p99 = late_times if i < 12 else on_time
            ready = ready_while_late if i < 12 else 20
            signal = Signal(at, "t", running=80.0, waiting=0.0, ready_pods=ready,
                            queue_time_mean_s=mean, queue_time_p99_s=p99)  # fmt: skip
            made, state = decide(spec, signal, state, at, STALE)
            if i == 11:
                learnt = math.exp(state.headroom_log)
                assert made is not None and made.late_share is not None
                assert made.headroom == pytest.approx(learnt)  # exported as it is applied
                assert made.late_share == pytest.approx(0.3, abs=0.02)
                surge, detail = made.headroom_surge, made.detail
        return learnt, math.exp(state.headroom_log), surge, detail

    surge_learnt, surge_left, surge_part, detail = run(ready_while_late=5)  # 10 needed, 5 ready
    steady_learnt, steady_left, steady_part, _ = run(ready_while_late=20)  # 10 needed, 20 ready
    assert surge_learnt > 1.25 and steady_learnt == pytest.approx(surge_learnt, abs=0.05)
    assert surge_part == pytest.approx(surge_learnt) and steady_part == 1.0
    assert "learnt while replicas were on their way" in detail
    assert surge_left < 1.06  # x1.37 * exp(-1800 / 900), less the integral's pace
    assert steady_left > 1.1  # the integral alone: ~20% off in 30 minutes
    assert surge_left - 1.0 < 0.5 * (steady_left - 1.0)


def test_the_headroom_covers_the_flow_and_not_the_drain_of_a_backlog() -> None:
    """A backlog is a known quantity: the replicas that drain it within the SLO are counted once.
    The headroom covers what is uncertain, the arrivals to come; multiplied onto the drain too, a
    ramp that outran the cold start (a backlog and a headroom raised by its lateness at once)
    asked for several nodes more than either needs."""
    spec = queue_spec()
    signal = Signal(
        at=T0, source="t", running=200.0, waiting=900.0, arrival_rate=70.0, ready_pods=24
    )
    needs = {}
    for headroom in (1.0, 1.5):
        made, _ = decide(spec, signal, PolicyState(headroom_log=math.log(headroom)), T0, STALE)
        assert made is not None and made.need is not None
        needs[headroom] = made.need
    flow = 70.0 * 5.0 / 8.0  # arrivals x S / targetConcurrency
    assert needs[1.0] > flow + 5.0  # the backlog's drain is in the need
    assert needs[1.5] - needs[1.0] == pytest.approx(0.5 * flow)


@pytest.mark.parametrize(
    ("waiting_share", "slo_s"), [(0.5, 2.0), (0.2, 1.0), (1.0, 3.0), (0.05, 8.0), (0.02, 0.5)]
)
def test_the_late_share_is_read_back_from_a_mean_and_a_p99(
    waiting_share: float, slo_s: float
) -> None:
    from gpu_queue_scaler.decision.policy import late_share

    mean, p99 = plant_queue_times(waiting_share)
    if waiting_share == 1.0:
        mean, p99 = WAIT_MEAN_S, WAIT_MEAN_S * math.log(100.0)
    expected = waiting_share * math.exp(-slo_s / WAIT_MEAN_S)
    # Two (pi, theta) fit one (mean, p99): the larger late share is taken, never a smaller one.
    assert late_share(mean, p99, slo_s) >= expected * (1 - 1e-6)
    assert late_share(mean, p99, slo_s) <= 3 * expected
    assert late_share(mean, p99, p99) == pytest.approx(0.01, rel=1e-6)
    assert late_share(0.0, 0.0, slo_s) == 0.0


ANY_VALUE = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(0, 1e3),
    st.sampled_from([0.0, 1e-300, 1e154, 1e308]),
)


def test_a_nan_arrival_rate_with_a_queue_term_gives_a_decision_not_a_crash() -> None:
    # A NaN arrival rate made the queue term's flow NaN: the term was dropped from the need but
    # its flow stayed the steady need the window remembers, and ceil(NaN) raised in decide.
    spec = make_spec(queueTimeSloSeconds=2, maxReplicas=50)
    signal = Signal(
        at=T0,
        source="t",
        waiting=0.0,
        arrival_rate=math.nan,
        service_time_s=1.0,
        kv_cache_usage=1.0,
        ready_pods=1,
    )
    decision, _ = decide(spec, signal, PolicyState(), T0, STALE)
    assert decision is not None and 0 <= decision.replicas <= 50


@settings(PROPERTIES, max_examples=300)
@given(
    st.lists(
        st.tuples(ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE, ANY_VALUE),
        min_size=1,
        max_size=30,
    ),
    st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_any_signal_gives_a_bounded_decision_or_a_hold(
    ticks: list[tuple[float | None, ...]], ready: int | None
) -> None:
    """Whatever the servers report (NaN, infinities, overflowing sums) into the operating-point
    fit and the late-share loop, decide answers within the bounds or holds, and never keeps a
    non-finite S or headroom."""
    spec = make_spec(queueTimeSloSeconds=2, maxReplicas=50)
    state = PolicyState()
    for i, (running, waiting, arrival, s, mean, p99, kv) in enumerate(ticks):
        at = T0 + 5.0 * i
        signal = Signal(
            at=at,
            source="t",
            running=running,
            waiting=waiting,
            arrival_rate=arrival,
            service_time_s=s,
            queue_time_mean_s=mean,
            queue_time_p99_s=p99,
            kv_cache_usage=kv,
            ready_pods=ready,
        )
        decision, state = decide(spec, signal, state, at, STALE)
        if decision is not None:
            assert 0 <= decision.replicas <= 50
        assert math.isfinite(state.headroom_log) and 0.0 <= state.headroom_log <= math.log(1.6)
        for bucket in state.service_fit:
            assert all(math.isfinite(v) for v in bucket[1:])


# --- whole nodes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("in_flight", "per_node", "max_replicas", "replicas"),
    [
        (74.0, 8, 100, 16),  # need 9.25 -> 10 -> two nodes of 8
        (64.0, 8, 100, 8),  # exactly one node: unchanged
        (74.0, 8, 12, 12),  # within maxReplicas, even if that leaves a node part-filled
        (74.0, 1, 100, 10),  # the default: no rounding
        (74.0, 4, 100, 12),
    ],
)
def test_targets_round_up_to_whole_nodes(
    in_flight: float, per_node: int, max_replicas: int, replicas: int
) -> None:
    # A node is billed whole: the replicas that fill one already asked for cost nothing.
    spec = make_spec(replicasPerNode=per_node, maxReplicas=max_replicas)
    decision = Driver(spec).tick(T0, in_flight)
    assert decision is not None
    assert decision.replicas == replicas
    if replicas % per_node == 0 and per_node > 1 and in_flight / 8 % per_node:
        assert "rounded up to whole nodes of" in decision.detail


def test_a_scale_down_that_empties_no_node_or_leaves_no_tenth_spare_is_not_made() -> None:
    # 13 replicas' worth of need falls to 9 after the window: both fit two nodes of 8, so the
    # target stays 16 (releasing 4 replicas frees no node). At 7.5 a node could go, but the
    # need swings tick to tick on steady traffic: emptied with 8 left, the node would be asked
    # for again on the next swing, a cold start late; it is kept while the need is within 10%
    # of the replicas left. At 7 it goes, and an idle workload still goes to zero.
    drive = Driver(make_spec(replicasPerNode=8, scaleDownStabilizationSeconds=60))
    assert drive.outcome(T0, 13 * 8.0) == (16, True, Reason.CURRENT_NEED)
    at = T0
    for need, replicas in ((9.0, 16), (7.5, 16), (7.0, 8)):
        for _ in range(20):
            at += 10.0
            decision = drive.tick(at, need * 8.0)
        assert decision is not None and decision.replicas == replicas, (need, decision)
        kept = "a node kept: the 8 left would be over 90% full (8 needed) -> 16"
        assert (kept in decision.detail) == (need == 7.5), decision.detail
    for _ in range(30):
        at += 30.0
        decision = drive.tick(at, 0.0)
    assert decision is not None and decision.replicas == 0 and not decision.active


@pytest.mark.parametrize("raw", ["0", "65", "1.5", "eight"])
def test_replicas_per_node_out_of_range_names_the_key(raw: str) -> None:
    with pytest.raises(ValueError, match="replicasPerNode") as caught:
        make_spec(replicasPerNode=raw)
    assert "an integer from 1 to 64" in str(caught.value)
