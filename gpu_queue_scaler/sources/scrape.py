"""The direct-scrape source: the fast path, with no Prometheus scrape lag.

Each read scrapes every serving pod of the workload concurrently with a short timeout, parses the
lines of the metric families the backend's catalog reads with prometheus_client's parser (the
rest of the text is skipped, `exposition.parse`), and evaluates the backend's catalog on the
recent scrapes (counters become rates across scrapes, resets handled). A pod that times out or
answers garbage is left out with a reason while the others count; when no pod answers, the read
fails and the engine holds the last target.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import AsyncIterator

import httpx
from urllib3.response import GzipDecoder

from gpu_queue_scaler.catalog import CATALOGS, families, signal_exprs
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError, user_key
from gpu_queue_scaler.sources.discovery import EndpointSliceDiscovery
from gpu_queue_scaler.sources.exposition import Scrape, parse
from gpu_queue_scaler.sources.httpclient import async_client
from gpu_queue_scaler.sources.promql import matchers_for
from gpu_queue_scaler.sources.window import Window

MAX_BODY_BYTES = 8 * 1024 * 1024  # decoded; a pod's /metrics is KBs to a few MB
ACCEPT = {"Accept-Encoding": "gzip"}  # as Prometheus asks (httpx would offer deflate, br, zstd)
FORGET_AFTER_S = 900.0
FAMILIES: dict[str, frozenset[str]] = {}  # backend -> the metric families its catalog reads


async def _inflated(
    raw: AsyncIterator[bytes], decoder: GzipDecoder, body: bytearray
) -> AsyncIterator[bytes]:
    """`raw` inflated, each piece at most one byte past what room MAX_BODY_BYTES leaves `body`
    (the caller's, growing as it takes the pieces): enough to tell that it is over."""
    async for chunk in raw:
        yield decoder.decompress(chunk, max_length=MAX_BODY_BYTES + 1 - len(body))


class ScrapeSource:
    def __init__(self, discovery: EndpointSliceDiscovery | None = None) -> None:
        self._discovery = discovery or EndpointSliceDiscovery()
        # No proxy, and idle connections reused only briefly: see
        # gpu_queue_scaler.sources.httpclient.
        self._client = async_client(follow_redirects=False)
        self._windows: dict[str, tuple[float, Window]] = {}

    async def targets(self, spec: WorkloadSpec) -> list[str]:
        trigger = spec.trigger
        if trigger.scrape_targets:
            return [f"[{h}]:{p}" if ":" in h else f"{h}:{p}" for h, p in trigger.scrape_targets]
        service = trigger.values.get("service")
        if not service or spec.metrics_port is None:
            raise SourceError("direct scrape needs scrapeTargets, or service and metricsPort")
        addresses = await self._discovery.addresses(trigger.namespace, service)
        if not addresses:
            raise SourceError(f"service {trigger.namespace}/{service} has no ready endpoints")
        return [
            f"[{a}]:{spec.metrics_port}" if ":" in a else f"{a}:{spec.metrics_port}"
            for a in addresses
        ]

    async def _scrape(
        self, target: str, path: str, timeout_s: float, wanted: frozenset[str]
    ) -> Scrape | str:
        """One pod's scrape, or why not (every reason names the pod, and a timeout the URL)."""
        url = f"http://{target}{path}"
        try:
            async with asyncio.timeout(timeout_s):  # the whole answer, not each socket read
                body = await self._body(url, timeout_s)
        except (TimeoutError, httpx.TimeoutException):
            return f"{target}: timed out after {timeout_s:g} s reading {url}"
        except httpx.HTTPError as exc:
            return f"{target}: {type(exc).__name__}: {str(exc) or 'no detail'} ({url})"[:300]
        if isinstance(body, str):
            return f"{target}: {body}"
        return parse(body[0].decode(body[1], errors="replace"), wanted)

    async def _body(self, url: str, timeout_s: float) -> tuple[bytearray, str] | str:
        """The answer's body, decoded, with its text encoding; or why it is not read.

        Read as it arrives and given up past MAX_BODY_BYTES decoded, where reading it whole
        first held every byte a pod sent (or a small gzip body inflated to GBs). gzip is
        inflated by urllib3's decoder, which takes a bound on what it gives back: one network
        read (64 KiB at most) inflates to at most what room the cap leaves, where httpx's own
        decoder would inflate it whole (~64 MiB: deflate reaches ~1,000:1). Only gzip is asked
        for and taken: a stacked encoding (`gzip, gzip`) is refused unread."""
        async with self._client.stream("GET", url, headers=ACCEPT, timeout=timeout_s) as response:
            if response.status_code != 200:
                return f"HTTP {response.status_code}"
            encoding = response.headers.get("content-encoding", "").strip().lower() or "identity"
            if encoding not in ("identity", "gzip"):
                return f"Content-Encoding {encoding[:40]!r} refused (gzip or none is read)"
            body = bytearray()
            if encoding == "identity":
                chunks = response.aiter_bytes()  # each a network read, 64 KiB at most
            else:
                chunks = _inflated(response.aiter_raw(), GzipDecoder(), body)
            try:
                async for chunk in chunks:
                    body += chunk
                    if len(body) > MAX_BODY_BYTES:
                        return (
                            f"metrics body over {MAX_BODY_BYTES} bytes (the cap), not read further"
                        )
            except zlib.error as exc:
                return f"undecodable gzip body: {exc}"[:200]
            return body, response.encoding or "utf-8"  # decoded as it is: no copy

    def _window(self, key: str, window_s: float, now: float) -> Window:
        for old in [k for k, (used, _) in self._windows.items() if now - used > FORGET_AFTER_S]:
            del self._windows[old]
        _, window = self._windows.get(key, (now, Window(window_s)))
        window.window_s = window_s
        self._windows[key] = (now, window)
        return window

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        targets = await self.targets(spec)
        path = str(spec.trigger.values.get("metricsPath", "/metrics"))
        exprs = signal_exprs(spec.trigger.backend, {})
        wanted = FAMILIES.setdefault(spec.trigger.backend, families(exprs))
        outcomes = await asyncio.gather(
            *(self._scrape(t, path, spec.scrape_timeout_s, wanted) for t in targets)
        )
        now = time.time()
        window = self._window(user_key(spec.trigger), spec.rate_window_s, now)
        window.keep_only(targets)
        reasons: list[str] = []
        answered = 0
        for target, outcome in zip(targets, outcomes, strict=True):
            if isinstance(outcome, str):
                reasons.append(outcome)
                continue
            answered += 1
            reasons += [f"{target}: {problem}" for problem in outcome.problems]
            window.add(target, now, outcome)
        if answered == 0:
            raise SourceError("no pod answered: " + "; ".join(reasons[:5]))
        catalog = CATALOGS[spec.trigger.backend]
        matchers = matchers_for(spec, catalog.model_label)
        # Direct scrape sees a pod's own labels: drop the namespace scoping Prometheus needs.
        if spec.namespace_label:
            matchers = tuple(m for m in matchers if m[0] != spec.namespace_label)
        values: dict[str, float | None] = {}
        for field, expr in exprs.items():
            values[field], why = window.evaluate(expr, matchers, now, spec.max_sample_age_s)
            if why is not None:
                reasons.append(f"{field}: {why}")
        return Signal.from_values(at, "scrape", values, 0.0, tuple(reasons))

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []  # the sources registry pairs direct scrape with Prometheus history when it can

    def forget(self, workload: str) -> None:
        """Drop a gone workload's window (its pods' recent scrapes)."""
        self._windows.pop(workload, None)

    async def close(self) -> None:
        await self._client.aclose()
