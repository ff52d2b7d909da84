"""Trigger metadata -> TriggerSpec: typed values, every rejection rule, metric names, the cache."""

from __future__ import annotations

import hashlib
import re
import traceback
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_queue_scaler.settings.fields import (
    BACKENDS,
    FIELDS,
    SERVER_KEYS,
    TRIGGER_KEYS,
    Field,
    Range,
)
from gpu_queue_scaler.settings.trigger import (
    METRIC_NAME_MAX,
    PROBLEMS_KEPT,
    SYNTHETIC_KEYS,
    TriggerCache,
    TriggerError,
    TriggerSpec,
    parse_trigger,
    sanitize_metric_name,
)

ACCEPTED_BACKENDS = "vllm | triton | custom | synthetic"
METRIC_NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?")


def synthetic(**extra: str) -> dict[str, str]:
    return {"backend": "synthetic", **extra}


def vllm(**extra: str) -> dict[str, str]:
    return {"backend": "vllm", "serverAddress": "http://prometheus.monitoring:9090", **extra}


def rejected(metadata: dict[str, str], name: str = "llama") -> TriggerError:
    with pytest.raises(TriggerError) as info:
        parse_trigger("team-a", name, metadata)
    return info.value


# --- numeric fields, discovered from the registry ---------------------------------------------


def numeric_bounds(field: Field) -> tuple[float, float, bool, bool] | None:
    """(lo, hi, lo_open, is_integer) for fields built with fields.real/fields.integer, else None."""
    if not isinstance(field.parse, Range):
        return None
    r = field.parse
    return r.lo, r.hi, r.lo_open, r.integer


NUMERIC = {f.key: (f, b) for f in FIELDS if (b := numeric_bounds(f)) is not None}
TRIGGER_NUMERIC = [key for key in NUMERIC if key in TRIGGER_KEYS]


def test_numeric_field_discovery_finds_the_known_fields() -> None:
    # Guards the registry-driven parametrization below against silently covering nothing.
    assert {
        "targetConcurrency",
        "minReplicas",
        "maxReplicas",
        "coldStartSeconds",
        "pollingIntervalSeconds",
        "horizonSeconds",
        "scaleDownStabilizationSeconds",
        "scaleToZeroIdleSeconds",
        "syntheticPeakRps",
        "syntheticPeriodSeconds",
        "syntheticServiceSeconds",
    } <= set(TRIGGER_NUMERIC)
    assert set(SERVER_KEYS) <= set(NUMERIC)
    assert NUMERIC["targetConcurrency"][1] == (0, 1e5, True, False)
    assert NUMERIC["minReplicas"][1] == (0, 10000, False, True)


def bad_numeric_values(key: str) -> list[tuple[str, str]]:
    """(case id, raw value) that the field must reject: derived from its declared bounds."""
    _, (lo, hi, lo_open, is_int) = NUMERIC[key]
    below = lo if lo_open else lo - 1
    cases = [
        ("non-numeric", "abc"),
        ("empty", ""),
        ("nan", "nan"),
        ("inf", "inf"),
        ("-inf", "-inf"),
        ("negative", "-1"),
        ("below-min", repr(below)),
        ("above-max", repr(hi * 2 + 1)),
    ]
    if lo_open:
        cases.append(("zero", "0"))
    if is_int:
        cases.append(("fraction", "1.5"))
    return cases


NUMERIC_REJECTIONS = [
    pytest.param(key, raw, id=f"{key}-{case}")
    for key in TRIGGER_NUMERIC
    for case, raw in bad_numeric_values(key)
]


@pytest.mark.parametrize(("key", "raw"), NUMERIC_REJECTIONS)
def test_numeric_value_out_of_range_is_rejected_naming_key_and_accepted(key: str, raw: str) -> None:
    field = NUMERIC[key][0]
    error = rejected(synthetic(**{key: raw}))
    assert [p.path for p in error.problems] == [key]
    assert error.problems[0].message.startswith(f"got {raw!r}; accepted: {field.accepted}")
    assert str(error).startswith(f"{key}: got {raw!r}")


