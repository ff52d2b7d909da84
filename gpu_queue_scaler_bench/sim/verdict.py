"""The scaler row against the project's goals, computed from a bench's measures.

One place for the goals, so the replay's table (`scaler demo`, `scaler bench replay`) and
`bench/results/replay.md` judge the same way:

- **SLO**: at least GOAL_ATTAINMENT of requests within the SLO, wherever the oracle reaches it
  (where it does not, no causal policy is held to it);
- **GPU-hours against the oracle's**: at most 1.25x on smooth and diurnal traffic, 1.5x on
  bursty traffic; the class of each shipped trace is named here (`BURSTY`, `SMOOTH`), and any
  other trace gets its ratio without a limit (its kind is not known);
- **always-on** (the fewest replicas a fixed fleet meets the SLO goal with, tried at the
  oracle's peak and in whole nodes below it: a baseline sized in hindsight): never more
  GPU-hours;
- **the reactive KEDA rows** (`KEDA_ROWS`): ahead = fewer misses at no more GPU-hours, or fewer
  GPU-hours at no more misses; behind = the KEDA row is ahead of the scaler; mixed = neither.

A goal missed is printed in capitals on the first screen: the bench reports it, never hides it.
Beside each goal missed, when the run has the `reactive-bound(hindsight)` row (the oracle's exact
need now, no lag and no noise, with the best headroom in hindsight, held for the scaler's window),
the verdict says whether that bound meets it. Where it does, the gap is in how the scaler reads
the present; where it does not, reading the present perfectly and holding it as long is not
enough on that trace, and the way to the goal is foresight (the forecast) or a different hold.
The goal stays missed either way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpu_queue_scaler_bench.sim.policies import KEDA_INFLIGHT, KEDA_INFLIGHT_BEST, REACTIVE_BEST

GOAL_ATTAINMENT = 0.99
BURSTY = ("AzureLLMInferenceTrace_code", "aggregate_rate_reason_deepseek-r1")
SMOOTH = (
    "AzureLLMInferenceTrace_conv",
    "conversation_trace",
    "aggregate_rate_language_m-small",
    "aggregate_rate_language_m-large",
    "aggregate_rate_multimodal_mm-image",
)
LIMIT_BURSTY = 1.5
LIMIT_SMOOTH = 1.25
KEDA_ROWS = (KEDA_INFLIGHT, KEDA_INFLIGHT_BEST)


@dataclass(frozen=True)
class Outcome:
    """One policy's result: the share of requests within the SLO and the GPU-hours paid."""

    attainment: float
    gpu_hours: float


def against(mine: Outcome, other: Outcome) -> str:
    """ahead, behind, mixed or equal (see the module docstring)."""
    a, b = mine.attainment, other.attainment
    g, h = mine.gpu_hours, other.gpu_hours
    if a >= b and g <= h and (a > b or g < h):
        return "ahead"
    if b >= a and h <= g and (b > a or h < g):
        return "behind"
    return "mixed" if (a, g) != (b, h) else "equal"


def limit_for(trace: str) -> tuple[float | None, str]:
    """The GPU-hour limit over the oracle's for a trace, and the kind of traffic it is for."""
    if trace in BURSTY:
        return LIMIT_BURSTY, "bursty"
    if trace in SMOOTH:
        return LIMIT_SMOOTH, "smooth or diurnal"
    return None, "unclassified"


