"""Render bench/results/replay.md from the runs `bench/run_replay_all.sh` made.

Usage: python bench/replay_md.py INDEX.tsv NPROC > replay.md, where each line of INDEX.tsv is
`json path<TAB>runtime seconds<TAB>command line` and each JSON is `scaler bench replay --json`.
"""

from __future__ import annotations

import datetime
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpu_queue_scaler_bench.sim.verdict import (
    GOAL_ATTAINMENT,
    KEDA_ROWS,
    LIMIT_BURSTY,
    LIMIT_SMOOTH,
    Outcome,
    Verdict,
    judge,
)

POLICIES = (
    "always-on",
    "hpa-gpu-util",
    "keda-prometheus",
    "keda-inflight-70%",
    "keda-inflight-best(hindsight)",
    "scaler",
    "scaler+companion",
    "scaler+prewarm",
    "reactive-bound(hindsight)",
    "oracle",
)


def _reach(v: Verdict, goal: str) -> str:
    """What the reactive bound says of a goal the scaler missed (`Verdict.bound_meets`)."""
    reach = v.bound_meets()[goal]
    return "" if reach is None else ", bound " + ("met" if reach else "too")


def _verdict(runs: list[tuple[Path, int, str, dict[str, Any]]], row: str = "scaler") -> list[str]:
    """Per trace at 180 s cold start: the default scaler row against each goal
    (`gpu_queue_scaler_bench.sim.verdict`, which the replay's own table prints too)."""
    out = [
        f"## Verdict: the default `{row}` row against the goals (cold start 180 s)",
        "",
        "Computed from the runs below. **SLO**: its attainment, goal >= "
        f"{GOAL_ATTAINMENT:g} wherever the oracle reaches it; **GPU-h / oracle**: goal <= "
        f"{LIMIT_SMOOTH:g} on smooth and diurnal traces, <= {LIMIT_BURSTY:g} on bursty ones "
        "(Azure code, deepseek-r1); **always-on**: never more GPU-h at equal attainment; "
        "**KEDA**: ahead = fewer misses at no more GPU-h, or fewer GPU-h at no more misses; "
        "behind = the KEDA row is ahead of it; mixed = neither. Beside a goal missed, whether "
        "the reactive bound (hindsight) meets it: **bound met**, the gap is in how the scaler "
        "reads the present; **bound too**, reading the present perfectly and holding it as "
        "long is not enough on that trace: the way to the goal is foresight or a different hold.",
        "",
        "| trace | SLO (oracle) | GPU-h / oracle | vs always-on | "
        + " | ".join(f"vs {name}" for name in KEDA_ROWS)
        + " |",
        "|---|---|---|---|" + "---|" * len(KEDA_ROWS),
    ]
    met = {"slo": 0, "cost": 0, "always": 0, "keda": 0}
    counted = {"slo": 0, "cost": 0, "always": 0, "keda": 0}
    missed, bound_too = 0, 0
    for _, _, _, found in runs:
        if found["cold_start_s"] != 180:
            continue
        outcomes = {
            p["name"]: Outcome(p["slo_attainment"], p["gpu_hours"]) for p in found["policies"]
        }
        v = judge(found["trace"], outcomes, row)
        if v is None:
            continue
        counted["slo"] += 1
        met["slo"] += v.slo_met
        slo = (
            f"{v.scaler.attainment:.3f} ({v.oracle.attainment:.3f}) "
            f"{'met' if v.slo_met else 'missed' + _reach(v, 'slo')}"
        )
        if v.cost_met is None:
            cost = f"{v.ratio:.2f}x (no goal)"
        else:
            counted["cost"] += 1
            met["cost"] += v.cost_met
            word = "met" if v.cost_met else "missed" + _reach(v, "cost")
            cost = f"{v.ratio:.2f}x {word} (<= {v.limit:g})"
        counted["always"] += 1
        met["always"] += v.cheaper_than_always_on
        always = (
            f"{v.scaler.gpu_hours:.1f} vs {v.always_on.gpu_hours:.1f} GPU-h, "
            f"{'cheaper' if v.cheaper_than_always_on else 'costlier'} "
            f"({v.always_on.attainment:.3f})"
        )
        if not v.cheaper_than_always_on:
            always += _reach(v, "always-on")
        missed += len(v.missed())
        bound_too += sum(v.bound_meets()[goal] is False for goal in v.missed())
        keda = {name: "—" for name in KEDA_ROWS}
        for name, word, other in v.keda_verdicts():
            counted["keda"] += 1
            met["keda"] += word == "ahead"
            keda[name] = f"{word} ({other.attainment:.3f} / {other.gpu_hours:.1f} GPU-h)"
        label = f"{v.trace} x{found['scale']:g}"
        out.append(f"| {label} | {slo} | {cost} | {always} | " + " | ".join(keda.values()) + " |")
    out += [
        "",
        f"Met: SLO on {met['slo']} of {counted['slo']} traces; GPU-hours limit on "
        f"{met['cost']} of {counted['cost']}; no costlier than always-on on {met['always']} of "
        f"{counted['always']}; ahead of a KEDA row in {met['keda']} of {counted['keda']} "
        f"comparisons. Of the {missed} goals missed, the reactive bound misses {bound_too} too.",
        "",
    ]
    return out