@pytest.mark.parametrize("key", TRIGGER_NUMERIC)
def test_numeric_bounds_themselves_are_accepted(key: str) -> None:
    _, (lo, hi, lo_open, is_int) = NUMERIC[key]
    low = lo + 1 if lo_open and is_int else (lo + hi) / 2 if lo_open else lo
    for raw in (low, hi):
        text = str(int(raw)) if is_int else repr(float(raw))
        metadata = synthetic(**{key: text})
        if key == "minReplicas":
            metadata["maxReplicas"] = "10000"
        spec = parse_trigger("team-a", "llama", metadata)
        assert spec.values[key] == raw
        assert type(spec.values[key]) is (int if is_int else float)


# --- valid triggers -----------------------------------------------------------------------------


def test_minimal_synthetic_trigger() -> None:
    spec = parse_trigger("team-a", "demo", {"backend": "synthetic"})
    assert spec == TriggerSpec(
        namespace="team-a",
        name="demo",
        backend="synthetic",
        metric_name="synthetic-demo",
        model=None,
        profile=None,
        label_selector=(),
        scrape_targets=(),
        values=spec.values,
    )
    assert dict(spec.values) == {"backend": "synthetic"}
    assert spec.workload == "team-a/demo"
    assert spec.tuning() == {}


def test_full_vllm_trigger_parses_into_typed_values() -> None:
    metadata = {
        "scalerAddress": "gpu-queue-scaler.gpu-queue-scaler:6000",
        "backend": "vllm",
        "serverAddress": "http://prometheus.monitoring:9090/",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "labelSelector": 'namespace="inference",pod=~"llama-.*"',
        "scrapeTargets": "10.0.0.1:8000,[::1]:8002,vllm-0.vllm:8000",
        "profile": "llama-3-8b",
        "targetConcurrency": "12.5",
        "minReplicas": "1",
        "maxReplicas": "16",
        "coldStartSeconds": "240",
        "pollingIntervalSeconds": "15",
        "horizonSeconds": "300",
    }
    spec = parse_trigger("inference", "llama", metadata)
    assert spec.backend == "vllm"
    assert spec.model == "meta-llama/Llama-3.1-8B-Instruct"
    assert spec.profile == "llama-3-8b"
    assert spec.metric_name == "vllm-meta-llama-llama-3-1-8b-instruct"
    assert spec.label_selector == (("namespace", "=", "inference"), ("pod", "=~", "llama-.*"))
    assert spec.scrape_targets == (("10.0.0.1", 8000), ("::1", 8002), ("vllm-0.vllm", 8000))
    assert spec.tuning() == {
        "serverAddress": "http://prometheus.monitoring:9090",  # trailing slash dropped
        "targetConcurrency": 12.5,
        "minReplicas": 1,
        "maxReplicas": 16,
        "coldStartSeconds": 240.0,
        "pollingIntervalSeconds": 15.0,
        "horizonSeconds": 300.0,
    }
    assert type(spec.values["minReplicas"]) is int
    assert type(spec.values["maxReplicas"]) is int
    assert type(spec.values["coldStartSeconds"]) is float


def test_label_selector_unquoted_and_escaped_values() -> None:
    spec = parse_trigger("ns", "n", synthetic(labelSelector=r'app = llama , path!~"a\"b" ,x!=""'))
    assert spec.label_selector == (("app", "=", "llama"), ("path", "!~", 'a"b'), ("x", "!=", ""))


def test_values_are_whitespace_trimmed() -> None:
    spec = parse_trigger("ns", "n", {"backend": " synthetic ", "targetConcurrency": " 4 "})
    assert spec.backend == "synthetic"
    assert spec.values["targetConcurrency"] == 4.0


# --- every rejection rule -------------------------------------------------------------------

