"""The engine's scheduling: evaluations take turns on the event loop, each workload ticks on its
own phase of a wall-clock grid and decides at once, warm starts are admitted in order and replay
in slices, and a workload no longer asked for ends its loop and gives its forecast row back.
Time is the test's (`ManualClock`) wherever the engine ticks."""

from __future__ import annotations

import ast
import asyncio
import math
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest

from gpu_queue_scaler.decision import decider as decider_module
from gpu_queue_scaler.decision.policy import Decision, Reason
from gpu_queue_scaler.engine import Engine, schedule
from gpu_queue_scaler.engine.schedule import (
    PHASE_SLOTS,
    PHASE_SPREAD,
    SEASON_RECALL_STEP_S,
    phase_of,
    recall_segment,
    tick_after,
    tick_at_or_before,
)
from gpu_queue_scaler.engine.turns import Turnstile
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError
from gpu_queue_scaler.sources.synthetic import SyntheticSource
from gpu_queue_scaler_bench.load.polls import trigger_metadata
from tests.conftest import ManualClock, poll, synthetic


async def test_turnstile_lets_one_waiter_through_per_loop_iteration() -> None:
    """The engine's evaluations take turns (gpu_queue_scaler.engine.turns.Turnstile): between two of
    them the event loop runs everything else that is ready, so a burst of ticks cannot starve
    RPCs."""
    turns = Turnstile()
    order: list[str] = []

    async def evaluation(name: str) -> None:
        await turns.take()
        order.append(name)

    async def rpc() -> None:  # something else ready on the loop, one step per iteration
        for step in range(3):
            order.append(f"rpc{step}")
            await asyncio.sleep(0)

    cancelled = asyncio.create_task(evaluation("x"))
    tasks = [asyncio.create_task(evaluation(n)) for n in "abc"]
    await asyncio.sleep(0)
    cancelled.cancel()  # a cancelled waiter gives its turn away
    await asyncio.gather(rpc(), *tasks)
    assert [o for o in order if not o.startswith("rpc")] == ["a", "b", "c"]
    # each evaluation ran in an iteration of its own, interleaved with the other task's steps
    between = [order.index(n) for n in "abc"]
    assert all(later - earlier >= 2 for earlier, later in pairwise(between)), order


def test_phases_are_stable_spread_and_below_the_spread() -> None:
    """Each workload ticks at its own phase of the interval
    (gpu_queue_scaler.engine.schedule.phase_of): the same in every replica and restart (a stable
    hash, not Python's salted one), below PHASE_SPREAD, and spread, so 1,000 workloads do not
    evaluate in one burst (a few per instant: a burst longer than an RPC's few loop iterations
    raises the RPCs' p99); but in PHASE_SLOTS instants only, so the event loop wakes at most
    PHASE_SLOTS times per interval, not once per workload."""
    keys = [(f"bench-{i % 10}", f"so-{i:05d}", f"synthetic-so-{i:05d}") for i in range(1000)]
    phases = [phase_of(key) for key in keys]
    assert phase_of(keys[0]) == phases[0]
    assert all(0.0 <= p < PHASE_SPREAD for p in phases)
    buckets = Counter(int(p / PHASE_SPREAD * 10) for p in phases)
    assert len(buckets) == 10 and max(buckets.values()) < 150, buckets  # ~100 in each tenth
    slots = Counter(phases)
    # 1,000 keys in 500 slots: about 430 instants (Poisson, 2 a slot), none holding many
    assert PHASE_SLOTS / 2 < len(slots) <= PHASE_SLOTS and max(slots.values()) <= 8, slots
    assert all(
        p * PHASE_SLOTS / PHASE_SPREAD == pytest.approx(round(p * PHASE_SLOTS / PHASE_SPREAD))
        for p in slots
    )


def test_the_tick_grid_is_arithmetic_only() -> None:
    """`gpu_queue_scaler.engine.schedule` takes time as an argument: it imports no clock, no event
    loop and no I/O, so the grid every replica computes depends on its arguments alone."""
    tree = ast.parse(Path(schedule.__file__).read_text(encoding="utf-8"))
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    imported |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    pure = {
        "__future__",
        "math",
        "zlib",
        "typing",
        "gpu_queue_scaler.decision.policy",
        "gpu_queue_scaler.decision.season",  # for HISTORY_S: deterministic, no I/O, no clock
        "gpu_queue_scaler.settings.spec",
    }
    assert imported - pure == set()
    assert {"math", "zlib"} <= imported  # the imports were read


