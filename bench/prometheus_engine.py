"""The engine's cost with 1,000 workloads on one Prometheus: reads batched against each alone.

Usage: python bench/prometheus_engine.py [--workloads 1000] [--seconds 30] [--prometheus PATH]

`bench/prometheus_reads.py` times the source's reads in waves; this one runs what `scaler serve`
runs: an `Engine` with `--workloads` vLLM workloads (distinct names, `serverAddress` a real
Prometheus: Debian's `prometheus` on 127.0.0.1 with a free port, scraping two pods' worth of real
vLLM /metrics text served here on loopback), each ticking every 5 s on its phase, warm start
included. Two runs in this process, one after the other, each a fresh `Engine` on the same
Prometheus: *batched* (as shipped: workloads that tick together share a request) and *alone*
(`BATCH_MAX_READS` = 1, so every read asks alone, its queries still combined). For each it
prints how long the first decisions took (warm starts), then, over `--seconds` of steady ticks,
the reads that asked Prometheus per second (due: workloads / 5 s), this process's CPU (share of
a core, and per read), Prometheus's CPU (share, per read) and its query requests per read (from
its own `prometheus_http_requests_total`), with the ratios alone / batched. On a 2-core machine
Prometheus and this process compete: a run that saturates them reads less often than due.
Only the Prometheus process started here is stopped, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.trigger import TriggerCache
from gpu_queue_scaler.sources import batching
from gpu_queue_scaler.sources import prometheus as prometheus_source
from prometheus_client.parser import text_string_to_metric_families

from prometheus_reads import PODS, SAMPLES, prometheus_cpu_s, serve_text, start_prometheus

INTERVAL_S = 5.0  # the default evaluationIntervalSeconds and queryIntervalSeconds


READS = [0]  # reads that asked Prometheus (not served from the source's cache)


def counting_reads() -> None:
    """Count the source's reads that ask Prometheus: a saturated run evaluates fewer ticks than
    its workloads are due, so figures are per read done, not per tick due. A read counts when
    its answer is in, as Prometheus counts a request once it has answered it: counted as it
    starts, the reads in flight at the window's end had no request counted yet (0.89 requests
    per read alone, on a machine busy with another job)."""
    ask = prometheus_source.PrometheusSource._read_results

    async def counted(self: Any, *args: Any) -> Any:
        result = await ask(self, *args)
        READS[0] += 1
        return result

    prometheus_source.PrometheusSource._read_results = counted  # type: ignore[method-assign]


def query_requests(url: str) -> float:
    """Prometheus's own count of /api/v1/query requests so far (its /metrics)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "prometheus_http_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels.get("handler") == "/api/v1/query"
    )


async def run(
    url: str, pid: int, workloads: int, seconds: float, settle_s: float
) -> dict[str, float]:
    store = ConfigStore(Config(server=ServerSettings(first_decision_timeout_s=600)))
    engine = Engine(store)
    triggers = TriggerCache()
    specs = [
        triggers.parse("team-a", f"llama-{i}", {"backend": "vllm", "serverAddress": url})
        for i in range(workloads)
    ]
    started = time.perf_counter()
    await asyncio.gather(*(engine.decision(spec) for spec in specs))
    first_s = time.perf_counter() - started

    async def keep_asking() -> None:  # as KEDA does, so no loop goes idle
        while True:
            for spec in specs:
                engine.touch(spec)
            await asyncio.sleep(2.0)

    asking = asyncio.create_task(keep_asking())
    try:
        await asyncio.sleep(settle_s)
        cpu, wall, reads = time.process_time(), time.perf_counter(), READS[0]
        prom, asked = prometheus_cpu_s(pid), await asyncio.to_thread(query_requests, url)
        await asyncio.sleep(seconds)
        wall = time.perf_counter() - wall
        cpu = time.process_time() - cpu
        reads = READS[0] - reads
        prom = prometheus_cpu_s(pid) - prom
        asked = await asyncio.to_thread(query_requests, url) - asked
    finally:
        asking.cancel()
        await engine.close()
    return {
        "first decisions s": first_s,
        "reads/s": reads / wall,
        "CPU % of a core": 100 * cpu / wall,
        "CPU ms/read": 1000 * cpu / max(reads, 1),
        "Prometheus CPU %": 100 * prom / wall,
        "Prom. CPU ms/read": 1000 * prom / max(reads, 1),
        "requests/read": asked / max(reads, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=1000)
    parser.add_argument(
        "--seconds", type=float, default=30.0, help="measured; a multiple of 5 (whole intervals)"
    )
    parser.add_argument(
        "--settle", type=float, default=2 * INTERVAL_S, help="after first decisions, seconds"
    )
    parser.add_argument("--prometheus", default=shutil.which("prometheus"), help="its binary")
    args = parser.parse_args()
    pods = [serve_text((SAMPLES / name).read_bytes()) for name in PODS]
    targets = [f"127.0.0.1:{pod.server_address[1]}" for pod in pods]
    counting_reads()
    shipped = batching.BATCH_MAX_READS
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-prometheus-engine-") as tmp:
        proc, url = start_prometheus(targets, Path(tmp), args.prometheus)
        try:
            for name, batch_max in (("batched", shipped), ("alone", 1)):
                batching.BATCH_MAX_READS = batch_max
                results[name] = asyncio.run(
                    run(url, proc.pid, args.workloads, args.seconds, args.settle)
                )
        finally:
            batching.BATCH_MAX_READS = shipped
            proc.terminate()
            proc.wait(timeout=15)
    for pod in pods:
        pod.shutdown()
    print(
        f"{args.workloads} vLLM workloads through one real Prometheus, ticking every "
        f"{INTERVAL_S:g} s, {args.seconds:g} s measured"
    )
    keys = list(results["batched"])
    print(f"{'':>9}" + "".join(f"{key:>19}" for key in keys))
    for name, row in results.items():
        print(f"{name:>9}" + "".join(f"{row[key]:>19.2f}" for key in keys))
    print(
        f"{'ratio':>9}"
        + "".join(
            f"{results['alone'][key] / max(results['batched'][key], 1e-9):>18.2f}x" for key in keys
        )
        + "   (alone / batched)"
    )


if __name__ == "__main__":
    main()
