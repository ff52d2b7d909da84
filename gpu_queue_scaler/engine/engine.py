"""The engine: one background loop per workload, scheduled on its tick grid, and the decision
cache that every RPC reads.

KEDA asks GetMetricSpec, GetMetrics and IsActive on every evaluation, every pollingInterval and
on every HPA query, round-robin across scaler replicas; none of those calls may touch a metrics
backend. So each workload gets one loop, started the first time KEDA asks about it and stopped
once KEDA has not asked for `workloadIdleTimeoutSeconds`; the loop reads signals, decides, and
publishes the decision; RPCs only read it.

Ticks are aligned to the wall clock (t = k x evaluationIntervalSeconds + the workload's phase)
and a new loop first replays the source's history over the policy's windows, so two replicas, or
a restarted one, given the same signals hold the same state and return the same answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

from gpu_queue_scaler.decision.bank import ForecastBanks
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.engine.admission import MAX_WORKLOADS, Admission
from gpu_queue_scaler.engine.evaluation import evaluate
from gpu_queue_scaler.engine.faults import Fault, NoDecisionError
from gpu_queue_scaler.engine.schedule import WorkloadKey, next_tick
from gpu_queue_scaler.engine.turns import Turnstile
from gpu_queue_scaler.engine.warm_start import WARM_STARTS_AT_ONCE, WarmStarts
from gpu_queue_scaler.engine.workload import Workload
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.settings.trigger import TriggerSpec
from gpu_queue_scaler.sources import Source, Sources

log = logging.getLogger(__package__)  # "gpu_queue_scaler.engine" for every module of the package


class Engine:
    """The workloads' loops: started when KEDA first asks, stopped when it no longer does."""

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
        """`warm_starts_at_once`: replays admitted together (see `WarmStarts.run`); a bench or a
        test sets it here rather than patching the module's default. `max_workloads`: the most loops
        at once (see MAX_WORKLOADS). `clock` (ticks), `monotonic` (idle timeouts) and `sleep`
        (the wait for the next tick) are time as an argument: a test moves them together."""
        if warm_starts_at_once < 1:
            raise ValueError(f"warm_starts_at_once: at least 1, got {warm_starts_at_once}")
        self._admission = Admission(max_workloads)
        self._store = store
        self._source_for = sources if sources is not None else Sources()
        self._clock = clock
        self._monotonic = monotonic
        self._sleep = sleep
        self._workloads: dict[WorkloadKey, Workload] = {}
        self._banks = ForecastBanks()  # workloads' forecasts, one vectorised update per bin
        self._closing = False  # watchers end; loops keep answering unary calls
        self._stopped = False  # loops end (cancelled, and each checks this before every tick)
        self._turns = Turnstile()  # one evaluation per event-loop iteration (RPCs interleave)
        self._warm_starts = WarmStarts(
            store, self._source_for, clock, self._turns, warm_starts_at_once
        )

    # --- what the RPCs call: memory only -----------------------------------------------------

    def touch(self, trigger: TriggerSpec) -> Workload | None:
        """The workload for this trigger, started on first sight; marks it as asked for. None
        when none is started: the trigger does not fit the ConfigMap, or the table is full."""
        workload = self._touch(trigger)
        return None if isinstance(workload, NoDecisionError) else workload

    def _touch(self, trigger: TriggerSpec) -> Workload | NoDecisionError:
        key = (trigger.namespace, trigger.name, trigger.metric_name)
        workload = self._workloads.get(key)
        if workload is None:
            resolved = self._admission.admit(
                key, trigger, self._store.current, len(self._workloads)
            )
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
            if workload is None:  # none started (`Admission.admit`): asked again an interval later
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
            await self._warm_starts.run(workload)
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
                await evaluate(workload, tick, self._store, self._source_for, self._monotonic)
                workload.last_tick = tick
                # The season's older hours, aside: once the first answer is out, and again when a
                # config change of the forecast settings starts a new season.
                if workload.recall_due():
                    workload.recalling = asyncio.create_task(self._warm_starts.recall(workload))
        except Exception:  # a bug must not leave KEDA with a silently frozen target
            log.exception("workload loop crashed", extra={"workload": key[0] + "/" + key[1]})
            workload.publish(
                None, NoDecisionError(Fault.UNAVAILABLE, "internal error; see scaler logs")
            )
        finally:
            if workload.recalling is not None:
                workload.recalling.cancel()
            if self._workloads.get(key) is workload:
                del self._workloads[key]
                release = getattr(self._source_for, "release", None)
                if release is not None:  # its Prometheus source closes if no one else reads it
                    release(workload.trigger)
            workload.release_forecast()
            workload.first.set()
            workload.updated.set()
