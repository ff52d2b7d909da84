"""CPU of a warm start's replay: `decide` with and without its detail, and the cost of its values.

Usage: python bench/decide_cpu.py [--workloads 200] [--repeats 5]

A new workload's first answer waits for its warm start: the policy's memory
(`policy.policy_memory_s`, one tick per evaluation interval) read from history and replayed
through `decide`, so that a replica that just started answers as one that ran all along. That
is CPU on the event loop that serves the RPCs, so on a restart of 1,000 ScaledObjects it is what
the first calls wait on (`scaler bench load`, "first per object"). In this process, on the
`scaler bench load` workloads (synthetic sources, no I/O), best of `--repeats`:

- *history*: the synthetic source's history read (a stand-in for Prometheus's range queries);
- *replay, detail*: `Decider.tick` tick by tick as a live tick runs it (explain=True);
- *replay, quiet*: `Decider.replay`, as the engine replays (explain=False: the same decisions,
  no detail text);
- *season history* and *recall*: once a workload's first answer is out, the hours its season
  lacks (`Decider.missing`), read on a minute's grid (`engine.schedule.recall_segment`) and
  recalled into it (`Decider.recall`: array operations and one period search, no decisions);
- *value*: one `Decision` built as the NamedTuple it is, against the same fields as a frozen
  dataclass (what it was before).

It prints ms per warm start and us per value, and the ratios quiet / detail, recall / replay and
NamedTuple / frozen dataclass.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import time
from collections.abc import Callable

from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.engine.schedule import history_segments, recall_segment, tick_at_or_before
from gpu_queue_scaler.engine.warm_start import read_history
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import TriggerCache
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources.synthetic import SyntheticSource
from gpu_queue_scaler_bench.load.polls import trigger_metadata

INTERVAL_S = 5.0
STALE_S = 600.0
VALUES = 20_000  # values built per timing of one construction


def best(repeats: int, run: Callable[[], object]) -> float:
    """The fastest of `repeats` timed runs, in seconds (the least disturbed by the machine)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def replay(histories: list[tuple[WorkloadSpec, list[Signal]]], explain: bool) -> None:
    """Every history through a new workload's `Decider`: live ticks (explain) or its replay."""
    for spec, history in histories:
        decider = Decider(spec, stale_s=STALE_S)
        if explain:
            with decider.replaying():  # as `replay` does, the detail apart
                for signal in history:
                    decider.tick(signal, signal.at)
        else:
            decider.replay(history)
        decider.release()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    triggers = TriggerCache()
    specs = [
        resolve(triggers.parse(f"bench-{i % 10}", f"so-{i:05d}", trigger_metadata(i)), Config())
        for i in range(args.workloads)
    ]
    source = SyntheticSource()
    end = tick_at_or_before(time.time(), INTERVAL_S, 0.0)

    async def read_all() -> list[tuple[WorkloadSpec, list[Signal]]]:
        return [
            (spec, await read_history(source, spec, history_segments(spec, end, INTERVAL_S)))
            for spec in specs
        ]

    histories = asyncio.run(read_all())
    ticks = sum(len(history) for _, history in histories)
    read_s = best(args.repeats, lambda: asyncio.run(read_all()))
    loud_s = best(args.repeats, lambda: replay(histories, explain=True))
    quiet_s = best(args.repeats, lambda: replay(histories, explain=False))

    def replayed() -> list[Decider]:
        deciders = []
        for spec, history in histories:
            decider = Decider(spec, stale_s=STALE_S)
            decider.replay(history)
            deciders.append(decider)
        return deciders

    async def read_missing(deciders: list[Decider]) -> list[list[Signal]]:
        out = []
        for decider in deciders:
            segment = recall_segment(decider.missing(), INTERVAL_S)
            assert segment is not None  # a replayed season lacks its older hours
            out.append(await source.history(decider.spec, segment.start, segment.end, segment.step))
        return out

    fed = replayed()  # what the reads need of them (`missing`) does not change as they read
    older = asyncio.run(read_missing(fed))
    older_s = best(args.repeats, lambda: asyncio.run(read_missing(fed)))

    def recall_all() -> float:  # the recall alone, on freshly replayed deciders
        deciders = replayed()
        start = time.perf_counter()
        for decider, signals in zip(deciders, older, strict=True):
            decider.recall(signals)
        return time.perf_counter() - start

    recall_s = min(recall_all() for _ in range(args.repeats))

    frozen = dataclasses.make_dataclass(
        "FrozenDecision", [(name, object) for name in Decision._fields], frozen=True
    )
    spec, history = histories[0]
    sample = Decider(spec, stale_s=STALE_S).tick(history[-1], history[-1].at)
    assert sample is not None
    fields = sample._asdict()  # a real decision's values, built both ways below
    named_s = best(args.repeats, lambda: [Decision(**fields) for _ in range(VALUES)])
    frozen_s = best(args.repeats, lambda: [frozen(**fields) for _ in range(VALUES)])

    per_start = 1000.0 / len(histories)  # s in all -> ms per warm start
    print(f"{len(histories)} warm starts, {ticks // len(histories)} ticks, best of {args.repeats}")
    for name, took in (("history (synthetic)", read_s), ("replay, detail", loud_s)):
        print(f"  {name:<28} {took * per_start:7.3f} ms per warm start")
    print(f"  {'replay, quiet':<28} {quiet_s * per_start:7.3f} ms per warm start")
    print(f"  {'ratio quiet / detail':<28} {quiet_s / loud_s:7.3f}")
    points = sum(len(signals) for signals in older) // len(older)
    read = f"{older_s * per_start:7.3f} ms per warm start ({points} points)"
    print(f"  {'season history (synthetic)':<28} {read}")
    print(f"  {'recall':<28} {recall_s * per_start:7.3f} ms per warm start")
    print(f"  {'ratio recall / replay, quiet':<28} {recall_s / quiet_s:7.3f}")
    print(f"  {'Decision, NamedTuple':<28} {named_s / VALUES * 1e6:7.3f} us")
    print(f"  {'Decision, frozen dataclass':<28} {frozen_s / VALUES * 1e6:7.3f} us")
    print(f"  {'ratio NamedTuple / frozen':<28} {named_s / frozen_s:7.3f}")


if __name__ == "__main__":
    main()
