"""The Prometheus source: the transport. A workload's queries (rendered in
`gpu_queue_scaler.sources.promql`) are asked over prometheus-api-client's session (its retrying
adapter; the answers are read here, `PrometheusSource._request`, as its own query methods read a
whole answer into memory before looking at it).

Queries are scoped to one deployment: the model label, the ScaledObject's namespace (via
`namespaceLabel`) and the trigger's `labelSelector`. Each query has a bounded timeout and bounded
retries (urllib3 `Retry`: connection errors and 502/503/504, with backoff); a query that fails,
times out, returns garbage or a non-finite value leaves its signal missing with the reason, and when
every query fails the read fails, so the engine holds the last target (fail static). A read's
queries travel combined in one or two requests (`combined_query`, `PrometheusSource._results`),
and the reads of workloads that tick together travel in one request between them
(`gpu_queue_scaler.sources.batching`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import cast

import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests import JSONDecodeError, RequestException, Response, Session, Timeout
from requests.exceptions import ChunkedEncodingError
from urllib3.util.retry import Retry

from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError, user_key
from gpu_queue_scaler.sources.batching import Batcher, Found
from gpu_queue_scaler.sources.promql import (
    age_query,
    combined_groups,
    combined_query,
    instant_outcome,
    plan,
    render,
    split_answer,
)

log = logging.getLogger(__name__)
RETRY = Retry(
    total=2,
    connect=2,
    read=1,
    status=2,
    backoff_factor=0.1,
    status_forcelist=(502, 503, 504),
    allowed_methods=("GET", "POST"),  # every POST here is a query: a read, safe to repeat
    raise_on_status=False,
)
SPLIT_S = 300.0  # after a combined query timed out, one query per signal for this long
POST_REFUSED = (403, 405)  # a POSTed batch answered so: the source stops batching
MAX_ANSWER_BYTES = 4 * 1024 * 1024
"""The largest answer to one query, decoded (gzip included): past it the answer is not read further
and the query fails naming this cap. The answers this source asks for are small: a read's are
aggregated series (~200 bytes each), a batch's a few hundred of those, a warm start's combined
range query a dozen series of at most HISTORY_MAX_POINTS (2,400) points of ~30 bytes: all under
1 MiB. A custom query that is not aggregated can match a whole fleet instead, tens of MB whose
JSON takes seconds and hundreds of MB to decode. 4 MiB leaves the real answers room four times
over; a read's requests in flight (its combined groups, or one per query after an unusable
answer) each hold at most this much. A constant, not a setting: no answer of a query this
scaler asks comes near it."""
READ_CHUNK_BYTES = 64 * 1024  # one socket read, and at most this much decoded from it at a time


def _cause(exc: RequestException, timeout_s: float) -> str:
    """What went wrong, without the URL-encoded query that requests puts in its message."""
    reason: BaseException = exc
    for _ in range(5):  # requests -> urllib3 MaxRetryError -> the underlying error
        inner = getattr(reason, "reason", None) or (reason.args[0] if reason.args else None)
        if not isinstance(inner, BaseException) or inner is reason:
            break
        reason = inner
    text = str(reason)
    if isinstance(exc, Timeout) or "timed out" in text.lower():
        return f"timed out after {timeout_s:g}s"
    if "refused" in text.lower():
        return "connection refused"
    return f"{type(reason).__name__}: {text.split(' (Caused by')[0]}"[:200]


class AnswerTooLargeError(ValueError):
    """An answer over MAX_ANSWER_BYTES (decoded): Prometheus answered, but not usably."""


def read_capped(response: Response, timeout_s: float, started: float) -> bytearray:
    """The body of a streamed `response` (stream=True), decoded as urllib3 decodes it (at most
    READ_CHUNK_BYTES from one socket read at a time, so a small gzip body that inflates to GBs
    costs one chunk). Raises AnswerTooLargeError past MAX_ANSWER_BYTES, and requests' Timeout
    past `timeout_s` since `started` (monotonic) in all: requests' own timeout bounds each socket
    read, and a body sent a byte at a time would hold a pool thread for as long as it lasts."""
    body = bytearray()
    while True:
        try:
            chunk = response.raw.read1(READ_CHUNK_BYTES, decode_content=True)
        except urllib3.exceptions.ReadTimeoutError:
            raise Timeout(f"timed out after {timeout_s:g}s reading the answer") from None
        except urllib3.exceptions.DecodeError as exc:  # it answered, in a broken encoding
            raise ValueError(f"undecodable answer: {exc}"[:200]) from None
        except urllib3.exceptions.HTTPError as exc:  # cut short, reset: as requests names it
            raise ChunkedEncodingError(f"{type(exc).__name__}: {exc}"[:200]) from None
        if not chunk:
            break
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise AnswerTooLargeError(f"answer over {MAX_ANSWER_BYTES} bytes (the cap), not read")
        if time.monotonic() - started > timeout_s:
            raise Timeout(f"timed out after {timeout_s:g}s reading the answer")
    return body  # json.loads takes it as it is: no copy


class PrometheusSource:
    """One per Prometheus URL; workloads share its connection pool."""

    def __init__(self, url: str, *, combine: bool = True, batch: bool = True) -> None:
        self.url = url
        self.combine = combine  # False: one request per query, always (tests compare the two)
        self.batch = batch  # False: each read asks alone (its queries still combined)
        self._session = Session()
        self._client = PrometheusConnect(
            url=url, retry=RETRY, disable_ssl=False, session=self._session
        )
        # Its own threads (requests is blocking): a hung Prometheus must not queue every query of
        # every workload behind asyncio's small default pool.
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="prometheus")
        self._cache: dict[str, tuple[float, Signal]] = {}
        self._split_until: dict[str, float] = {}  # workload -> one query per signal until then
        # workload -> (the spec, its PromQL by field, the same with the age query): a spec
        # changes only when its trigger or the config does (the engine keeps one per resolve,
        # `resolved_for`), so its queries are rendered once per spec, not once per read.
        self._rendered: dict[str, tuple[WorkloadSpec, dict[str, str], dict[str, str]]] = {}
        self._batcher = Batcher(self._send_batch, SPLIT_S)

    def forget(self, workload: str) -> None:
        """Drop what is kept for a workload no longer read here (its last signal, its batching
        state): a source outlives its workloads, each of which leaves these behind."""
        for kept in (self._cache, self._split_until, self._rendered):
            kept.pop(workload, None)
        self._batcher.forget(workload)

    def close(self) -> None:
        """Release the threads and connections: no workload reads this URL any more."""
        self._batcher.cancel()
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._session.close()

    async def _ask(self, send: Callable[[], object], timeout_s: float) -> object:
        """`send()` (one request through the client) in the pool: its result, ConnectionError when
        Prometheus did not answer (down, refused, timed out), ValueError when it answered with an
        error or garbage."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self._pool, send)
        except AnswerTooLargeError as exc:
            raise ValueError(f"prometheus at {self.url}: {exc}") from None
        except (JSONDecodeError, KeyError, TypeError, IndexError, RecursionError) as exc:
            # requests' JSONDecodeError is a RequestException too, but Prometheus did answer
            raise ValueError(f"prometheus at {self.url} answered garbage: {exc!r}"[:300]) from None
        except RequestException as exc:
            raise ConnectionError(f"prometheus at {self.url}: {_cause(exc, timeout_s)}") from None
        except PrometheusApiClientException as exc:
            raise ValueError(f"prometheus at {self.url} answered {exc}"[:300]) from None
        except ValueError as exc:
            raise ValueError(f"prometheus at {self.url} answered garbage: {exc!r}"[:300]) from None

    async def _instant(self, query: str, timeout_s: float) -> object:
        """One instant query's result (`_ask`)."""
        return await self._ask(
            lambda: self._request("GET", "/api/v1/query", {"query": query}, timeout_s), timeout_s
        )

    def _request(self, method: str, path: str, form: dict[str, str], timeout_s: float) -> object:
        """One query's `data.result` (blocking: in the pool), its fields in the URL (GET) or a
        form body (POST). The answer is streamed and capped (`read_capped`); a status other than
        200 raises PrometheusApiClientException, as prometheus-api-client's query methods do."""
        started = time.monotonic()
        with self._session.request(
            method,
            f"{self.url}{path}",
            params=form if method == "GET" else None,
            data=form if method == "POST" else None,
            headers=self._client.headers,
            auth=self._client.auth,
            timeout=timeout_s,
            stream=True,
        ) as response:
            status = response.status_code
            body = read_capped(response, timeout_s, started)
        if status in POST_REFUSED and method == "POST" and self.batch:
            # A proxy in front of Prometheus that takes only GET: every batch would cost a failed
            # request before its reads ask alone, so batching stops for this source.
            self.batch = False
            log.warning(
                "prometheus at %s refused a POSTed query (HTTP %d); reads ask one at a time",
                self.url,
                status,
            )
        if status != 200:
            raise PrometheusApiClientException(f"HTTP Status Code {status} ({body[:200]!r})")
        return json.loads(body)["data"]["result"]

    def _posted(self, query: str, timeout_s: float) -> object:
        """An instant query's result, asked with the query in a POSTed form body (blocking): a
        batch's combined query is too long for a request line."""
        return self._request("POST", "/api/v1/query", {"query": query}, timeout_s)

    async def _read_results(self, key: str, queries: dict[str, str], timeout_s: float) -> Found:
        """A read's results: in a batch with other workloads' reads where it can
        (`Batcher.join`), else asked alone (`_results`)."""
        now = time.monotonic()
        if (
            self.batch
            and self.combine
            and self._split_until.get(key, 0.0) <= now
            and self._batcher.may_join(key, now)
        ):
            found = await self._batcher.join(key, queries, timeout_s)
            if found is not None:
                return found
        return await self._results(key, queries, lambda q: self._instant(q, timeout_s))

    async def _send_batch(
        self, query: str, tags: dict[str, str], timeout_s: float
    ) -> dict[str, list[object]]:
        """A batch's combined query POSTed, its answer split per tag in the pool (`_ask`)."""
        parts = await self._ask(
            lambda: split_answer(self._posted(query, timeout_s), tags), timeout_s
        )
        return cast("dict[str, list[object]]", parts)

    async def _results(
        self, key: str | None, queries: Mapping[str, str], ask: Callable[[str], Awaitable[object]]
    ) -> dict[str, object]:
        """Each query's result (as its own request would have it) or the exception, asked in a
        few requests (`combined_groups`, `combined_query`) where it can, else one per query.

        One request per query, 12 per vLLM read, would take a scaler polling 1,000 workloads
        several cores for the requests alone (`bench/prometheus_reads.py`; the figures:
        docs/signals.md). When Prometheus answers a combined query
        with an error or a malformed answer (a custom query that is not an instant vector, say),
        its queries are asked again one by one, so the reasons name the query at fault; when it
        times out (one slow custom query holds up the whole expression), its signals fail in this
        round and the workload `key` (None: nothing remembered, as for a warm start's one-off
        history) asks one query per signal for SPLIT_S, so a slow query leaves only its own
        signal missing. Not answering at all (down, refused) is the same for
        every query: no second round."""
        split = not self.combine or (
            key is not None and self._split_until.get(key, 0.0) > time.monotonic()
        )
        if not split and key is not None:
            self._split_until.pop(key, None)
        groups = [[field] for field in queries] if split else combined_groups(queries)
        found: dict[str, object] = {}
        for part in await asyncio.gather(
            *(self._group(key, {f: queries[f] for f in group}, ask) for group in groups)
        ):
            found.update(part)
        return found

    async def _group(
        self, key: str | None, queries: dict[str, str], ask: Callable[[str], Awaitable[object]]
    ) -> dict[str, object]:
        """`_results` for one group: in one request when there are several."""
        if len(queries) > 1:
            try:
                return dict(split_answer(await ask(combined_query(queries)), queries))
            except ConnectionError as exc:
                if key is not None and "timed out" in str(exc):
                    self._split_until[key] = time.monotonic() + SPLIT_S
                return dict.fromkeys(queries, exc)
            except ValueError:
                if key is not None:
                    self._split_until[key] = time.monotonic() + SPLIT_S
        answers = await asyncio.gather(*(ask(q) for q in queries.values()), return_exceptions=True)
        return dict(zip(queries, answers, strict=True))

    def _queries(self, key: str, spec: WorkloadSpec, *, aged: bool) -> dict[str, str]:
        """The workload's PromQL by field; `aged` adds "_newest", the age query (when it has
        one), which a read asks and a history does not."""
        kept = self._rendered.get(key)
        if kept is None or kept[0] is not spec:
            matchers, exprs = plan(spec)
            fields = {field: render(expr, spec, matchers) for field, expr in exprs.items()}
            newest_query = age_query(spec, exprs, matchers)
            with_age = {**fields, "_newest": newest_query} if newest_query else fields
            kept = self._rendered[key] = (spec, fields, with_age)
        return kept[2] if aged else kept[1]

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        key = user_key(spec.trigger)
        cached = self._cache.get(key)
        if cached is not None and 0 <= at - cached[0] < spec.query_interval_s:
            return cached[1]
        queries = self._queries(key, spec, aged=True)
        results = await self._read_results(key, queries, spec.query_timeout_s)
        values: dict[str, float | None] = {}
        reasons: list[str] = []
        errors = 0
        for field, query in queries.items():
            answer = instant_outcome(results[field])
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                values[field] = None
                if not isinstance(answer, LookupError):
                    errors += 1
                reasons.append(f"{field}: {str(answer) or type(answer).__name__} [{query[:160]}]")
            else:
                values[field] = answer
        if errors == len(queries):
            raise SourceError(reasons[0] if reasons else f"prometheus at {self.url}: no answer")
        newest = values.pop("_newest", None)
        age = time.time() - newest if newest is not None else None
        if age is not None and age > spec.max_sample_age_s:
            raise SourceError(
                f"newest sample is {age:.0f}s old (maxSampleAgeSeconds={spec.max_sample_age_s:g})"
            )
        reasons = [r for r in reasons if not r.startswith("_newest")]
        signal = Signal.from_values(at, "prometheus", values, age, tuple(reasons))
        self._cache[key] = (at, signal)
        return signal

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        """Range queries on the tick grid (start, start+step, ... < end) for the warm start, asked
        as a read's are (`_results`); any failure fails the history."""
        if end <= start:
            return []
        queries = self._queries(user_key(spec.trigger), spec, aged=False)
        last = start + math.floor((end - start) / step - 1e-9) * step
        timeout = spec.query_timeout_s * 4

        def ranged(query: str) -> Awaitable[object]:
            form = {
                "query": query,
                "start": str(round(start)),
                "end": str(round(last)),
                "step": f"{max(1, round(step * 1000))}ms",  # Prometheus durations are integers
            }
            return self._ask(
                lambda: self._request("GET", "/api/v1/query_range", form, timeout), timeout
            )

        results = await self._results(user_key(spec.trigger), queries, ranged)
        grid: dict[float, dict[str, float]] = {}
        try:
            for field, result in results.items():
                if isinstance(result, Exception):  # down, refused, timed out: a cold start
                    raise SourceError(f"history: {str(result) or type(result).__name__}"[:300])
                if isinstance(result, BaseException):
                    raise result
                for series in result[:1]:  # type: ignore[index]
                    for ts, raw in series.get("values", []):
                        value = float(raw)
                        if math.isfinite(value):
                            tick = start + round((float(ts) - start) / step) * step
                            grid.setdefault(tick, {})[field] = value
        except (
            AttributeError,  # the answer parsed, but not as a range result
            KeyError,
            TypeError,
            ValueError,
            OverflowError,
            RecursionError,
        ) as exc:
            raise SourceError(f"prometheus at {self.url}: history: {exc}"[:300]) from None
        return [
            Signal.from_values(tick, "prometheus-history", grid[tick])
            for tick in sorted(t for t in grid if start <= t < end)
        ]
