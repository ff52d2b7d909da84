"""One workload's runtime state in the engine: its trigger and resolve, its `Decider`, and the
decision (or the fault) it last published for the RPCs to read."""

from __future__ import annotations

import asyncio

from gpu_queue_scaler.decision.bank import ForecastBanks
from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.engine.faults import Fault, NoDecisionError, SourceFailures
from gpu_queue_scaler.engine.schedule import phase_of
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import ResolveError, WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import TriggerSpec

PROBLEM_MAX = 4000  # characters of a workload's kept fault: what a status message can carry

# A resolve: its trigger and config (compared by identity: both are immutable and replaced, never
# changed) and its result, a spec or the message of the error to raise.
Resolved = tuple[object, object, WorkloadSpec | str]


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


class Workload:
    """One workload's loop state. Its decision state and forecast seat are its `Decider`
    (`gpu_queue_scaler.decision.decider`, the one tick implementation the simulator and the benches
    run too), made at its first resolved spec; its forecast is a row of the engine's shared `banks`.

    `decision` is what the RPCs read: the last one published, fresh or held, None with a
    `problem`. The decider's `state.last_good` is the last one made from a real signal, which a
    hold repeats: two facts that part at a hold or an incomplete signal, not one kept twice."""

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
        self.recalling: asyncio.Task[None] | None = None  # the season's older hours (`recall`)
        self.source_failures = SourceFailures()
        self.phase = phase_of((trigger.namespace, trigger.name, trigger.metric_name))
        self.resolved: Resolved | None = None  # the last resolve (`resolved_for`)

    def spec(self, config: Config) -> WorkloadSpec:
        """The workload's spec, resolved again only when its trigger or the config changed;
        NoDecisionError (FAILED_PRECONDITION) when the trigger does not fit the config."""
        cached = self.resolved = resolved_for(self.trigger, config, self.resolved)
        if isinstance(cached[2], str):
            raise NoDecisionError(Fault.FAILED_PRECONDITION, cached[2])
        return cached[2]

    def decider_for(self, spec: WorkloadSpec, stale_s: float) -> Decider:
        """The workload's decider, configured for this tick's spec and stale target."""
        if self.decider is None:
            self.decider = Decider(spec, self.banks, stale_s)
        else:
            self.decider.configure(spec, stale_s)
        return self.decider

    def recall_due(self) -> bool:
        """The season wants its older hours (`Decider.recall_due`) and no read is on its way."""
        if self.recalling is not None and not self.recalling.done():
            return False
        return self.decider is not None and self.decider.recall_due()

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
