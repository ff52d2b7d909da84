"""The Prometheus source: catalog expressions rendered as PromQL, and reads against a fake
Prometheus HTTP API on 127.0.0.1 that answers each rendered query as the test says."""

from __future__ import annotations

import asyncio
import http.server
import json
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus

import pytest

from gpu_queue_scaler.catalog import CATALOGS, SIGNAL_FIELDS, signal_exprs
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.sources import SourceError, batching
from gpu_queue_scaler.sources.batching import BATCH_MAX_QUERY_CHARS
from gpu_queue_scaler.sources.prometheus import PrometheusSource
from gpu_queue_scaler.sources.promql import (
    FIELD_LABEL,
    MAX_QUERY_URL_CHARS,
    combined_groups,
    combined_query,
    matchers_for,
    render,
)
from gpu_queue_scaler.sources.scrape import ScrapeSource
from tests.servers.base import write_reply

SELECTOR = 'service="llama",pod=~"llama-.*"'


def modules_loaded_by(module: str) -> set[str]:
    """The modules a fresh interpreter holds after importing `module` alone."""
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return set(done.stdout.split())


@pytest.mark.parametrize("module", [render.__module__, ScrapeSource.__module__])
def test_rendering_and_the_scrape_source_load_no_prometheus_transport(module: str) -> None:
    """PromQL rendering is pure, and the direct-scrape source shares only its label matchers with
    the Prometheus source: neither loads that source or its HTTP client."""
    loaded = modules_loaded_by(module)
    transport = {PrometheusSource.__module__, "prometheus_api_client", "requests"}
    assert not loaded & transport, sorted(loaded & transport)
    if module == render.__module__:
        io = loaded & {"asyncio", "httpx", "urllib3", "socket"}
        assert not io, f"rendering does no I/O, but loads {sorted(io)}"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback traffic never goes through a proxy from the environment (requests reads it)."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def make_spec(backend: str = "vllm", url: str = "http://127.0.0.1:1", **extra: str) -> WorkloadSpec:
    metadata = {
        "backend": backend,
        "model": "m",
        "serverAddress": url,
        "labelSelector": SELECTOR,
        **extra,
    }
    return resolve(parse_trigger("team-a", "llama", metadata), Config())


def rendered(spec: WorkloadSpec) -> dict[str, str]:
    backend = spec.trigger.backend
    matchers = matchers_for(spec, CATALOGS[backend].model_label)
    return {
        field: render(expr, spec, matchers)
        for field, expr in signal_exprs(backend, spec.queries).items()
    }


# --- render --------------------------------------------------------------------------------------

MODEL_MATCHER = {"vllm": 'model_name="m"', "triton": 'model="m"'}


@pytest.mark.parametrize("backend", ["vllm", "triton"])
def test_every_selector_carries_model_namespace_and_label_selector(backend: str) -> None:
    queries = rendered(make_spec(backend))
    assert set(queries) == set(CATALOGS[backend].signals)
    for field, query in queries.items():
        selectors = re.findall(r"\{([^{}]*)\}", query)
        assert selectors, (field, query)
        for selector in selectors:
            assert MODEL_MATCHER[backend] in selector, (field, query)
            assert 'namespace="team-a"' in selector, (field, query)
            assert 'service="llama"' in selector, (field, query)
            assert 'pod=~"llama-.*"' in selector, (field, query)