REJECTIONS = [
    pytest.param({}, "backend", ["required", ACCEPTED_BACKENDS], id="missing-backend"),
    pytest.param(
        {"targetConcurrency": "8"}, "backend", ["required", ACCEPTED_BACKENDS], id="no-backend"
    ),
    pytest.param(
        {"backend": "sglang"},
        "backend",
        ["got 'sglang'", f"accepted: {ACCEPTED_BACKENDS}"],
        id="unknown-backend",
    ),
    pytest.param(
        {"backend": "VLLM"}, "backend", ["got 'VLLM'", ACCEPTED_BACKENDS], id="backend-case"
    ),
    pytest.param(
        synthetic(colour="blue"),
        "colour",
        ["unknown key; accepted keys: see `scaler reference`"],
        id="unknown-key",
    ),
    pytest.param(
        synthetic(**{"": "x"}),
        "",
        ["unknown key; accepted keys: see `scaler reference`"],
        id="empty-key",
    ),
    pytest.param(
        synthetic(targetconcurrency="8"),
        "targetconcurrency",
        ["unknown key; did you mean 'targetConcurrency'? (accepted keys: see `scaler reference`)"],
        id="did-you-mean",
    ),
    pytest.param(
        synthetic(evaluationIntervalSeconds="5"),
        "evaluationIntervalSeconds",
        [
            "unknown key; evaluationIntervalSeconds belongs in the `server:` section of the "
            "ConfigMap (accepted keys: see `scaler reference`)"
        ],
        id="server-key-in-trigger",
    ),
    pytest.param(
        synthetic(minReplicas="1.5"),
        "minReplicas",
        ["got '1.5'; accepted: an integer from 0 to 10000"],
        id="min-replicas-fraction",
    ),
    pytest.param(
        synthetic(minReplicas="5", maxReplicas="3"),
        "minReplicas",
        ["minReplicas (5) must not exceed maxReplicas (3)"],
        id="min-above-max",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "ftp://prom:9090"},
        "serverAddress",
        ["got 'ftp://prom:9090'", "accepted: an http(s):// base URL"],
        id="url-ftp",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "http://"},
        "serverAddress",
        ["got 'http://'", "an http(s):// base URL"],
        id="url-no-host",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "prometheus:9090"},
        "serverAddress",
        ["an http(s):// base URL"],
        id="url-no-scheme",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "http://prom:9090/api?query=up"},
        "serverAddress",
        ["without query"],
        id="url-query",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "http://prom:9090/#x"},
        "serverAddress",
        ["an http(s):// base URL"],
        id="url-fragment",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "http://prom:99999"},
        "serverAddress",
        ["got 'http://prom:99999'", "an http(s):// base URL"],
        id="url-port-too-big",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "http://prom:abc"},
        "serverAddress",
        ["got 'http://prom:abc'"],
        id="url-port-not-number",
    ),
    pytest.param(
        {"backend": "vllm", "serverAddress": "http://prom:0"},
        "serverAddress",
        ["got 'http://prom:0'", "an http(s):// base URL"],
        id="url-port-zero",
    ),
    pytest.param(
        vllm(scrapeTargets="vllm-0.vllm"),
        "scrapeTargets",
        ["got 'vllm-0.vllm'", "comma-separated host:port list"],
        id="targets-no-port",
    ),
    pytest.param(
        vllm(scrapeTargets="10.0.0.1:0"),
        "scrapeTargets",
        ["comma-separated host:port list", "bad port in '10.0.0.1:0'"],
        id="targets-port-0",
    ),
    pytest.param(
        vllm(scrapeTargets="10.0.0.1:8000,10.0.0.2:70000"),
        "scrapeTargets",
        ["bad port in '10.0.0.2:70000'"],
        id="targets-port-70000",
    ),
    pytest.param(
        vllm(scrapeTargets="bad_host!:8000"),
        "scrapeTargets",
        ["bad host 'bad_host!'", "host:port list"],
        id="targets-garbage-host",
    ),
    pytest.param(
        vllm(scrapeTargets="[not-v6]:8000"),
        "scrapeTargets",
        ["host:port list"],
        id="targets-bad-ipv6",
    ),
    pytest.param(vllm(scrapeTargets=""), "scrapeTargets", ["host:port list"], id="targets-empty"),
    pytest.param(
        vllm(scrapeTargets=" , ,"), "scrapeTargets", ["host:port list"], id="targets-only-commas"
    ),
    pytest.param(
        synthetic(labelSelector="namespace"),
        "labelSelector",
        ["cannot read a matcher at 'namespace'", "comma-separated label matchers"],
        id="selector-no-operator",
    ),
    pytest.param(
        synthetic(labelSelector='9ns="x"'),
        "labelSelector",
        ["cannot read a matcher", 'name="value"'],
        id="selector-bad-label-name",
    ),
    pytest.param(
        synthetic(labelSelector='pod=~"llama-("'),
        "labelSelector",
        ["bad regular expression 'llama-('", "label matchers"],
        id="selector-bad-regex",
    ),
    pytest.param(
        synthetic(labelSelector='pod!~"[z-a]"'),
        "labelSelector",
        ["bad regular expression '[z-a]'"],
        id="selector-bad-negative-regex",
    ),
    pytest.param(
        synthetic(labelSelector=",".join(f'l{i}="v"' for i in range(21))),
        "labelSelector",
        ["at most 20"],
        id="selector-21-matchers",
    ),
    pytest.param(synthetic(labelSelector=""), "labelSelector", ["at most 20"], id="selector-empty"),
    pytest.param(
        synthetic(profile="Llama"),
        "profile",
        ["got 'Llama'", "lowercase letters, digits, '.', '_', '-'; at most 63"],
        id="profile-uppercase",
    ),
    pytest.param(synthetic(profile="a" * 64), "profile", ["at most 63"], id="profile-too-long"),
    pytest.param(
        synthetic(profile="-llama"), "profile", ["lowercase letters"], id="profile-leading-dash"
    ),
    pytest.param(
        synthetic(model="llama 3"), "model", ["got 'llama 3'", "[A-Za-z0-9._:/@+-]"], id="model"
    ),
    pytest.param(
        synthetic(metricName="my metric"),
        "metricName",
        ["up to 200 characters from [A-Za-z0-9._-]"],
        id="metric-name",
    ),
    pytest.param(
        synthetic(syntheticPattern="square"),
        "syntheticPattern",
        ["got 'square'; accepted: wave | sine | constant | zero"],
        id="synthetic-pattern",
    ),
]


