"""Per-workload background loops and the decision cache that every RPC reads.

KEDA asks GetMetricSpec, GetMetrics and IsActive on every evaluation, every pollingInterval and
on every HPA query, round-robin across scaler replicas; none of those calls may touch a metrics
backend. So each workload gets one loop, started the first time KEDA asks about it and stopped
once KEDA has not asked for `workloadIdleTimeoutSeconds`; the loop reads signals, decides, and
publishes the decision; RPCs only read it.

Ticks are aligned to the wall clock (t = k x evaluationIntervalSeconds + the workload's phase)
and a new loop first replays the source's history over the policy's windows, so two replicas, or
a restarted one, given the same signals hold the same state and return the same answer.

Phases. A workload's ticks are offset from the wall-clock grid by its phase, a fixed fraction of
the interval taken from a hash of its key (namespace, name, metric; crc32, so the same in every
replica and every restart), below PHASE_SPREAD of the interval. With one shared grid, a thousand
workloads evaluate at the same instant and hold the event loop, and every RPC waiting on it, for
the whole burst (the p99 of `scaler bench load`); with phases, their evaluations are spread over
PHASE_SPREAD of every interval, in PHASE_SLOTS instants (a timed wake-up of the event loop costs
CPU, and a long burst at one instant costs the RPCs' p99: see `phase_of`) where the workloads of
a slot take turns, one evaluation per loop iteration (`Turnstile`). The trade-off,
latency-wise: none for the decisions KEDA reads. A workload still evaluates once per interval,
so a decision is never older than one interval (plus its read) and recovery still comes within
one evaluation; its first decision still comes at once (on the last tick of its grid at or
before now); KEDA polls at arbitrary instants, so the mean age of the decision it reads is
unchanged. What moves is where in the interval each workload's tick falls: up to PHASE_SPREAD x
interval later than the shared grid (and, for a given workload, always by the same amount).
Why not the whole interval: a forecast bin closes at the first observation in the next bin
(scaler.forecast_bank), so a tick's read must end before any workload's first tick of the next
bin; the unused part of the interval keeps that margin (half an interval, 2.5 s at the default
5 s, instead of a whole one on a shared grid).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from enum import Enum
from typing import Any, NamedTuple, TypeVar

from scaler import telemetry
from scaler.config import Config
from scaler.config_watch import ConfigStore
from scaler.decider import Decider
from scaler.forecast_bank import ForecastBanks
from scaler.policy import TICK_TOLERANCE_S, Decision, policy_memory_s
from scaler.signals import Signal
from scaler.sources import Source, SourceError, Sources
from scaler.trigger import TriggerSpec
from scaler.workload import ResolveError, WorkloadSpec, resolve

log = logging.getLogger(__package__)  # "scaler.engine" for every module of the package
T = TypeVar("T")

HISTORY_MAX_POINTS = 2400  # per range query; Prometheus allows 11,000
FORECAST_MEMORY_BINS = 120  # the forecaster's error memory (weights down to 1/100) and warm-up
FORECAST_WARMUP_MAX_S = 6 * 3600.0
SOURCE_FAILURE_LOG_EVERY_S = 60.0  # a persisting source failure is logged at most this often
PHASE_SPREAD = 0.5  # phases cover [0, PHASE_SPREAD) of the interval (see the module docstring)
PHASE_SLOTS = 500  # phases take one of this many values (see phase_of)
REPLAY_SLICE_S = 0.001  # a warm start's replay gives the event loop a turn after this much CPU
# Warm-start replays at once by default; the rest wait their turn in arrival order
# (Engine._warm_start; Engine(warm_starts_at_once=...)).
WARM_STARTS_AT_ONCE = 16
HISTORY_PATIENCE_S = 1.0  # a warm start's history read slower than this gives its turn back
WARM_START_CATCH_UPS = 3  # ticks passed during a warm start's replay are replayed, this often
WorkloadKey = tuple[str, str, str]
# Workloads (loops) at once. Each costs ~30 KB and a share of every tick's CPU; one is started for
# every new (namespace, name, metric) KEDA asks about and stays until it is not asked for
# workloadIdleTimeoutSeconds, so without a bound a client inventing names grows the table without
# end. A workload past it gets UNAVAILABLE (KEDA's fallback) until a place frees.
MAX_WORKLOADS = 5000
PROBLEM_MAX = 4000  # characters of a workload's kept fault: what a status message can carry


# A resolve: its trigger and config (compared by identity: both are immutable and replaced, never
# changed) and its result, a spec or the message of the error to raise.
Resolved = tuple[object, object, WorkloadSpec | str]
REFUSALS_KEPT = 1024  # refused triggers whose resolve is remembered (`Engine._refusal`)


def resolved_for(trigger: TriggerSpec, config: Config, cached: Resolved | None) -> Resolved:
    """`cached` if it is this trigger's and config's resolve, else a new resolve."""
    if cached is not None and cached[0] is trigger and cached[1] is config:
        return cached
    result: WorkloadSpec | str
    try:
        result = resolve(trigger, config)
    except ResolveError as exc:
        result = f"{trigger.workload}: {exc}"
    return (trigger, config, result)


def key_fraction(key: WorkloadKey) -> float:
    """A stable hash of the key (crc32, not Python's salted hash) as a fraction in [0, 1)."""
    return zlib.crc32("\x00".join(key).encode("utf-8", "surrogatepass")) / 2**32


def phase_of(key: WorkloadKey) -> float:
    """The workload's phase as a fraction of the interval, in [0, PHASE_SPREAD): from a stable
    hash of its key, so every replica and every restart puts its ticks at the same instants.

    Phases come in PHASE_SLOTS steps (5 ms apart at the default 5 s), not continuously: each
    distinct instant is a wake-up of the event loop from a timed wait, which costs CPU
    (`bench/loop_wakeups.py`, 1,000 no-op workloads: ~55-61 us per tick on distinct instants,
    ~51 us in 500 slots, ~37 us in 50). Workloads sharing a slot wake together and then take
    turns (`Turnstile`), one evaluation per loop iteration, so RPCs still interleave between any
    two of them; but an RPC takes a few loop iterations (request, handler, response), and each
    iteration of a slot's burst carries one evaluation, so an RPC that lands in a burst waits for
    up to that many evaluations. So 500 slots, two workloads an instant at 1,000: shorter bursts
    than an RPC, for ~10% more server CPU than 50 (`scaler bench load` figures: docs/bench.md, 1,000
    ScaledObjects)."""
    return PHASE_SPREAD * math.floor(key_fraction(key) * PHASE_SLOTS) / PHASE_SLOTS


def tick_at_or_before(now: float, interval: float, phase: float) -> float:
    """The last tick k x interval + phase x interval at or before `now`."""
    offset = phase * interval
    return math.floor((now - offset) / interval) * interval + offset


def tick_after(last: float, interval: float, phase: float) -> float:
    """The first tick of the grid strictly after `last` (the grid may have changed since)."""
    offset = phase * interval
    k = math.floor((last - offset) / interval) + 1
    while k * interval + offset <= last:  # rounding put `last` just below its own grid point
        k += 1
    return k * interval + offset


def next_tick(now: float, last: float | None, interval: float, phase: float) -> float:
    """The tick to evaluate next: the latest of the grid at or before `now` (a loop that stalled
    past ticks skips them), or, if that one is done already (`last`), the one after it."""
    tick = tick_at_or_before(now, interval, phase)
    if last is not None and tick <= last:
        tick = tick_after(last, interval, phase)
    return tick


class Segment(NamedTuple):
    """A tick-aligned grid of history: start, start + step, ... < end."""

    start: float
    end: float
    step: float


def _segment(end: float, span: float, interval: float) -> Segment:
    """A tick-aligned grid that covers `span` before `end` in at most HISTORY_MAX_POINTS points."""
    step = interval * max(1, math.ceil(span / interval / HISTORY_MAX_POINTS))
    return Segment(end - math.ceil(span / step) * step, end, step)


def history_segments(spec: WorkloadSpec, end: float, interval: float) -> tuple[Segment, Segment]:
    """What a warm start replays up to the tick `end`, older part first. The fine part, tick for
    tick, covers all the policy remembers exactly: the stabilization window, replicas asked
    within the horizon, and panic's windows. The older part, on a coarser grid, covers the idle
    window and, with forecasting on, the forecaster's memory (its error window plus a horizon
    of bins), so a late replica's outlook matches."""
    fine = _segment(end, policy_memory_s(spec), interval)
    memory = spec.scale_to_zero_idle_s
    if spec.forecast:
        bins = FORECAST_MEMORY_BINS + math.ceil(spec.horizon_s / spec.forecast_step_s)
        memory = max(memory, min(FORECAST_WARMUP_MAX_S, bins * spec.forecast_step_s))
    return _segment(fine.start, max(0.0, memory - (end - fine.start)), interval), fine


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


class Fault(Enum):
    UNAVAILABLE = "unavailable"  # no data (yet); KEDA's fallback applies
    FAILED_PRECONDITION = "failed_precondition"  # the trigger does not fit the ConfigMap


class NoDecisionError(Exception):
    def __init__(self, fault: Fault, message: str) -> None:
        super().__init__(message)
        self.fault = fault
        self.message = message


class SourceFailures:
    """Logs a run of failed reads: once when it starts, with the fault and what is held; at most
    every SOURCE_FAILURE_LOG_EVERY_S while it persists, with the count; once when a read succeeds
    again. A fault the sources report (backend down, every pod failing, a timeout, a trigger that
    no longer fits the ConfigMap) is a warning; a source raising what no source should (a bug) is
    an error, with its traceback once. The evaluation counters still count every tick."""

    def __init__(self) -> None:
        self.count = 0  # failures in the current run; 0 while the source answers
        self.started = 0.0
        self.logged = 0.0

    def failed(
        self, workload: str, exc: Exception, now: float, *, bug: bool, held: int | None
    ) -> None:
        self.count += 1
        error = repr(exc) if bug else str(getattr(exc, "message", exc))
        fields = {"workload": workload, "error": error, "failures": self.count, "held": held}
        holding = f"holding {held} replicas" if held is not None else "no target to hold"
        if self.count == 1:
            self.started = self.logged = now
            if bug:
                log.error("source failed", exc_info=exc, extra={"event": "source_failed", **fields})
            else:
                log.warning(
                    "signals failing (%s): %s",
                    holding,
                    error,
                    extra={"event": "source_failed", **fields},
                )
        elif now - self.logged >= SOURCE_FAILURE_LOG_EVERY_S:
            self.logged = now
            log.log(
                logging.ERROR if bug else logging.WARNING,
                "source still failing (%d failures in %.0fs; %s): %s",
                self.count,
                now - self.started,
                holding,
                error,
                extra={
                    "event": "source_failing",
                    "failing_s": round(now - self.started, 3),
                    **fields,
                },
            )

    def succeeded(self, workload: str, now: float) -> None:
        if self.count:
            log.info(
                "source recovered after %d failures in %.0fs",
                self.count,
                now - self.started,
                extra={
                    "event": "source_recovered",
                    "workload": workload,
                    "failures": self.count,
                    "failing_s": round(now - self.started, 3),
                },
            )
            self.count = 0


class Turnstile:
    """Lets waiters through one per event-loop iteration, in arrival order.

    Phases spread the workloads' ticks over the interval, but loops still wake together (a
    timer late behind a pause, close phases, warm starts of workloads seen at once), and a
    thousand loops evaluating back to back would hold the event loop, and every RPC with it, for
    the whole burst (hundreds of ms: the p99 of `scaler bench load` on one shared grid). A loop
    takes a turn before each evaluation, and a warm start's replay before each slice of it: a
    burst is spread over as many iterations and the loop polls for I/O, so answers RPCs, between
    any two. Nothing is held after the turn: a source's network reads still overlap."""

    def __init__(self) -> None:
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._granting = False

    async def take(self) -> None:
        loop = asyncio.get_running_loop()
        turn: asyncio.Future[None] = loop.create_future()
        self._waiting.append(turn)
        if not self._granting:
            self._granting = True
            loop.call_soon(self._grant, loop)
        await turn

    def _grant(self, loop: asyncio.AbstractEventLoop) -> None:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():  # a cancelled waiter gives its turn to the next
                turn.set_result(None)
                break
        if self._waiting:
            loop.call_soon(self._grant, loop)  # the next turn in the next iteration
        else:
            self._granting = False


class WarmStartTurn:
    """One admission to the warm starts' queue (a FIFO semaphore), given back at most once: at
    the end, or early by `patiently` when a read outlasts its patience."""

    def __init__(self, queue: asyncio.Semaphore) -> None:
        self._queue = queue
        self.held = False

    async def __aenter__(self) -> WarmStartTurn:
        await self._queue.acquire()
        self.held = True
        return self

    async def __aexit__(self, *_: object) -> None:
        self.give_back()

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self._queue.release()

    async def patiently(self, read: Coroutine[Any, Any, T], patience_s: float) -> T:
        """`read`'s result; if it takes longer than `patience_s`, the turn is given back while
        it goes on (the read itself is never cut short here; its own timeouts apply)."""
        task = asyncio.ensure_future(read)
        try:
            done, _ = await asyncio.wait({task}, timeout=patience_s)
            if not done:
                self.give_back()
            return await task
        finally:
            task.cancel()  # a no-op once done; ends the read if this warm start is cancelled


class Workload:
    """One workload's loop state. Its decision state and forecast seat are its `Decider`
    (`scaler.decider`, the one tick implementation the simulator and the benches run too), made
    at its first resolved spec; its forecast is a row of the engine's shared `banks`."""

    def __init__(
        self, trigger: TriggerSpec, asked_at: float, banks: ForecastBanks | None = None
    ) -> None:
        self.trigger = trigger
        self.last_asked = asked_at
        self.decision: Decision | None = None
        # Why there is no decision, as values: an exception kept and raised again at every call
        # would keep every earlier raise's frames in its traceback.
        self.problem: tuple[Fault, str] | None = None
        self.banks = banks if banks is not None else ForecastBanks()
        self.decider: Decider | None = None  # made at the first resolved spec (`decider_for`)
        self.last_tick: float | None = None
        self.first = asyncio.Event()  # the first evaluation has finished (with or without result)
        self._updated: asyncio.Event | None = None  # see `updated`
        self.task: asyncio.Task[None] | None = None
        self.source_failures = SourceFailures()
        self.phase = phase_of((trigger.namespace, trigger.name, trigger.metric_name))
        self.resolved: Resolved | None = None  # the last resolve (`resolved_for`)

    def decider_for(self, spec: WorkloadSpec, stale_s: float) -> Decider:
        """The workload's decider, configured for this tick's spec and stale target."""
        if self.decider is None:
            self.decider = Decider(spec, self.banks, stale_s)
        else:
            self.decider.configure(spec, stale_s)
        return self.decider

    def hold(self, at: float, stale_s: float, faults: tuple[str, ...]) -> Decision | None:
        """No signal this tick: the last good decision held (None before any, or once stale)."""
        if self.decider is None:
            return None
        self.decider.stale_s = stale_s
        return self.decider.hold(at, faults)

    def release_forecast(self) -> None:
        """Give the forecast's bank row back (the loop ended)."""
        if self.decider is not None:
            self.decider.release()

    @property
    def updated(self) -> asyncio.Event:
        """Set at the next publish; a new one after each. Made when first asked for (a watcher
        asks), not at every publish: most workloads are never watched."""
        if self._updated is None:
            self._updated = asyncio.Event()
        return self._updated

    def publish(self, decision: Decision | None, problem: NoDecisionError | None) -> None:
        self.decision = decision
        # Cut as a status message is (a fault can list every pod's reason): kept per workload.
        self.problem = None if problem is None else (problem.fault, problem.message[:PROBLEM_MAX])
        self.first.set()
        event, self._updated = self._updated, None
        if event is not None:
            event.set()


class Engine:
    def __init__(
        self,
        store: ConfigStore,
        sources: Callable[[WorkloadSpec], Source] | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        warm_starts_at_once: int = WARM_STARTS_AT_ONCE,
        max_workloads: int = MAX_WORKLOADS,
    ) -> None:
        """`warm_starts_at_once`: replays admitted together (see `_warm_start`); a bench or a test
        sets it here rather than patching the module's default. `max_workloads`: the most loops
        at once (see MAX_WORKLOADS). `clock` (ticks), `monotonic` (idle timeouts) and `sleep`
        (the wait for the next tick) are time as an argument: a test moves them together."""
        if warm_starts_at_once < 1:
            raise ValueError(f"warm_starts_at_once: at least 1, got {warm_starts_at_once}")
        self._max_workloads = max_workloads
        self._store = store
        self._source_for = sources if sources is not None else Sources()
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._workloads: dict[WorkloadKey, Workload] = {}
        self._refused: dict[WorkloadKey, Resolved] = {}  # oldest first (see `_refusal`)
        self._refused_under: Config | None = None  # the config they were resolved under
        self._banks = ForecastBanks()  # workloads' forecasts, one vectorised update per bin
        self._closing = False  # watchers end; loops keep answering unary calls
        self._stopped = False  # loops end (cancelled, and each checks this before every tick)
        self._turns = Turnstile()  # one evaluation per event-loop iteration (RPCs interleave)
        self._warm_starts = asyncio.Semaphore(warm_starts_at_once)  # FIFO (see _warm_start)

    # --- what the RPCs call: memory only -----------------------------------------------------

    def touch(self, trigger: TriggerSpec) -> Workload | None:
        """The workload for this trigger, started on first sight; marks it as asked for. None
        when none is started: the trigger does not fit the ConfigMap, or the table is full."""
        workload = self._touch(trigger)
        return None if isinstance(workload, NoDecisionError) else workload

    def _refusal(self, key: WorkloadKey, trigger: TriggerSpec) -> Resolved | NoDecisionError:
        """The trigger resolved, or why no workload is started for it. A trigger that does not
        fit the ConfigMap gets no loop (nothing to read; it is checked again at its next call, so
        a ConfigMap edit that makes it fit starts one); nor does one past `max_workloads`. A
        refusal is remembered by the identity of trigger and config, as `Workload.resolved` is:
        KEDA re-sends a refused trigger on every poll, and resolving it again gives the same."""
        config = self._store.current
        if self._refused_under is not config:  # entries of an older one would keep it alive
            self._refused.clear()
            self._refused_under = config
        resolved = resolved_for(trigger, config, self._refused.get(key))
        if isinstance(resolved[2], str):
            self._refused[key] = resolved
            if len(self._refused) > REFUSALS_KEPT:  # a client can invent names without end
                del self._refused[next(iter(self._refused))]
            return NoDecisionError(Fault.FAILED_PRECONDITION, resolved[2])
        self._refused.pop(key, None)
        if len(self._workloads) >= self._max_workloads:
            return NoDecisionError(
                Fault.UNAVAILABLE,
                f"{trigger.workload}: this scaler serves at most {self._max_workloads} workloads "
                "at once; a workload not asked for in workloadIdleTimeoutSeconds frees its place",
            )
        return resolved

    def _touch(self, trigger: TriggerSpec) -> Workload | NoDecisionError:
        key = (trigger.namespace, trigger.name, trigger.metric_name)
        workload = self._workloads.get(key)
        if workload is None:
            resolved = self._refusal(key, trigger)
            if isinstance(resolved, NoDecisionError):
                return resolved
            workload = Workload(trigger, self._monotonic(), self._banks)
            workload.resolved = resolved  # the first tick uses it, not a second resolve
            self._workloads[key] = workload
            if not self._closing:
                workload.task = asyncio.create_task(self._run(key, workload), name=str(key))
        workload.trigger = trigger  # metadata edits take effect at the next tick
        workload.last_asked = self._monotonic()
        return workload

    async def decision(self, trigger: TriggerSpec) -> Decision:
        workload = self._touch(trigger)
        if isinstance(workload, NoDecisionError):
            raise workload
        if not workload.first.is_set():
            timeout = self._store.current.server.first_decision_timeout_s
            try:
                await asyncio.wait_for(workload.first.wait(), timeout)
            except TimeoutError:
                raise NoDecisionError(
                    Fault.UNAVAILABLE,
                    f"{trigger.workload}: first decision not ready within {timeout:g}s",
                ) from None
        if workload.decision is None:
            fault, message = workload.problem or (Fault.UNAVAILABLE, f"{trigger.workload}: no data")
            raise NoDecisionError(fault, message)  # a new one each time (see Workload.problem)
        return workload.decision

    async def watch(self, trigger: TriggerSpec) -> AsyncIterator[Decision | None]:
        """Every decision as it is published; keeps the workload alive while watched."""
        while not self._closing:
            workload = self.touch(trigger)
            if workload is None:  # none started (`_refusal`): asked again an interval later
                yield None
                await self._sleep(self._store.current.server.evaluation_interval_s)
                continue
            event = workload.updated
            if workload.first.is_set():
                yield workload.decision
            await event.wait()

    def decisions(self) -> Iterator[Decision]:
        return (w.decision for w in list(self._workloads.values()) if w.decision is not None)

    def specs(self) -> Iterator[WorkloadSpec]:
        """The resolved spec of every tracked workload whose trigger resolves (for /metrics)."""
        for w in list(self._workloads.values()):
            if w.resolved is not None and not isinstance(w.resolved[2], str):
                yield w.resolved[2]

    def __len__(self) -> int:
        return len(self._workloads)

    def release_watchers(self) -> None:
        """End every `watch` (streams close with OK) while loops keep answering unary calls."""
        self._closing = True
        for workload in self._workloads.values():
            workload.updated.set()

    async def close(self) -> None:
        """Stop every loop and wake every watcher (they see `_closing` and end).

        Loops are cancelled and also check `_stopped` before every tick, so a loop whose
        cancellation is lost (a source that swallows CancelledError) still ends at its next tick.
        """
        self._closing = self._stopped = True
        tasks = [w.task for w in self._workloads.values() if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        close = getattr(self._source_for, "close", None)
        if close is not None:
            await close()
        for workload in self._workloads.values():
            workload.updated.set()
            workload.first.set()

    # --- the background loop -----------------------------------------------------------------

    async def _run(self, key: WorkloadKey, workload: Workload) -> None:
        try:
            await self._warm_start(workload)
            while not self._stopped:
                server = self._store.current.server
                interval = server.evaluation_interval_s
                now = self._clock()
                tick = next_tick(now, workload.last_tick, interval, workload.phase)
                if tick > now:
                    await self._sleep(max(0.0, tick - self._clock()))
                # Idle only after a first decision: a warm start slower than the idle timeout
                # (a backend slow to answer its history) must not end the loop that a caller
                # is waiting on, with "no data" instead of a target.
                idle = self._monotonic() - workload.last_asked > server.workload_idle_timeout_s
                if idle and workload.last_tick is not None:
                    log.info(
                        "workload no longer asked for; loop stopped",
                        extra={"workload": key[0] + "/" + key[1]},
                    )
                    return
                await self._turns.take()
                await self._evaluate(workload, tick)
                workload.last_tick = tick
        except Exception:  # a bug must not leave KEDA with a silently frozen target
            log.exception("workload loop crashed", extra={"workload": key[0] + "/" + key[1]})
            workload.publish(
                None, NoDecisionError(Fault.UNAVAILABLE, "internal error; see scaler logs")
            )
        finally:
            if self._workloads.get(key) is workload:
                del self._workloads[key]
                release = getattr(self._source_for, "release", None)
                if release is not None:  # its Prometheus source closes if no one else reads it
                    release(workload.trigger)
            workload.release_forecast()
            workload.first.set()
            workload.updated.set()

    def _spec(self, workload: Workload) -> WorkloadSpec:
        """The workload's spec, resolved again only when its trigger or the config changed."""
        cached = workload.resolved = resolved_for(
            workload.trigger, self._store.current, workload.resolved
        )
        if isinstance(cached[2], str):
            raise NoDecisionError(Fault.FAILED_PRECONDITION, cached[2])
        return cached[2]

    async def _warm_start(self, workload: Workload) -> None:
        """Replay the source's recent history through the policy on the tick grid.

        The stabilization window is replayed at the evaluation interval, exactly as a running
        replica computed it; the older part of the idle window only has to show when the
        workload was last busy, so it is replayed on a coarser grid (still tick-aligned).
        """
        try:
            spec = self._spec(workload)
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
        async with WarmStartTurn(self._warm_starts) as turn:
            interval = self._store.current.server.evaluation_interval_s
            end = tick_at_or_before(self._clock(), interval, workload.phase)
            segments = history_segments(spec, end, interval)
            try:
                source = self._source_for(spec)
                history = await turn.patiently(
                    read_history(source, spec, segments), HISTORY_PATIENCE_S
                )
            except Exception as exc:  # down, refused, garbage, a bug: a cold start, not a crash
                bug = not isinstance(exc, (SourceError, TimeoutError))
                log.warning(
                    "no history for warm start: %s",
                    str(exc) or type(exc).__name__,
                    exc_info=bug,
                    extra={"workload": spec.workload},
                )
                return
            await self._replay(workload, spec, source, history, end, interval, segments[-1].step)

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

    async def _evaluate(self, workload: Workload, at: float) -> None:
        stale = self._store.current.server.stale_target_s
        previous = workload.decision
        timeout: float | None = None  # set once the read is asked for
        try:
            spec = self._spec(workload)
            source = self._source_for(spec)
            timeout = max(self._store.current.server.evaluation_interval_s, spec.read_deadline_s)
            # Not asyncio.wait_for: on Python 3.11 it swallows a cancellation that arrives after
            # the read finished but before wait_for resumed (CPython gh-86296), and the loop
            # then never stops. asyncio.timeout awaits the read in this task: nothing is lost.
            async with asyncio.timeout(timeout):
                signal = await source.read(spec, at)
        except Exception as exc:  # a source bug must not cost the last good target
            why = str(exc) or repr(exc)
            if isinstance(exc, TimeoutError) and not str(exc):  # its own text is empty
                why = "the read timed out"
                if timeout is not None:  # said only when it happens, not at every tick
                    kind = "synthetic" if spec.signal_source == "none" else spec.signal_source
                    why = f"the {kind} read timed out after {timeout:g} s"
            problem = (
                exc
                if isinstance(exc, NoDecisionError)
                else NoDecisionError(Fault.UNAVAILABLE, f"{workload.trigger.workload}: {why}")
            )
            decision = workload.hold(at, stale, (problem.message,))
            bug = not isinstance(exc, (NoDecisionError, SourceError, TimeoutError))
            workload.source_failures.failed(
                workload.trigger.workload,
                exc if bug else problem,
                self._monotonic(),
                bug=bug,
                held=decision.replicas if decision is not None else None,
            )
            telemetry.evaluation_counter("held" if decision else "none").inc()
            workload.publish(decision, None if decision else problem)
            return
        workload.source_failures.succeeded(workload.trigger.workload, self._monotonic())
        decision = workload.decider_for(spec, stale).tick(signal, at)
        telemetry.evaluation_counter("decided" if decision else "none").inc()
        missing = None
        if decision is None:
            missing = NoDecisionError(
                Fault.UNAVAILABLE,
                f"{spec.workload}: signal incomplete: {', '.join(signal.reasons)}",
            )
        workload.publish(decision, missing)
        if decision is not None and (
            previous is None
            or (previous.replicas, previous.active, previous.reason)
            != (decision.replicas, decision.active, decision.reason)
        ):
            log.info(
                "decision",
                extra={
                    "event": "decision",
                    "decision_id": decision.decision_id,
                    "workload": decision.workload,
                    "metric": decision.metric_name,
                    "replicas": decision.replicas,
                    "active": decision.active,
                    "reason": decision.reason.value,
                    "detail": decision.detail,
                    "faults": list(decision.faults),  # why a `hold` holds (missing signals)
                    "forecast_q90": decision.outlook.upper_max if decision.outlook else None,
                },
            )