def test_ticks_on_a_phased_grid() -> None:
    interval, phase = 5.0, 0.3
    now = 1_800_000_003.7
    tick = tick_at_or_before(now, interval, phase)
    assert tick <= now < tick + interval
    assert (tick - phase * interval) / interval == pytest.approx(round((tick - 1.5) / 5.0))
    following = tick_after(tick, interval, phase)
    assert following == tick_at_or_before(tick + interval, interval, phase)
    assert following - tick == pytest.approx(interval)
    # the grid changed (a new interval): the next tick is the first one after the last
    assert tick < tick_after(tick, 2.0, phase) <= tick + 2.0


async def test_a_workload_ticks_at_its_phase_and_decides_at_once() -> None:
    """The first decision comes at once, on the last tick of the workload's grid at or before
    now (the engine's clock does not move until the test moves it: a decision that waited for
    a later tick would never come); then one per interval on that grid."""
    interval = 0.2
    clock = ManualClock(start=1_800_000_000.05)
    store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=interval)))
    engine = clock.engine(store)
    trigger = parse_trigger("team-a", "phased", synthetic(syntheticPattern="constant"))
    phase = phase_of((trigger.namespace, trigger.name, trigger.metric_name))
    try:
        decision = await asyncio.wait_for(engine.decision(trigger), 30)
        assert decision.at == pytest.approx(tick_at_or_before(clock.now, interval, phase))
        ats = [decision.at]
        for _ in range(3):
            clock.advance(interval)
            workload = engine.touch(trigger)
            assert workload is not None
            assert await poll(lambda w=workload: w.decision.at > ats[-1], 30), "no next tick"
            ats.append(workload.decision.at)
    finally:
        await engine.close()
    for at in ats:
        k = (at - phase * interval) / interval
        assert k == pytest.approx(round(k), abs=1e-6), (at, phase)
    # One decision per tick of the grid, one interval apart.
    gaps = [(b - a) / interval for a, b in pairwise(ats)]
    assert gaps == pytest.approx([1.0, 1.0, 1.0], abs=1e-6), gaps


async def test_a_burst_of_new_workloads_gets_first_decisions_in_the_order_it_came(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """200 workloads new at once (a restart): the first ones touched get their first decision
    after about one group of WARM_STARTS_AT_ONCE warm starts, not after all 200 replays shared
    the CPU (then every caller waits for the whole burst, past firstDecisionTimeoutSeconds).
    Counted in policy decisions made (a warm start is ~60), not in seconds."""
    made = [0]
    real_decide = decider_module.decide

    def counted(*args: object, **kwargs: object) -> object:
        made[0] += 1
        return real_decide(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(decider_module, "decide", counted)
    group = 8
    store = ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=60.0)))
    engine = Engine(store, warm_starts_at_once=group)
    workloads = 200
    triggers = [
        parse_trigger(f"bench-{i % 10}", f"so-{i:05d}", trigger_metadata(i))
        for i in range(workloads)
    ]
    made_before: dict[int, int] = {}

    async def first(index: int) -> None:
        await engine.decision(triggers[index])
        made_before[index] = made[0]

    try:
        await asyncio.wait_for(asyncio.gather(*(first(i) for i in range(workloads))), 60)
    finally:
        await engine.close()
    per_warm_start = made[0] / workloads
    assert per_warm_start > 20  # replays happened (the count means something)
    firsts = [made_before[i] for i in range(group)]
    # In the order they came: the first group is done after about its own replays.
    assert max(firsts) <= 2 * group * per_warm_start, (firsts, per_warm_start)
    # And the last ones after nearly all of them.
    assert made_before[workloads - 1] >= 0.8 * made[0]


def test_warm_starts_at_once_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="warm_starts_at_once: at least 1, got 0"):
        Engine(ConfigStore(Config()), warm_starts_at_once=0)


class HeldHistorySource:
    """The synthetic source, except that the history reads of the ScaledObjects whose names
    start with `held` wait until `release`: a backend timing out during a restart, or (all held)
    reads that end at one moment, as when one Prometheus answer unblocks many."""

    def __init__(self, held: str = "") -> None:
        self.synthetic = SyntheticSource()
        self.release = asyncio.Event()
        self.held = held
        self.holding = 0  # history reads waiting for `release`

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        return await self.synthetic.read(spec, at)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        if spec.trigger.name.startswith(self.held):
            self.holding += 1
            await self.release.wait()
        return await self.synthetic.history(spec, start, end, step)


