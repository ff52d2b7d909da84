"""CPU per tick of the engine's loop machinery: workloads on distinct phases vs in phase slots.

Usage: python bench/loop_wakeups.py [--workloads 1000] [--interval 5] [--seconds 15]

Each workload is a task that does what `Engine._run` does around an evaluation, with a no-op
evaluation: sleep to its next tick on its phased grid, take a `Turnstile` turn, count the tick.
Two runs in this process, one after the other, same workloads and interval:

- *distinct*: every workload on its own phase (a continuous hash), as before PHASE_SLOTS;
- *slotted*: `gpu_queue_scaler.engine.schedule.phase_of` (phases in PHASE_SLOTS steps).

It prints CPU microseconds per tick (process time over the ticks counted) for each, and the
ratio. What it shows: the cost of a tick is mostly the event loop's timed wake-ups, which
slots share among the workloads of a slot.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable

from gpu_queue_scaler.engine.schedule import (
    PHASE_SLOTS,
    PHASE_SPREAD,
    key_fraction,
    next_tick,
    phase_of,
)
from gpu_queue_scaler.engine.turns import Turnstile

Key = tuple[str, str, str]


def distinct_phase(key: Key) -> float:
    """A continuous phase from the same hash: one wake-up instant per workload."""
    return PHASE_SPREAD * key_fraction(key)


async def _ticks(phase: float, interval: float, turns: Turnstile, count: list[int]) -> None:
    last: float | None = None
    while True:
        now = time.time()
        tick = next_tick(now, last, interval, phase)
        if tick > now:
            await asyncio.sleep(max(0.0, tick - time.time()))
        await turns.take()
        count[0] += 1
        last = tick


async def cpu_per_tick(
    phases: Callable[[Key], float], workloads: int, interval: float, seconds: float
) -> tuple[float, int]:
    """CPU microseconds per tick over `seconds` (after one interval to settle), and the ticks."""
    turns, count = Turnstile(), [0]
    keys = [(f"ns-{i % 10}", f"so-{i:05d}", f"metric-{i:05d}") for i in range(workloads)]
    tasks = [asyncio.create_task(_ticks(phases(k), interval, turns, count)) for k in keys]
    try:
        await asyncio.sleep(interval)
        cpu0, ticks0 = time.process_time(), count[0]
        await asyncio.sleep(seconds)
        cpu, ticks = time.process_time() - cpu0, count[0] - ticks0
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return cpu / max(ticks, 1) * 1e6, ticks


async def main(workloads: int, interval: float, seconds: float) -> None:
    distinct, n_distinct = await cpu_per_tick(distinct_phase, workloads, interval, seconds)
    slotted, n_slotted = await cpu_per_tick(phase_of, workloads, interval, seconds)
    print(f"{workloads} workloads, interval {interval:g}s, {seconds:g}s each, no-op evaluations")
    print(f"  distinct phases:        {distinct:7.1f} us CPU per tick ({n_distinct} ticks)")
    print(f"  {PHASE_SLOTS} phase slots:        {slotted:7.1f} us CPU per tick ({n_slotted} ticks)")
    print(f"  slotted / distinct:     {slotted / distinct:7.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args()
    asyncio.run(main(args.workloads, args.interval, args.seconds))