@dataclass(frozen=True)
class Verdict:
    """The scaler row against each goal on one run."""

    trace: str
    scaler: Outcome
    oracle: Outcome
    always_on: Outcome
    keda: tuple[tuple[str, Outcome], ...]
    limit: float | None
    kind: str
    bound: Outcome | None = None  # the reactive bound's row, if the run has it

    def _slo_met(self, row: Outcome) -> bool:
        return row.attainment >= GOAL_ATTAINMENT or self.oracle.attainment < GOAL_ATTAINMENT

    def _cost_met(self, row: Outcome) -> bool | None:
        o = self.oracle.gpu_hours
        return None if self.limit is None else row.gpu_hours <= self.limit * o

    @property
    def slo_met(self) -> bool:
        return self._slo_met(self.scaler)

    @property
    def ratio(self) -> float:
        o = self.oracle.gpu_hours
        return self.scaler.gpu_hours / o if o else float("inf")

    @property
    def cost_met(self) -> bool | None:
        return self._cost_met(self.scaler)

    @property
    def cheaper_than_always_on(self) -> bool:
        return self.scaler.gpu_hours <= self.always_on.gpu_hours

    def missed(self) -> tuple[str, ...]:
        """The goals missed, by the names `bound_meets` uses."""
        met = {"slo": self.slo_met, "cost": self.cost_met, "always-on": self.cheaper_than_always_on}
        return tuple(goal for goal, ok in met.items() if ok is False)

    def bound_meets(self) -> dict[str, bool | None]:
        """Whether the reactive bound meets each goal ("slo", "cost", "always-on"); None where
        the run has no bound or the goal has no limit."""
        b = self.bound
        if b is None:
            return {"slo": None, "cost": None, "always-on": None}
        return {
            "slo": self._slo_met(b),
            "cost": self._cost_met(b),
            "always-on": b.gpu_hours <= self.always_on.gpu_hours,
        }

    def _reach(self, goal: str) -> str:
        """What the reactive bound says about a goal the scaler missed (see the module
        docstring), or nothing."""
        met, b = self.bound_meets()[goal], self.bound
        if met is None or b is None:
            return ""
        figures = f"{b.attainment:.4f} / {b.gpu_hours:.2f} GPU-h"
        if met:
            return f"; the reactive bound meets it ({figures}): the gap is in reading the present"
        return (
            f"; the reactive bound misses it too ({figures}): reading the present perfectly, "
            "held as long, is not enough here; the oracle's foresight is"
        )

    def keda_verdicts(self) -> tuple[tuple[str, str, Outcome], ...]:
        return tuple((name, against(self.scaler, o), o) for name, o in self.keda)

    def lines(self, slo_s: float) -> list[str]:
        """The verdict as the replay's table prints it, a goal per line."""
        s, o, f = self.scaler, self.oracle, self.always_on
        slo = "met" if self.slo_met else "MISSED" + self._reach("slo")
        cost = (
            "no limit for a trace of unknown kind"
            if self.cost_met is None
            else f"goal <= {self.limit:g} on {self.kind} traffic: "
            + ("met" if self.cost_met else "MISSED" + self._reach("cost"))
        )
        fixed = "no more GPU-hours: met"
        if not self.cheaper_than_always_on:
            fixed = "MORE GPU-hours: MISSED" + self._reach("always-on")
        out = [
            "verdict: the scaler row against the project's goals (docs/bench.md)",
            f"  SLO: {s.attainment:.4f} of requests within {slo_s:g} s, goal >= "
            f"{GOAL_ATTAINMENT:g} where the oracle reaches it (oracle {o.attainment:.4f}): {slo}",
            f"  GPU-hours: {self.ratio:.2f}x the oracle's ({s.gpu_hours:.2f} / "
            f"{o.gpu_hours:.2f}), {cost}",
            "  vs always-on (the smallest fixed fleet that meets the goal): "
            f"{s.gpu_hours:.2f} against {f.gpu_hours:.2f} GPU-h at {s.attainment:.4f} / "
            f"{f.attainment:.4f} within the SLO: {fixed}",
        ]
        for name, word, other in self.keda_verdicts():
            out.append(
                f"  vs {name}: {word} ({other.attainment:.4f} / {other.gpu_hours:.2f} GPU-h)"
            )
        return out


def judge(trace: str, outcomes: Mapping[str, Outcome], row: str = "scaler") -> Verdict | None:
    """The verdict for `row`, or None when the run lacks it, the oracle or always-on."""
    mine, oracle, fixed = outcomes.get(row), outcomes.get("oracle"), outcomes.get("always-on")
    if mine is None or oracle is None or fixed is None:
        return None
    limit, kind = limit_for(trace)
    keda = tuple((name, outcomes[name]) for name in KEDA_ROWS if name in outcomes)
    return Verdict(trace, mine, oracle, fixed, keda, limit, kind, outcomes.get(REACTIVE_BEST))
