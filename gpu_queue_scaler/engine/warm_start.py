"""A new loop's warm start: read the source's recent history, admitted first come, first served,
and replay it through the workload's decider on the tick grid, in slices that let RPCs through.

Two replicas, or a restarted one, given the same signals then hold the same state and return
the same answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gpu_queue_scaler.decision.policy import TICK_TOLERANCE_S
from gpu_queue_scaler.engine.faults import NoDecisionError
from gpu_queue_scaler.engine.schedule import (
    Segment,
    history_segments,
    recall_segment,
    tick_at_or_before,
)
from gpu_queue_scaler.engine.turns import Turnstile, WarmStartTurn
from gpu_queue_scaler.engine.workload import Workload
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import Source, SourceError

log = logging.getLogger(__package__)  # "gpu_queue_scaler.engine" for every module of the package


def _no_history(what: str, exc: BaseException, spec: WorkloadSpec) -> None:
    """A history read failed: down, refused, garbage or late is a warning; anything else is a
    bug, and its traceback is logged too."""
    bug = not isinstance(exc, (SourceError, TimeoutError))
    log.warning(
        "%s: %s",
        what,
        str(exc) or type(exc).__name__,
        exc_info=bug,
        extra={"workload": spec.workload},
    )


REPLAY_SLICE_S = 0.001  # a warm start's replay gives the event loop a turn after this much CPU
# Warm-start replays at once by default; the rest wait their turn in arrival order
# (`WarmStarts.run`; Engine(warm_starts_at_once=...)).
WARM_STARTS_AT_ONCE = 16
HISTORY_PATIENCE_S = 1.0  # a warm start's history read slower than this gives its turn back
WARM_START_CATCH_UPS = 3  # ticks passed during a warm start's replay are replayed, this often
# The seasons' older hours are read this many at a time (`WarmStarts.recall`): a restart of 1,000
# workloads must not send Prometheus 1,000 six-hour range queries at once.
RECALLS_AT_ONCE = 4


async def read_history(
    source: Source, spec: WorkloadSpec, segments: tuple[Segment, ...]
) -> list[Signal]:
    """The segments' signals, in order. The segments are read at once (a warm start waits for
    one round trip, not one per segment); if one read fails, the others are cancelled. An empty
    segment (the idle window inside the fine part) is not read; a single one is awaited
    directly, without tasks: fewer loop iterations for a first answer to wait through."""
    segments = tuple(segment for segment in segments if segment.end > segment.start)
    if len(segments) == 1:
        only = segments[0]
        return await source.history(spec, only.start, only.end, only.step)
    reads = [
        asyncio.ensure_future(source.history(spec, segment.start, segment.end, segment.step))
        for segment in segments
    ]
    try:
        parts = await asyncio.gather(*reads)
    finally:
        for read in reads:
            read.cancel()  # a no-op once done
    return [signal for part in parts for signal in part]


class WarmStarts:
    """The engine's warm starts: `run` is one, for a new workload, before its first live tick.

    `clock` is the engine's (ticks), `turns` its `Turnstile` (a replay's slices take turns with
    the evaluations), `at_once` the replays admitted together."""

    def __init__(
        self,
        store: ConfigStore,
        source_for: Callable[[WorkloadSpec], Source],
        clock: Callable[[], float],
        turns: Turnstile,
        at_once: int = WARM_STARTS_AT_ONCE,
    ) -> None:
        self._store = store
        self._source_for = source_for
        self._clock = clock
        self._turns = turns
        self._queue = asyncio.Semaphore(at_once)  # FIFO (see `run`)
        self._recalls = asyncio.Semaphore(RECALLS_AT_ONCE)

    async def run(self, workload: Workload) -> None:
        """Replay the source's recent history through the policy on the tick grid.

        The stabilization window is replayed at the evaluation interval, exactly as a running
        replica computed it; the older part of the idle window only has to show when the
        workload was last busy, so it is replayed on a coarser grid (still tick-aligned).
        """
        try:
            spec = workload.spec(self._store.current)
        except NoDecisionError:
            return
        # A burst of new workloads (a restart of this replica, or of KEDA's operator, which asks
        # about every ScaledObject as it reconciles them) is a burst of replays, CPU-bound.
        # Sharing the CPU among all of them finishes every one at the end of the burst, past the
        # callers' first-decision timeout (1,000 at once: no first decision within 2 s); taking
        # them WARM_STARTS_AT_ONCE at a time, in the order they came, finishes the first ones at
        # once and the rest one after another, and bounds the history reads in flight. A read
        # slower than HISTORY_PATIENCE_S (a backend timing out) gives its turn back, so it
        # does not hold the queue; its workload then replays without one.
        async with WarmStartTurn(self._queue) as turn:
            interval = self._store.current.server.evaluation_interval_s
            end = tick_at_or_before(self._clock(), interval, workload.phase)
            segments = history_segments(spec, end, interval)
            try:
                source = self._source_for(spec)
                history = await turn.patiently(
                    read_history(source, spec, segments), HISTORY_PATIENCE_S
                )
            except Exception as exc:  # down, refused, garbage, a bug: a cold start, not a crash
                _no_history("no history for warm start", exc, spec)
                return
            await self._replay(workload, spec, source, history, end, interval, segments[-1].step)

    async def recall(self, workload: Workload) -> None:
        """After the warm start and the first decision (and after a config change that starts a
        new season): read the hours of history the season lacks (`Decider.missing`, on a
        minute's grid) and recall them into it (`Decider.recall`), so that `forecast: wake`
        reads a period at once after a restart.
        Not in the warm start, and a task of its own beside the workload's loop: neither its
        first answer nor its ticks wait for any of this. RECALLS_AT_ONCE reads at a time, in
        the order asked; a read that fails costs the season its older history only (logged)."""
        async with self._recalls:
            decider = workload.decider
            if decider is None:
                return
            decider.recall_started()
            interval = self._store.current.server.evaluation_interval_s
            segment = recall_segment(decider.missing(), interval)
            if segment is None:
                return
            spec = decider.spec
            try:
                older = await self._source_for(spec).history(
                    spec, segment.start, segment.end, segment.step
                )
            except Exception as exc:
                _no_history("no season history for warm start", exc, spec)
                return
        await self._turns.take()  # array operations: well under a replay slice of CPU
        try:
            decider.recall(older)
        except Exception:  # a bug costs the season its older hours, never the workload's loop
            log.exception("season recall failed", extra={"workload": spec.workload})

    async def _replay(
        self,
        workload: Workload,
        spec: WorkloadSpec,
        source: Source,
        history: list[Signal],
        end: float,
        interval: float,
        step: float,
    ) -> None:
        """Feed `history` (up to the tick `end`) through the policy, then the ticks that passed
        meanwhile (at most WARM_START_CATCH_UPS more reads), as a running replica decided them."""
        decider = workload.decider_for(spec, self._store.current.server.stale_target_s)
        with decider.replaying():
            # A replay is tens of decisions (ms of CPU): it takes turns in slices, so it holds
            # the event loop, and the RPCs waiting on it, for REPLAY_SLICE_S at a time. The
            # first slice takes one too: warm starts whose history reads end together would
            # otherwise run their first slices back to back in one loop iteration.
            slice_end = 0.0
            for _catch_up in range(WARM_START_CATCH_UPS + 1):
                for signal in history:
                    if time.perf_counter() >= slice_end:
                        await self._turns.take()
                        slice_end = time.perf_counter() + REPLAY_SLICE_S
                    decider.tick(signal, signal.at, explain=False)  # no one reads its detail
                # A tick that passed during the replay is replayed too, as a running replica
                # evaluated it: the first live tick is then the one after it.
                later = tick_at_or_before(self._clock(), interval, workload.phase)
                if later <= end + TICK_TOLERANCE_S:
                    break
                try:
                    history = await source.history(spec, end, later, step)
                except Exception:  # replayed so far is kept; the live ticks take over
                    break
                end = later
