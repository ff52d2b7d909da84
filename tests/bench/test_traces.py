"""gpu_queue_scaler_bench.traces: every shipped trace loads with its documented counts; binning
keeps the counts; malformed files fail with a message naming the file and the accepted formats."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from gpu_queue_scaler_bench.traces import Trace, TraceError, binned, default_bin_s, load_trace

TRACES = Path(__file__).resolve().parents[2] / "bench" / "traces"
AZURE_CODE = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_code.csv"
AZURE_CONV = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
MOONCAKE = TRACES / "mooncake" / "conversation_trace.jsonl"
SERVEGEN = TRACES / "servegen"


@pytest.fixture(scope="module")
def azure_code() -> Trace:
    return load_trace(AZURE_CODE)


@pytest.fixture(scope="module")
def azure_conv() -> Trace:
    return load_trace(AZURE_CONV)


@pytest.fixture(scope="module")
def mooncake() -> Trace:
    return load_trace(MOONCAKE)


# ---- shipped traces --------------------------------------------------------------------------


def test_licenses_and_readme_ship_with_the_traces() -> None:
    for path in (
        "README.md",
        "azure-llm-2023/LICENSE",
        "azure-llm-2023/AzureLLMInferenceDataset2023.md",
        "mooncake/LICENSE-APACHE",
        "mooncake/FAST25-README.md",
        "servegen/LICENSE",
        "servegen/README-ServeGen.md",
    ):
        assert (TRACES / path).is_file(), path
    readme = (TRACES / "README.md").read_text(encoding="utf-8")
    assert "CC BY 4.0" in readme
    assert "Splitwise" in readme  # the attribution CC BY 4.0 requires


@pytest.mark.parametrize(
    ("fixture", "count", "minutes"),
    [("azure_code", 8819, 57), ("azure_conv", 19366, 58), ("mooncake", 12031, 59)],
)
def test_request_traces_load_with_documented_counts(
    fixture: str, count: int, minutes: int, request: pytest.FixtureRequest
) -> None:
    trace: Trace = request.getfixturevalue(fixture)
    assert trace.kind == "requests"
    assert trace.arrivals_s is not None
    assert trace.arrivals_s.dtype == np.float64
    assert trace.arrivals_s.size == count == trace.requests
    assert trace.arrivals_s[0] == 0.0
    assert np.all(np.diff(trace.arrivals_s) >= 0)
    assert trace.duration_s / 60 == pytest.approx(minutes, abs=1)
    for tokens in (trace.input_tokens, trace.output_tokens):
        assert tokens is not None
        assert tokens.dtype == np.int64
        assert tokens.shape == (count,)
        assert tokens.min() >= 0
    assert trace.rates is None and trace.window_s is None


def test_azure_timestamps_keep_sub_microsecond_digits(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:46.6805901,10,1\n"
        "2023-11-16 18:16:00,1,1\n",
        encoding="utf-8",
    )
    trace = load_trace(path)
    assert trace.arrivals_s is not None
    assert trace.arrivals_s[1] == pytest.approx(1e-7, abs=1e-9)
    assert trace.arrivals_s[2] == pytest.approx(60 - 46.68059, abs=1e-9)
    assert trace.input_tokens is not None and list(trace.input_tokens) == [374, 10, 1]


def test_azure_first_request_and_tokens(azure_conv: Trace) -> None:
    assert azure_conv.input_tokens is not None and azure_conv.output_tokens is not None
    assert list(azure_conv.input_tokens[:3]) == [374, 396, 879]
    assert azure_conv.output_tokens[0] == 44
    assert azure_conv.arrivals_s is not None
    assert azure_conv.arrivals_s[1] == pytest.approx(50.9951690 - 46.6805900, abs=1e-9)
    assert azure_conv.resolution_s == 0.0  # not quantised


def test_mooncake_is_detected_as_quantised(mooncake: Trace) -> None:
    assert mooncake.resolution_s == pytest.approx(3.0, abs=0.01)
    assert mooncake.name == "conversation_trace"
    with pytest.raises(ValueError, match="resolution"):
        binned(mooncake, 1.0)


@pytest.mark.parametrize(
    ("name", "windows", "gaps"),
    [
        ("aggregate_rate_language_m-large", 2016, 0),
        ("aggregate_rate_language_m-small", 2016, 37),
        ("aggregate_rate_multimodal_mm-image", 144, 0),
        ("aggregate_rate_reason_deepseek-r1", 144, 0),
    ],
)
def test_servegen_rate_traces(name: str, windows: int, gaps: int) -> None:
    trace = load_trace(SERVEGEN / f"{name}.csv")
    assert trace.kind == "rates"
    assert trace.window_s == 600.0
    assert trace.rates is not None and trace.cv is not None
    assert trace.rates.shape == trace.cv.shape == (windows,)
    assert int(np.isnan(trace.rates).sum()) == gaps  # zero windows are gaps, not idle
    assert np.all(trace.rates[~np.isnan(trace.rates)] > 0)
    assert np.all(np.isnan(trace.cv[np.isnan(trace.rates)]))
    assert trace.arrivals_s is None
    assert default_bin_s(trace) == 600.0
    assert trace.duration_s == windows * 600.0


def test_servegen_first_window_values() -> None:
    trace = load_trace(SERVEGEN / "aggregate_rate_language_m-large.csv")
    assert trace.rates is not None and trace.cv is not None
    assert trace.rates[0] == pytest.approx(212.78)
    assert trace.cv[0] == pytest.approx(2.11795)


# ---- binning ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fixture", ["azure_code", "azure_conv", "mooncake"])
@pytest.mark.parametrize("bin_s", [3.0, 10.0, 60.0, 7.5])
def test_binned_request_counts_sum_to_the_requests(
    fixture: str, bin_s: float, request: pytest.FixtureRequest
) -> None:
    trace: Trace = request.getfixturevalue(fixture)
    rates = binned(trace, bin_s)
    assert np.all(rates >= 0)
    assert float(rates.sum() * bin_s) == pytest.approx(trace.requests, rel=1e-9)
    assert rates.size == math.ceil(trace.duration_s / bin_s - 1e-9)


def test_binned_default_is_10_s_for_requests(azure_conv: Trace) -> None:
    assert default_bin_s(azure_conv) == 10.0
    assert np.array_equal(binned(azure_conv), binned(azure_conv, 10.0))


def test_binned_counts_match_a_histogram_when_not_quantised(azure_code: Trace) -> None:
    assert azure_code.arrivals_s is not None
    rates = binned(azure_code, 60.0)
    counts = np.bincount((azure_code.arrivals_s // 60).astype(int))
    assert rates * 60 == pytest.approx(counts[: rates.size], abs=1e-9)


def test_quantised_clock_does_not_alias_into_bins(tmp_path: Path) -> None:
    """4 requests on every 3 s tick: 10 s bins hold 3 or 4 ticks, but the rate is flat 4/3 req/s."""
    lines = [
        json.dumps({"timestamp": tick * 3000 + (tick % 3 == 1), "input_length": 1})
        for tick in range(400)
        for _ in range(4)
    ]
    path = tmp_path / "clock.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    trace = load_trace(path)
    assert trace.resolution_s == pytest.approx(3.0, abs=0.002)
    rates = binned(trace, 10.0)
    assert rates[:-1] == pytest.approx(np.full(rates.size - 1, 4 / 3), abs=0.01)
    assert trace.arrivals_s is not None
    naive = np.bincount((trace.arrivals_s // 10).astype(int)) / 10  # what a plain count shows
    assert naive[:-1].max() - naive[:-1].min() >= 0.3


def test_mooncake_10_s_bins_are_smooth(mooncake: Trace) -> None:
    # a flat 145-247 req/min trace: 10 s bins stay within a plausible band, no 3-vs-4 tick pattern
    rates = binned(mooncake, 10.0)[:-1]
    assert 2.0 < float(rates.mean()) < 4.5
    period3 = rates[: rates.size // 3 * 3].reshape(-1, 3).mean(axis=0)
    assert period3.max() - period3.min() < 0.2


def test_binned_rates_are_the_series_and_gaps_stay_gaps() -> None:
    trace = load_trace(SERVEGEN / "aggregate_rate_language_m-small.csv")
    assert trace.rates is not None
    series = binned(trace)
    assert np.array_equal(series, trace.rates, equal_nan=True)
    assert float(np.nansum(series) * 600) == pytest.approx(trace.requests)
    hourly = binned(trace, 3600.0)
    assert hourly.size == 2016 // 6
    assert np.isnan(hourly).sum() >= 1
    known = ~np.isnan(hourly)
    assert hourly[known] == pytest.approx(trace.rates.reshape(-1, 6).mean(axis=1)[known], rel=1e-12)
    with pytest.raises(ValueError, match="multiple"):
        binned(trace, 900.0)


def test_binned_rejects_bad_widths(azure_conv: Trace) -> None:
    for width in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="bin_s"):
            binned(azure_conv, width)


# ---- detection and errors --------------------------------------------------------------------


def test_format_is_detected_from_content_not_extension(tmp_path: Path) -> None:
    jsonl = tmp_path / "requests.csv"
    jsonl.write_text('{"timestamp": 0}\n{"timestamp": 1500}\n', encoding="utf-8")
    trace = load_trace(jsonl)
    assert trace.kind == "requests"
    assert trace.arrivals_s is not None and list(trace.arrivals_s) == [0.0, 1.5]
    assert trace.input_tokens is None and trace.output_tokens is None
    rates = tmp_path / "rates.txt"
    rates.write_text("ts,rate\n0,2\n60,0\n180,4\n", encoding="utf-8")
    trace = load_trace(rates)
    assert trace.kind == "rates" and trace.window_s == 60.0
    assert trace.rates is not None
    assert np.array_equal(trace.rates, [2.0, np.nan, np.nan, 4.0], equal_nan=True)
    numeric = tmp_path / "seconds.log"
    numeric.write_text("timestamp,input_tokens\n5.5,3\n2.5,4\n", encoding="utf-8")
    trace = load_trace(numeric)
    assert trace.arrivals_s is not None and list(trace.arrivals_s) == [0.0, 3.0]
    assert trace.input_tokens is not None and list(trace.input_tokens) == [4, 3]  # follow the sort


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("", "empty file"),
        ("\n\n", "empty file"),
        ("time,count\n1,2\n", "unrecognised first line"),
        ("TIMESTAMP,ContextTokens\n", "no requests"),
        ("TIMESTAMP,ContextTokens\nyesterday,3\n", r":2: TIMESTAMP 'yesterday'"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,many\n", r":2: input tokens 'many'"),
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46\n", r":2: missing column"),
        ('{"timestamp": 0}\n{"time": 3}\n', r":2: needs a numeric 'timestamp'"),
        ('{"timestamp": 0}\n{"timestamp": 3\n', r":2: not a JSON object"),
        ("[1, 2]\n", "unrecognised first line"),
        ("ts,total_rate\n0,1\n", "at least two windows"),
        ("ts,total_rate\n0,1\n600,-1\n", "negative"),
        ("ts,total_rate\n0,1\n600,1\n1000,1\n", "regular grid"),
        ("ts,total_rate\n600,1\n0,1\n", "strictly increasing"),
        ("ts,total_rate\n0,1\n600,fast\n", r":3: rate 'fast'"),
    ],
)
def test_malformed_files_fail_clearly(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TraceError, match=match) as info:
        load_trace(path)
    assert str(path) in str(info.value)


def test_unrecognised_file_names_the_accepted_formats(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(TraceError, match="accepted formats") as info:
        load_trace(path)
    assert "TIMESTAMP" in str(info.value) and "total_rate" in str(info.value)


def test_missing_and_binary_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        load_trace(tmp_path / "nope.csv")
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\xff\xfe\x00\x81garbage")
    with pytest.raises(TraceError, match="not UTF-8"):
        load_trace(binary)
    assert issubclass(TraceError, ValueError)


def test_the_synthetic_idle_trace_is_what_its_generator_writes(tmp_path: Path) -> None:
    """bench/traces/synthetic/idle-bursts.csv is reproducible from its seeded generator."""
    import importlib.util

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "make_idle_trace", root / "bench/make_idle_trace.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(tmp_path / "idle.csv")
    shipped = root / "bench/traces/synthetic/idle-bursts.csv"
    assert (tmp_path / "idle.csv").read_bytes() == shipped.read_bytes()
    trace = load_trace(shipped)
    gaps = np.diff(trace.arrivals_s)
    assert gaps.max() > 1700  # the 30-minute silences that make a fleet scale to zero