def test_vllm_queries() -> None:
    q = rendered(make_spec("vllm"))
    sel = 'model_name="m",namespace="team-a",service="llama",pod=~"llama-.*"'
    # Both spellings of every vLLM name, joined with `or`.
    assert q["waiting"] == (
        f"(sum(vllm:num_requests_waiting{{{sel}}}) or sum(vllm_num_requests_waiting{{{sel}}}))"
    )
    assert q["running"] == (
        f"(sum(vllm:num_requests_running{{{sel}}}) or sum(vllm_num_requests_running{{{sel}}}))"
    )
    assert q["ready_pods"].startswith(f"(count(vllm:num_requests_waiting{{{sel}}}) or ")
    # Arrivals: completions + in-flight growth, clamped at 0; the growth terms are optional.
    arrival = q["arrival_rate"]
    assert arrival.startswith("clamp_min(") and arrival.endswith(", 0)")
    assert f"sum(rate(vllm:request_success_total{{{sel}}}[60s]))" in arrival
    assert f"sum(rate(vllm_request_success_total{{{sel}}}[60s]))" in arrival
    assert f"sum(deriv(vllm:num_requests_waiting{{{sel}}}[60s]))" in arrival
    assert f"sum(deriv(vllm:num_requests_running{{{sel}}}[60s]))" in arrival
    assert arrival.count("or vector(0)") == 2
    # Mean queue time: rate(sum) / rate(count).
    mean = q["queue_time_mean_s"]
    assert f"sum(rate(vllm:request_queue_time_seconds_sum{{{sel}}}[60s]))" in mean
    assert ") / (" in mean
    assert f"sum(rate(vllm:request_queue_time_seconds_count{{{sel}}}[60s]))" in mean
    # Quantiles from buckets, summed by le.
    for field, base in (
        ("queue_time_p99_s", "request_queue_time_seconds"),
        ("ttft_p99_s", "time_to_first_token_seconds"),
    ):
        for name in (f"vllm:{base}", f"vllm_{base}"):
            assert (
                f"histogram_quantile(0.99, sum by (le) (rate({name}_bucket{{{sel}}}[60s])))"
                in q[field]
            )
    # KV cache: the pods' mean, under both the current and the pre-0.9.2 names.
    for name in (
        "vllm:kv_cache_usage_perc",
        "vllm_kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
    ):
        assert f"avg({name}{{{sel}}})" in q["kv_cache_usage"]


def test_triton_queries() -> None:
    q = rendered(make_spec("triton"))
    sel = 'model="m",namespace="team-a",service="llama",pod=~"llama-.*"'
    assert q["waiting"] == f"sum(nv_inference_pending_request_count{{{sel}}})"
    assert q["ready_pods"] == f"count(nv_inference_pending_request_count{{{sel}}})"
    # Compute microseconds per second = requests in compute.
    assert f"sum(rate(nv_inference_compute_infer_duration_us{{{sel}}}[60s]))" in q["running"]
    assert q["running"].endswith("* 1e-06)")
    # Arrivals: successes + failures, the failure counter optional.
    arrival = q["arrival_rate"]
    assert f"sum(rate(nv_inference_request_success{{{sel}}}[60s]))" in arrival
    assert f"sum(rate(nv_inference_request_failure{{{sel}}}[60s]))" in arrival
    assert arrival.endswith("or vector(0))")
    assert "clamp_min" not in arrival
    mean = q["queue_time_mean_s"]
    assert f"sum(rate(nv_inference_queue_duration_us{{{sel}}}[60s]))" in mean
    assert ") / (" in mean
    p99 = q["queue_time_p99_s"]
    assert p99 == f'(max(nv_inference_queue_summary_us{{{sel},quantile="0.99"}}) * 1e-06)'
    assert q["ttft_p99_s"] == (
        "(histogram_quantile(0.99, sum by (le) "
        f"(rate(nv_inference_first_response_histogram_ms_bucket{{{sel}}}[60s]))) * 0.001)"
    )


@pytest.mark.parametrize("backend", ["vllm", "triton"])
def test_the_rate_window_follows_rate_window_seconds(backend: str) -> None:
    queries = rendered(make_spec(backend, rateWindowSeconds="90"))
    ranged = [q for q in queries.values() if "rate(" in q or "deriv(" in q]
    assert ranged
    for query in ranged:
        assert "[90s]" in query
        assert "[60s]" not in query


def test_label_values_with_quotes_and_backslashes_are_escaped() -> None:
    spec = make_spec("vllm", labelSelector=r'team="a\"b\\c"')
    assert spec.trigger.label_selector == (("team", "=", 'a"b\\c'),)
    waiting = rendered(spec)["waiting"]
    assert r'team="a\"b\\c"' in waiting
    # Every quote inside the selectors is escaped: the selector still ends where it should.
    assert 'sum(vllm:num_requests_waiting{model_name="m",namespace="team-a",team="a' in waiting


