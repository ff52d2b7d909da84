"""RSS and threads of one scaler server under hostile trigger metadata.

Usage: python bench/hostile_rss.py [--maps 10000] [--polls 20000] [--seed 0]

One real server (gRPC on loopback, the shipped defaults) in this process. A KEDA-like client
first sends `--maps` fuzzed metadata maps, each for a ScaledObject of its own (GetMetricSpec,
GetMetrics, IsActive): most rejected, many valid, each valid Prometheus one with a
`serverAddress` of its own and each direct-scrape one scraping its own target, all on loopback
at ports that refuse connections. Then it polls one rejected ScaledObject (`targetConcurrency:
"-1"`) `--polls` times, IsActive and GetMetrics alternated, and as often one that names an
unknown profile. It prints the process's RSS and OS threads (gRPC's own included) at start,
after the maps and after each run of polls, each also as a ratio against the figure at start,
and the workloads the engine holds. The goal: flat (what the maps leave is bounded by the
engine's bounds, not growing with their count; under 300 MB) and the polls add nothing (under
16 MB).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import random
import socket
import string
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler.serve.server import ScalerServer
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.fields import BY_KEY, TRIGGER_KEYS, Range
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler_bench.emulators.keda import KedaLikeClient, scaled_object

AT_ONCE = 16  # calls in flight


def process_status() -> tuple[float, int]:
    """This process's resident set (MB) and OS threads (gRPC's own included), from /proc."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def refusing_port() -> socket.socket:
    """A loopback port bound but not listening: every connection to it is refused at once."""
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    return held


def fuzzed_value(rng: random.Random, key: str, index: int, port: int) -> str:
    """A value for `key`: often valid, often not, sometimes long."""
    roll = rng.random()
    if roll < 0.1:
        return rng.choice('x9ü(":,=') * rng.randint(81, 5000)
    if roll < 0.2:
        return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40)))
    parse = BY_KEY[key].parse if key in BY_KEY else None
    if isinstance(parse, Range):
        lo, hi = parse.lo, min(parse.hi, 1e6)
        value = rng.uniform(lo - 1, hi + 1) if rng.random() < 0.2 else rng.uniform(lo, hi)
        return str(round(value)) if parse.integer else repr(value)
    valid = {
        "serverAddress": f"http://127.0.0.1:{port}/prometheus-{index}",
        "scrapeTargets": f"127.0.0.1:{port}",
        "model": f"model-{index}",
        "labelSelector": f'pod=~"serve-{index}.*"',
        "profile": "no-such-profile",
        "metricName": f"queue-{index}",
        "metricsPath": "/metrics",
        "signalSource": rng.choice(("auto", "prometheus", "scrape")),
        "namespaceLabel": rng.choice(("namespace", "none")),
        "forecast": rng.choice(("on", "off")),
        "syntheticPattern": rng.choice(("constant", "wave", "zero")),
        "waitingQuery": "sum(queue{$selector})",
    }
    return valid.get(key, "")


# Keys the generator leaves out: `service` would list EndpointSlices from a Kubernetes API.
KEYS = tuple(k for k in TRIGGER_KEYS if k not in ("service", "scalerAddress"))


def fuzzed_maps(count: int, seed: int, port: int) -> Iterator[dict[str, str]]:
    rng = random.Random(seed)
    for index in range(count):
        backend = rng.choice(("vllm", "triton", "custom", "synthetic", "sglang"))
        metadata = {"backend": backend}
        if backend in ("vllm", "triton", "custom"):
            where = "serverAddress" if rng.random() < 0.6 else "scrapeTargets"
            metadata[where] = fuzzed_value(rng, where, index, port)
        for key in rng.sample(KEYS, rng.randint(0, 4)):
            metadata[key] = fuzzed_value(rng, key, index, port)
        if rng.random() < 0.05:
            metadata["x" * rng.randint(1, 3000)] = "unknown key"
        yield metadata


async def call(client: KedaLikeClient, ref: pb.ScaledObjectRef, counts: dict[str, int]) -> None:
    """What KEDA asks on one evaluation; each outcome counted by status code."""
    for code in await client.statuses(ref):
        counts[code.name] = counts.get(code.name, 0) + 1


async def poll(
    client: KedaLikeClient, ref: pb.ScaledObjectRef, polls: int, counts: dict[str, int]
) -> None:
    """`polls` calls about one ScaledObject, IsActive and GetMetrics alternated, as KEDA and
    the HPA ask."""
    request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName="synthetic-unknown")
    for index in range(polls):
        try:
            if index % 2:
                await client.stub.GetMetrics(request, timeout=30)
            else:
                await client.stub.IsActive(ref, timeout=30)
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        counts[f"poll {code}"] = counts.get(f"poll {code}", 0) + 1


async def run(maps: int, polls: int, seed: int) -> None:
    logging.getLogger("gpu_queue_scaler").setLevel(logging.CRITICAL)  # every map's failing reads
    held = refusing_port()
    port = held.getsockname()[1]
    server = ScalerServer(ConfigStore(Config()), "127.0.0.1:0", grace_s=1.0)
    await server.start()
    client = KedaLikeClient(f"127.0.0.1:{server.port}")
    counts: dict[str, int] = {}
    rows: list[tuple[str, float, int, int]] = []

    def row(label: str) -> None:
        gc.collect()
        rss, threads = process_status()
        rows.append((label, rss, threads, len(server.engine)))
        base_rss, base_threads = rows[0][1], rows[0][2]
        print(
            f"{label:<38} {rss:>8.1f} {rss / base_rss:>6.2f}x {threads:>8} "
            f"{threads / base_threads:>6.2f}x {len(server.engine):>10}",
            flush=True,
        )

    try:
        # Warm-up: the first calls of each kind load code and build gRPC's own state.
        for metadata in fuzzed_maps(50, seed + 1, port):
            await call(client, scaled_object("bench", "warm-up", metadata), counts)
        print(f"{'':<38} {'RSS MB':>8} {'ratio':>7} {'threads':>8} {'ratio':>7} {'workloads':>10}")
        row("start")
        queue = iter(enumerate(fuzzed_maps(maps, seed, port)))

        async def worker() -> None:
            for index, metadata in queue:
                await call(client, scaled_object("bench", f"fuzz-{index:05d}", metadata), counts)

        await asyncio.gather(*(worker() for _ in range(AT_ONCE)))
        row(f"after {maps} fuzzed metadata maps")
        rejected = scaled_object(
            "bench", "rejected", {"backend": "vllm", "targetConcurrency": "-1"}
        )
        await poll(client, rejected, polls, counts)
        row(f"after {polls} polls of a rejected one")
        unknown = scaled_object("bench", "unknown", {"backend": "synthetic", "profile": "nope"})
        await poll(client, unknown, polls, counts)
        row(f"after {polls} polls of an unknown profile")
        print(
            f"the maps added {rows[1][1] - rows[0][1]:.1f} MB; the polls "
            f"{rows[2][1] - rows[1][1]:.1f} MB (rejected) and {rows[3][1] - rows[2][1]:.1f} MB "
            "(unknown profile)"
        )
        print("calls: " + ", ".join(f"{code} {n}" for code, n in sorted(counts.items())))
    finally:
        await client.close()
        await server.stop()
        held.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--maps", type=int, default=10_000)
    parser.add_argument("--polls", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not Path("/proc/self/status").exists():
        sys.exit("needs Linux's /proc/self/status for RSS and threads")
    asyncio.run(run(args.maps, args.polls, args.seed))


if __name__ == "__main__":
    main()
