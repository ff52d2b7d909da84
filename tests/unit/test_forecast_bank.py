"""The shared forecast bank: a workload's outlook through a bank of many rows is, exactly (==), the
outlook of a `NeedForecast` of its own fed the same needs, whoever else joins, leaves or misses
bins; rows are independent and reused clean; a need for a closed bin is dropped and counted; a
warm-started row equals a live one. And the row operations underneath
(`gpu_queue_scaler.forecast._rows`)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from gpu_queue_scaler.decision.bank import BankedForecast, ForecastBank, ForecastBanks, _outlooks
from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.outlook import NeedForecast, Outlook
from gpu_queue_scaler.forecast import ScalerForecaster
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger

T0 = 1_800_000_000.0
INTERVAL = 2.0  # the loops' tick

# (step, horizon, season): plain, seasonal, a one-bin horizon, a season not dividing T0's bin
SHAPES = [(10.0, 60.0, None), (5.0, 40.0, 200.0), (10.0, 5.0, None), (4.0, 24.0, 28.0)]


def need(rng: random.Random, k: int, phase: float) -> float | None:
    """A noisy wave with missing decisions (None) and an occasional NaN."""
    draw = rng.random()
    if draw < 0.08:
        return None
    if draw < 0.1:
        return math.nan
    return max(0.0, 3.0 + 2.0 * math.sin(k / 9.0 + phase) + rng.gauss(0.0, 0.7))


def run_many(shape: tuple[float, float, float | None], ticks: int, seed: int) -> int:
    """Workloads come and go on one bank, each with a reference NeedForecast; every observation's
    outlook must equal its reference's. Returns how many outlooks were compared."""
    rng = random.Random(seed)
    banks = ForecastBanks()
    live: dict[int, tuple[BankedForecast, NeedForecast, float]] = {}
    compared = 0
    next_id = 0
    for k in range(ticks):
        at = T0 + k * INTERVAL
        if rng.random() < 0.05 or not live:  # joins
            for _ in range(rng.randint(1, 3)):
                live[next_id] = (banks.join(*shape), NeedForecast(*shape), rng.random() * 6.0)
                next_id += 1
        if len(live) > 2 and rng.random() < 0.06:  # leaves (never the oldest: it runs through)
            gone = rng.choice(sorted(live)[1:])
            live.pop(gone)[0].release()
        order = list(live.items())
        rng.shuffle(order)
        for _, (seat, reference, phase) in order:
            if rng.random() < 0.05:  # this loop skipped a tick (a slow read)
                continue
            value = need(rng, k, phase)
            got = seat.observe(at, value)
            expected = reference.observe(at, value)
            assert got == expected, (k, seat.row)
            assert seat.outlook == reference.outlook
            compared += expected is not None
    bank = next(iter(banks))
    assert bank.dropped == 0
    return compared


@pytest.mark.parametrize("shape", SHAPES)
def test_each_row_equals_its_own_need_forecast_while_others_join_and_leave(
    shape: tuple[float, float, float | None],
) -> None:
    compared = run_many(shape, ticks=500, seed=int(shape[0] * 100 + shape[1]))
    assert compared > 1000


def test_a_long_quiet_spell_restarts_like_a_need_forecast() -> None:
    shape = (10.0, 30.0, None)
    bank = ForecastBanks()
    seats = [bank.join(*shape) for _ in range(3)]
    references = [NeedForecast(*shape) for _ in range(3)]
    times = [T0 + 10.0 * i for i in range(40)]
    times += [times[-1] + 10.0 * 20_000 + 10.0 * i for i in range(40)]  # > MAX_GAP_BINS
    for i, at in enumerate(times):
        for j, (seat, reference) in enumerate(zip(seats, references, strict=True)):
            if j == 2 and 20 <= i < 60:
                continue  # this one also misses the first observations after the gap
            value = 1.0 + j + 0.1 * (i % 7)
            assert seat.observe(at, value) == reference.observe(at, value)


