"""The goals' verdict: one computation for the replay's table (`scaler demo`) and replay.md."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from gpu_queue_scaler_bench.sim.policies import KEDA_INFLIGHT, KEDA_INFLIGHT_BEST, REACTIVE_BEST
from gpu_queue_scaler_bench.sim.verdict import Outcome, against, judge

CONV = "AzureLLMInferenceTrace_conv"  # smooth: GPU-hours <= 1.25x the oracle's
CODE = "AzureLLMInferenceTrace_code"  # bursty: <= 1.5x


def outcomes(scaler: Outcome, **others: Outcome) -> dict[str, Outcome]:
    return {
        "scaler": scaler,
        "oracle": others.get("oracle", Outcome(1.0, 32.0)),
        "always-on": others.get("always_on", Outcome(1.0, 38.9)),
        KEDA_INFLIGHT: others.get("keda", Outcome(0.973, 46.9)),
        KEDA_INFLIGHT_BEST: others.get("best", Outcome(0.987, 41.1)),
    }


@pytest.mark.parametrize(
    ("mine", "other", "word"),
    [
        (Outcome(0.99, 10.0), Outcome(0.98, 10.0), "ahead"),  # fewer misses, same cost
        (Outcome(0.99, 9.0), Outcome(0.99, 10.0), "ahead"),  # cheaper, same misses
        (Outcome(0.98, 11.0), Outcome(0.99, 10.0), "behind"),
        (Outcome(0.99, 11.0), Outcome(0.98, 10.0), "mixed"),  # better and dearer
        (Outcome(0.99, 10.0), Outcome(0.99, 10.0), "equal"),
    ],
)
def test_ahead_means_better_on_one_axis_and_no_worse_on_the_other(
    mine: Outcome, other: Outcome, word: str
) -> None:
    assert against(mine, other) == word


def test_the_demo_trace_costlier_than_always_on_is_printed_as_missed() -> None:
    # The demo's figures: on time, but 40.9 GPU-h against a fixed fleet's 38.9 and 1.28x the
    # oracle's on smooth traffic: both goals missed, and said so in capitals.
    v = judge(CONV, outcomes(Outcome(1.0, 40.9)))
    assert v is not None
    assert v.slo_met and v.cost_met is False and not v.cheaper_than_always_on
    text = "\n".join(v.lines(2.0))
    assert "goal <= 1.25 on smooth or diurnal traffic: MISSED" in text
    assert "MORE GPU-hours: MISSED" in text
    assert f"vs {KEDA_INFLIGHT}: ahead" in text and f"vs {KEDA_INFLIGHT_BEST}: ahead" in text
    cheaper = judge(CONV, outcomes(Outcome(1.0, 38.0)))
    assert cheaper is not None and cheaper.cheaper_than_always_on and cheaper.cost_met
    assert "no more GPU-hours: met" in "\n".join(cheaper.lines(2.0))


def test_the_limit_follows_the_kind_of_traffic() -> None:
    scaler = Outcome(0.995, 45.0)  # 1.41x a 32 GPU-h oracle
    bursty, smooth = judge(CODE, outcomes(scaler)), judge(CONV, outcomes(scaler))
    assert bursty is not None and bursty.limit == 1.5 and bursty.cost_met
    assert smooth is not None and smooth.limit == 1.25 and smooth.cost_met is False
    unknown = judge("my-trace", outcomes(scaler))
    assert unknown is not None and unknown.limit is None and unknown.cost_met is None
    assert "no limit for a trace of unknown kind" in "\n".join(unknown.lines(2.0))


def test_the_slo_is_held_only_where_the_oracle_reaches_it() -> None:
    late = Outcome(0.95, 30.0)
    reachable = judge(CODE, outcomes(late))
    assert reachable is not None and not reachable.slo_met
    assert "MISSED" in reachable.lines(2.0)[1]
    unreachable = judge(CODE, outcomes(late, oracle=Outcome(0.98, 25.0)))
    assert unreachable is not None and unreachable.slo_met


def test_no_verdict_without_the_rows_it_compares() -> None:
    assert judge(CONV, {"scaler": Outcome(1.0, 1.0), "oracle": Outcome(1.0, 1.0)}) is None
    v = judge(CONV, {k: Outcome(1.0, 1.0) for k in ("scaler", "oracle", "always-on")})
    assert v is not None and v.keda_verdicts() == ()


def test_a_goal_missed_says_whether_reading_the_present_perfectly_would_meet_it() -> None:
    # The demo's figures at 180 s: the reactive bound (the exact need now, no lag, the best
    # headroom in hindsight) pays 40.6 GPU-h for 1.000, more than the fixed fleet's 38.9 too, so
    # the always-on goal is out of a reactive rule's reach there: the verdict says so, and the
    # goal stays MISSED. On Azure code the bound is on time where the scaler is late.
    demo = judge(CONV, {**outcomes(Outcome(1.0, 40.7)), REACTIVE_BEST: Outcome(1.0, 40.6)})
    assert demo is not None and demo.bound_meets()["always-on"] is False
    always = next(line for line in demo.lines(2.0) if "vs always-on" in line)
    assert "MORE GPU-hours: MISSED; the reactive bound misses it too (1.0000 / 40.60" in always
    assert "reading the present perfectly, held as long, is not enough here" in always
    code = judge(CODE, {**outcomes(Outcome(0.975, 22.2)), REACTIVE_BEST: Outcome(0.995, 31.4)})
    assert code is not None and code.bound_meets()["slo"] is True
    slo = code.lines(2.0)[1]
    assert "MISSED; the reactive bound meets it (0.9950 / 31.40 GPU-h)" in slo
    assert "the gap is in reading the present" in slo
    # A goal met says nothing of the bound; a run without the bound says nothing either.
    met = judge(CODE, {**outcomes(Outcome(0.995, 22.2)), REACTIVE_BEST: Outcome(0.9, 20.0)})
    assert met is not None and "reactive bound" not in "\n".join(met.lines(2.0))
    alone = judge(CONV, outcomes(Outcome(1.0, 40.7)))
    assert alone is not None and alone.bound_meets()["always-on"] is None
    assert "reactive bound" not in "\n".join(alone.lines(2.0))


def test_replay_md_counts_the_goals_the_reactive_bound_misses_too() -> None:
    # bench/replay_md.py writes the verdict table of bench/results/replay.md from the runs' JSON.
    path = Path(__file__).resolve().parents[2] / "bench" / "replay_md.py"
    loaded = importlib.util.spec_from_file_location("replay_md", path)
    assert loaded is not None and loaded.loader is not None
    replay_md = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(replay_md)

    def run(trace: str, **rows: Outcome) -> tuple[Path, int, str, dict[str, Any]]:
        policies = [
            {"name": name, "slo_attainment": o.attainment, "gpu_hours": o.gpu_hours}
            for name, o in rows.items()
        ]
        found = {"cold_start_s": 180, "trace": trace, "scale": 1.0, "policies": policies}
        return Path(f"{trace}.json"), 1, "scaler bench replay", found

    base = {"oracle": Outcome(1.0, 32.0), "always-on": Outcome(1.0, 38.9)}
    table = replay_md._verdict(
        [
            # conv-like: costlier than always-on and over 1.25x, and the bound is too
            run(CONV, scaler=Outcome(1.0, 40.7), **base, **{REACTIVE_BEST: Outcome(1.0, 40.6)}),
            # code-like: late where the bound is on time
            run(CODE, scaler=Outcome(0.97, 22.0), **base, **{REACTIVE_BEST: Outcome(0.995, 31.0)}),
        ]
    )
    conv = next(line for line in table if line.startswith(f"| {CONV}"))
    assert "1.27x missed, bound too" in conv and "costlier (1.000), bound too" in conv
    code = next(line for line in table if line.startswith(f"| {CODE}"))
    assert "0.970 (1.000) missed, bound met" in code
    assert any("Of the 3 goals missed, the reactive bound misses 2 too." in line for line in table)