@pytest.mark.parametrize(("metadata", "key", "fragments"), REJECTIONS)
def test_each_rule_rejects_naming_the_key_and_what_is_accepted(
    metadata: dict[str, str], key: str, fragments: list[str]
) -> None:
    error = rejected(metadata)
    assert [p.path for p in error.problems] == [key], str(error)
    for fragment in fragments:
        assert fragment in error.problems[0].message, str(error)
    assert str(error).startswith(f"{key or repr(key)}: ")  # an empty key is shown quoted


SYNTHETIC_VALID = {
    "syntheticPattern": "sine",
    "syntheticPeakRps": "5",
    "syntheticPeriodSeconds": "60",
    "syntheticServiceSeconds": "1",
}


def test_synthetic_keys_come_from_the_registry() -> None:
    assert set(SYNTHETIC_KEYS) == {f.key for f in FIELDS if f.key.startswith("synthetic")}
    assert set(SYNTHETIC_KEYS) == set(SYNTHETIC_VALID)


@pytest.mark.parametrize("backend", [b for b in BACKENDS if b != "synthetic"])
@pytest.mark.parametrize("key", SYNTHETIC_KEYS)
def test_synthetic_keys_are_rejected_for_other_backends(backend: str, key: str) -> None:
    error = rejected(vllm(backend=backend, **{key: SYNTHETIC_VALID[key]}))
    assert [p.path for p in error.problems] == [key]
    assert error.problems[0].message == f"applies only to backend synthetic, not {backend}"
    # ...and the same value is fine with the synthetic backend.
    assert parse_trigger("ns", "n", synthetic(**{key: SYNTHETIC_VALID[key]})).backend == "synthetic"


def test_several_problems_are_all_reported() -> None:
    error = rejected(
        {
            "model": "bad model",
            "targetConcurrency": "0",
            "minReplicas": "many",
            "targetconcurrency": "8",
            "scrapeTargets": "host",
        }
    )
    paths = [p.path for p in error.problems]
    assert sorted(paths) == sorted(
        [
            "model",
            "targetConcurrency",
            "minReplicas",
            "targetconcurrency",
            "scrapeTargets",
            "backend",
        ]
    )
    assert len(error.problems) == 6
    for path in paths:
        assert f"{path}: " in str(error)


def test_several_problems_with_backend_include_bounds_and_synthetic_keys() -> None:
    error = rejected(
        vllm(minReplicas="9", maxReplicas="2", syntheticPeakRps="3", profile="UPPER", foo="1")
    )
    assert sorted(p.path for p in error.problems) == [
        "foo",
        "minReplicas",
        "profile",
        "syntheticPeakRps",
    ]


def test_huge_repetition_count_in_label_regex_is_a_trigger_error() -> None:
    # re.compile raises OverflowError (not re.error) for a repeat count beyond 2**32.
    error = rejected(synthetic(labelSelector='pod=~"a{99999999999}"'))
    assert [p.path for p in error.problems] == ["labelSelector"]


def test_deeply_nested_label_regex_is_a_trigger_error() -> None:
    # re.compile raises RecursionError for a deeply nested pattern.
    error = rejected(synthetic(labelSelector='pod=~"' + "(" * 2000 + ")" * 2000 + '"'))
    assert [p.path for p in error.problems] == ["labelSelector"]