def test_namespace_label_none_drops_the_namespace_matcher() -> None:
    for query in rendered(make_spec("vllm", namespaceLabel="none")).values():
        assert "namespace=" not in query
        assert 'model_name="m"' in query


def test_a_custom_namespace_label() -> None:
    for query in rendered(make_spec("triton", namespaceLabel="kubernetes_namespace")).values():
        assert 'kubernetes_namespace="team-a"' in query
        assert ',namespace="' not in query


def test_a_promql_override_substitutes_selector_and_model() -> None:
    spec = make_spec("vllm", waitingQuery='sum(my_queue_depth{$selector, served_model="$model"})')
    q = rendered(spec)
    assert q["waiting"] == (
        'sum(my_queue_depth{model_name="m",namespace="team-a",service="llama",pod=~"llama-.*", '
        'served_model="m"})'
    )
    # The other signals keep the built-in queries.
    assert q["running"].startswith("(sum(vllm:num_requests_running{")


# --- a fake Prometheus HTTP API ------------------------------------------------------------------


@dataclass
class Answer:
    """How the fake answers one query."""

    status: int = 200
    body: bytes = b""
    delay_s: float = 0.0


def vector(*values: float | str) -> Answer:
    result = [
        {"metric": {"pod": f"p{i}"}, "value": [time.time(), str(v)]} for i, v in enumerate(values)
    ]
    doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return Answer(body=json.dumps(doc).encode())


class _Listener(http.server.ThreadingHTTPServer):
    """A backlog for every read's queries at once: with the default of 5, queries asked one by
    one next to hung ones overflowed it on a loaded machine, the kernel dropped their SYNs, and
    the retransmit (1 s) outlasted the 0.5 s connect timeout the tests set, so a query that
    answers at once read as missing."""

    request_queue_size = 128


