"""The real Triton harness shows queueing in its metrics under load, and drains after it.

Run: .venv/bin/pytest -p tests.servers.triton tests/real/test_harness_triton.py
(needs .venv-triton: bash tests/servers/install_triton.sh)
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler.sources.httpclient import async_client
from tests.servers.triton import TritonServer, triton_load

pytestmark = [pytest.mark.real_servers, pytest.mark.slow, pytest.mark.timeout(180)]

LABELS = {"model": "toy", "version": "1"}
PENDING = "nv_inference_pending_request_count"
SUCCESS = "nv_inference_request_success"


async def scrape(client: httpx.AsyncClient, url: str) -> dict[str, float]:
    """The toy model's (version 1) value of each metric family, by family name.

    Keyed by family name because the parser names counter samples `<family>_total`.
    """
    resp = await client.get(url)
    resp.raise_for_status()
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(resp.text):
        for sample in family.samples:
            if sample.name in (family.name, f"{family.name}_total") and all(
                sample.labels.get(k) == v for k, v in LABELS.items()
            ):
                values[family.name] = sample.value
    return values


async def test_pending_rises_under_load_and_drains(triton_server: TritonServer) -> None:
    url = triton_server.metrics_url
    async with async_client(timeout=5.0) as client:
        before = await scrape(client, url)
        assert PENDING in before and SUCCESS in before, sorted(before)

        stop = asyncio.Event()
        load = asyncio.create_task(
            triton_load(
                triton_server.http_url,
                concurrency=32,
                duration_s=20.0,
                max_requests=20_000,
                stop=stop,
            )
        )
        max_pending = 0.0
        seen: list[float] = []
        try:
            deadline = time.monotonic() + 15.0
            for _ in range(300):  # bounded in count and in time
                if time.monotonic() > deadline or load.done():
                    break
                await asyncio.sleep(0.1)
                pending = (await scrape(client, url))[PENDING]
                seen.append(pending)
                max_pending = max(max_pending, pending)
                if max_pending >= 16 and len(seen) >= 10:
                    break
        finally:
            stop.set()
            result = await asyncio.wait_for(load, timeout=30.0)

        during = await scrape(client, url)
        assert max_pending >= 16, f"max pending {max_pending}; samples {seen[-20:]}"
        # Served: a transport error in hundreds of requests on a loaded runner is not a fault.
        assert result.ok > 0 and result.errors <= max(1, result.ok // 100), (
            result,
            result.failures[:5],
        )
        assert during[SUCCESS] > before[SUCCESS], (before, during)

        # After the load stops, the queue drains to zero.
        drained = None
        deadline = time.monotonic() + 15.0
        for _ in range(150):
            if time.monotonic() > deadline:
                break
            drained = (await scrape(client, url))[PENDING]
            if drained == 0:
                break
            await asyncio.sleep(0.1)
        assert drained == 0, f"pending still {drained} after the load stopped"
        print(
            f"\ntriton start {triton_server.start_seconds:.1f}s; max pending {max_pending:.0f}; "
            f"load ok={result.ok} errors={result.errors} in {result.seconds:.1f}s"
        )