async def test_a_warm_start_whose_history_read_hangs_does_not_hold_up_the_others() -> None:
    """A history read slower than HISTORY_PATIENCE_S gives its warm-start turn back: reads that
    hang (more of them than WARM_STARTS_AT_ONCE) leave the other workloads' first decisions to
    come, and the hanging ones still warm-start once their reads return."""
    source = HeldHistorySource(held="slow-")
    engine = Engine(
        ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=30.0))),
        sources=lambda _: source,
        warm_starts_at_once=2,
    )
    slow = [parse_trigger("team-a", f"slow-{i}", trigger_metadata(i)) for i in range(3)]
    fast = [parse_trigger("team-a", f"fast-{i}", trigger_metadata(i)) for i in range(5)]
    for trigger in slow:
        engine.touch(trigger)
    try:
        assert await poll(lambda: source.holding >= 2, 30)  # the slow ones are first in line
        # Bounded waits (30 s), not claims of speed: the fast ones get their turn once the slow
        # reads outlast HISTORY_PATIENCE_S.
        decisions = await asyncio.wait_for(asyncio.gather(*(engine.decision(t) for t in fast)), 30)
        assert all(d.replicas >= 1 for d in decisions)
        assert not any(engine.touch(t).first.is_set() for t in slow)  # still reading
        source.release.set()
        later = await asyncio.wait_for(asyncio.gather(*(engine.decision(t) for t in slow)), 30)
        assert all(d.replicas >= 1 for d in later)
    finally:
        source.release.set()
        await engine.close()


async def test_warm_starts_whose_reads_end_together_replay_one_slice_per_loop_iteration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Between two slices of replay the event loop runs an iteration (RPCs are answered), also
    for a replay's first slice: 16 warm starts whose history reads end at once must not run
    their first slices back to back in one iteration (that held the loop for 16 slices). Counted
    in decisions per loop iteration: at most one warm start's replay and its first evaluation."""
    iteration = [0]
    per_iteration: Counter[int] = Counter()
    real_decide = decider_module.decide

    def counted(*args: object, **kwargs: object) -> object:
        per_iteration[iteration[0]] += 1
        return real_decide(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(decider_module, "decide", counted)
    source = HeldHistorySource()
    workloads = 16
    engine = Engine(
        ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=30.0))),
        sources=lambda _: source,
        warm_starts_at_once=workloads,
    )
    triggers = [parse_trigger("team-a", f"so-{i}", trigger_metadata(i)) for i in range(workloads)]
    stop = asyncio.Event()

    async def metronome() -> None:  # one step per loop iteration
        for _ in range(1_000_000):
            if stop.is_set():
                return
            iteration[0] += 1
            await asyncio.sleep(0)

    counting = asyncio.create_task(metronome())
    try:
        for trigger in triggers:
            engine.touch(trigger)
        for _ in range(100):  # every loop is waiting on its history read
            await asyncio.sleep(0)
        source.release.set()
        await asyncio.wait_for(asyncio.gather(*(engine.decision(t) for t in triggers)), 30)
    finally:
        stop.set()
        await counting
        await engine.close()
    per_warm_start = sum(per_iteration.values()) / workloads
    assert per_warm_start > 20  # replays happened (the count means something)
    assert max(per_iteration.values()) <= per_warm_start + 2, (
        max(per_iteration.values()),
        per_warm_start,
    )


