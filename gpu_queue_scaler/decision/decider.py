"""One workload's decision, tick by tick: the one implementation of a tick that every caller runs.

A tick is signal -> `gpu_queue_scaler.decision.policy.decide` -> feed the forecaster the demand
behind the decision. The engine (live ticks and a warm start's replay), the simulator's scaler row
and the benches all call a `Decider`, so what the bench measures is what serves KEDA, not a copy of
it.

A `Decider` owns what a workload carries between ticks: the `PolicyState` (the policy's windows,
the replicas asked and not yet ready, the closed-loop headroom), the demand's recent history and
period (`gpu_queue_scaler.decision.season.Season`: what `forecast: wake` reads) and, with
`forecast: on`, its forecast seat: a row of a `ForecastBank` shared with other workloads (the
engine's `ForecastBanks`; a decider built alone gets banks of its own), or, while `replaying`
history, a `NeedForecast` of its own that then joins the bank holding what a live row would hold
(`ForecastBank.adopt`).

Synchronous and without I/O or a clock: time is an argument, and the caller schedules the ticks
(the engine on its tick grid, the simulator on its step). The policy state is a value (`state`)
that can be handed out and taken back; the forecast seat is not (a bank row is shared), so it
stays with the decider until `release`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np

from gpu_queue_scaler.decision import capacity
from gpu_queue_scaler.decision.bank import BankedForecast, ForecastBanks
from gpu_queue_scaler.decision.outlook import NeedForecast, Outlook
from gpu_queue_scaler.decision.policy import Decision, PolicyState, Reason, decide, hold
from gpu_queue_scaler.decision.season import HISTORY_S, Season
from gpu_queue_scaler.settings.fields import BY_KEY
from gpu_queue_scaler.signals import Signal

if TYPE_CHECKING:  # annotations only: the decision imports no settings code at run time
    from gpu_queue_scaler.settings.spec import WorkloadSpec

DEFAULT_STALE_S = float(BY_KEY["staleTargetSeconds"].default)  # as ServerSettings' default


def _or_nan(value: float | None) -> float:
    return math.nan if value is None else value


class Decider:
    """A workload's decision state and forecast seat; `tick` is one evaluation.

    `spec` and `stale_s` may change between ticks (a trigger edit, a ConfigMap reload): set them
    with `configure`; the forecast seat follows the spec's forecast settings at the next tick."""

    def __init__(
        self,
        spec: WorkloadSpec,
        banks: ForecastBanks | None = None,
        stale_s: float = DEFAULT_STALE_S,
        state: PolicyState | None = None,
    ) -> None:
        self.spec = spec
        self.stale_s = stale_s
        self.state = state if state is not None else PolicyState()
        self.banks = banks if banks is not None else ForecastBanks()
        self.forecast: BankedForecast | NeedForecast | None = None
        self.season: Season | None = None  # the demand's history and period, with a forecast
        self._recalled: Season | None = None  # the season a recall was last started for
        self._replaying = False

    def configure(self, spec: WorkloadSpec, stale_s: float) -> None:
        """The spec and stale target for the next ticks (the state carries over)."""
        self.spec = spec
        self.stale_s = stale_s

    # --- one tick ------------------------------------------------------------------------------

    def tick(
        self,
        signal: Signal | None,
        at: float,
        *,
        faults: tuple[str, ...] = (),
        explain: bool = True,
    ) -> Decision | None:
        """Decide tick `at` from `signal` (None: no signal, the last decision is held), carry the
        state to the next tick and feed the forecaster. `explain=False` leaves the decision's
        detail empty (a replay's decisions are read by no one but the next tick)."""
        outlook = self.outlook()
        decision, self.state = decide(
            self.spec,
            signal,
            self.state,
            at,
            self.stale_s,
            faults,
            outlook=outlook,
            explain=explain,
        )
        if (
            explain
            and decision is not None
            and self.spec.forecast_wakes_only
            and decision.reason is not Reason.HOLD
            and decision.outlook is None
        ):
            decision = decision._replace(detail=decision.detail + self._wake_note(outlook))
        self.learn(at, decision)
        return decision

    def hold(self, at: float, faults: tuple[str, ...]) -> Decision | None:
        """The read failed: hold the last good decision (fail static), or None once it is older
        than the stale target. Nothing is learnt and the state does not change."""
        return hold(self.state, at, self.stale_s, faults)

    def replay(self, signals: Iterable[Signal]) -> Decision | None:
        """Decide every signal at its own time, as live ticks would have (a warm start), and
        return the last decision. Callers that must yield between ticks (the engine) use
        `replaying` and `tick(..., explain=False)` themselves: the same steps."""
        decision = None
        with self.replaying():
            for signal in signals:
                decision = self.tick(signal, signal.at, explain=False)
        return decision

    # --- the forecast seat ---------------------------------------------------------------------

    def outlook(self) -> Outlook | None:
        """The current forecast outlook (None with forecasting off). With `forecast: on` it is
        the forecaster's, from a seat taken on first use and taken again when the forecast's
        step, horizon or season change (a season found in the demand, `seasonPeriodSeconds:
        auto`: the new seat learns the history held). With `wake` it is the season's own
        (`Season.outlook`), once one period is held: no forecaster seat. Its horizon is the
        scaler's plus the rate window: the demand series lags arrivals by that window, so a
        ramp read at the horizon alone would wake replicas a rate window late."""
        spec = self.spec
        if not spec.forecast:
            self.release()
            self.season = None
            return None
        season = self._season()
        wake = spec.forecast_wakes_only
        period_s = self._period_s()
        if wake:
            self.release()
            if period_s is None:
                return None
            return season.outlook(period_s, spec.horizon_s + spec.rate_window_s)
        shape = (spec.forecast_step_s, spec.horizon_s, period_s)
        current = self.forecast
        if current is None or (current.step_s, current.horizon_s, current.period_s) != shape:
            found = current is not None and current.period_s != period_s and spec.season_auto
            self.release()
            if found:  # the new seat learns the demand held (`Season.replay_into`)
                private = NeedForecast(*shape)
                season.replay_into(private)
                if self._replaying:
                    current = self.forecast = private
                else:
                    current = self.forecast = self.banks.join(*shape)
                    current.adopt(private)
            else:
                current = self.forecast = (
                    NeedForecast(*shape) if self._replaying else self.banks.join(*shape)
                )
        return current.outlook

    def _season(self) -> Season:
        """The season for the spec's forecast settings (a new one when they changed)."""
        spec, season = self.spec, self.season
        if season is None or (season.step_s, season.search, season.keep) != (
            spec.forecast_step_s,
            spec.season_auto,
            spec.forecast_wakes_only,
        ):
            season = self.season = Season(
                spec.forecast_step_s, spec.season_auto, keep=spec.forecast_wakes_only
            )
        return season

    def recall_due(self) -> bool:
        """The season lacks older history and none was recalled into it yet: after a restart,
        and after a config change of the forecast settings, which starts a new season
        (`_season`); without a recall that one would wait a period before `wake` reads."""
        season = self.season
        return season is not None and season is not self._recalled and self.missing() is not None

    def recall_started(self) -> None:
        """A recall is on its way for the current season (once per season, failed or not)."""
        self._recalled = self.season

    def missing(self) -> tuple[float, float] | None:
        """The span of older history the season could hold and does not (`Season.missing`),
        or None: nothing to recall (no season kept, or it is full)."""
        return None if not self.spec.forecast or self.season is None else self.season.missing()

    def recall(self, signals: Sequence[Signal]) -> None:
        """Put a warm start's older history (`missing`) into the season alone, after the replay:
        the arrival rate as read, and the offered load from each signal's own S (a live tick's
        is the policy's mean over minutes, which a signal alone does not have). So a restarted
        scaler finds the period and wakes for the next burst at once, instead of a period and
        more later. No decisions: microseconds a signal."""
        if not self.spec.forecast or self.season is None or not signals:
            return
        capacity_spec = self.spec.capacity
        at = np.fromiter((s.at for s in signals), float, len(signals))
        demand = np.fromiter(
            (_or_nan(capacity.offered(s, capacity_spec)) for s in signals), float, len(signals)
        )
        rate = np.fromiter((_or_nan(s.arrival_rate) for s in signals), float, len(signals))
        self.season.recall(at, demand, rate)

    def _period_s(self) -> float | None:
        """The season the forecast runs on: the one found in the demand (`auto`), else the
        configured one (with `auto`, the daily one until a period is found)."""
        found = self.season.period_s if self.season is not None else None
        return found if self.spec.season_auto and found is not None else self.spec.season_period_s

    def _wake_note(self, outlook: Outlook | None) -> str:
        """Why `forecast: wake` did not read the forecast on this tick (for `scaler explain`)."""
        if outlook is not None:
            return "; forecast (wake) not read: the workload needed replicas within the window"
        spec = self.spec
        found = self.season.period_s if self.season is not None else None
        period = self._period_s()
        if spec.season_auto and found is None:
            return "; forecast (wake) not read: no period found in the demand yet"
        if period is None:
            return "; forecast (wake) never read: no season (seasonPeriodSeconds=0)"
        if 2 * period > HISTORY_S:
            return (
                f"; forecast (wake) never read: two periods of {period:g}s do not fit the "
                f"{HISTORY_S:g}s of history it holds (forecast: on forecasts longer seasons)"
            )
        which = "found" if found == period else "set"
        # Not how much has been seen: the detail stays a function of the policy state and the
        # signal, as the rest of the decision is (a state handed back decides the same).
        return f"; forecast (wake) not read until a period is seen: period {period:g}s ({which})"

    def learn(self, at: float, decision: Decision | None) -> None:
        """Feed the demand behind a fresh decision (not a held one) to the forecaster: the
        offered load when it is known (`capacity.offered`), else the need. The need of a queued
        fleet depends on the fleet itself (a short fleet queues, then drains), the offered load
        does not, and that is what is ahead of us to forecast."""
        if self.spec.forecast and (self.forecast is not None or self.season is not None):
            value = rate = None
            if decision is not None and decision.reason is not Reason.HOLD:
                value, rate = decision.demand, decision.arrival_rate
            if self.season is not None:  # a replay searches once, at its end (`replaying`)
                self.season.observe(at, value, rate, search=not self._replaying)
            if self.forecast is not None:
                self.forecast.observe(at, value)

    def release(self) -> None:
        """Give the forecast's bank row back (the workload is gone, or its forecast settings
        changed or turned off)."""
        if isinstance(self.forecast, BankedForecast):
            self.forecast.release()
        self.forecast = None

    @contextmanager
    def replaying(self) -> Iterator[None]:
        """Replay history: it is older than the bank's open bin, so the forecast learns it on a
        `NeedForecast` of its own, which then joins the bank (`ForecastBank.adopt`) holding what
        a row live all along would hold."""
        self.release()
        self._replaying = True
        try:
            yield
        finally:
            self._replaying = False
            if self.season is not None:
                self.season.find()  # once, for the minutes replayed (see `learn`)
            private = self.forecast
            if isinstance(private, NeedForecast):
                seat = self.banks.join(private.step_s, private.horizon_s, private.period_s)
                seat.adopt(private)
                self.forecast = seat
