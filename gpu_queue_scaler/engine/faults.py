"""Why a workload has no decision (`Fault`, `NoDecisionError`: what an RPC answers instead) and
how a run of failed reads is logged (`SourceFailures`)."""

from __future__ import annotations

import logging
from enum import Enum

log = logging.getLogger(__package__)  # "gpu_queue_scaler.engine" for every module of the package

SOURCE_FAILURE_LOG_EVERY_S = 60.0  # a persisting source failure is logged at most this often


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
