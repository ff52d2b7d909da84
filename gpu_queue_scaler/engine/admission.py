"""Which triggers get a loop: one that fits the ConfigMap, while the table has room; refusals
are remembered, so KEDA re-sending a refused trigger on every poll costs no resolve."""

from __future__ import annotations

from gpu_queue_scaler.engine.faults import Fault, NoDecisionError
from gpu_queue_scaler.engine.schedule import WorkloadKey
from gpu_queue_scaler.engine.workload import Resolved, resolved_for
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.trigger import TriggerSpec

# Workloads (loops) at once. Each costs ~30 KB and a share of every tick's CPU; one is started for
# every new (namespace, name, metric) KEDA asks about and stays until it is not asked for
# workloadIdleTimeoutSeconds, so without a bound a client inventing names grows the table without
# end. A workload past it gets UNAVAILABLE (KEDA's fallback) until a place frees.
MAX_WORKLOADS = 5000
REFUSALS_KEPT = 1024  # refused triggers whose resolve is remembered (`Admission.admit`)


class Admission:
    """The engine's door: `admit` resolves a trigger seen for the first time, or says why no
    loop is started for it."""

    def __init__(self, max_workloads: int = MAX_WORKLOADS) -> None:
        self.max_workloads = max_workloads
        self._refused: dict[WorkloadKey, Resolved] = {}  # oldest first
        self._refused_under: Config | None = None  # the config they were resolved under

    def admit(
        self, key: WorkloadKey, trigger: TriggerSpec, config: Config, tracked: int
    ) -> Resolved | NoDecisionError:
        """The trigger resolved, or why no workload is started for it. A trigger that does not
        fit the ConfigMap gets no loop (nothing to read; it is checked again at its next call, so
        a ConfigMap edit that makes it fit starts one); nor does one past `max_workloads` (with
        `tracked` loops running). A refusal is remembered by the identity of trigger and config,
        as `Workload.resolved` is: KEDA re-sends a refused trigger on every poll, and resolving
        it again gives the same."""
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
        if tracked >= self.max_workloads:
            return NoDecisionError(
                Fault.UNAVAILABLE,
                f"{trigger.workload}: this scaler serves at most {self.max_workloads} workloads "
                "at once; a workload not asked for in workloadIdleTimeoutSeconds frees its place",
            )
        return resolved
