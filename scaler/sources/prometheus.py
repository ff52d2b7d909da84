"""The Prometheus source: catalog expressions rendered as PromQL, asked over prometheus-api-client's
session (its retrying adapter; the answers are read here, `PrometheusSource._request`, as its own
query methods read a whole answer into memory before looking at it).

Queries are scoped to one deployment: the model label, the ScaledObject's namespace (via
`namespaceLabel`) and the trigger's `labelSelector`. Each query has a bounded timeout and bounded
retries (urllib3 `Retry`: connection errors and 502/503/504, with backoff); a query that fails,
times out, returns garbage or a non-finite value leaves its signal missing with the reason, and when
every query fails the read fails, so the engine holds the last target (fail static). A read's
queries travel combined in one or two requests (`combined_query`, `PrometheusSource._results`),
and the reads of workloads that tick together travel in one request between them
(`PrometheusSource._join`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from dataclasses import field as default
from typing import cast
from urllib.parse import quote_plus

import urllib3
from prometheus_api_client import PrometheusConnect
from prometheus_api_client.exceptions import PrometheusApiClientException
from requests import JSONDecodeError, RequestException, Response, Session, Timeout
from requests.exceptions import ChunkedEncodingError
from urllib3.util.retry import Retry

from scaler.signals import Signal
from scaler.sources import SourceError
from scaler.sources.catalog import (
    CATALOGS,
    AtLeastZero,
    Count,
    Deriv,
    Expr,
    Gauge,
    Matcher,
    Plus,
    PromQL,
    Quantile,
    Rate,
    Ratio,
    signal_exprs,
)
from scaler.workload import WorkloadSpec

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
FIELD_LABEL = "scaler_signal"  # tags each signal's series in a combined query
# A combined query travels URL-encoded in the request line, and proxies in front of Prometheus
# cap it at ~8 KiB (nginx's default buffer): a read's queries are combined in groups within this.
MAX_QUERY_URL_CHARS = 6000
SPLIT_S = 300.0  # after a combined query timed out, one query per signal for this long
# Reads of different workloads that start within BATCH_WINDOW_S of a batch's first travel in one
# POSTed request (the engine ticks the workloads of a phase slot together, one per loop
# iteration: ~20 at 1,000 workloads). A batch is kept small: Prometheus's cost per query grows
# faster than its length (2.42, measured: per vLLM read 8.1 ms of its CPU alone, 5.8 ms in a
# query of 5 reads, 7.3 ms in 12, 24 ms in 50), and one bad query sends few reads back alone.
BATCH_WINDOW_S = 0.02
BATCH_MAX_READS = 16
BATCH_MAX_QUERY_CHARS = 16_000  # PromQL characters (~5 vLLM reads); the read crossing it is in
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
Found = dict[str, object]  # each query's result, as its own request would have had it, or why not


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def matchers_for(spec: WorkloadSpec, model_label: str | None) -> tuple[Matcher, ...]:
    found: list[Matcher] = []
    if model_label and spec.trigger.model:
        found.append((model_label, "=", spec.trigger.model))
    if spec.namespace_label:
        found.append((spec.namespace_label, "=", spec.trigger.namespace))
    found += spec.trigger.label_selector
    return tuple(found)


def render_selector(matchers: tuple[Matcher, ...]) -> str:
    return ",".join(f"{label}{op}{_quote(value)}" for label, op, value in matchers)


def render(expr: Expr, spec: WorkloadSpec, matchers: tuple[Matcher, ...]) -> str:
    """PromQL for one catalog expression."""
    sel = render_selector(matchers)
    window = f"[{max(1, round(spec.rate_window_s))}s]"

    def series(name: str, extra: tuple[Matcher, ...] = ()) -> str:
        return f"{name}{{{render_selector(matchers + extra)}}}"

    def alternatives(parts: list[str], scale: float = 1.0) -> str:
        body = parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"
        return body if scale == 1.0 else f"({body} * {scale!r})"

    match expr:
        case Gauge():
            return alternatives(
                [f"{expr.agg}({series(n, expr.extra)})" for n in expr.names], expr.scale
            )
        case Count(of=gauge):
            return alternatives([f"count({series(n, gauge.extra)})" for n in gauge.names])
        case Rate():
            return alternatives(
                [f"sum(rate({series(n, expr.extra)}{window}))" for n in expr.names], expr.scale
            )
        case Deriv(of=gauge):
            return alternatives([f"sum(deriv({series(n)}{window}))" for n in gauge.names])
        case Quantile():
            buckets = [f"sum by (le) (rate({series(n + '_bucket')}{window}))" for n in expr.names]
            parts = [f"histogram_quantile({expr.q!r}, {b})" for b in buckets]
            return alternatives(parts, expr.scale)
        case Plus(terms=(first, *rest)):
            return " + ".join(
                [f"({render(first, spec, matchers)})"]
                + [f"(({render(t, spec, matchers)}) or vector(0))" for t in rest]
            )
        case Ratio(num=num, den=den):
            return f"({render(num, spec, matchers)}) / ({render(den, spec, matchers)})"
        case AtLeastZero(of=inner):
            return f"clamp_min({render(inner, spec, matchers)}, 0)"
        case PromQL(query=query):
            return query.replace("$selector", sel).replace("$model", spec.trigger.model or "")
    raise ValueError(f"cannot render {expr!r}")


def _age_query(
    spec: WorkloadSpec, exprs: Mapping[str, Expr], matchers: tuple[Matcher, ...]
) -> str | None:
    ready = exprs.get("ready_pods")
    if isinstance(ready, Count):
        return " or ".join(
            f"max(timestamp({n}{{{render_selector(matchers)}}}))" for n in ready.of.names
        )
    return None


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


def _plan(spec: WorkloadSpec) -> tuple[tuple[Matcher, ...], dict[str, Expr]]:
    """The label matchers and the signal expressions (with overrides) of one workload."""
    matchers = matchers_for(spec, CATALOGS[spec.trigger.backend].model_label)
    return matchers, signal_exprs(spec.trigger.backend, spec.queries)


def _scalar(result: object) -> float:
    """The single value of an aggregated instant-query result; raises ValueError otherwise."""
    if not isinstance(result, list):
        raise ValueError(f"unexpected answer {str(result)[:80]!r}")
    if not result:
        raise LookupError("no series matched")
    if len(result) > 1:
        raise ValueError(f"{len(result)} series where one was expected: aggregate the query")
    value = float(result[0]["value"][1])
    if not math.isfinite(value):
        raise ValueError(f"non-finite value {value}")
    return value


def _value(result: object) -> float:
    """`_scalar`, with a malformed sample reported as ValueError."""
    try:
        return _scalar(result)
    except (KeyError, TypeError, IndexError, OverflowError) as exc:  # e.g. a 400-digit integer
        raise ValueError(f"malformed result: {exc!r}"[:300]) from None


def _outcome(result: object) -> float | BaseException:
    """A query's value, or why it has none (the exception its request raised, or its result's)."""
    if isinstance(result, BaseException):
        return result
    try:
        return _value(result)
    except (ValueError, LookupError) as exc:
        return exc


def combined_query(queries: Mapping[str, str]) -> str:
    """All of a read's queries as one PromQL expression: each one's series tagged with its signal
    in FIELD_LABEL (label_replace), joined with `or` (distinct tags, so nothing is dropped) in a
    balanced tree: `or` binds to the left, and a flat chain of a batch's hundreds of parts cost
    Prometheus 20-30% more CPU (2.42: 240 and 600 parts)."""
    parts = [
        f'label_replace(({query}), "{FIELD_LABEL}", "{field}", "", "")'
        for field, query in queries.items()
    ]
    while len(parts) > 2:
        paired = [f"({a} or {b})" for a, b in zip(parts[::2], parts[1::2], strict=False)]
        parts = paired + parts[len(paired) * 2 :]
    return " or ".join(parts)


def combined_groups(queries: Mapping[str, str]) -> list[list[str]]:
    """The signals in groups whose combined query stays within MAX_QUERY_URL_CHARS once
    URL-encoded (in order; a query too long to share a request has one of its own)."""
    groups: list[list[str]] = []
    size = 0
    for field, query in queries.items():
        length = len(quote_plus(combined_query({field: query}))) + len(" or ()")
        if not groups or size + length > MAX_QUERY_URL_CHARS:
            groups.append([])
            size = 0
        groups[-1].append(field)
        size += length
    return groups


def split_answer(result: object, fields: Iterable[str]) -> dict[str, list[object]]:
    """A combined query's answer as each query's own would have been; ValueError when it is not
    one (a series without a known tag)."""
    parts: dict[str, list[object]] = {field: [] for field in fields}
    if not isinstance(result, list):
        raise ValueError(f"unexpected answer {str(result)[:80]!r}")
    for series in result:
        metric = series.get("metric") if isinstance(series, dict) else None
        field = metric.get(FIELD_LABEL) if isinstance(metric, dict) else None
        if not isinstance(field, str) or field not in parts:
            raise ValueError(f"a series without a known {FIELD_LABEL}: {str(series)[:80]!r}")
        parts[field].append(series)
    return parts


def tagged(reads: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Several reads' queries under distinct tags (`<read>/<signal>`), for one combined query."""
    return {f"{i}/{name}": q for i, queries in enumerate(reads) for name, q in queries.items()}


