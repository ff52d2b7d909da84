"""What any reactive policy can reach on a trace: the oracle's exact need, without foresight.

Usage: python bench/reactive_bound.py [--case NAME | --trace FILE [--scale F] [--compress C]
       [--duration S]] [--seed N] [--cold-start S] [--headroom 1.0,1.18,...] [--window 180,300]

`--case` takes one of `bench/run_replay_all.sh`'s cases by file stem or any unique part of it
(`_conv`, `deepseek`), with that script's own --scale, --compress and --duration.

The simulator's goal (>= 99% of requests within the SLO at <= 1.2x the oracle's GPU-hours) asks
how much of the oracle's lead is foresight. This bench answers it with
`gpu_queue_scaler_bench.sim.policies.ReactiveBound`, a policy given everything but the future: the
need the oracle computes for each second (its refined need, as the bench's
`reactive-bound(hindsight)` row reads it), at once and exactly, asked for with `--headroom` and held
for `--window` seconds, nodes packed as the oracle packs them. It runs on the same requests, seed
and warm fleet as the oracle and this scaler (alone and with the Karpenter companion's packing),
in the same process, and prints each one's SLO attainment and GPU-hours as a ratio to the
oracle's. If the bound meets the goal where the scaler does not, the gap is in how the scaler
reads the present; the bound's own distance from the oracle is what knowing the future is worth.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from gpu_queue_scaler_bench.sim.command import ReplayOptions, load_requests, sim_config
from gpu_queue_scaler_bench.sim.policies import ReactiveBound
from gpu_queue_scaler_bench.sim.report import measure
from gpu_queue_scaler_bench.sim.run import COMPANION, PolicyRun, run_bench, simulate

from decision_cases import cases, pick

CONV = "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


def row(run: PolicyRun, oracle_gpu_s: float, slo_s: float) -> str:
    m = measure(run, slo_s)  # the bench's own measures, as `scaler bench replay` prints them
    return (
        f"| {run.name} | {m.slo_attainment:.3f} | {m.gpu_hours:.1f} "
        f"| {run.gpu_seconds / oracle_gpu_s:.2f}x | {run.ready.mean():.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", help="a case of bench/run_replay_all.sh (overrides --trace)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", default=CONV)
    parser.add_argument("--scale", type=float, default=20.0)
    parser.add_argument("--compress", type=float, default=1.0)
    parser.add_argument("--duration", type=float, default=None)
    parser.add_argument("--cold-start", type=float, default=180.0)
    parser.add_argument("--headroom", default="1.0,1.18,1.3,1.45,1.6")
    parser.add_argument("--window", default="180,300")
    args = parser.parse_args()
    if args.case is not None:
        known = cases()
        base = known[pick(args.case, list(known))]
    else:
        base = ReplayOptions(
            trace=args.trace, scale=args.scale, compress=args.compress, duration_s=args.duration
        )
    options = replace(base, seed=args.seed, cold_start_s=args.cold_start, companion=True)
    requests = load_requests(options)
    cfg = replace(sim_config(options), policies=("scaler", "oracle"))
    bench = run_bench(requests, cfg, scale=options.scale)
    runs = {run.name: run for run in bench.runs}
    oracle = runs["oracle"]
    need = bench.oracle_need
    assert need is not None  # run_bench with the oracle sets it
    on_trace = need[: round(requests.duration_s / cfg.dt)]
    print(
        f"{requests.name} x{options.scale:g}, {options.cold_start_s:g} s cold start, "
        f"{requests.count:,} requests; the oracle's need, per second: mean {on_trace.mean():.1f} "
        f"replicas\n"
    )
    print("| policy | SLO (queue wait) | GPU-hours | / oracle | ready replicas (mean) |")
    print("|---|--:|--:|--:|--:|")
    print(row(oracle, oracle.gpu_seconds, cfg.slo_s))
    for name in ("scaler", COMPANION):
        print(row(runs[name], oracle.gpu_seconds, cfg.slo_s))
    alone = replace(cfg, policies=("scaler",), companion=False)
    pre_s = bench.preroll_s
    for window in (float(w) for w in args.window.split(",")):
        for headroom in (float(h) for h in args.headroom.split(",")):
            policy = ReactiveBound(need, cfg.dt, pre_s, headroom, window)
            run = simulate(policy, requests, alone, bench.initial_replicas)
            print(row(run, oracle.gpu_seconds, cfg.slo_s), flush=True)


if __name__ == "__main__":
    main()
