"""Fuzzed trigger metadata through the real server (gRPC on loopback), with memory and threads
bounded in the same test.

The trigger fuzzer in tests/unit/test_fuzz.py calls the uncached parser, so it never reached what
broke a server: the trigger cache kept each rejection's exception, and every re-raise added its
frames (RSS grew ~3.7 KB a poll of one rejected ScaledObject, and a valid trigger naming an unknown
profile leaked through the workload's kept error); every distinct `serverAddress` opened a
Prometheus source with a thread pool kept for good (threads 10 -> ~190 per 2,500 maps, then
"can't start new thread"). Here the fuzzer's own vocabulary goes through `scaler serve`'s path:
GetMetricSpec, GetMetrics, IsActive, as KEDA asks them. Every address is on loopback, at a port
that refuses connections.
"""

from __future__ import annotations

import asyncio
import gc
import random
import socket
import string
import time
import tracemalloc
from collections.abc import Iterator

import grpc
import pytest

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler.engine import Engine, NoDecisionError
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.fields import TRIGGER_KEYS
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import MAX_PROMETHEUS_SERVERS, SourceError, Sources
from tests.conftest import poll, ref, run_bench
from tests.surface.test_malformed_rpcs import os_status  # RSS and threads, as that test reads them
from tests.unit.test_fuzz import KNOWN_VALUES, VALUES_BY_KEY

SETTINGS = ServerSettings(
    evaluation_interval_s=1.0,  # hundreds of loops: a tick a second keeps the test's CPU low
    workload_idle_timeout_s=60.0,
    first_decision_timeout_s=5.0,
)
# Keys whose valid values send traffic: only loopback ones, or invalid ones, are drawn for them.
# `service` would list EndpointSlices from a Kubernetes API: only invalid names are drawn.
OFF_LOOPBACK = ("serverAddress", "scrapeTargets", "service")


def value_for(rng: random.Random, key: str, index: int, port: int) -> str:
    if key == "serverAddress":
        return rng.choice(
            (f"http://127.0.0.1:{port}/prom-{index}", "ftp://h", "http://h:0", "http://[::1")
        )
    if key == "scrapeTargets":
        return rng.choice((f"127.0.0.1:{port}", "a:65536", ":80", "127.0.0.1:1," * 1001))
    if key == "service":
        return rng.choice(("Llama", "-x", "a" * 64))
    roll = rng.random()
    if roll < 0.4 and key in VALUES_BY_KEY:
        return rng.choice(VALUES_BY_KEY[key])
    if roll < 0.8:
        return rng.choice(KNOWN_VALUES)
    if roll < 0.9:
        return rng.choice('x9ü(":,=') * rng.randint(81, 5000)
    return "".join(rng.choice(string.printable) for _ in range(rng.randint(0, 40)))


def fuzzed_maps(count: int, seed: int, port: int) -> Iterator[dict[str, str]]:
    """Metadata maps from the trigger fuzzer's vocabulary, many valid (each Prometheus one with
    a `serverAddress` of its own, and direct-scrape ones), many not."""
    rng = random.Random(seed)
    keys = (*TRIGGER_KEYS, "targetconcurrency", "BACKEND", "")
    for index in range(count):
        backend = rng.choice(("vllm", "triton", "custom", "synthetic", "sglang"))
        metadata = {"backend": backend}
        if backend in ("vllm", "triton") and rng.random() < 0.4:  # direct scrape
            metadata["scrapeTargets"] = f"127.0.0.1:{port}"
        elif backend != "synthetic":
            metadata["serverAddress"] = f"http://127.0.0.1:{port}/prom-{index}"
        if backend == "custom":
            metadata["waitingQuery"] = "sum(q{$selector})"
        for key in rng.sample(keys, rng.randint(0, 4)):
            text = value_for(rng, key, index, port)
            if key in OFF_LOOPBACK or "://" not in text:  # no other key's value is an address
                metadata[key] = text
        yield metadata