class FakePrometheus:
    """`GET /api/v1/query` (and POST, the query in a form body) on 127.0.0.1:<free port>, in a
    thread. `answer(query)` decides."""

    def __init__(self, answer: Callable[[str], Answer]) -> None:
        self.answer = answer
        self.queries: list[str] = []
        self.posted: list[str] = []  # the queries that came in a POSTed body
        self.refuse_post = False
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                self.reply(url.path, urllib.parse.parse_qs(url.query).get("query", [""])[0])

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                query = urllib.parse.parse_qs(body.decode()).get("query", [""])[0]
                with fake._lock:
                    fake.posted.append(query)
                if fake.refuse_post:  # a proxy in front that takes GET only
                    write_reply(self, 405, b"method not allowed", "text/plain")
                    return
                self.reply(urllib.parse.urlsplit(self.path).path, query)

            def reply(self, path: str, query: str) -> None:
                with fake._lock:
                    fake.queries.append(query)
                reply = fake.answer(query) if path == "/api/v1/query" else Answer(404)
                if reply.delay_s and fake._stopping.wait(reply.delay_s):
                    return
                write_reply(self, reply.status, reply.body, "application/json")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = _Listener(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self.port = int(self._httpd.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def requests(self) -> int:
        with self._lock:
            return len(self.queries)

    def stop(self) -> None:
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def prometheus() -> Iterator[Callable[[Callable[[str], Answer]], FakePrometheus]]:
    started: list[FakePrometheus] = []

    def start(answer: Callable[[str], Answer]) -> FakePrometheus:
        server = FakePrometheus(answer)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


GOOD = {
    "waiting": 14.0,
    "running": 2.0,
    "arrival_rate": 3.5,
    "queue_time_mean_s": 1.25,
    "queue_time_p99_s": 4.5,
    "ttft_p99_s": 0.8,
    "kv_cache_usage": 0.75,
    "ready_pods": 2.0,
    "service_time_s": 1.75,
    "prompt_tokens_rate": 900.0,
    "generation_tokens_rate": 240.0,
}


COMBINED_PART = re.compile(
    r'label_replace\(\((.*?)\), "' + FIELD_LABEL + r'", "([\w/]+)", "", ""\)(?=\)* or |\)*$)'
)


def combined_answer(query: str, answer: Callable[[str], Answer]) -> Answer | None:
    """A combined query (`combined_query`) answered as Prometheus would from each part's own
    answer: the series of each, tagged with its signal. A part that fails the request (an HTTP
    error, garbage, a delay) fails the whole. None when `query` is not a combined one."""
    parts = [(m.group(1), m.group(2)) for m in COMBINED_PART.finditer(query)]
    if not parts or combined_query({field: inner for inner, field in parts}) != query:
        return None
    series: list[dict[str, Any]] = []
    delay = 0.0
    for inner, field in parts:
        reply = answer(inner)
        delay = max(delay, reply.delay_s)
        try:
            doc = json.loads(reply.body)
            result = doc["data"]["result"]
        except (ValueError, KeyError, TypeError):
            return reply
        if reply.status != 200:
            return reply
        series += [{**s, "metric": {**s["metric"], FIELD_LABEL: field}} for s in result]
    doc = {"status": "success", "data": {"resultType": "vector", "result": series}}
    return Answer(body=json.dumps(doc).encode(), delay_s=delay)


def answers(
    spec: WorkloadSpec, special: dict[str, Answer] | None = None
) -> Callable[[str], Answer]:
    """Each rendered query answered with GOOD (or its `special` answer); the sample-age query with
    a fresh timestamp; a combined query from its parts' answers; anything else with HTTP 400 (a
    query we did not expect)."""
    by_query = {query: field for field, query in rendered(spec).items()}
    special = special or {}

    def answer(query: str) -> Answer:
        field = by_query.get(query)
        if field is None:
            if query.startswith("max(timestamp("):
                return special.get("_newest") or vector(time.time())
            combined = combined_answer(query, answer)
            if combined is not None:
                return combined
            return Answer(400, b'{"status":"error","error":"unexpected query"}')
        return special.get(field) or vector(GOOD[field])

    return answer


def requests_per_read(spec: WorkloadSpec) -> int:
    """How many requests one read sends: its queries (with the sample-age one) in groups."""
    queries = rendered(spec)
    queries["_newest"] = "max(timestamp(" + "x" * 200 + "))"  # about its length
    return len(combined_groups(queries))


# A query that never answers while the test runs (the fake's wait ends when it stops): a read
# that returns at all was ended by its own timeout, which `read` bounds.
HUNG_S = 3600.0


async def read(source: PrometheusSource, spec: WorkloadSpec, at: float = 1000.0) -> Any:
    """One read, bounded: the read's own deadline plus slack (TimeoutError past it)."""
    return await asyncio.wait_for(source.read(spec, at), timeout=spec.read_deadline_s + 10)


async def test_good_answers_give_every_value(prometheus: Any) -> None:
    server, spec = await start_with(prometheus, {})
    signal = await read(PrometheusSource(server.url), spec)
    for field in SIGNAL_FIELDS:
        assert getattr(signal, field) == pytest.approx(GOOD[field]), field
    assert signal.ready_pods == 2
    assert signal.source == "prometheus"
    assert signal.reasons == ()
    assert signal.age_s is not None and 0 <= signal.age_s < 30
    # Every signal's query and the sample-age query, combined in a few requests (within the URL
    # budget); all scoped to the deployment.
    assert len(server.queries) == requests_per_read(spec) < len(SIGNAL_FIELDS) + 1
    assert all(len(quote_plus(q)) <= MAX_QUERY_URL_CHARS for q in server.queries)
    assert all('model_name="m"' in q for q in server.queries)


def spec_with(server: FakePrometheus, backend: str = "vllm", **extra: str) -> WorkloadSpec:
    return make_spec(backend, server.url, **extra)


async def start_with(
    prometheus: Any, special: dict[str, Answer], backend: str = "vllm", **extra: str
) -> tuple[FakePrometheus, WorkloadSpec]:
    """A fake whose answers are keyed by the queries of the spec that points at it."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    spec = spec_with(server, backend, **extra)
    holder["answer"] = answers(spec, special)
    return server, spec


async def test_long_custom_queries_are_combined_within_the_url_budget(prometheus: Any) -> None:
    """Custom queries of thousands of characters (up to 4,000 are accepted) still read, each
    request's URL-encoded query within MAX_QUERY_URL_CHARS: a long query gets a request of its
    own (as every query had before they were combined) rather than making a combined request
    longer still."""
    padding = " + ".join(
        f'(sum(my_queue_depth{{$selector, shard="{i:03d}"}}) or vector(0))' for i in range(60)
    )
    long_query = f"({padding})"
    assert 3000 < len(long_query) <= 4000
    server, spec = await start_with(
        prometheus, {}, waitingQuery=long_query, runningQuery=long_query.replace("depth", "run")
    )
    signal = await read(PrometheusSource(server.url), spec)
    assert signal.waiting == GOOD["waiting"] and signal.running == GOOD["running"]
    assert signal.arrival_rate == GOOD["arrival_rate"]
    assert signal.reasons == ()
    assert 2 < len(server.queries) < len(SIGNAL_FIELDS) + 1
    own = set(rendered(spec).values())
    for query in server.queries:  # within the budget, or one signal's query on its own
        assert len(quote_plus(query)) <= MAX_QUERY_URL_CHARS or query in own
    assert any(q in own for q in server.queries)  # the long ones went alone


async def test_no_series_leaves_the_field_missing_with_a_reason(prometheus: Any) -> None:
    server, spec = await start_with(prometheus, {"waiting": vector()})
    signal = await read(PrometheusSource(server.url), spec)
    assert signal.waiting is None
    assert signal.running == 2.0
    reason = next(r for r in signal.reasons if r.startswith("waiting:"))
    assert "no series" in reason


FAILURES = {
    "http-500": (Answer(500, b'{"status":"error","error":"boom"}'), "500"),
    "garbage-json": (Answer(200, b"<html>not json"), "JSONDecodeError"),
    "no-result": (Answer(200, b'{"data": {}}'), "answered garbage"),
    "nan": (vector("NaN"), "non-finite"),
    "two-series": (vector(1, 2), "2 series"),
}


@pytest.mark.parametrize("kind", list(FAILURES))
async def test_a_bad_answer_leaves_that_field_missing_with_a_reason(
    prometheus: Any, kind: str
) -> None:
    answer, says = FAILURES[kind]
    server, spec = await start_with(prometheus, {"waiting": answer})
    signal = await read(PrometheusSource(server.url), spec)
    assert signal.waiting is None
    assert signal.running == 2.0
    assert signal.arrival_rate == 3.5
    reasons = [r for r in signal.reasons if r.startswith("waiting:")]
    assert len(reasons) == 1
    assert says in reasons[0]
    assert "vllm:num_requests_waiting" in reasons[0]  # the reason shows the query


async def test_when_every_query_fails_the_read_fails(prometheus: Any) -> None:
    server = prometheus(lambda query: Answer(500, b'{"status":"error","error":"down"}'))
    spec = spec_with(server)
    with pytest.raises(SourceError) as caught:
        await read(PrometheusSource(server.url), spec)
    assert "500" in str(caught.value)


async def test_a_stale_newest_sample_fails_the_read(prometheus: Any) -> None:
    """Prometheus answers, but its newest sample is 10 minutes old: a dead scrape, not data."""
    server, spec = await start_with(
        prometheus, {"_newest": vector(time.time() - 600)}, maxSampleAgeSeconds="60"
    )
    with pytest.raises(SourceError) as caught:
        await read(PrometheusSource(server.url), spec)
    assert "newest sample" in str(caught.value)


async def slow_read(prometheus: Any) -> Any:
    """`waiting` and `running` never answer (HUNG_S) against a 0.5 s query timeout; the rest
    answer at once. Two reads, each bounded by `read` (a read that waited for the hung queries
    would time out there): the first asks for the signals combined, so the slow queries hold up
    the ones they share a request with; the second asks one query per signal."""
    slow = Answer(delay_s=HUNG_S)
    server, spec = await start_with(
        prometheus, {"waiting": slow, "running": slow}, queryTimeoutSeconds="0.5"
    )
    source = PrometheusSource(server.url)
    return [await read(source, spec, at) for at in (1000.0, 1010.0)]


async def test_a_slow_query_leaves_its_field_missing_in_bounded_time(prometheus: Any) -> None:
    first, second = await slow_read(prometheus)
    assert first.waiting is None and first.running is None
    # The signals asked in another request than the slow ones answered.
    groups = combined_groups({**rendered(make_spec()), "_newest": "max(timestamp(x))"})
    apart = [f for g in groups if "waiting" not in g and "running" not in g for f in g]
    assert [f for f in apart if f != "_newest"]
    assert all(getattr(first, f) is not None for f in apart if f != "_newest")
    # After the timeout, one query per signal: only the slow ones are missing.
    assert second.waiting is None and second.running is None
    assert second.arrival_rate == 3.5
    assert second.kv_cache_usage == 0.75
    assert any(r.startswith("waiting:") for r in second.reasons)


async def test_a_slow_query_reason_says_it_timed_out(prometheus: Any) -> None:
    """The operator must be able to tell a timeout from a refused connection. requests reports a
    retried read timeout as `ConnectionError: ... Max retries exceeded with url: <the whole
    URL-encoded query> (Caused by ReadTimeoutError(...))`, and the 300-character cut drops the
    cause."""
    for signal in await slow_read(prometheus):
        reason = next(r for r in signal.reasons if r.startswith("waiting:"))
        assert "timed out" in reason.lower() or "timeout" in reason.lower(), reason


async def test_a_hung_prometheus_fails_the_read_in_bounded_time(prometheus: Any) -> None:
    server = prometheus(lambda query: Answer(delay_s=HUNG_S))
    spec = spec_with(server, queryTimeoutSeconds="0.5")
    with pytest.raises(SourceError):  # not `read`'s TimeoutError: the read's own timeout ended it
        await read(PrometheusSource(server.url), spec)


async def test_connection_refused_fails_the_read_naming_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    spec = make_spec("vllm", url)
    with pytest.raises(SourceError) as caught:
        await read(PrometheusSource(url), spec)
    assert url in str(caught.value)


async def test_reads_within_query_interval_reuse_the_last_answer(prometheus: Any) -> None:
    special = {"waiting": vector(14.0)}
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    spec = spec_with(server, queryIntervalSeconds="5")
    holder["answer"] = answers(spec, special)
    source = PrometheusSource(server.url)
    first = await read(source, spec, at=1000.0)
    per_read = server.requests
    assert first.waiting == 14.0
    assert per_read == requests_per_read(spec)

    special["waiting"] = vector(20.0)
    again = await read(source, spec, at=1004.9)
    assert server.requests == per_read  # Prometheus was not asked
    assert again.waiting == 14.0

    later = await read(source, spec, at=1005.0)
    assert server.requests == 2 * per_read
    assert later.waiting == 20.0


async def test_a_changed_spec_is_read_with_its_own_queries(prometheus: Any) -> None:
    """The source renders a workload's PromQL once per spec: a config reload or a changed trigger
    (a new spec for the same workload) is read with the new queries on its next read."""
    server, spec = await start_with(prometheus, {}, queryIntervalSeconds="0")
    source = PrometheusSource(server.url)
    await read(source, spec, at=1000.0)
    assert any("[60s]" in q for q in server.queries)
    assert not any("[120s]" in q for q in server.queries)
    wider = spec_with(server, queryIntervalSeconds="0", rateWindowSeconds="120")
    seen = len(server.queries)
    await read(source, wider, at=1001.0)
    asked = server.queries[seen:]
    assert any("[120s]" in q for q in asked) and not any("[60s]" in q for q in asked)


async def test_query_interval_zero_queries_every_read(prometheus: Any) -> None:
    server, spec = await start_with(prometheus, {}, queryIntervalSeconds="0")
    source = PrometheusSource(server.url)
    await read(source, spec, at=1000.0)
    await read(source, spec, at=1000.0)
    assert server.requests == 2 * requests_per_read(spec)


# --- reads of several workloads in one request -------------------------------------------------


def team(server: FakePrometheus, size: int, **extra: str) -> list[WorkloadSpec]:
    """`size` vLLM workloads on `server`, each its own model (so its own queries)."""
    return [
        resolve(
            parse_trigger(
                "team-a",
                f"llama-{i}",
                {"backend": "vllm", "model": f"m{i}", "serverAddress": server.url, **extra},
            ),
            Config(),
        )
        for i in range(size)
    ]


def team_answers(
    specs: list[WorkloadSpec], special: dict[tuple[int, str], Answer] | None = None
) -> Callable[[str], Answer]:
    """Workload i's `waiting` is 100 + i (so an answer routed to the wrong workload shows), the
    rest GOOD; (i, field) in `special` answers otherwise; combined queries from their parts."""
    by_query = {q: (i, f) for i, spec in enumerate(specs) for f, q in rendered(spec).items()}
    special = special or {}

    def answer(query: str) -> Answer:
        found = by_query.get(query)
        if found is None:
            if query.startswith("max(timestamp("):
                return vector(time.time())
            return combined_answer(query, answer) or Answer(400, b'{"error":"unexpected"}')
        if found in special:
            return special[found]
        i, field = found
        return vector(100.0 + i if field == "waiting" else GOOD[field])

    return answer


async def read_together(source: PrometheusSource, specs: list[WorkloadSpec], at: float) -> Any:
    """Every workload's read started at once, as the engine's ticks of one phase slot are."""
    return await asyncio.gather(*(read(source, spec, at) for spec in specs))


@pytest.fixture
def one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches bounded by BATCH_MAX_READS only, so a test's few workloads make one."""
    monkeypatch.setattr(batching, "BATCH_MAX_QUERY_CHARS", 10**9)


def assert_own_values(signals: list[Any]) -> None:
    for i, signal in enumerate(signals):
        assert signal.waiting == 100.0 + i
        assert signal.running == GOOD["running"] and signal.ready_pods == 2
        assert signal.reasons == ()


async def test_workloads_that_read_together_share_one_request(
    prometheus: Any, one_batch: None
) -> None:
    """Twelve workloads ticking together are one POSTed request (their 144 queries combined),
    each workload's values its own, as twelve reads alone would have them."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    specs = team(server, 12, queryIntervalSeconds="0")
    holder["answer"] = team_answers(specs)
    signals = await read_together(PrometheusSource(server.url), specs, 1000.0)
    assert server.requests == 1 and len(server.posted) == 1
    assert_own_values(signals)
    alone = [await read(PrometheusSource(server.url), spec, 1000.0) for spec in specs]
    assert len(server.posted) == 1  # a read with no company asks alone, still combined
    assert server.requests == 1 + 12 * requests_per_read(specs[0])
    assert [s.waiting for s in alone] == [s.waiting for s in signals]


async def test_a_batch_stays_within_its_query_budget(prometheus: Any) -> None:
    """Prometheus's cost per query grows faster than its length: twelve workloads that tick
    together go as a few requests of about BATCH_MAX_QUERY_CHARS each, every query asked once."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    specs = team(server, 12, queryIntervalSeconds="0")
    holder["answer"] = team_answers(specs)
    assert_own_values(await read_together(PrometheusSource(server.url), specs, 1000.0))
    one_read = len(combined_query(rendered(specs[0])))
    assert 2 <= len(server.posted) <= 12 * one_read // BATCH_MAX_QUERY_CHARS + 1
    for query in server.posted:
        assert len(query) < BATCH_MAX_QUERY_CHARS + 2 * one_read
    tags = [[m.group(2) for m in COMBINED_PART.finditer(query)] for query in server.posted]
    assert all(len(set(each)) == len(each) for each in tags)
    assert sum(map(len, tags)) == 12 * (len(SIGNAL_FIELDS) + 1)


async def test_a_bad_query_in_a_batch_costs_only_its_own_signal(
    prometheus: Any, one_batch: None
) -> None:
    """Prometheus rejects the batch for one workload's query: every workload asks again alone in
    the same read, so only that workload's signal is missing, with a reason naming its query;
    the next reads batch the others again, without the one at fault."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    specs = team(server, 6, queryIntervalSeconds="0")
    bad = Answer(400, b'{"status":"error","error":"parse error"}')
    holder["answer"] = team_answers(specs, {(3, "running"): bad})
    source = PrometheusSource(server.url)
    first = await read_together(source, specs, 1000.0)
    assert [s.waiting for s in first] == [100.0 + i for i in range(6)]
    assert first[3].running is None
    assert any(r.startswith("running:") and "400" in r for r in first[3].reasons)
    assert all(
        s.running == GOOD["running"] and s.reasons == () for i, s in enumerate(first) if i != 3
    )
    posted = len(server.posted)
    second = await read_together(source, specs, 1010.0)
    assert len(server.posted) == posted + 1  # the five others, together again
    assert [s.waiting for s in second] == [100.0 + i for i in range(6)]
    assert second[3].running is None and second[3].waiting == 103.0


async def test_a_batch_that_times_out_sends_its_workloads_alone(
    prometheus: Any, one_batch: None
) -> None:
    """One workload's slow query holds up the whole batch past its timeout: that read's signals
    are missing for every workload in it (each read fails, and the engine holds each target),
    within the read's bounded time; the next reads ask alone (only the slow workload's fails),
    and the one after asks the slow workload's queries one by one: only its slow signal is
    missing."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    specs = team(server, 4, queryIntervalSeconds="0", queryTimeoutSeconds="0.5")
    holder["answer"] = team_answers(specs, {(2, "waiting"): Answer(delay_s=HUNG_S)})
    source = PrometheusSource(server.url)

    async def together(at: float) -> list[Any]:
        outcomes = await asyncio.gather(
            *(read(source, spec, at) for spec in specs), return_exceptions=True
        )
        assert not any(isinstance(o, TimeoutError) for o in outcomes)  # `read`'s bound: hung
        return outcomes

    first = await together(1000.0)
    assert all(isinstance(outcome, SourceError) for outcome in first)
    assert "timed out" in str(first[0])
    posted = len(server.posted)
    second = await together(1010.0)
    assert len(server.posted) == posted  # alone now
    assert [getattr(s, "waiting", None) for s in second] == [100.0, 101.0, None, 103.0]
    assert isinstance(second[2], SourceError)
    third = await together(1020.0)
    assert [s.waiting for s in third] == [100.0, 101.0, None, 103.0]
    assert third[2].running == GOOD["running"]


async def test_a_prometheus_that_refuses_post_is_read_one_workload_at_a_time(
    prometheus: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A proxy that takes only GET answers the first batch 405: its reads ask alone in the same
    round (no signal lost), the source says so once, and sends no more batches."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    server.refuse_post = True
    specs = team(server, 4, queryIntervalSeconds="0")
    holder["answer"] = team_answers(specs)
    source = PrometheusSource(server.url)
    with caplog.at_level("WARNING", logger="gpu_queue_scaler.sources.prometheus"):
        assert_own_values(await read_together(source, specs, 1000.0))
        assert_own_values(await read_together(source, specs, 1010.0))
    assert len(server.posted) == 1
    refused = [r for r in caplog.records if "refused a POSTed query" in r.getMessage()]
    assert len(refused) == 1 and "405" in refused[0].getMessage()


def test_a_batch_left_open_by_an_ended_loop_is_not_joined(prometheus: Any) -> None:
    """A source outlives an event loop that ended mid-batch (its reads abandoned): reads in the
    next loop start a batch of their own instead of waiting on one whose timer is gone."""
    holder: dict[str, Callable[[str], Answer]] = {}
    server = prometheus(lambda query: holder["answer"](query))
    specs = team(server, 3, queryIntervalSeconds="0")
    holder["answer"] = team_answers(specs)
    source = PrometheusSource(server.url)

    async def abandon() -> None:
        reading = asyncio.ensure_future(source.read(specs[0], 1000.0))
        await asyncio.sleep(0)  # it joined a batch; the loop ends before the batch's timer
        assert not reading.done()

    asyncio.run(abandon())

    async def together() -> Any:
        return await read_together(source, specs, 1010.0)

    assert_own_values(asyncio.run(together()))