def test_rows_are_independent() -> None:
    """The same row's outlooks whatever the other rows see (values, NaN, nothing)."""
    shape = (5.0, 40.0, 200.0)
    runs = []
    for others in ("none", "noise", "nan"):
        banks = ForecastBanks()
        target = banks.join(*shape)
        rest = [banks.join(*shape) for _ in range(0 if others == "none" else 9)]
        rng = random.Random(3)
        seen: list[Outlook | None] = []
        for k in range(400):
            at = T0 + k * INTERVAL
            for seat in rest:
                seat.observe(at, rng.random() * 50 if others == "noise" else math.nan)
            seen.append(target.observe(at, 2.0 + math.sin(k / 11.0)))
        runs.append(seen)
    assert runs[0] == runs[1] == runs[2]
    assert sum(outlook is not None for outlook in runs[0]) > 300


def test_an_adopted_history_replaces_a_start_made_in_the_same_bin() -> None:
    """A row's first observation restarts it (the reset is done for all rows at the next bin's
    update); a history adopted later in that bin is what the row holds, not the restart."""
    shape = (10.0, 60.0, None)
    banks = ForecastBanks()
    other = banks.join(*shape)
    private = NeedForecast(*shape)
    for k in range(200):
        private.observe(T0 + k * INTERVAL, 2.0 + (k % 7))
    at = T0 + 200 * INTERVAL
    other.observe(at, 1.0)
    seat = banks.join(*shape)
    assert seat.observe(at, 50.0) is None  # starts over...
    seat.adopt(private)  # ...then takes the replayed history instead
    assert seat.outlook == private.outlook is not None
    for k in range(201, 400):
        at = T0 + k * INTERVAL
        other.observe(at, 1.0)
        value = 3.0 + (k % 5)
        assert seat.observe(at, value) == private.observe(at, value)


def test_outlooks_are_built_as_outlook_builds_them() -> None:
    """The bank builds Outlooks in one C loop: the same objects as the constructor's."""
    built = _outlooks([1.5, 0.0], [2.5, 0.25], ("naive", "ses"), [60.0, 55.0], 1234.0)
    expected = [Outlook(1.5, 2.5, "naive", 60.0, 1234.0), Outlook(0.0, 0.25, "ses", 55.0, 1234.0)]
    assert built == expected
    assert [o._asdict() for o in built] == [o._asdict() for o in expected]
    assert built[1].upper_max == 0.25 and built[1].model == "ses" and built[0].made_at == 1234.0
    assert [hash(outlook) for outlook in built] == [hash(outlook) for outlook in expected]
    assert [repr(outlook) for outlook in built] == [repr(outlook) for outlook in expected]
    assert all(type(outlook) is Outlook for outlook in built)
    with pytest.raises(AttributeError):
        built[0].point_max = 3.0  # type: ignore[misc]
    with pytest.raises(ValueError, match="one value per row"):
        _outlooks([1.0], [2.0, 3.0], ("naive",), [60.0], 0.0)


def test_a_released_row_is_reused_clean() -> None:
    shape = (10.0, 60.0, None)
    banks = ForecastBanks()
    keep = banks.join(*shape)
    first = banks.join(*shape)
    for k in range(100):
        keep.observe(T0 + k * INTERVAL, 1.0)
        first.observe(T0 + k * INTERVAL, 40.0 + k)  # a busy history, then gone
    row = first.row
    first.release()
    second = banks.join(*shape)
    assert second.row == row and second.outlook is None
    reference = NeedForecast(*shape)
    for k in range(100, 300):
        at = T0 + k * INTERVAL
        keep.observe(at, 1.0)
        value = 2.0 + (k % 5)
        assert second.observe(at, value) == reference.observe(at, value)
    assert reference.outlook is not None


def test_capacity_grows_geometrically_and_the_bank_goes_with_its_last_row() -> None:
    banks = ForecastBanks()
    seats = [banks.join(10.0, 60.0, None) for _ in range(9)]
    bank = seats[0].bank
    assert (len(bank), bank.capacity) == (9, 16)
    other = banks.join(10.0, 55.0, None)  # 6 bins too: same bank, its own horizon_s
    assert other.bank is bank
    assert banks.join(10.0, 70.0, None).bank is not bank
    for seat in [*seats, other]:
        seat.release()
    assert bank not in list(banks)


def test_one_update_per_bin_for_all_rows() -> None:
    banks = ForecastBanks()
    seats = [banks.join(10.0, 60.0, None) for _ in range(50)]
    for k in range(50):  # 100 s: ten bins, five ticks each
        for seat in seats:
            seat.observe(T0 + k * INTERVAL, 1.0)
    assert seats[0].bank.updates == 9  # the tenth bin is still open


