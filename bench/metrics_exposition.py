"""The cost of the scaler's own /metrics with many workloads: series, bytes and CPU per scrape.

Usage: python bench/metrics_exposition.py [--workloads 1000] [--repeat 5]

`scaler serve` exports every tracked workload's latest decision and signals as labelled gauges
(`gpu_queue_scaler.telemetry.DecisionCollector`), rendered by prometheus_client when Prometheus
scrapes /metrics (from the HTTP server's own thread, holding the GIL while it renders). This starts
an `Engine` with `--workloads` synthetic workloads (the `scaler bench load` triggers, no I/O),
waits for their first decisions, and prints the series and bytes of one scrape, and the CPU of
collecting the families and of rendering the whole text, each averaged over `--repeat` scrapes.
"""

from __future__ import annotations

import argparse
import asyncio
import time

from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.trigger import TriggerCache
from gpu_queue_scaler.telemetry import DecisionCollector
from gpu_queue_scaler_bench.load.polls import trigger_metadata
from prometheus_client import CollectorRegistry, generate_latest


async def measure(workloads: int, repeat: int) -> tuple[int, int, float, float]:
    """(series, bytes, collect ms, render ms) of one scrape."""
    engine = Engine(ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=120))))
    triggers = TriggerCache()
    specs = [
        triggers.parse(f"bench-{i % 10}", f"so-{i:05d}", trigger_metadata(i))
        for i in range(workloads)
    ]
    try:
        await asyncio.gather(*(engine.decision(spec) for spec in specs))
        collector = DecisionCollector(engine.decisions)
        registry = CollectorRegistry()
        registry.register(collector)
        start = time.process_time()
        for _ in range(repeat):
            families = list(collector.collect())
        collect_ms = 1000 * (time.process_time() - start) / repeat
        start = time.process_time()
        for _ in range(repeat):
            body = generate_latest(registry)
        render_ms = 1000 * (time.process_time() - start) / repeat
        series = sum(len(family.samples) for family in families)
        return series, len(body), collect_ms, render_ms
    finally:
        await engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    series, size, collect_ms, render_ms = asyncio.run(measure(args.workloads, args.repeat))
    print(
        f"{args.workloads} workloads: {series} series ({series / args.workloads:.1f} each), "
        f"{size / 1e6:.2f} MB per scrape"
    )
    print(
        f"CPU per scrape: {collect_ms:.1f} ms collecting, {render_ms:.1f} ms for the whole text "
        f"({1000 * render_ms / series:.1f} us a series)"
    )


if __name__ == "__main__":
    main()