# --- metric names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("Llama_3.1--8B", "llama-3-1-8b"),
        ("--vllm--Llama--", "vllm-llama"),
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-llama-3-1-8b-instruct"),
        ("a  b\tc", "a-b-c"),
        ("ÄÖÜ-model", "model"),
        ("", "workload"),
        ("!!!", "workload"),
    ],
)
def test_sanitize_metric_name(raw: str, expected: str) -> None:
    assert sanitize_metric_name(raw) == expected


def test_long_metric_name_is_cut_with_hash_suffix() -> None:
    raw = "m" * 300
    name = sanitize_metric_name(raw)
    assert len(name) == METRIC_NAME_MAX == 100
    assert name == "m" * 91 + "-" + hashlib.sha256(raw.encode()).hexdigest()[:8]


def test_long_names_differing_only_at_the_end_do_not_collide() -> None:
    first = sanitize_metric_name("model-" + "x" * 200 + "-a")
    second = sanitize_metric_name("model-" + "x" * 200 + "-b")
    assert first != second
    assert len(first) <= 100
    assert len(second) <= 100
    assert first[:-8] == second[:-8]


def test_name_of_exactly_100_is_kept_and_101_is_cut() -> None:
    assert sanitize_metric_name("a" * 100) == "a" * 100
    assert len(sanitize_metric_name("a" * 101)) == 100
    assert sanitize_metric_name("a" * 101) != "a" * 100


def test_cut_never_leaves_double_dash_before_the_hash() -> None:
    name = sanitize_metric_name("a" * 90 + "-" + "b" * 50)
    assert "--" not in name
    assert METRIC_NAME_RE.fullmatch(name)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.text(max_size=400))
def test_sanitized_name_is_always_valid(raw: str) -> None:
    name = sanitize_metric_name(raw)
    assert METRIC_NAME_RE.fullmatch(name), name
    assert len(name) <= METRIC_NAME_MAX
    assert "--" not in name


def test_default_metric_name_is_backend_and_model_or_name() -> None:
    assert parse_trigger("ns", "My_App", synthetic()).metric_name == "synthetic-my-app"
    with_model = parse_trigger("ns", "My_App", synthetic(model="Qwen/Qwen2.5-7B"))
    assert with_model.metric_name == "synthetic-qwen-qwen2-5-7b"


def test_metric_name_override_is_used_and_sanitised() -> None:
    spec = parse_trigger("ns", "app", synthetic(model="llama", metricName="GPU.Queue_Llama"))
    assert spec.metric_name == "gpu-queue-llama"


# --- accepts_metric -------------------------------------------------------------------------


@pytest.fixture
def demo_spec() -> TriggerSpec:
    spec = parse_trigger("team-a", "demo", synthetic(model="llama"))
    assert spec.metric_name == "synthetic-llama"
    return spec


@pytest.mark.parametrize(
    ("metric", "accepted"),
    [
        ("synthetic-llama", True),
        ("s0-synthetic-llama", True),
        ("s12-synthetic-llama", True),
        ("x0-synthetic-llama", False),
        ("s-synthetic-llama", False),
        ("s0synthetic-llama", False),
        ("s0-synthetic-llama-2", False),
        ("s0-", False),
        ("synthetic-other", False),
        ("", False),
    ],
)
def test_accepts_metric(demo_spec: TriggerSpec, metric: str, accepted: bool) -> None:
    assert demo_spec.accepts_metric(metric) is accepted


# --- TriggerCache -----------------------------------------------------------------------------


def test_cache_returns_the_identical_spec() -> None:
    cache = TriggerCache()
    first = cache.parse("ns", "a", synthetic(targetConcurrency="4"))
    again = cache.parse("ns", "a", dict(synthetic(targetConcurrency="4")))
    assert again is first
    assert len(cache) == 1
    other_name = cache.parse("ns", "b", synthetic(targetConcurrency="4"))
    assert other_name is not first
    assert other_name.name == "b"
    assert len(cache) == 2


def test_cache_keeps_failures_as_problems_and_raises_a_new_error_each_time() -> None:
    """A cached rejection is its problems, not the exception: raising one exception again at
    every poll grew its traceback by every raise's frames (RSS +3.7 KB a call)."""
    cache = TriggerCache()
    bad = {"backend": "nope"}
    depths = []
    for _ in range(200):
        with pytest.raises(TriggerError) as raised:
            cache.parse("ns", "a", bad)
        depths.append(len(traceback.extract_tb(raised.value.__traceback__)))
        assert [p.path for p in raised.value.problems] == ["backend"]
    with pytest.raises(TriggerError) as again:
        cache.parse("ns", "a", bad)
    assert again.value is not raised.value
    assert len(set(depths)) == 1  # the same frames each time, not one more set per raise
    assert len(cache) == 1


