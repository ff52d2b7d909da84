"""The period found in a workload's own demand (`seasonPeriodSeconds: auto`) and the forecast
that wakes an idle workload ahead of a recurring ramp (`forecast: wake`, the default).

A recurring burst, as a cron-driven batch job sends it: 10 minutes of 2 requests a second, then
30 minutes of nothing. A replica takes a cold start to serve, so a reactive scaler meets every
burst a cold start late; the forecast, once it has found the period and seen it once, brings the
workload back before the burst, and stays out of the decision while the workload is busy."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pytest

from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.outlook import NeedForecast, Outlook
from gpu_queue_scaler.decision.policy import PolicyState, Reason, decide
from gpu_queue_scaler.decision.season import HISTORY_S, Season
from gpu_queue_scaler.forecast.period import autocorrelation, find_period
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import TriggerError, parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler_bench.sim import policies

T0 = 1_800_000_000.0  # a multiple of 2400 s: the bursts start on the minute
PERIOD_S = 2400.0
BURST_S = 600.0
INTERVAL = 5.0


def bursts(n: int, period: int = 240, width: int = 60, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return np.where(t % period < width, 5.0 + rng.normal(0.0, 0.5, n), 0.0)


# --- find_period ----------------------------------------------------------------------------------


def test_a_recurring_burst_is_found_once_its_shift_overlaps_the_series_enough() -> None:
    assert find_period(bursts(359), min_lag=60, min_overlap=120) is None  # 240 + 120 not covered
    found = find_period(bursts(361), min_lag=60, min_overlap=120)
    assert found is not None and found[0] == 240 and found[1] > 0.8
    long = find_period(bursts(2000), min_lag=60, min_overlap=120)
    assert long is not None and long[0] == 240  # not a multiple: 480 and 720 peak as high


def test_a_cycle_is_found_through_noise_and_missing_points() -> None:
    rng = np.random.default_rng(1)
    t = np.arange(600)
    series = 5.0 + 3.0 * np.sin(2 * np.pi * t / 90) + rng.normal(0.0, 0.7, t.size)
    series[rng.random(t.size) < 0.1] = math.nan
    found = find_period(series, min_lag=20, min_overlap=60)
    assert found is not None and abs(found[0] - 90) <= 2  # within a few percent


@pytest.mark.parametrize(
    "series",
    [
        np.random.default_rng(2).normal(5.0, 1.0, 1000),  # noise
        np.linspace(0.0, 10.0, 1000) + np.random.default_rng(3).normal(0.0, 0.5, 1000),  # ramp
        np.full(1000, 3.0),  # constant
        np.full(1000, math.nan),  # nothing known
        np.zeros(0),
    ],
    ids=["noise", "ramp", "constant", "all-missing", "empty"],
)
def test_traffic_without_a_recurrence_has_no_period(series: np.ndarray) -> None:
    assert find_period(series, min_lag=20, min_overlap=60) is None


def test_the_autocorrelation_is_one_at_lag_zero_and_zero_for_a_constant() -> None:
    r = autocorrelation(bursts(500))
    assert r[0] == pytest.approx(1.0) and r[120] < 0.0 < r[240]
    assert not autocorrelation(np.full(50, 2.0)).any()


# --- Season -------------------------------------------------------------------------------------


def demand_at(at: float) -> float:
    return 5.0 if (at - T0) % PERIOD_S < BURST_S else 0.0


def test_the_season_finds_the_period_once_and_keeps_it() -> None:
    season = Season(10.0, search=True)
    changes = []
    rng = np.random.default_rng(4)
    for k in range(round(6 * PERIOD_S / INTERVAL)):
        at = T0 + k * INTERVAL
        noisy = demand_at(at) * (1.0 + 0.1 * rng.normal())
        if season.observe(at, noisy):
            changes.append((at - T0, season.period_s))
    assert changes and changes[0][1] == PERIOD_S
    assert len(changes) == 1, changes  # found once; it does not flap between near-equal lags
    assert changes[0][0] <= PERIOD_S + BURST_S + 1200.0  # as soon as the overlap allows
    assert season.covers(PERIOD_S) and not season.covers(3 * PERIOD_S)


def test_the_period_is_read_from_the_arrivals_when_late_bursts_shift_the_demand() -> None:
    """Every other burst met a cold start late: its demand (what is served) comes 240 s after
    its arrivals. The demand alone recurs every two periods; what clients send recurs every
    one, and that is the period the wake must read."""

    def served(at: float) -> float:
        shift = 240.0 if int((at - T0) // PERIOD_S) % 2 else 0.0
        return demand_at(at - shift) if (at - T0) % PERIOD_S >= shift else 0.0

    by_demand, by_arrivals = Season(10.0, search=True), Season(10.0, search=True)
    for k in range(round(6 * PERIOD_S / INTERVAL)):
        at = T0 + k * INTERVAL
        by_demand.observe(at, served(at))
        by_arrivals.observe(at, served(at), 0.4 * demand_at(at))
    assert by_demand.period_s == 2 * PERIOD_S  # no arrival rate known: the demand's own period
    assert by_arrivals.period_s == PERIOD_S


def test_the_history_is_bounded_and_a_long_gap_restarts_it() -> None:
    season = Season(10.0, search=True)
    size = round(HISTORY_S / 10.0)
    tracemalloc.start()
    try:
        for k in range(round(3 * HISTORY_S / 30.0)):  # three times the history, a tick per 30 s
            season.observe(T0 + 30.0 * k, demand_at(T0 + 30.0 * k))
            if k == 100:
                before = tracemalloc.get_traced_memory()[0]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert season.history().size == size and grown < 64_000
    assert season.period_s == PERIOD_S
    later = T0 + 30.0 * 3 * HISTORY_S / 30.0 + 10.0 * 20_000  # 20,000 bins without a tick
    season.observe(later, 1.0)
    assert not season.covers(10.0) and season.history().size == 0
    assert season.period_s == PERIOD_S  # a pattern that pauses keeps its period


def test_a_forecast_seat_replayed_from_the_season_forecasts_as_one_fed_live() -> None:
    """A period found with `forecast: on` starts a new forecaster seat on the history the season
    holds (`replay_into`): bins, gaps and the open bin's demand so far. It then forecasts
    exactly as a seat fed the same ticks live would have."""
    season = Season(10.0, search=True)
    live = NeedForecast(10.0, 210.0, PERIOD_S)
    at = T0
    while at < T0 + 2 * PERIOD_S + 7.0:  # ends inside a bin, a minute-long gap on the way
        demand = None if T0 + 1000.0 <= at < T0 + 1060.0 else demand_at(at)
        season.observe(at, demand)
        live.observe(at, demand)
        at += INTERVAL
    replayed = NeedForecast(10.0, 210.0, PERIOD_S)
    season.replay_into(replayed)
    assert (replayed.bin, replayed.total, replayed.count) == (live.bin, live.total, live.count)
    for _ in range(3):  # the next bins close alike
        at += 10.0
        assert replayed.observe(at, 5.0) == live.observe(at, 5.0)


# --- the decision -------------------------------------------------------------------------------


def spec(**extra: str) -> WorkloadSpec:
    metadata = policies.scaler_metadata(8.0, 2.0, 180.0, 16, {"scaleToZeroIdleSeconds": "120"})
    metadata.update(extra)
    return resolve(parse_trigger("team-a", "batch", metadata), Config())


def run(workload: WorkloadSpec, periods: int) -> list[tuple[float, int, Reason]]:
    """(time into the trace, target, reason) per tick of a decider whose fleet follows its
    target a cold start later (replicas asked at t serve from t + 180 s)."""
    decider = Decider(workload)
    asked: list[tuple[float, int]] = []
    out = []
    for k in range(round(periods * PERIOD_S / INTERVAL)):
        at = T0 + k * INTERVAL
        ready = max([n for t, n in asked if t <= at - 180.0], default=0)
        asked = [(t, n) for t, n in asked if t > at - 180.0] + [(at - 180.0, ready)]
        rate = 2.0 * demand_at(at) / 5.0
        in_flight = rate * 4.0  # S = 4 s
        running = min(in_flight, ready * 8.0)
        signal = Signal(
            at,
            "scrape",
            waiting=in_flight - running,
            running=running,
            arrival_rate=rate,
            queue_time_mean_s=0.0,
            queue_time_p99_s=0.0,
            ready_pods=ready,
            service_time_s=4.0,
        )
        decision = decider.tick(signal, at)
        assert decision is not None
        asked.append((at, decision.replicas))
        out.append((at - T0, decision.replicas, decision.reason))
    decider.release()
    return out


def before_burst(ticks: list[tuple[float, int, Reason]], burst: int) -> int:
    """The target 60 s before burst `burst` (counted from 0) starts."""
    at = burst * PERIOD_S - 60.0
    return next(target for t, target, _ in ticks if t >= at)


def test_wake_brings_an_idle_workload_back_before_a_recurring_burst() -> None:
    woken = run(spec(), 5)  # the defaults: forecast wake, seasonPeriodSeconds auto
    reactive = run(spec(forecast="off"), 5)
    assert [before_burst(reactive, b) for b in (1, 2, 3, 4)] == [0, 0, 0, 0]
    # Not before the period is found (its shift must overlap the series by 20 minutes, so the
    # second burst comes first); from then on, back before every burst, the third included.
    assert before_burst(woken, 1) == 0
    assert all(before_burst(woken, b) >= 1 for b in (2, 3, 4))
    assert all(
        target == 0 for t, target, _ in woken if 2 * PERIOD_S - 900 <= t < 2 * PERIOD_S - 600
    )


def signal_at(at: float) -> Signal:
    """What a server shows at `at` on the recurring burst: 2 requests a second for 10 minutes
    (S = 4 s, one replica of 8 slots busy), then nothing."""
    rate = 2.0 * demand_at(at) / 5.0
    return Signal(
        at,
        "scrape",
        waiting=0.0,
        running=rate * 4.0,
        arrival_rate=rate,
        queue_time_mean_s=0.0,
        queue_time_p99_s=0.0,
        ready_pods=1 if rate else 0,
        service_time_s=4.0 if rate else None,
    )


def test_a_restarted_decider_recalls_the_season_and_wakes_for_the_next_burst() -> None:
    """A scaler restarted 20 minutes before the fifth burst: after its first tick the warm start
    recalls the hours its season lacks (`Decider.missing`) on a minute's grid
    (`Decider.recall`). With the recall it finds the period and wakes for the burst; without
    it (what a restart knew before), it does not, and the burst waits a cold start."""
    restart = T0 + 5 * PERIOD_S - 1200.0
    before = restart + 1200.0 - 60.0
    targets = {}
    for recalled in (True, False):
        decider = Decider(spec())
        decider.tick(signal_at(restart), restart)
        missing = decider.missing()
        assert missing is not None and missing[1] - missing[0] >= HISTORY_S - 60.0
        if recalled:
            start = max(T0, missing[0])
            decider.recall([signal_at(t) for t in np.arange(start, missing[1], 60.0)])
            assert decider.season is not None and decider.season.period_s == PERIOD_S
            assert decider.missing() is None or decider.missing()[1] <= start
        at, made = restart + INTERVAL, None
        while at < before:
            made = decider.tick(signal_at(at), at)
            at += INTERVAL
        assert made is not None
        targets[recalled] = made
        decider.release()
    woken, cold = targets[True], targets[False]
    assert woken.replicas >= 1 and woken.reason is Reason.FORECAST, woken.detail
    assert cold.replicas == 0 and "no period found in the demand yet" in cold.detail


def test_wake_leaves_a_busy_workload_to_its_need() -> None:
    woken = run(spec(), 5)
    busy = [(t, reason) for t, _, reason in woken if (t % PERIOD_S) < BURST_S + 300.0]
    assert busy and all(reason is not Reason.FORECAST for t, reason in busy if t % PERIOD_S > 300)


def test_the_policy_reads_the_forecast_only_for_a_quiet_workload_in_wake_mode() -> None:
    workload = spec()
    outlook = Outlook(point_max=3.0, upper_max=4.0, model="SeasonalNaive", horizon_s=210.0,
                      made_at=T0)  # fmt: skip
    quiet = Signal(T0, "scrape", waiting=0.0, running=0.0, arrival_rate=0.0, ready_pods=0)
    woken, _ = decide(workload, quiet, PolicyState(), T0, 60.0, outlook=outlook)
    assert woken is not None and woken.replicas == 4 and woken.reason is Reason.FORECAST
    busy = Signal(T0, "scrape", waiting=0.0, running=8.0, arrival_rate=2.0, ready_pods=1)
    state = PolicyState()
    for k in range(3):
        with_outlook, _ = decide(workload, busy, state, T0 + 5.0 * k, 60.0, outlook=outlook)
        without, state = decide(workload, busy, state, T0 + 5.0 * k, 60.0)
        assert with_outlook is not None and without is not None
        assert (
            with_outlook.replicas == without.replicas and with_outlook.reason is not Reason.FORECAST
        )
    on = spec(forecast="on")
    sized, _ = decide(
        on, busy, PolicyState(), T0, 60.0, outlook=Outlook(9.0, 9.0, "Naive", 210.0, T0)
    )
    assert sized is not None and sized.replicas == 9  # `on` sizes a busy workload by it too


# --- settings -----------------------------------------------------------------------------------


def test_season_and_forecast_settings() -> None:
    default = spec()
    assert default.forecast and default.forecast_wakes_only and default.season_auto
    assert default.season_period_s == 86400.0  # until the demand shows another
    fixed = spec(seasonPeriodSeconds="3600", forecast="on")
    assert fixed.season_period_s == 3600.0 and not fixed.season_auto
    assert not fixed.forecast_wakes_only
    assert spec(seasonPeriodSeconds="0").season_period_s is None
    assert not spec(forecast="off").forecast
    for key, value in (("seasonPeriodSeconds", "daily"), ("forecast", "sometimes")):
        metadata = policies.scaler_metadata(8.0, 2.0, 180.0, 16, {key: value})
        with pytest.raises(TriggerError) as info:
            parse_trigger("team-a", "batch", metadata)
        text = str(info.value)
        assert key in text and repr(value) in text and "accepted" in text


def test_explain_says_why_wake_did_not_read_the_forecast() -> None:
    quiet = Signal(T0, "scrape", waiting=0.0, running=0.0, arrival_rate=0.0, ready_pods=0)
    decider = Decider(spec())
    made = decider.tick(quiet, T0)
    assert made is not None
    assert "forecast (wake) not read: no period found in the demand yet" in made.detail
    fixed = Decider(spec(seasonPeriodSeconds="2400")).tick(quiet, T0)
    assert fixed is not None
    assert "not read until a period is seen: period 2400s (set)" in fixed.detail
    daily = Decider(spec(seasonPeriodSeconds="86400")).tick(quiet, T0)
    assert daily is not None and "two periods of 86400s do not fit" in daily.detail
    off = Decider(spec(seasonPeriodSeconds="0")).tick(quiet, T0)
    assert off is not None and "no season (seasonPeriodSeconds=0)" in off.detail
    reactive = Decider(spec(forecast="off")).tick(quiet, T0)
    assert reactive is not None and "wake" not in reactive.detail
    decider.release()


def test_wake_reads_the_forecast_for_a_horizon_after_the_workload_was_last_quiet() -> None:
    """The burst a wake foresaw arrives while the replicas it woke still load: the forecast is
    read for a horizon after the last quiet tick, so they are not let go at the burst's start."""
    workload = spec()
    outlook = Outlook(point_max=3.0, upper_max=4.0, model="SeasonalMax", horizon_s=210.0,
                      made_at=T0)  # fmt: skip
    quiet = Signal(T0, "scrape", waiting=0.0, running=0.0, arrival_rate=0.0, ready_pods=0)
    woken, state = decide(workload, quiet, PolicyState(), T0, 60.0, outlook=outlook)
    assert woken is not None and woken.replicas == 4
    # `scaler explain` says what the numbers are: the demand seen, not a quantile.
    assert "a period ago<=3.00, one or two periods ago<=4.00 (SeasonalMax)" in woken.detail
    assert "q90" not in woken.detail
    busy = Signal(T0, "scrape", waiting=0.0, running=8.0, arrival_rate=2.0, ready_pods=1)
    at = T0
    read = []
    while at < T0 + workload.horizon_s + 30.0:
        at += 5.0
        made, state = decide(workload, busy, state, at, 60.0, outlook=outlook)
        assert made is not None
        read.append((at - T0, made.outlook is not None))
    assert all(seen for t, seen in read if t < workload.horizon_s)
    assert not any(seen for t, seen in read if t >= workload.horizon_s)


