"""Batching of reads: the reads of different workloads that start together gather for a moment
and travel as one combined query, each read's results split back to it. Asynchronous but with no
transport of its own: the Prometheus source (`gpu_queue_scaler.sources.prometheus`) owns one
`Batcher`, passes it how to send a batch, and decides which reads may join one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from dataclasses import field as default

from gpu_queue_scaler.sources.promql import combined_query, tagged

log = logging.getLogger(__name__)
# Reads of different workloads that start within BATCH_WINDOW_S of a batch's first travel in one
# POSTed request (the engine ticks the workloads of a phase slot together, one per loop
# iteration, and a window spans a few slots). A batch is kept small: Prometheus's cost per
# query grows faster than its length (`bench/prometheus_reads.py`; the figures: docs/signals.md),
# and one bad query sends few reads back alone.
BATCH_WINDOW_S = 0.02
BATCH_MAX_READS = 16
BATCH_MAX_QUERY_CHARS = 16_000  # PromQL characters (~5 vLLM reads); the read crossing it is in
Found = dict[str, object]  # each query's result, as its own request would have had it, or why not
Read = tuple[str, dict[str, str], "asyncio.Future[Found | None]"]  # workload, queries, results
# How a batch is sent: (combined query, its tags, timeout) -> the answer split per tag; raises
# ConnectionError when Prometheus did not answer, ValueError when it answered unusably.
SendBatch = Callable[[str, dict[str, str], float], Awaitable[dict[str, list[object]]]]


@dataclass
class _Batch:
    """Reads gathering for one request: (workload, its queries, where its results go)."""

    timeout_s: float
    loop: asyncio.AbstractEventLoop  # its timer's: a batch left open by a loop that ended is
    # never joined from another (a source can outlive one asyncio.run)
    reads: list[Read] = default(default_factory=list)
    chars: int = 0
    closed: bool = False


class Batcher:
    """The batches gathering for one source, and the workloads kept out of them for a while."""

    def __init__(self, send: SendBatch, alone_s: float) -> None:
        self._send_batch = send
        self._alone_s = alone_s  # after a batch timed out, its workloads ask alone this long
        self._alone_until: dict[str, float] = {}  # workload -> out of batches until then
        self._open: dict[float, _Batch] = {}  # the batch gathering, per query timeout
        self._sending: set[asyncio.Task[None]] = set()

    def may_join(self, key: str, now: float) -> bool:
        """Whether workload `key` may join a batch at `now` (monotonic): not while it is kept
        out after a batch of its timed out."""
        if self._alone_until.get(key, 0.0) > now:
            return False
        self._alone_until.pop(key, None)
        return True

    def forget(self, key: str) -> None:
        """Drop what is kept for a workload no longer read (a batcher outlives its workloads)."""
        self._alone_until.pop(key, None)

    def cancel(self) -> None:
        """Cancel the batches being sent: the source is closing."""
        for task in list(self._sending):
            task.cancel()

    def join(
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

    async def _send(self, reads: list[Read], timeout_s: float) -> None:
        """One request for the batch's reads, its answer split back per read. Failures as for a
        read's own combined query: an error or garbage answer sends every read to ask alone in
        the same round (where a bad query splits its own workload); a timeout leaves the batch's
        signals missing this round and its workloads ask alone for `alone_s` (one slow query
        then costs its own workload, not the batch); down or refused fails every read."""
        tags = tagged([queries for _key, queries, _future in reads])
        query = combined_query(tags)
        outcomes: list[Found | None]
        try:
            parts = await self._send_batch(query, tags, timeout_s)
            outcomes = [
                {name: parts[f"{i}/{name}"] for name in queries}
                for i, (_key, queries, _future) in enumerate(reads)
            ]
        except ConnectionError as exc:
            if "timed out" in str(exc):
                until = time.monotonic() + self._alone_s
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
