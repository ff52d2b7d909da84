"""Graceful shutdown of a real `scaler serve` process on SIGTERM and SIGINT."""

from __future__ import annotations

import asyncio
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scaler._proto import externalscaler_pb2 as pb
from scaler.config import Config
from scaler.config_watch import ConfigStore
from scaler.engine import Engine
from scaler.kedaclient import KedaLikeClient
from scaler.signals import Signal
from scaler.workload import WorkloadSpec
from tests.conftest import FAST, ref, synthetic
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_drains_closes_streams_and_exits_zero(sig):
    server = ServeProcess("--metrics-address", "off", "--drain-seconds", "1.0")
    client = KedaLikeClient(f"127.0.0.1:{server.port}")
    health = health_pb2_grpc.HealthStub(client.channel)
    try:
        so = ref("llama", synthetic())
        active_stream = client.stub.StreamIsActive(so)
        spec_stream = client.stub.StreamMetricSpec(so)
        assert (await asyncio.wait_for(active_stream.read(), 10)).result is True
        assert (await asyncio.wait_for(spec_stream.read(), 10)).metricSpecs
        request = pb.GetMetricsRequest(scaledObjectRef=so, metricName="synthetic-llama")

        server.proc.send_signal(sig)
        # Draining: health says NOT_SERVING so Kubernetes and KEDA move away, yet calls answer.
        deadline = time.monotonic() + 5
        status = health_pb2.HealthCheckResponse.SERVING
        while status == health_pb2.HealthCheckResponse.SERVING and time.monotonic() < deadline:
            status = (await health.Check(health_pb2.HealthCheckRequest(service=""))).status
        assert status == health_pb2.HealthCheckResponse.NOT_SERVING
        reply = await client.stub.GetMetrics(request, timeout=5)
        assert reply.metricValues[0].metricValue == 2

        # Then open streams are closed by the server with OK, not dropped.
        assert await asyncio.wait_for(active_stream.read(), 10) == grpc.aio.EOF
        assert await asyncio.wait_for(active_stream.code(), 10) == grpc.StatusCode.OK
        assert await asyncio.wait_for(spec_stream.code(), 10) == grpc.StatusCode.OK
        returncode = await asyncio.to_thread(server.proc.wait, 15)
        assert returncode == 0
        events = [line.get("event") for line in server.lines()]
        assert events.index("shutdown") < events.index("stopped")
    finally:
        await client.close()
        server.stop()


class SlowSource:
    """A source whose reads take a while, so calls are really in flight at shutdown."""

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        await asyncio.sleep(0.8)
        return Signal(at=at, source="test", running=24.0, waiting=0.0, arrival_rate=1.0)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


async def test_stop_lets_calls_in_flight_finish(start_server):
    store = ConfigStore(Config(server=FAST))
    server, client = await start_server(
        store=store, engine=Engine(store, sources=lambda _: SlowSource())
    )
    so = ref("llama", synthetic())
    request = pb.GetMetricsRequest(scaledObjectRef=so, metricName="synthetic-llama")
    in_flight = [asyncio.ensure_future(client.stub.GetMetrics(request)) for _ in range(5)]
    await asyncio.sleep(0.2)  # the calls now wait for the workload's first decision
    await server.stop()
    replies = await asyncio.gather(*in_flight)
    # 24 in flight / 8 = 3, answered although the stop began while they waited
    assert [reply.metricValues[0].metricValue for reply in replies] == [3] * 5


def test_invalid_config_at_start_refuses_to_start(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("defaults:\n  targetConcurrency: zero\n")
    with pytest.raises(RuntimeError) as info:
        ServeProcess("--config", str(config), "--metrics-address", "off")
    assert "defaults.targetConcurrency" in str(info.value)
    assert "refusing to start" in str(info.value)