def test_cache_is_bounded_by_bytes_and_keeps_no_input_whole() -> None:
    """2,000 rejected triggers with distinct 100 KB values kept 803 MB: the cache kept each
    map whole (its key) and each error quoting it. Now an entry keeps a digest and short
    problems, and the cache is bounded by an estimate of bytes as well as entries."""
    cache = TriggerCache(max_bytes=2_000_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for index in range(300):
            huge = f"{index}" + "x" * 100_000
            with pytest.raises(TriggerError) as raised:
                cache.parse("ns", "a", {**synthetic(), "targetConcurrency": huge, huge: "1"})
            assert all(len(p.path) <= 80 and len(p.message) <= 1200 for p in raised.value.problems)
            del raised, huge
        targets = ",".join(f"10.0.{i // 250}.{i % 250}:8000" for i in range(1000))
        for index in range(300):  # accepted ones, each parsed into 1,000 (host, port) pairs
            cache.parse("ns", f"ok-{index}", {"backend": "vllm", "scrapeTargets": targets})
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert cache.bytes <= 2_000_000
    assert grown < 4_000_000, grown  # the inputs were 35 MB, the parsed specs 45 MB


def test_cache_keeps_at_most_a_few_problems_each_cut_short() -> None:
    cache = TriggerCache()
    metadata = {**synthetic(), **{f"k{i}-" + "z" * 500: "v" for i in range(300)}}
    for _ in range(2):
        with pytest.raises(TriggerError) as raised:
            cache.parse("ns", "many", metadata)
        problems = raised.value.problems
        assert len(problems) == PROBLEMS_KEPT + 1
        assert problems[-1].message == "and 280 more problems not shown"
        assert all(len(p.path) <= 80 for p in problems)


def test_cache_evicts_the_oldest_beyond_capacity() -> None:
    cache = TriggerCache(capacity=2)
    a = cache.parse("ns", "a", synthetic())
    b = cache.parse("ns", "b", synthetic())
    cache.parse("ns", "c", synthetic())
    assert len(cache) == 2
    assert cache.parse("ns", "a", synthetic()) is not a  # evicted, parsed anew (evicts b)
    assert cache.parse("ns", "b", synthetic()) is not b


def test_cache_eviction_is_least_recently_used() -> None:
    cache = TriggerCache(capacity=2)
    a = cache.parse("ns", "a", synthetic())
    b = cache.parse("ns", "b", synthetic())
    assert cache.parse("ns", "a", synthetic()) is a  # a is now the most recent
    cache.parse("ns", "c", synthetic())  # evicts b
    assert len(cache) == 2
    assert cache.parse("ns", "a", synthetic()) is a
    assert cache.parse("ns", "b", synthetic()) is not b


# --- fuzz -----------------------------------------------------------------------------------

KNOWN_KEYS = (*TRIGGER_KEYS, *SERVER_KEYS, "targetconcurrency", "Backend", "")
INTERESTING_VALUES = (
    "synthetic",
    "vllm",
    "0",
    "-1",
    "1e309",
    "nan",
    "1.5",
    "http://[::1",
    "http://h:99999",
    "[::1]:8000",
    "a:1,b:",
    'a=~"("',
    'a="x",b!~"y"',
    "Llama",
)


@settings(
    max_examples=2000,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    st.dictionaries(
        st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=30)),
        st.one_of(st.sampled_from(INTERESTING_VALUES), st.text(max_size=60)),
        max_size=12,
    )
)
def test_fuzz_only_trigger_errors_each_naming_an_input_key(metadata: dict[str, str]) -> None:
    error: TriggerError | None = None
    try:
        spec: Any = parse_trigger("ns", "fuzz", metadata)
    except TriggerError as exc:
        error = exc
    if error is None:
        assert spec.backend in BACKENDS
        assert METRIC_NAME_RE.fullmatch(spec.metric_name)
        return
    assert str(error)
    assert error.problems
    for problem in error.problems:
        assert problem.message
        assert problem.path in metadata or problem.path == "backend"