async def test_a_workload_no_longer_asked_for_stops_and_gives_its_forecast_row_back() -> None:
    """Idle drop: the first tick past workloadIdleTimeoutSeconds since KEDA last asked ends the
    loop (not one before it), the workload leaves the table and its decider's forecast row goes
    back to the shared bank (the bank goes with its last row); asked again, it starts anew."""
    interval, idle_s = 0.25, 1.0
    clock = ManualClock()
    settings = ServerSettings(evaluation_interval_s=interval, workload_idle_timeout_s=idle_s)
    engine = clock.engine(ConfigStore(Config(server=settings)))
    trigger = parse_trigger("team-a", "idle", synthetic(forecast="on"))
    try:
        await asyncio.wait_for(engine.decision(trigger), 30)
        [workload] = engine._workloads.values()
        assert workload.decider is not None and workload.decider.forecast is not None
        assert [len(bank) for bank in engine._banks] == [1]
        for _ in range(round(idle_s / interval)):  # up to the idle timeout: still ticking
            last = workload.last_tick
            clock.advance(interval)
            assert await poll(lambda last=last: workload.last_tick != last, 30), "no tick"
        assert len(engine) == 1
        clock.advance(interval)  # the first tick past the idle timeout ends the loop
        assert await poll(lambda: len(engine) == 0, 30), "the idle loop did not stop"
        assert workload.task is not None and workload.task.done()
        assert workload.decider.forecast is None and not list(engine._banks)
        again = await asyncio.wait_for(engine.decision(trigger), 30)
        assert again.replicas >= 1 and len(engine) == 1
    finally:
        await engine.close()


# --- the season's history at a warm start ------------------------------------------------------

BURST_PERIOD_S, BURST_S = 2400.0, 600.0


def _bursting(at: float) -> Signal:
    """A cron-like workload: 2 requests a second for 10 minutes of every 40 (S = 4 s)."""
    rate = 2.0 if at % BURST_PERIOD_S < BURST_S else 0.0
    return Signal(
        at,
        "prometheus",
        waiting=0.0,
        running=4.0 * rate,
        arrival_rate=rate,
        queue_time_mean_s=0.0,
        queue_time_p99_s=0.0,
        ready_pods=1 if rate else 0,
        service_time_s=4.0 if rate else None,
    )


class BurstHistorySource:
    """Prometheus as a restarted scaler finds it: the workload's last hours of bursts on any
    grid asked (`reads`: the history reads seen)."""

    def __init__(self, older_fails: bool = False) -> None:
        self.older_fails = older_fails
        self.reads: list[tuple[float, float, float]] = []

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        return _bursting(at)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        self.reads.append((start, end, step))
        if self.older_fails and step >= SEASON_RECALL_STEP_S:
            raise SourceError("prometheus answered 503")
        count = max(0, math.ceil((end - start) / step - 1e-9))
        return [_bursting(start + i * step) for i in range(count)]


def test_the_recall_segment_reads_what_the_season_lacks_on_a_minutes_grid() -> None:
    end = 1_800_000_000.0
    segment = recall_segment((end - 6 * 3600.0, end), 5.0)
    assert segment is not None and segment.end == end and segment.step == SEASON_RECALL_STEP_S
    assert segment.start == end - 6 * 3600.0  # 360 points, on the grid that ends at `end`
    assert (segment.end - segment.start) / segment.step <= schedule.HISTORY_MAX_POINTS
    assert recall_segment((end - 7.0, end), 5.0) is None  # less than a step: nothing to read
    assert recall_segment(None, 5.0) is None


async def _restarted_before_a_burst(
    source: BurstHistorySource, recalled: Callable[[], bool]
) -> tuple[Decision, Decision]:
    """A scaler started 200 s before a burst, half an hour after the last one: its first
    decision, and its next one, taken once `recalled()` says the season's read is over."""
    clock = ManualClock(start=1_800_000_000.0 + 5 * BURST_PERIOD_S - 200.0)
    engine = clock.engine(
        ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=30.0))),
        sources=lambda _: source,
    )
    trigger = parse_trigger("team-a", "batch", synthetic(scaleToZeroIdleSeconds="120"))
    try:
        first = await asyncio.wait_for(engine.decision(trigger), 30)
        assert await poll(recalled, 30)
        clock.advance(5.0)
        assert await poll(lambda: next(engine.decisions()).at > first.at, 30)
        return first, next(engine.decisions())
    finally:
        await engine.close()


async def test_a_restarted_scaler_wakes_for_the_next_burst_from_the_season_it_recalls() -> None:
    """Once its first answer is out, the loop reads the hours the season lacks from the history
    source (on a minute's grid) and recalls them, and its next decision wakes the workload for
    the burst. Its first answer, from the replayed minutes alone, does not."""
    source = BurstHistorySource()
    first, woken = await _restarted_before_a_burst(
        source, lambda: any(step >= SEASON_RECALL_STEP_S for _, _, step in source.reads)
    )
    assert first.replicas == 0 and "no period found in the demand yet" in first.detail
    assert woken.reason is Reason.FORECAST and woken.replicas >= 1, woken.detail


