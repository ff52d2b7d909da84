"""One live evaluation of a workload: read its signal under a deadline, decide or hold, publish,
and log the decision when it changed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpu_queue_scaler import telemetry
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.engine.faults import Fault, NoDecisionError
from gpu_queue_scaler.engine.workload import Workload
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.sources import Source, SourceError

log = logging.getLogger(__package__)  # "gpu_queue_scaler.engine" for every module of the package


async def evaluate(
    workload: Workload,
    at: float,
    store: ConfigStore,
    source_for: Callable[[WorkloadSpec], Source],
    monotonic: Callable[[], float],
) -> None:
    """Evaluate tick `at`: read the signal (within the interval or the read deadline, the
    longer), decide, publish. A failed read holds the last good decision (fail static) or
    publishes why there is none; a changed decision is logged."""
    stale = store.current.server.stale_target_s
    previous = workload.decision
    timeout: float | None = None  # set once the read is asked for
    try:
        spec = workload.spec(store.current)
        source = source_for(spec)
        timeout = max(store.current.server.evaluation_interval_s, spec.read_deadline_s)
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
            monotonic(),
            bug=bug,
            held=decision.replicas if decision is not None else None,
        )
        telemetry.evaluation_counter("held" if decision else "none").inc()
        workload.publish(decision, None if decision else problem)
        return
    workload.source_failures.succeeded(workload.trigger.workload, monotonic())
    decision = workload.decider_for(spec, stale).tick(signal, at)
    telemetry.evaluation_counter("decided" if decision else "none").inc()
    missing = None
    if decision is None:
        missing = NoDecisionError(
            Fault.UNAVAILABLE,
            f"{spec.workload}: signal incomplete: {', '.join(signal.reasons)}",
        )
    workload.publish(decision, missing)
    if decision is not None:
        log_if_changed(previous, decision)


def log_if_changed(previous: Decision | None, decision: Decision) -> None:
    """Log a decision whose replicas, activity or reason differ from the one published before."""
    shown = (decision.replicas, decision.active, decision.reason)
    if previous is not None and (previous.replicas, previous.active, previous.reason) == shown:
        return
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
