"""The synthetic generator: documented shapes, Little's law, determinism, the history grid."""

from __future__ import annotations

import pytest

from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import Sources
from gpu_queue_scaler.sources.synthetic import SyntheticSource, synthetic_rate, synthetic_signal

PERIOD = 600.0
PEAK = 20.0
T0 = 1_700_000_400.0  # a multiple of PERIOD: phase 0


def make_spec(**metadata: str) -> WorkloadSpec:
    trigger = parse_trigger("team-a", "demo", {"backend": "synthetic", **metadata})
    return resolve(trigger, Config())


def rate(pattern: str, phase: float, start: float = 0.0) -> float:
    return synthetic_rate(pattern, PEAK, PERIOD, start + phase * PERIOD)


def test_t0_is_at_phase_zero() -> None:
    assert T0 % PERIOD == 0


# --- rate shapes --------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [0.0, T0])
def test_wave_peaks_at_a_quarter_and_is_zero_in_the_second_half(start: float) -> None:
    assert rate("wave", 0.25, start) == pytest.approx(PEAK)
    assert rate("wave", 0.0, start) == pytest.approx(0.0, abs=1e-9)
    assert rate("wave", 1 / 12, start) == pytest.approx(PEAK / 2)  # sin(pi/6)
    assert 0 < rate("wave", 0.1, start) < PEAK
    for phase in (0.5, 0.5001, 0.6, 0.75, 0.9, 0.9999):
        assert rate("wave", phase, start) == 0.0
    assert rate("wave", 1.25, start) == pytest.approx(PEAK)  # periodic


def test_sine_stays_between_ten_percent_and_the_peak() -> None:
    assert rate("sine", 0.25) == pytest.approx(PEAK)
    assert rate("sine", 0.75) == pytest.approx(0.1 * PEAK)
    assert rate("sine", 0.0) == pytest.approx(0.55 * PEAK)
    samples = [rate("sine", i / 200, T0) for i in range(200)]
    assert min(samples) == pytest.approx(0.1 * PEAK)
    assert max(samples) == pytest.approx(PEAK)
    assert all(0.1 * PEAK - 1e-9 <= r <= PEAK + 1e-9 for r in samples)


@pytest.mark.parametrize("phase", [0.0, 0.25, 0.5, 0.75, 0.99])
def test_constant_and_zero(phase: float) -> None:
    assert rate("constant", phase) == PEAK
    assert rate("zero", phase) == 0.0


# --- signals ----------------------------------------------------------------------------------


def test_constant_signal_follows_littles_law() -> None:
    spec = make_spec(syntheticPattern="constant", syntheticPeakRps="6", syntheticServiceSeconds="2")
    signal = synthetic_signal(spec, T0 + 17)
    queue_time = 2 / 4 * (6 / 6) ** 2
    assert signal == Signal(
        at=T0 + 17,
        source="synthetic",
        waiting=6 * queue_time,
        running=6 * 2.0,
        arrival_rate=6.0,
        queue_time_mean_s=queue_time,
        service_time_s=2.0,  # reported, as vLLM and Triton do
        age_s=0.0,
    )
    assert signal.in_flight == 15.0


def test_wave_signal_at_the_peak_and_idle() -> None:
    spec = make_spec(
        syntheticPattern="wave",
        syntheticPeakRps="10",
        syntheticPeriodSeconds="100",
        syntheticServiceSeconds="4",
    )
    peak = synthetic_signal(spec, 25.0)
    assert peak.arrival_rate == pytest.approx(10.0)
    assert peak.running == pytest.approx(10.0 * 4)  # rate x service
    assert peak.queue_time_mean_s == pytest.approx(4 / 4)
    assert peak.waiting == pytest.approx(10.0 * 1.0)  # rate x queue time
    idle = synthetic_signal(spec, 75.0)
    assert (idle.arrival_rate, idle.running, idle.waiting, idle.in_flight) == (0.0, 0.0, 0.0, 0.0)
    assert idle.busy is False


def test_half_load_queue_time_scales_with_load_squared() -> None:
    spec = make_spec(
        syntheticPattern="wave",
        syntheticPeakRps="10",
        syntheticPeriodSeconds="120",
        syntheticServiceSeconds="2",
    )
    signal = synthetic_signal(spec, 10.0)  # phase 1/12: half the peak
    assert signal.arrival_rate == pytest.approx(5.0)
    assert signal.running == pytest.approx(5.0 * 2)
    assert signal.queue_time_mean_s == pytest.approx(2 / 4 * 0.25)
    assert signal.waiting == pytest.approx(5.0 * 2 / 4 * 0.25)


def test_zero_peak_is_idle_not_an_error() -> None:
    spec = make_spec(syntheticPattern="constant", syntheticPeakRps="0")
    signal = synthetic_signal(spec, T0)
    assert (signal.arrival_rate, signal.running, signal.waiting) == (0.0, 0.0, 0.0)
    assert signal.queue_time_mean_s == 0.0


def test_defaults_apply_without_synthetic_keys() -> None:
    # Built-in: wave, 20 rps peak, 600 s period, 2 s service.
    signal = synthetic_signal(make_spec(), T0 + 150)
    assert signal.arrival_rate == pytest.approx(20.0)
    assert signal.running == pytest.approx(40.0)
    assert signal.waiting == pytest.approx(20.0 * 0.5)


def test_signal_is_deterministic_for_equal_inputs() -> None:
    metadata = {"syntheticPattern": "sine", "syntheticPeakRps": "7.5"}
    first = [synthetic_signal(make_spec(**metadata), T0 + t) for t in (0.0, 33.3, 451.0)]
    second = [synthetic_signal(make_spec(**metadata), T0 + t) for t in (0.0, 33.3, 451.0)]
    assert first == second
    assert first[0] != first[1]


# --- the source -------------------------------------------------------------------------------


async def test_read_matches_the_pure_function() -> None:
    spec = make_spec(syntheticPattern="sine")
    source = Sources()(spec)
    assert isinstance(source, SyntheticSource)
    assert await source.read(spec, T0 + 42) == synthetic_signal(spec, T0 + 42)


@pytest.mark.parametrize(
    ("start", "end", "step", "expected"),
    [
        (T0, T0 + 100, 30, [T0, T0 + 30, T0 + 60, T0 + 90]),
        (T0, T0 + 90, 30, [T0, T0 + 30, T0 + 60]),  # end itself is excluded
        (T0, T0 + 1, 30, [T0]),
        (T0, T0, 30, []),
        (T0, T0 - 60, 30, []),
        (0.0, 1.0, 0.25, [0.0, 0.25, 0.5, 0.75]),
    ],
)
async def test_history_is_the_grid_start_to_before_end(
    start: float, end: float, step: float, expected: list[float]
) -> None:
    spec = make_spec(syntheticPattern="wave")
    history = await SyntheticSource().history(spec, start, end, step)
    assert [s.at for s in history] == expected
    assert history == [synthetic_signal(spec, at) for at in expected]


async def test_history_never_reaches_end_with_a_float_step() -> None:
    # (2.1 - 0) / 0.3 == 7.000000000000001, so ceil() yields an 8th point at 0 + 7 * 0.3 == 2.1.
    history = await SyntheticSource().history(make_spec(), 0.0, 2.1, 0.3)
    assert all(s.at < 2.1 for s in history), [s.at for s in history]
    assert len(history) == 7