async def test_fuzzed_metadata_maps_keep_threads_and_memory_bounded(start_server) -> None:
    """2,000 fuzzed maps, each a ScaledObject of its own: Prometheus sources (each with its
    own threads) stay under their bound, and every one is closed, its threads gone, once the
    workloads reading it are dropped; the engine's table is bounded; RSS grows by what the
    live workloads hold, not by a pool per map."""
    held = socket.socket()  # bound, not listening: every connection to it is refused at once
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    skipped = [0.0]  # the engine's monotonic clock runs this far ahead: idle time, injected
    store = ConfigStore(Config(server=SETTINGS))
    sources = Sources()
    engine = Engine(
        store, sources=sources, monotonic=lambda: time.monotonic() + skipped[0], max_workloads=300
    )
    _, client = await start_server(store=store, engine=engine)
    try:
        for metadata in fuzzed_maps(20, 1, port):  # warm-up: code paths, gRPC's own threads
            await client.statuses(ref("warm-up", metadata))
        gc.collect()
        rss_before, threads_before = os_status()
        codes: dict[grpc.StatusCode, int] = {}
        queue = iter(enumerate(fuzzed_maps(2000, 0, port)))
        most_sources, most_workloads = [0], [0]

        async def worker() -> None:
            for index, metadata in queue:
                for code in await client.statuses(ref(f"fuzz-{index:04d}", metadata)):
                    codes[code] = codes.get(code, 0) + 1
                most_sources[0] = max(most_sources[0], len(sources))
                most_workloads[0] = max(most_workloads[0], len(engine))

        await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(8))), 240)
        gc.collect()
        rss_after, threads_after = os_status()
        assert codes.get(grpc.StatusCode.OK, 0) > 300, codes  # many maps were valid
        assert not codes.keys() & {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}, codes
        assert most_sources[0] <= MAX_PROMETHEUS_SERVERS == 16
        assert most_workloads[0] <= 300
        # 16 sources, a thread or two each (before: one pool per map's serverAddress, ~300)
        assert threads_after <= threads_before + 40, (threads_before, threads_after)
        assert rss_after - rss_before < 60, (rss_before, rss_after)  # MB

        # Valid workloads on top, more than the table's bound: it fills up, and no further.
        refused = []
        for index in range(350):
            so = ref(f"valid-{index}", {"backend": "synthetic", "syntheticPattern": "constant"})
            request = pb.GetMetricsRequest(
                scaledObjectRef=so, metricName=f"synthetic-valid-{index}"
            )
            try:
                await client.stub.GetMetrics(request, timeout=30)
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                refused.append(exc.details())
        assert len(engine) == 300
        assert refused and all("at most 300 workloads" in text for text in refused), refused[:3]

        scrape = sources._scrape  # direct scrape's windows, one per workload scraping
        assert scrape is not None and scrape._windows

        # Idle: every workload's loop ends at its next tick, its sources closed, windows gone.
        skipped[0] = SETTINGS.workload_idle_timeout_s + 1
        assert await poll(lambda: len(engine) == 0 and len(sources) == 0, 30)
        assert not scrape._windows

        def threads_back() -> bool:
            return os_status()[1] <= threads_before + 2

        assert await poll(threads_back, 30), (threads_before, os_status()[1])

        # A workload started after that reads Prometheus again: the bound frees its places.
        so = ref("after", {"backend": "vllm", "serverAddress": f"http://127.0.0.1:{port}/x"})
        assert (await client.statuses(so))[0] == grpc.StatusCode.OK
        assert len(sources) == 1
    finally:
        held.close()


async def test_polls_of_a_rejected_scaledobject_keep_no_memory(start_server) -> None:
    """Polls of one ScaledObject rejected by the trigger parser (INVALID_ARGUMENT) and of one
    that names an unknown profile (FAILED_PRECONDITION) allocate nothing that stays: before,
    the cache's (or the workload's) exception grew by each raise's frames."""
    server, client = await start_server(Config(server=SETTINGS))
    stub = client.stub
    bad = ref("bad", {"backend": "vllm", "targetConcurrency": "-1"})
    no_profile = ref("np", {"backend": "synthetic", "profile": "nope"})
    expected = {
        "bad": grpc.StatusCode.INVALID_ARGUMENT,
        "np": grpc.StatusCode.FAILED_PRECONDITION,
    }

    async def polls(count: int) -> None:
        for index in range(count):
            for so, metric in ((bad, "vllm-bad"), (no_profile, "synthetic-np")):
                try:
                    if index % 2:
                        await stub.IsActive(so, timeout=30)
                    else:
                        request = pb.GetMetricsRequest(scaledObjectRef=so, metricName=metric)
                        await stub.GetMetrics(request, timeout=30)
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == expected[so.name], exc
                else:
                    raise AssertionError(f"{so.name} answered")

    await polls(200)  # warm-up
    gc.collect()
    rss_before, threads_before = os_status()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        await asyncio.wait_for(polls(3000), 240)  # 6,000 calls
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    rss_after, threads_after = os_status()
    # Bytes. Before: each call kept ~2 KB (rejected) or ~0.6 KB (unknown profile), 8 MB in all.
    assert grown < 500_000, grown
    assert rss_after - rss_before < 16, (rss_before, rss_after)  # MB, as the bench's goal
    assert threads_after <= threads_before + 2
    assert len(server.engine) == 0  # neither started a loop


def test_hostile_rss_bench_prints_its_rows() -> None:
    lines = run_bench("hostile_rss.py", "--maps", "200", "--polls", "300")
    rows = {line.split("  ")[0]: line.split() for line in lines if line[:1].isalpha()}
    for label in (
        "start",
        "after 200 fuzzed metadata maps",
        "after 300 polls of a rejected one",
        "after 300 polls of an unknown profile",
    ):
        figures = rows[label][-5:]  # RSS MB, ratio, threads, ratio, workloads
        assert float(figures[0]) > 0 and figures[1].endswith("x") and int(figures[2]) > 0, lines
    assert rows["start"][-4] == rows["start"][-2] == "1.00x", lines  # ratios against the start
    assert any(line.startswith("calls: ") and "poll INVALID_ARGUMENT 300" in line for line in lines)


class LongFailure:
    """A source whose every read fails with a 1 MB reason (a fault listing every pod's)."""

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        raise SourceError("no pod answered: " + "pod: refused; " * 70_000)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


async def test_a_workloads_kept_fault_is_cut_to_what_a_status_can_carry() -> None:
    engine = Engine(ConfigStore(Config(server=SETTINGS)), sources=lambda _: LongFailure())
    trigger = parse_trigger("team-a", "long", {"backend": "vllm", "scrapeTargets": "a:1"})
    try:
        for _ in range(3):
            with pytest.raises(NoDecisionError) as raised:
                await engine.decision(trigger)
            assert raised.value.message.startswith("team-a/long: no pod answered: pod: refused")
            assert len(raised.value.message) <= 4000
    finally:
        await engine.close()
