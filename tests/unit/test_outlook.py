"""The forecast in the decision: outlook binning, sizing for the horizon, no scale to zero while
traffic is forecast, and activation ahead of a predicted ramp."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_queue_scaler.decision.outlook import NeedForecast, Outlook
from gpu_queue_scaler.decision.policy import PolicyState, Reason, decide
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources.synthetic import synthetic_signal

T0 = 1_800_000_000.0  # a multiple of every period and step used here


def spec(**metadata: str) -> WorkloadSpec:
    base = {"backend": "synthetic", "targetConcurrency": "4", "forecast": "on"}
    return resolve(parse_trigger("team-a", "llama", {**base, **metadata}), Config())


def outlook(upper: float, point: float | None = None) -> Outlook:
    return Outlook(
        point_max=upper if point is None else point,
        upper_max=upper,
        model="holt_damped",
        horizon_s=210.0,
        made_at=T0,
    )


def busy(in_flight: float, at: float = T0) -> Signal:
    return Signal(at=at, source="test", running=in_flight, waiting=0.0, arrival_rate=1.0)


def idle(at: float) -> Signal:
    return Signal(at=at, source="test", running=0.0, waiting=0.0, arrival_rate=0.0)


def test_outlook_bins_on_the_wall_clock_and_sees_a_ramp():
    forecast = NeedForecast(step_s=10.0, horizon_s=60.0, period_s=None)
    assert forecast.observe(T0, 1.0) is None  # no bin closed yet
    result = None
    for i in range(1, 60):
        result = forecast.observe(T0 + 10.0 * i, 1.0 + 0.5 * i)  # need rises 0.5 per bin
    assert result is not None and result.made_at == T0 + 590.0
    assert result.upper_max >= result.point_max > 30.0  # ahead of the last closed bin (29.5)
    twin = NeedForecast(step_s=10.0, horizon_s=60.0, period_s=None)
    for i in range(60):
        twin.observe(T0 + 10.0 * i, 1.0 + 0.5 * i)
    assert twin.outlook == result  # deterministic: same inputs, same outlook


def test_gaps_are_missing_not_zero():
    forecast = NeedForecast(step_s=10.0, horizon_s=30.0, period_s=None)
    for i in range(30):
        forecast.observe(T0 + 10.0 * i, 5.0)
    after_gap = forecast.observe(T0 + 10.0 * 40, None)  # ten empty bins: NaN, state kept
    assert after_gap is not None and after_gap.point_max == 5.0


def test_target_covers_the_upper_forecast_within_the_horizon():
    decision, _ = decide(spec(), busy(8.0), PolicyState(), T0, 600.0, outlook=outlook(6.2))
    assert decision is not None
    assert (decision.replicas, decision.reason) == (7, Reason.FORECAST)  # need now is 2
    assert "q90<=6.20" in decision.detail
    reactive, _ = decide(
        spec(forecast="off"), busy(8.0), PolicyState(), T0, 600.0, outlook=outlook(6.2)
    )
    assert reactive is not None and (reactive.replicas, reactive.reason) == (2, Reason.CURRENT_NEED)


def test_no_scale_to_zero_while_the_forecast_expects_traffic():
    workload = spec(scaleToZeroIdleSeconds="60", scaleDownStabilizationSeconds="0")
    state = PolicyState()
    _, state = decide(workload, busy(4.0, T0), state, T0, 600.0)
    later = T0 + 600.0
    expecting, _ = decide(workload, idle(later), state, later, 600.0, outlook=outlook(0.5))
    assert expecting is not None
    assert (expecting.replicas, expecting.active, expecting.reason) == (1, True, Reason.FORECAST)
    quiet, _ = decide(workload, idle(later), state, later, 600.0, outlook=outlook(0.1))
    assert quiet is not None  # q90 of 0.1 replica x 4 per replica = 0.4 request: below one
    assert (quiet.replicas, quiet.active, quiet.reason) == (0, False, Reason.SCALE_TO_ZERO)


def run_wave(forecast: str, until: float) -> dict[float, tuple[int, bool, str]]:
    """A burst every 200 s (busy the first half, idle the second), decided every 5 s."""
    workload = spec(
        forecast=forecast,
        syntheticPattern="wave",
        syntheticPeriodSeconds="200",
        syntheticPeakRps="8",
        syntheticServiceSeconds="2",
        forecastStepSeconds="5",
        seasonPeriodSeconds="200",
        horizonSeconds="40",
        scaleToZeroIdleSeconds="20",
        scaleDownStabilizationSeconds="0",
        scaleDownMaxPercent="100",
    )
    state = PolicyState()
    need = NeedForecast(workload.forecast_step_s, workload.horizon_s, workload.season_period_s)
    seen: dict[float, tuple[int, bool, str]] = {}
    at = T0
    while at <= T0 + until:
        decision, state = decide(
            workload, synthetic_signal(workload, at), state, at, 600.0, outlook=need.outlook
        )
        assert decision is not None
        need.observe(at, decision.demand)  # as the engine feeds it
        seen[at - T0] = (decision.replicas, decision.active, decision.reason.value)
        at += 5.0
    return seen


def test_activation_ahead_of_a_predicted_ramp():
    """After a few periods the seasonal forecaster expects the next burst: the workload turns
    active (KEDA starts scaling from zero) before any request arrives, while the reactive policy
    is still at zero."""
    until = 8 * 200.0
    ahead = run_wave("on", until)
    reactive = run_wave("off", until)
    last_start = 7 * 200.0  # the last burst begins here (synthetic phase 0)
    just_before = [t for t in ahead if last_start - 40.0 < t < last_start]
    assert just_before, "no ticks in the horizon before the burst"
    assert any(ahead[t][1] and ahead[t][2] == "forecast" for t in just_before), {
        t: ahead[t] for t in just_before
    }
    assert all(reactive[t] == (0, False, "scale_to_zero") for t in just_before)
    # And it does not keep the fleet up through the whole idle half either.
    mid_idle = last_start - 80.0
    assert ahead[mid_idle][0] <= 1


def test_forecast_never_makes_a_target_nan_or_negative():
    for upper in (0.0, 1e-12, 3.999999999, 1e6):
        decision, _ = decide(spec(), busy(1.0), PolicyState(), T0, 600.0, outlook=outlook(upper))
        assert decision is not None
        assert 0 <= decision.replicas <= 100 and not math.isnan(decision.need or 0.0)


# --- properties of the whole rule with a forecast ------------------------------------------------

need_values = st.floats(min_value=0.0, max_value=500.0, allow_nan=False)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(
    bounds=st.tuples(st.integers(0, 5), st.integers(1, 60)).filter(lambda b: b[0] <= b[1]),
    in_flight=need_values,
    upper=need_values,
    idle_for=st.floats(min_value=0.0, max_value=1000.0),
)
def test_targets_stay_in_bounds_and_finite_with_any_outlook(bounds, in_flight, upper, idle_for):
    lo, hi = bounds
    workload = spec(minReplicas=str(lo), maxReplicas=str(hi), scaleToZeroIdleSeconds="60")
    state = PolicyState(last_busy_at=T0 - idle_for, first_at=T0 - 2000.0)
    decision, _ = decide(
        workload, busy(in_flight), state, T0, 600.0, outlook=outlook(upper, point=upper / 2)
    )
    assert decision is not None
    assert lo <= decision.replicas <= hi
    assert decision.active == (decision.replicas > 0)


@settings(max_examples=300, derandomize=True, deadline=None)
@given(in_flight=need_values, more=need_values, upper=need_values, more_upper=need_values)
def test_more_demand_or_a_higher_forecast_never_gives_fewer_replicas(
    in_flight, more, upper, more_upper
):
    workload = spec(maxReplicas="1000")
    base, _ = decide(workload, busy(in_flight), PolicyState(), T0, 600.0, outlook=outlook(upper))
    bigger, _ = decide(
        workload,
        busy(in_flight + more),
        PolicyState(),
        T0,
        600.0,
        outlook=outlook(upper + more_upper),
    )
    assert base is not None and bigger is not None
    assert bigger.replicas >= base.replicas