def _num(value: Any, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _node(found: dict[str, Any]) -> str:
    """The node type when it is not the 8-GPU default."""
    return f" ({found['node']})" if found.get("gpus_per_node", 8) != 8 else ""


def _revision() -> str:
    """The commit the runs used, and whether the simulator or the scaler had local changes."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "gpu_queue_scaler", "gpu_queue_scaler_bench"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown revision"
    return f"commit {head}" + (" with local changes in the packages" if dirty else "")


def main(index: str, nproc: str) -> None:
    runs: list[tuple[Path, int, str, dict[str, Any]]] = []
    for line in Path(index).read_text().splitlines():
        name, wall, command_line = line.split("\t", 2)
        runs.append((Path(name), int(wall), command_line, json.loads(Path(name).read_text())))
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    ran = {p["name"] for *_, found in runs for p in found["policies"]}
    policies = [name for name in POLICIES if name in ran]
    out = [
        "# Replay bench: the autoscaling policies on every trace",
        "",
        f"Generated by `bench/run_replay_all.sh` ({today}, {nproc} CPUs, {_revision()}); every "
        "command line is "
        "under its table (add `--json` for the JSON next to this file in `replay/`).",
        "Simulator: `gpu_queue_scaler_bench/sim/` (see docs/bench.md, *Trace-driven cluster "
        "simulator*): a vLLM "
        "fleet (Llama-3-8B on A100 40GB, p4d.24xlarge nodes of 8 GPUs; idle-bursts on one L4 "
        "per g6.xlarge node), cold start = node launch "
        "+ 60 s model load, SLO 2 s on queue wait (TTFT shown too), seed 0, warm start; Karpenter "
        "`consolidationPolicy: WhenEmptyOrUnderutilized` (its default: part-empty nodes are "
        "repacked by evicting their pods, which restart elsewhere; **evicted** counts them), "
        "terminationGracePeriodSeconds 180 s (a deleted pod drains, then what is left is "
        "dropped). The oracle must reach 0.999 with nothing dropped or the run fails. "
        "**keda-prometheus** is the documented pitfall (waiting requests only, min 0); "
        "**keda-inflight-70%** is KEDA's Prometheus scaler on running + waiting (AverageValue, "
        "min 1, HPA defaults) at 70% of a replica's slots, **keda-inflight-best(hindsight)** the "
        "best threshold of 50-100% chosen after the runs (named under each table); "
        "**reactive-bound(hindsight)** is a bound, not a policy one can run: the oracle's exact "
        "need now (no lag, no noise) x the best headroom of x1.0-x1.5 in hindsight, held for the "
        "scaler's scale-down window, so where it misses a goal only foresight meets it. "
        "**SLO wait**: share of all requests (dropped ones count as misses) admitted within 2 s; "
        "**GPU-h**: live nodes x GPUs per node over the trace's span, cold starts and idle GPUs "
        "included; **peak**: most replicas. Each --scale superimposes that many copies of the "
        "trace (seeded offsets) so the peak needs 16+ GPUs (**always-on** is the fewest replicas "
        "a fixed fleet meets 0.99 with, tried at the oracle's peak and in whole nodes below it, "
        "named under each table). ServeGen files are rates per 600 s window: replayed 24x "
        "compressed (a day in an hour, each window 25 s) with Gamma inter-arrivals of the "
        "window's CV; the 14-day language files are cut to their first two days. Traces and "
        "licenses: `bench/traces/README.md`.",
        "",
        *_verdict(runs),
        "## Summary: SLO attainment (queue wait) / GPU-hours",
        "",
        "| trace | cold start | requests | " + " | ".join(policies) + " |",
        "|---|--:|--:|" + "--:|" * len(policies),
    ]
    for _, _, _, found in runs:
        by_name = {p["name"]: p for p in found["policies"]}
        cells = []
        for name in policies:
            p = by_name.get(name)
            cells.append("—" if p is None else f"{p['slo_attainment']:.3f} / {p['gpu_hours']:.1f}")
        out.append(
            f"| {found['trace']} x{found['scale']:g}{_node(found)} | {found['cold_start_s']:g} s | "
            f"{found['requests']:,} | " + " | ".join(cells) + " |"
        )
    for path, seconds, command, found in runs:
        out += [
            "",
            f"## {found['trace']}, cold start {found['cold_start_s']:g} s",
            "",
            f"{found['requests']:,} requests over {found['duration_s'] / 60:.0f} min (scale "
            f"{found['scale']:g}); replica slots {found['replica_slots']}, scaler "
            f"targetConcurrency {found['target_concurrency']:g}, warm start "
            f"{found['initial_replicas']} replicas, always-on {found['always_on_replicas']}.",
            "",
            "| policy | SLO wait | SLO ttft | p50 wait s | p99 wait s | p99 ttft s | GPU-h | "
            "node-h | USD | dropped | events | evicted | peak | start p50/p99 s |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
        ]
        for p in found["policies"]:
            out.append(
                f"| {p['name']} | {p['slo_attainment']:.4f} | {p['ttft_attainment']:.4f} | "
                f"{_num(p['p50_queue_wait_s'], '.2f')} | {_num(p['p99_queue_wait_s'], '.2f')} | "
                f"{_num(p['p99_ttft_s'], '.2f')} | {p['gpu_hours']:.2f} | "
                f"{_num(p.get('node_hours'), '.2f')} | {p['cost_usd']:.0f} | "
                f"{p['dropped']} | {p['scale_events']} | {p.get('evictions', 0)} | "
                f"{p['peak_replicas']} | "
                f"{_num(p.get('replica_start_p50_s'), '.0f')}/"
                f"{_num(p.get('replica_start_p99_s'), '.0f')} |"
            )
        out += [""] + [f"- check: {note}" for note in found["checks"] + found["notes"]]
        plots = path.with_suffix("")
        out += [
            f"- command: `{command.strip()}`",
            f"- runtime: {seconds} s wall; plots: [`{plots.name}/fleet.png`](replay/{plots.name}"
            f"/fleet.png), [`{plots.name}/queue_wait.png`](replay/{plots.name}/queue_wait.png)",
        ]
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