def test_the_season_outlook_is_the_demand_one_and_two_periods_ago() -> None:
    season = Season(10.0, search=False, keep=True)
    at = T0
    while at < T0 + PERIOD_S - 300.0:  # a period less five minutes: not yet
        season.observe(at, demand_at(at))
        at += INTERVAL
    assert season.outlook(PERIOD_S, 210.0) is None
    while at < T0 + 2 * PERIOD_S - 180.0:  # one period seen: the burst of one period ago
        season.observe(at, demand_at(at))
        at += INTERVAL
    once = season.outlook(PERIOD_S, 210.0)
    assert once is not None and once.point_max == once.upper_max == 5.0
    while at < T0 + 3 * PERIOD_S - 180.0:  # the fourth burst is 180 s ahead: within 210 s
        season.observe(at, demand_at(at))
        at += INTERVAL
    ahead = season.outlook(PERIOD_S, 210.0)
    assert ahead is not None and ahead.point_max == ahead.upper_max == 5.0
    early = season.outlook(PERIOD_S, 120.0)  # a shorter horizon does not reach the burst yet
    assert early is not None and early.upper_max == 0.0
    # The fourth burst does not come: before the fifth the point drops it, the bound still
    # holds the third's; a period later both have.
    while at < T0 + 4 * PERIOD_S - 180.0:
        season.observe(at, 0.0)
        at += INTERVAL
    ahead = season.outlook(PERIOD_S, 210.0)
    assert ahead is not None and ahead.point_max == 0.0 and ahead.upper_max == 5.0
    while at < T0 + 5 * PERIOD_S - 180.0:
        season.observe(at, 0.0)
        at += INTERVAL
    ahead = season.outlook(PERIOD_S, 210.0)
    assert ahead is not None and ahead.point_max == ahead.upper_max == 0.0
