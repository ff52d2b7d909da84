"""How far each case's demand outruns what the scaler's scale-down window holds, within a horizon.

Usage: python bench/growth_ratio.py [--seed 0] [--cold-start 180] [--cases conv,code,...]
       [--jobs 2]

A replica asked now serves a horizon (coldStartSeconds + pollingIntervalSeconds) from now, and the
scaler holds the highest need of its scale-down window; so what a workload needs as headroom is
how often, and by how much, the highest need within the coming horizon exceeds what the window
holds now: R(t) = max(need over (t, t + horizon]) / max(need over (t - window, t]). This prints
its quantiles per case (weighted by the future need: a shortfall at a high load delays more
requests), from t = 0 on (the pre-roll only fills the window), for three series:

- `exact`: the oracle's refined need per second (what the traffic asks, known in hindsight);
- `tokens`: the scaler's `tokens` term per tick (the servers' token counters over the token
  capacities the bench configures), which no fleet-size effect moves while nothing waits;
- `demand`: the need the scaler sized from per tick, before its headroom (every term, the
  `queue` and `kv_cache` ones included, which a short or KV-bound fleet raises).

The cases are `bench/run_replay_all.sh`'s (read by `decision_cases.cases`). Where the `demand`
quantiles sit above the `exact` ones, the estimate, not the traffic, is what asks for headroom.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
from gpu_queue_scaler.decision import capacity
from gpu_queue_scaler_bench.sim.command import ReplayOptions, load_requests, sim_config
from gpu_queue_scaler_bench.sim.policies import ScalerPolicy
from gpu_queue_scaler_bench.sim.run import run_bench, simulate
from numpy.lib.stride_tricks import sliding_window_view
from numpy.typing import NDArray

from decision_cases import case_parser, cases, chosen, run_all

QUANTILES = (0.5, 0.8, 0.9, 0.95)
SERIES = ("exact", "tokens", "demand")


def outrun(
    x: NDArray[np.float64], step_s: float, window_s: float, horizon_s: float, first: int
) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(R, weight) for every index i >= first with a whole window behind it and a whole horizon
    ahead (see the module docstring); indices whose window holds under half a replica are left
    out (an idle workload outruns nothing it holds)."""
    w = max(1, round(window_s / step_s))
    h = max(1, round(horizon_s / step_s))
    held = sliding_window_view(x, w).max(axis=1)  # held[j] = max x[j .. j + w - 1]
    ahead = sliding_window_view(x, h).max(axis=1)  # ahead[j] = max x[j .. j + h - 1]
    i = np.arange(max(first, w - 1), x.size - h)
    past, future = held[i - w + 1], ahead[i + 1]
    kept = past >= 0.5
    return future[kept] / past[kept], future[kept]


def weighted_quantiles(r: NDArray[np.float64], weight: NDArray[np.float64]) -> list[float]:
    if r.size == 0:
        return [float("nan")] * len(QUANTILES)
    order = np.argsort(r)
    cumulative = np.cumsum(weight[order]) / weight.sum()
    picks = np.minimum(np.searchsorted(cumulative, QUANTILES), r.size - 1)
    return [float(r[order][k]) for k in picks]


def run_case(name: str, options: ReplayOptions) -> tuple[str, dict[str, list[float]], float]:
    started = time.monotonic()
    requests = load_requests(options)
    cfg = dataclasses.replace(sim_config(options), policies=("oracle",))
    result = run_bench(requests, cfg, options.scale)
    assert result.oracle_need is not None
    policy = ScalerPolicy(result.scaler_metadata)
    simulate(policy, requests, cfg, result.initial_replicas)
    spec = policy.spec
    window, horizon = spec.scale_down_stabilization_s, spec.horizon_s
    ticks = [d for d in policy.decisions if d.signal is not None and d.need is not None]
    at = np.array([d.at for d in ticks])
    step = float(np.median(np.diff(at)))
    first = int(np.searchsorted(at, 0.0))
    tokens = [capacity.token_work(d.signal, spec.capacity) for d in ticks if d.signal]
    series = {
        "exact": (np.asarray(result.oracle_need, dtype=np.float64), result.dt, 0),
        # A tick before the token rates are known reads 0: it only lowers a window's max.
        "tokens": (np.array([t or 0.0 for t in tokens]), step, first),
        "demand": (np.array([d.demand or 0.0 for d in ticks]), step, first),
    }
    out = {}
    for key, (x, dt, start) in series.items():
        r, weight = outrun(x, dt, window, horizon, start)
        out[key] = [*weighted_quantiles(r, weight), float(r.max()) if r.size else float("nan")]
    return name, out, time.monotonic() - started


def main() -> None:
    known = cases()
    parser = case_parser(__doc__.splitlines()[0], known)
    args = parser.parse_args()
    results = run_all(run_case, chosen(parser, args, known), args.jobs)
    heads = " | ".join(f"q{round(q * 100)}" for q in QUANTILES)
    print(f"seed {args.seed}, cold start {args.cold_start:g} s; R = highest need within the")
    print("horizon / highest need the scale-down window holds, weighted by the future need")
    print(f"| case | series | {heads} | max | wall s |")
    print("|---|---|" + "--:|" * (len(QUANTILES) + 2))
    for name, out, wall in results:
        for key in SERIES:
            cells = " | ".join(f"{v:.3f}" for v in out[key])
            print(f"| {name} | {key} | {cells} | {wall:.0f} |")


if __name__ == "__main__":
    main()
