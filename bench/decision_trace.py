"""The default scaler's decisions on one replay case, minute by minute, beside the oracle's fleet.

Usage: python bench/decision_trace.py CASE [--seed 0] [--cold-start 180]
       [--ticks FROM-TO] [--metadata KEY=VALUE ...]

`bench/decision_cases.py` says how each case ends (attainment, GPU-hours); this says where it
got there: per minute of the trace, the scaler's ready replicas and nodes, the range of its need
and target, the oracle's ready replicas and exact need (its refined need, the most replicas any
second of the minute asks for), the scaler's requests that waited past the SLO by the minute
they arrived, and which rule set the target how often. `--ticks 1340-1400` also prints every
evaluation in that span of trace seconds: the signal it read (ready, running, waiting, arrival
rate, KV usage, S) and the decision's own explanation. Cases are `bench/run_replay_all.sh`'s, by
file stem or any unique part of it (`_conv`, `deepseek`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import sys

import numpy as np
from gpu_queue_scaler.cli.options import parse_metadata
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler_bench.sim.command import load_requests, sim_config
from gpu_queue_scaler_bench.sim.policies import ScalerPolicy
from gpu_queue_scaler_bench.sim.run import BenchResult, PolicyRun, run_bench, simulate

from decision_cases import cases, pick


def span(text: str) -> tuple[float, float]:
    lo, sep, hi = text.partition("-")
    if not sep:
        raise argparse.ArgumentTypeError(f"--ticks takes FROM-TO in trace seconds, not {text!r}")
    try:
        return float(lo), float(hi)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"--ticks: {err}") from None


def minutes(
    result: BenchResult, oracle: PolicyRun, scaler: PolicyRun, decisions: list[Decision]
) -> list[str]:
    """One line per minute of the trace (see the module docstring)."""
    dt, slo_s = result.dt, result.config.slo_s
    late = (scaler.admit_t - scaler.arrivals_s > slo_s) | scaler.dropped
    late_by_minute = collections.Counter((scaler.arrivals_s[late] // 60).astype(int).tolist())
    exact = result.oracle_need if result.oracle_need is not None else np.zeros(0, np.int64)
    by_minute: dict[int, list[Decision]] = collections.defaultdict(list)
    for d in decisions:
        if d.at >= 0:
            by_minute[int(d.at // 60)].append(d)
    lines = [
        "| min | ready | nodes | need | target | oracle ready | exact need | late | set by |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for minute in sorted(by_minute):
        ticks = by_minute[minute]
        k0, k1 = int(minute * 60 / dt), int((minute + 1) * 60 / dt)
        ready, nodes, held = scaler.ready[k0:k1], scaler.nodes[k0:k1], oracle.ready[k0:k1]
        if ready.size == 0:
            continue
        needs = [d.need for d in ticks if d.need is not None]
        need = f"{min(needs):.1f}-{max(needs):.1f}" if needs else "-"
        targets = [d.replicas for d in ticks]
        reasons = collections.Counter(str(d.reason) for d in ticks)
        set_by = ", ".join(f"{r} {n}" for r, n in reasons.most_common())
        ahead = exact[k0:k1]
        lines.append(
            f"| {minute} | {ready.min()}-{ready.max()} | {nodes.max()} | {need} "
            f"| {min(targets)}-{max(targets)} | {held.max() if held.size else '-'} "
            f"| {ahead.max() if ahead.size else '-'} | {late_by_minute.get(minute, 0)} | {set_by} |"
        )
    return lines


def ticks(decisions: list[Decision], lo: float, hi: float) -> list[str]:
    """Every evaluation within [lo, hi]: its signal and its explanation."""

    def num(x: float | int | None, fmt: str = ".1f") -> str:
        return "-" if x is None else format(x, fmt)

    lines = []
    for d in decisions:
        if not lo <= d.at <= hi:
            continue
        s = d.signal
        read = "no signal"
        if s is not None:
            read = (
                f"ready {num(s.ready_pods, 'd')} running {num(s.running, '.0f')} "
                f"waiting {num(s.waiting, '.0f')} arrivals {num(s.arrival_rate)}/s "
                f"KV {num(s.kv_cache_usage, '.3f')} S {num(s.service_time_s)}s"
            )
        lines.append(f"t={d.at:.0f}s target {d.replicas} ({d.reason}); {read}")
        lines.append(f"    {d.detail}")
    return lines


def main() -> None:
    known = cases()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", help=f"of: {', '.join(known)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cold-start", type=float, default=180.0)
    parser.add_argument("--ticks", type=span, help="FROM-TO: every evaluation in that span (s)")
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    meta = parse_metadata(args.metadata)
    if meta is None:
        sys.exit(2)
    name = pick(args.case, list(known))
    options = dataclasses.replace(known[name], seed=args.seed, cold_start_s=args.cold_start)
    if meta:
        options = dataclasses.replace(options, metadata=meta)
    requests = load_requests(options)
    cfg = dataclasses.replace(sim_config(options), policies=("oracle",))
    result = run_bench(requests, cfg, options.scale)
    policy = ScalerPolicy(result.scaler_metadata)
    scaler = simulate(policy, requests, cfg, result.initial_replicas)
    oracle = result.runs[0]
    print(f"{name}, seed {args.seed}, cold start {args.cold_start:g} s, metadata {meta or 'none'}")
    print("\n".join(minutes(result, oracle, scaler, policy.decisions)))
    if args.ticks:
        print()
        print("\n".join(ticks(policy.decisions, *args.ticks)))


if __name__ == "__main__":
    main()