@dataclass
class _Batch:
    """Reads gathering for one request: (workload, its queries, where its results go)."""

    timeout_s: float
    loop: asyncio.AbstractEventLoop  # its timer's: a batch left open by a loop that ended is
    # never joined from another (a source can outlive one asyncio.run)
    reads: list[tuple[str, dict[str, str], asyncio.Future[Found | None]]] = default(
        default_factory=list
    )
    chars: int = 0
    closed: bool = False


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
        self._alone_until: dict[str, float] = {}  # workload -> out of batches until then
        self._open: dict[float, _Batch] = {}  # the batch gathering, per query timeout
        self._sending: set[asyncio.Task[None]] = set()

    def forget(self, workload: str) -> None:
        """Drop what is kept for a workload no longer read here (its last signal, its batching
        state): a source outlives its workloads, each of which leaves these behind."""
        for kept in (self._cache, self._split_until, self._alone_until):
            kept.pop(workload, None)

    def close(self) -> None:
        """Release the threads and connections: no workload reads this URL any more."""
        for task in list(self._sending):
            task.cancel()
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
        """A read's results: in a batch with other workloads' reads where it can (`_join`), else
        asked alone (`_results`)."""
        now = time.monotonic()
        if (
            self.batch
            and self.combine
            and self._split_until.get(key, 0.0) <= now
            and self._alone_until.get(key, 0.0) <= now
        ):
            self._alone_until.pop(key, None)
            found = await self._join(key, queries, timeout_s)
            if found is not None:
                return found
        return await self._results(key, queries, lambda q: self._instant(q, timeout_s))

    def _join(
        self, key: str, queries: dict[str, str], timeout_s: float
    ) -> asyncio.Future[Found | None]:
        """This read's place in the batch gathering (one is opened, and sent BATCH_WINDOW_S
        later, if none is): its results, or None when it is to ask alone (it was the batch's
        only read, or Prometheus answered the batch with an error or garbage)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Found | None] = loop.create_future()
        batch = self._open.get(timeout_s)
        if batch is None or batch.loop is not loop:
            batch = self._open[timeout_s] = _Batch(timeout_s, loop)
            loop.call_later(BATCH_WINDOW_S, self._close, batch)
        batch.reads.append((key, queries, future))
        batch.chars += sum(len(q) for q in queries.values())
        if len(batch.reads) >= BATCH_MAX_READS or batch.chars >= BATCH_MAX_QUERY_CHARS:
            self._close(batch)
        return future

    def _close(self, batch: _Batch) -> None:
        """Stop gathering; send the batch if it has two reads or more (a read cancelled meanwhile
        is left out), else tell its one read to ask alone."""
        if batch.closed:
            return
        batch.closed = True
        if self._open.get(batch.timeout_s) is batch:
            del self._open[batch.timeout_s]
        reads = [read for read in batch.reads if not read[2].done()]
        if len(reads) < 2:
            for _key, _queries, future in reads:
                future.set_result(None)
            return
        task = asyncio.get_running_loop().create_task(self._send(reads, batch.timeout_s))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(
        self,
        reads: list[tuple[str, dict[str, str], asyncio.Future[Found | None]]],
        timeout_s: float,
    ) -> None:
        """One request for the batch's reads, its answer split back per read. Failures as for a
        read's own combined query (`_results`): an error or garbage answer sends every read to
        ask alone in the same round (where a bad query splits its own workload); a timeout
        leaves the batch's signals missing this round and its workloads ask alone for SPLIT_S
        (one slow query then costs its own workload, not the batch); down or refused fails
        every read."""
        tags = tagged([queries for _key, queries, _future in reads])
        query = combined_query(tags)
        outcomes: list[Found | None]
        try:
            parts = cast(
                "dict[str, list[object]]",
                await self._ask(
                    lambda: split_answer(self._posted(query, timeout_s), tags), timeout_s
                ),
            )
            outcomes = [
                {name: parts[f"{i}/{name}"] for name in queries}
                for i, (_key, queries, _future) in enumerate(reads)
            ]
        except ConnectionError as exc:
            if "timed out" in str(exc):
                until = time.monotonic() + SPLIT_S
                for key, _queries, _future in reads:
                    self._alone_until[key] = until
            outcomes = [dict.fromkeys(queries, exc) for _key, queries, _future in reads]
        except ValueError:  # an error or garbage answer: each read asks alone
            outcomes = [None] * len(reads)
        except Exception:  # a bug: said once per batch, and no read is lost to it
            log.exception("batched prometheus read failed; its reads ask alone")
            outcomes = [None] * len(reads)
        for (_key, _queries, future), outcome in zip(reads, outcomes, strict=True):
            if not future.done():
                future.set_result(outcome)
                await asyncio.sleep(0)  # their decisions one per loop iteration, RPCs between

    async def _results(
        self, key: str | None, queries: Mapping[str, str], ask: Callable[[str], Awaitable[object]]
    ) -> dict[str, object]:
        """Each query's result (as its own request would have it) or the exception, asked in a
        few requests (`combined_groups`, `combined_query`) where it can, else one per query.

        One request per query was ~3.5 ms of this process's CPU each (requests in a thread
        pool; `bench/prometheus_reads.py`), 12 per vLLM read: a scaler polling 1,000 workloads
        every 5 s would need ~8 cores for that alone. When Prometheus answers a combined query
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

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        key = f"{spec.workload}|{spec.trigger.metric_name}"
        cached = self._cache.get(key)
        if cached is not None and 0 <= at - cached[0] < spec.query_interval_s:
            return cached[1]
        matchers, exprs = _plan(spec)
        queries = {field: render(expr, spec, matchers) for field, expr in exprs.items()}
        age_query = _age_query(spec, exprs, matchers)
        if age_query:
            queries["_newest"] = age_query
        results = await self._read_results(key, queries, spec.query_timeout_s)
        values: dict[str, float | None] = {}
        reasons: list[str] = []
        errors = 0
        for field, query in queries.items():
            answer = _outcome(results[field])
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
        matchers, exprs = _plan(spec)
        queries = {field: render(expr, spec, matchers) for field, expr in exprs.items()}
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

        results = await self._results(
            f"{spec.workload}|{spec.trigger.metric_name}", queries, ranged
        )
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