def test_a_need_for_a_closed_bin_is_dropped_and_counted() -> None:
    shape = (10.0, 30.0, None)
    banks = ForecastBanks()
    early, late = banks.join(*shape), banks.join(*shape)
    reference = NeedForecast(*shape)
    for k in range(50):  # both tick in step
        at = T0 + k * INTERVAL
        early.observe(at, 1.0)
        late.observe(at, 3.0)
        reference.observe(at, 3.0)
    bank = early.bank
    at = T0 + 50 * INTERVAL  # the first tick of a new bin (100 s)
    assert bank.bin == math.floor((at - INTERVAL) / 10.0)
    early.observe(at, 1.0)  # closes the previous bin
    assert bank.dropped == 0
    late.observe(at - INTERVAL, 99.0)  # its delayed tick from the previous bin
    assert bank.dropped == 1
    late.observe(at - INTERVAL, None)  # no need: nothing lost, nothing counted
    assert bank.dropped == 1
    # The row is where a NeedForecast that never got the 99 is.
    assert late.outlook == reference.observe(at, None)
    for k in range(51, 120):
        at = T0 + k * INTERVAL
        early.observe(at, 1.0)
        assert late.observe(at, 3.0) == reference.observe(at, 3.0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("history_ends", [-12, -1, 0, 1, 7])
def test_a_warm_started_row_equals_a_live_row(
    shape: tuple[float, float, float | None], history_ends: int
) -> None:
    """A workload replays its history privately and joins a bank whose other rows have ticked
    up to `join_at` (its history ends before, at, or after that): from then on it is the row of a
    workload that saw the same needs live, on another bank, all along."""
    rng = random.Random(11)
    values = [need(rng, k, 0.5) for k in range(600)]
    join_at = 400
    replay_to = join_at + history_ends  # the replayed ticks: 0 .. replay_to - 1
    start = max(join_at, replay_to)  # the first tick both see live
    live = ForecastBanks().join(*shape)
    for k in range(replay_to):
        live.observe(T0 + k * INTERVAL, values[k])
    banks = ForecastBanks()
    others = [banks.join(*shape) for _ in range(5)]
    for k in range(join_at):
        for j, seat in enumerate(others):
            seat.observe(T0 + k * INTERVAL, float(j))
    private = NeedForecast(*shape)
    for k in range(replay_to):
        private.observe(T0 + k * INTERVAL, values[k])
    warm = banks.join(*shape)
    warm.adopt(private)
    for k in range(start, 600):
        at = T0 + k * INTERVAL
        for j, seat in enumerate(others):
            seat.observe(at, float(j))
        assert warm.observe(at, values[k]) == live.observe(at, values[k]), k
    live_rows, warm_rows = live.bank._forecaster, warm.bank._forecaster
    assert live_rows is not None and warm_rows is not None
    warm_state = warm_rows.state()
    for key, array in live_rows.state().items():
        assert np.array_equal(array[live.row], warm_state[key][warm.row], equal_nan=True), key


def spec(**metadata: str) -> WorkloadSpec:
    base = {"backend": "synthetic", "targetConcurrency": "4", "forecast": "on"}
    return resolve(parse_trigger("team-a", "llama", {**base, **metadata}), Config())


def test_a_workload_alone_forecasts_as_a_need_forecast_and_its_replay_joins_clean() -> None:
    """`Decider.outlook` / `.learn` without an engine (the simulator): a private bank, the same
    numbers as a NeedForecast; a replayed decider on shared banks ends up with a live one."""
    workload_spec = spec(forecastStepSeconds="10", horizonSeconds="60")
    alone = Decider(workload_spec)
    shared = ForecastBanks()
    live = Decider(workload_spec, shared)
    replayed = Decider(workload_spec, shared)
    reference = NeedForecast(
        workload_spec.forecast_step_s, workload_spec.horizon_s, workload_spec.season_period_s
    )
    demands = [2.0 + math.sin(k / 13.0) for k in range(500)]
    for k, value in enumerate(demands[:300]):
        at = T0 + k * INTERVAL
        for workload in (alone, live):
            workload.outlook()
            assert workload.forecast is not None
            workload.forecast.observe(at, value)
        reference.observe(at, value)
        assert alone.outlook() == reference.outlook
    with replayed.replaying():
        for k, value in enumerate(demands[:300]):
            replayed.outlook()
            assert isinstance(replayed.forecast, NeedForecast)
            replayed.forecast.observe(T0 + k * INTERVAL, value)
    assert isinstance(replayed.forecast, BankedForecast)
    assert isinstance(live.forecast, BankedForecast)
    assert replayed.forecast.bank is live.forecast.bank
    for k, value in enumerate(demands[300:], start=300):
        at = T0 + k * INTERVAL
        for workload in (live, replayed):
            assert workload.forecast is not None
            workload.forecast.observe(at, value)
        assert replayed.outlook() == live.outlook() is not None
    live.release()
    assert live.forecast is None and len(replayed.forecast.bank) == 1
    replayed.configure(spec(forecast="off"), replayed.stale_s)
    assert replayed.outlook() is None
    assert not list(shared)


# --- row operations on the forecaster ------------------------------------------------------------


def arrays(forecaster: ScalerForecaster) -> dict[str, np.ndarray]:
    """Every array the forecaster and its candidates hold."""
    found = {
        name: value for name, value in vars(forecaster).items() if isinstance(value, np.ndarray)
    }
    for model in forecaster._models:
        found |= {
            f"{model.name}.{name}": value
            for name, value in vars(model).items()
            if isinstance(value, np.ndarray)
        }
    return found


def test_every_per_series_array_is_a_row_array() -> None:
    """`_ROWS` lists every array with a series axis (else a copied row would miss state)."""
    small, big = ScalerForecaster(2, 5, period=4), ScalerForecaster(3, 5, period=4)
    assert small._ROWS
    for name, array in arrays(small).items():
        other = arrays(big)[name]
        owner = (
            small if "." not in name else small._models[small.candidates.index(name.split(".")[0])]
        )
        attribute = name.split(".")[-1]
        if array.shape == other.shape:
            assert attribute not in owner._ROWS, name
        else:
            assert attribute in owner._ROWS, name
            axis = owner._ROWS[attribute]
            assert (array.shape[axis], other.shape[axis]) == (2, 3), name


def feed(forecaster: ScalerForecaster, columns: np.ndarray) -> None:
    for column in columns.T:
        forecaster.update(column)


def test_add_reset_and_copy_rows_do_not_change_the_numbers() -> None:
    rng = np.random.default_rng(5)
    data = np.abs(rng.normal(4.0, 2.0, (4, 300)))
    data[rng.random(data.shape) < 0.1] = np.nan
    reference = ScalerForecaster(4, 6, period=12)
    feed(reference, data)

    grown = ScalerForecaster(2, 6, period=12)
    feed(grown, data[:2, :100])  # two rows first
    grown.add_rows(2)  # two more join at bin 100: their own forecaster would start there
    feed(grown, data[:, 100:])
    late = ScalerForecaster(2, 6, period=12, origin=100)
    feed(late, data[2:, 100:])
    for key, array in grown.state().items():
        assert np.array_equal(array[:2], reference.state()[key][:2], equal_nan=True), key
        assert np.array_equal(array[2:], late.state()[key], equal_nan=True), key

    # A reset row is a new forecaster's row; copying a row in carries its whole future.
    grown.reset_rows(np.array([False, True, False, False]))
    fresh = ScalerForecaster(1, 6, period=12, origin=300)
    for key, array in grown.state().items():
        assert np.array_equal(array[1:2], fresh.state()[key], equal_nan=True), key
    grown.copy_rows([1], reference, [1])
    more = np.abs(rng.normal(4.0, 2.0, (4, 50)))
    feed(grown, more)
    feed(reference, more)
    got, expected = grown.predict(6), reference.predict(6)
    assert np.array_equal(got.point[:2], expected.point[:2])  # row 0 the same, row 1 copied
    assert np.array_equal(got.upper[:2], expected.upper[:2])
    assert got.model[:2] == expected.model[:2]
    with pytest.raises(ValueError, match="different forecaster"):
        grown.copy_rows([0], ScalerForecaster(1, 6, period=12), [0])  # another bin clock
    with pytest.raises(ValueError, match="out of range"):
        grown.reset_rows([4])


def test_bank_rejects_rows_not_in_use() -> None:
    bank = ForecastBank(10.0, 6, None)
    row = bank.add(60.0)
    bank.release(row)
    with pytest.raises(ValueError, match="not in use"):
        bank.observe(row, T0, 1.0)