async def test_a_config_change_that_starts_a_new_season_recalls_it_too() -> None:
    """A ConfigMap change of the forecast's bins starts the season afresh (its bins are another
    width). The loop recalls the new season's hours as it did after the restart, so the burst
    that comes is still woken for, not a period later."""
    source = BurstHistorySource()
    settings = ServerSettings(first_decision_timeout_s=30.0)
    store = ConfigStore(Config(server=settings))
    clock = ManualClock(start=1_800_000_000.0 + 5 * BURST_PERIOD_S - 200.0)
    engine = clock.engine(store, sources=lambda _: source)
    trigger = parse_trigger("team-a", "batch", synthetic(scaleToZeroIdleSeconds="120"))

    def recalls() -> int:
        return sum(step >= SEASON_RECALL_STEP_S for _, _, step in source.reads)

    async def next_tick() -> Decision:
        at = next(engine.decisions()).at
        clock.advance(5.0)
        assert await poll(lambda: next(engine.decisions()).at > at, 30)
        return next(engine.decisions())

    try:
        await asyncio.wait_for(engine.decision(trigger), 30)
        assert await poll(lambda: recalls() == 1, 30)
        assert (await next_tick()).reason is Reason.FORECAST  # the recalled season wakes it
        store.current = Config(defaults={"forecastStepSeconds": 20}, server=settings)
        store.generation += 1
        fresh = await next_tick()  # the new season holds this tick alone
        assert "no period found in the demand yet" in fresh.detail, fresh.detail
        assert await poll(lambda: recalls() == 2, 30)
        woken = await next_tick()
        assert woken.reason is Reason.FORECAST and woken.replicas >= 1, woken.detail
        await next_tick()
        assert recalls() == 2  # once for the new season, not every tick
    finally:
        await engine.close()


async def test_a_failed_season_read_costs_the_season_only(caplog: pytest.LogCaptureFixture) -> None:
    """The hours the season lacks are read after the first answer; that read failing is one
    warning, and the workload goes on deciding from its replayed minutes."""
    _, later = await _restarted_before_a_burst(
        BurstHistorySource(older_fails=True), lambda: "no season history" in caplog.text
    )
    assert "no season history for warm start: prometheus answered 503" in caplog.text
    assert later.replicas == 0 and "no period found in the demand yet" in later.detail


class HeldRecallSource(BurstHistorySource):
    """The seasons' reads (a minute's grid) wait for `release`; `most` counts them in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.in_flight = self.most = 0

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        if step < SEASON_RECALL_STEP_S:
            return await super().history(spec, start, end, step)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await self.release.wait()
            return await super().history(spec, start, end, step)
        finally:
            self.in_flight -= 1


async def test_season_reads_go_a_few_at_a_time_and_never_hold_up_the_ticks() -> None:
    """A restart of many workloads reads their seasons' hours RECALLS_AT_ONCE at a time (not
    a burst of six-hour range queries on Prometheus), and while those reads wait every
    workload keeps ticking on its own loop."""
    from gpu_queue_scaler.engine.warm_start import RECALLS_AT_ONCE

    clock = ManualClock(start=1_800_000_000.0 + 5 * BURST_PERIOD_S - 200.0)
    source = HeldRecallSource()
    engine = clock.engine(
        ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=30.0))),
        sources=lambda _: source,
    )
    triggers = [
        parse_trigger("team-a", f"batch-{i}", synthetic(scaleToZeroIdleSeconds="120"))
        for i in range(3 * RECALLS_AT_ONCE)
    ]
    try:
        firsts = await asyncio.wait_for(asyncio.gather(*(engine.decision(t) for t in triggers)), 30)
        assert await poll(lambda: source.in_flight == RECALLS_AT_ONCE, 30)
        clock.advance(5.0)  # a tick for every loop while the reads are held
        assert await poll(
            lambda: (
                all(d.at > firsts[0].at for d in engine.decisions())
                and len(list(engine.decisions())) == len(triggers)
            ),
            30,
        )
        source.release.set()
        assert await poll(lambda: sum(step >= SEASON_RECALL_STEP_S for *_, step in source.reads)
                          == len(triggers), 30)  # fmt: skip
    finally:
        source.release.set()
        await engine.close()
    assert source.most == RECALLS_AT_ONCE
