"""Graceful shutdown of a real `scaler serve` process on SIGTERM and SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.serve import server as server_module
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler_bench.emulators.keda import KedaLikeClient
from tests.conftest import FAST, poll, ref, synthetic
from tests.serve_process import ServeProcess

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_signal_drains_closes_streams_and_exits_zero(sig):
    server = ServeProcess("--metrics-address", "off", "--drain-seconds", "3.0")
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


class CloseDuringReadSource:
    """Starts `engine.close()` from inside a read that then finishes at once, so the close cancels
    the loop after the read is done but before the loop has resumed. On Python 3.11
    `asyncio.wait_for` lost exactly that cancellation (CPython gh-86296): the loop ticked on and
    `close()`, and with it `ScalerServer.stop()`, never returned."""

    def __init__(self, engine: Engine | None = None, *, fail: bool = False) -> None:
        self.engine = engine
        self.fail = fail
        self.closer: asyncio.Task[None] | None = None

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        if self.engine is not None and self.closer is None:
            self.closer = asyncio.create_task(self.engine.close())  # runs before the loop resumes
        if self.fail:
            raise KeyError("a bug in a source")
        return Signal(at=at, source="test", running=24.0, waiting=0.0, arrival_rate=1.0)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


@pytest.mark.parametrize("fail", [False, True], ids=["read-ok", "read-raises"])
async def test_close_stops_a_loop_cancelled_just_as_its_read_finished(fail):
    store = ConfigStore(Config(server=FAST))
    source = CloseDuringReadSource()
    engine = Engine(store, sources=lambda _: source)
    trigger = parse_trigger("team-a", "llama", synthetic())
    assert (await engine.decision(trigger)).replicas == 3
    [workload] = [engine.touch(trigger)]
    loop_task = workload.task
    assert loop_task is not None
    source.fail = fail
    source.engine = engine  # the next read starts the close
    try:
        for _ in range(100):
            if source.closer is not None:
                break
            await asyncio.sleep(0.01)
        assert source.closer is not None
        done, _ = await asyncio.wait({source.closer}, timeout=2.0)
        assert done, "engine.close() hung: the loop lost its cancellation and kept ticking"
        assert loop_task.done()
    finally:
        loop_task.cancel()  # without the fix the loop is still running; do not leak it
        await asyncio.wait({loop_task}, timeout=2.0)


class DeafSource:
    """A source with a worse bug: once `deaf`, a read ignores cancellation until released."""

    def __init__(self) -> None:
        self.deaf = False
        self.reading = asyncio.Event()
        self.release = asyncio.Event()

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        if self.deaf:
            self.reading.set()
            while not self.release.is_set():
                try:
                    await self.release.wait()
                except asyncio.CancelledError:
                    continue  # the bug: cancellation swallowed
        return Signal(at=at, source="test", running=24.0, waiting=0.0, arrival_rate=1.0)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


async def test_stop_is_bounded_when_a_loop_ignores_cancellation(monkeypatch, caplog):
    monkeypatch.setattr(server_module, "STOP_LOOPS_S", 0.5)
    source = DeafSource()
    store = ConfigStore(Config(server=FAST))
    server = server_module.ScalerServer(
        store, engine=Engine(store, sources=lambda _: source), grace_s=0.1
    )
    await server.start()
    client = KedaLikeClient(f"127.0.0.1:{server.port}")
    try:
        assert (await client.evaluate(ref("llama", synthetic()))).value == 3.0
    finally:
        await client.close()
    source.deaf = True
    await asyncio.wait_for(source.reading.wait(), 5)
    caplog.set_level(logging.ERROR, logger="gpu_queue_scaler.serve.server")
    stopping = asyncio.ensure_future(server.stop())
    try:
        done, _ = await asyncio.wait({stopping}, timeout=5.0)
        assert done, "stop() waited for a loop that ignores cancellation"
        assert not server.loops_stopped
        assert [getattr(r, "event", None) for r in caplog.records] == ["stop_timeout"]
    finally:
        source.release.set()  # the read returns; the loop sees the engine stopped and ends
    assert await poll(lambda: len(server.engine) == 0, 2.0)


def test_invalid_config_at_start_refuses_to_start(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("defaults:\n  targetConcurrency: zero\n")
    with pytest.raises(RuntimeError) as info:
        ServeProcess("--config", str(config), "--metrics-address", "off")
    assert "defaults.targetConcurrency" in str(info.value)
    assert "refusing to start" in str(info.value)
