"""First decisions after a burst of new workloads: warm starts in arrival order vs all at once.

Usage: python bench/warm_start_burst.py [--workloads 1000] [--timeout 2]

When this replica restarts, or KEDA's operator does (it asks about every ScaledObject as it
reconciles them), many workloads are new at once, and each one's first decision waits for its
warm start (its history replayed through the policy, ~6 ms of CPU here). Two runs in this
process, one after the other, each a fresh `Engine` with the same `scaler bench load` workloads
(synthetic sources, no I/O), all touched at the same instant:

- *at once*: every warm start replays at the same time (the engine before WARM_STARTS_AT_ONCE),
  sharing the CPU in 1 ms slices;
- *in order*: `gpu_queue_scaler.engine.warm_start.WARM_STARTS_AT_ONCE` replay at a time, the rest
  wait in arrival order.

It prints, for each, how many first decisions came within `--timeout` (the default of
firstDecisionTimeoutSeconds: after it a caller gets UNAVAILABLE), the p50 and p99 time to a
first decision and when the last came, and the ratios in order / at once.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.engine.warm_start import WARM_STARTS_AT_ONCE
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.trigger import TriggerCache
from gpu_queue_scaler_bench.load import quantile
from gpu_queue_scaler_bench.load.polls import trigger_metadata

WAIT_S = 60.0  # the runs' own first-decision timeout: long enough to see every one finish


async def burst(workloads: int, at_once: int) -> list[float]:
    """Seconds from the burst to each workload's first decision, with `at_once` warm starts
    admitted together."""
    store = ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=WAIT_S)))
    engine = Engine(store, warm_starts_at_once=at_once)
    triggers = TriggerCache()
    specs = [
        triggers.parse(f"bench-{i % 10}", f"so-{i:05d}", trigger_metadata(i))
        for i in range(workloads)
    ]
    start = time.perf_counter()

    async def first(index: int) -> float:
        await engine.decision(specs[index])
        return time.perf_counter() - start

    try:
        return list(await asyncio.gather(*(first(i) for i in range(workloads))))
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--timeout", type=float, default=2.0, help="firstDecisionTimeoutSeconds")
    args = parser.parse_args()
    runs = {
        "at once": asyncio.run(burst(args.workloads, args.workloads)),
        "in order": asyncio.run(burst(args.workloads, WARM_STARTS_AT_ONCE)),
    }
    print(
        f"{args.workloads} new workloads at once; warm starts in order: "
        f"{WARM_STARTS_AT_ONCE} at a time"
    )
    print(
        f"{'':>10} {'within ' + format(args.timeout, 'g') + ' s':>12} {'p50 s':>8} "
        f"{'p99 s':>8} {'last s':>8}"
    )
    rows = {}
    for name, times in runs.items():
        within = sum(t <= args.timeout for t in times)
        rows[name] = (within, quantile(times, 0.5), quantile(times, 0.99), max(times))
        print(
            f"{name:>10} {within:>12} {rows[name][1]:>8.2f} {rows[name][2]:>8.2f} "
            f"{rows[name][3]:>8.2f}"
        )
    new, old = rows["in order"], rows["at once"]
    print(
        f"in order / at once: p50 {new[1] / old[1]:.3f}, p99 {new[2] / old[2]:.3f}, "
        f"last {new[3] / old[3]:.3f}; first decisions within {args.timeout:g} s: "
        f"{new[0]} against {old[0]}"
    )


if __name__ == "__main__":
    main()
