"""The KEDA external-scaler surface over real gRPC on loopback, called as KEDA calls it."""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import logging
import math
import urllib.error
import urllib.request

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.engine.schedule import Segment
from gpu_queue_scaler.engine.warm_start import read_history
from gpu_queue_scaler.serve.server import GC_THRESHOLDS, ScalerServer, tune_gc
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError
from tests.conftest import DecisionLog, ManualClock, latest, poll, ref, synthetic

TICK_WAIT_S = 30.0  # the most a test waits for one tick's decision (a timeout, not a claim)


def constant_replicas(peak: float, service: float, target: float) -> int:
    """The documented synthetic shape at a constant rate: in flight = 1.25 x rate x service."""
    return math.ceil(1.25 * peak * service / target - 1e-9)


async def expect_error(call: object, code: grpc.StatusCode) -> str:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call  # type: ignore[misc]
    assert info.value.code() == code, info.value.details()
    return info.value.details() or ""


async def step(
    clock: ManualClock, interval: float, name: str, *servers: ScalerServer, ticks: int = 1
) -> None:
    """Move `clock` on by `ticks` evaluation intervals, one at a time, each time waiting
    (bounded) until every server's workload `name` published its decision for the new tick."""
    for _ in range(ticks):
        before = [latest(server, name) for server in servers]
        clock.advance(interval)

        def all_ticked(before: list[Decision | None] = before) -> bool:
            now = [latest(server, name) for server in servers]
            return all(
                d is not None and (b is None or d.at > b.at + interval / 2)
                for b, d in zip(before, now, strict=True)
            )

        assert await poll(all_ticked, TICK_WAIT_S), f"no decision for the tick at {clock.now}"


async def test_every_unary_rpc_returns_the_replica_target(start_server):
    _, client = await start_server()
    so = ref("llama", synthetic(syntheticPeakRps="6"))

    spec = await client.stub.GetMetricSpec(so)
    assert [(s.metricName, s.targetSize, s.targetSizeFloat) for s in spec.metricSpecs] == [
        ("synthetic-llama", 1, 1.0)
    ]
    metrics = await client.stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=so, metricName="synthetic-llama")
    )
    expected = constant_replicas(6, 2, 8)
    assert expected == 2
    assert [(m.metricName, m.metricValue, m.metricValueFloat) for m in metrics.metricValues] == [
        ("synthetic-llama", expected, float(expected))
    ]
    assert (await client.stub.IsActive(so)).result is True


async def test_idle_workload_is_inactive_and_targets_zero(start_server):
    _, client = await start_server()
    evaluation = await client.evaluate(ref("idle", synthetic(syntheticPattern="zero")))
    # Warm start replays the idle history, so a workload idle for longer than the window is
    # inactive from the first answer (and a restarted scaler agrees with a running one).
    assert (evaluation.value, evaluation.active) == (0.0, False)


async def test_metric_name_accepted_with_and_without_keda_prefix(start_server):
    _, client = await start_server()
    so = ref("llama", synthetic(model="meta-llama/Llama-3.1-8B"))
    name = (await client.stub.GetMetricSpec(so)).metricSpecs[0].metricName
    assert name == "synthetic-meta-llama-llama-3-1-8b"
    for asked in (name, f"s0-{name}", f"s3-{name}"):
        reply = await client.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=so, metricName=asked)
        )
        assert reply.metricValues[0].metricName == name


async def test_unknown_metric_name_is_not_found(start_server):
    _, client = await start_server()
    so = ref("llama", synthetic())
    details = await expect_error(
        client.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=so, metricName="s0-other")),
        grpc.StatusCode.NOT_FOUND,
    )
    assert "'s0-other'" in details and "synthetic-llama" in details


BAD_METADATA = [
    ({"backend": None}, "backend"),
    ({"backend": "sglang"}, "backend"),
    ({"targetConcurrency": "0"}, "targetConcurrency"),
    ({"targetConcurrency": "lots"}, "targetConcurrency"),
    ({"maxReplicas": "-1"}, "maxReplicas"),
    ({"minReplicas": "5", "maxReplicas": "2"}, "minReplicas"),
    ({"minReplicas": "1.5"}, "minReplicas"),
    ({"coldStartSeconds": "NaN"}, "coldStartSeconds"),
    ({"pollingIntervalSeconds": "0"}, "pollingIntervalSeconds"),
    ({"horizonSeconds": "1e9"}, "horizonSeconds"),
    ({"serverAddress": "prometheus:9090"}, "serverAddress"),
    ({"scrapeTargets": "10.0.0.1"}, "scrapeTargets"),
    ({"labelSelector": 'pod=~"("'}, "labelSelector"),
    ({"profile": "Not_A_Name!"}, "profile"),
    ({"targetConcurency": "8"}, "targetConcurency"),
    ({"syntheticPattern": "square"}, "syntheticPattern"),
]


@pytest.mark.parametrize(("change", "key"), BAD_METADATA)
async def test_bad_metadata_is_invalid_argument_naming_the_key(start_server, change, key):
    _, client = await start_server()
    metadata = synthetic()
    for k, v in change.items():
        if v is None:
            metadata.pop(k)
        else:
            metadata[k] = v
    so = ref("bad", metadata)
    calls = [
        client.stub.GetMetricSpec(so),
        client.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=so, metricName="x")),
        client.stub.IsActive(so),
    ]
    for call in calls:
        details = await expect_error(call, grpc.StatusCode.INVALID_ARGUMENT)
        assert f"{key}:" in details and "team-a/bad" in details
    for stream in (client.stub.StreamIsActive(so), client.stub.StreamMetricSpec(so)):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stream.read()
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"{key}:" in (info.value.details() or "")


async def test_error_lists_every_accepted_value(start_server):
    _, client = await start_server()
    details = await expect_error(
        client.stub.GetMetricSpec(ref("x", synthetic(backend="sglang"))),
        grpc.StatusCode.INVALID_ARGUMENT,
    )
    assert "vllm | triton | custom | synthetic" in details


async def test_unknown_profile_fails_metrics_but_not_the_spec(start_server):
    _, client = await start_server()
    so = ref("llama", synthetic(profile="nope"))
    assert (await client.stub.GetMetricSpec(so)).metricSpecs[0].targetSizeFloat == 1.0
    details = await expect_error(
        client.stub.GetMetrics(
            pb.GetMetricsRequest(scaledObjectRef=so, metricName="synthetic-llama")
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
    )
    assert "profile" in details and "'nope'" in details


async def test_spec_answers_while_the_backend_is_unreachable(start_server, caplog):
    """GetMetricSpec must not depend on the metrics backend, or KEDA's fallback never engages.
    Prometheus down from the first sight: the warm start's failed history read is a cold start,
    the calls say why there is no target (UNAVAILABLE, naming the refused backend: KEDA's
    fallback applies), and the workload's loop keeps running, to answer once Prometheus does."""
    caplog.set_level(logging.WARNING, logger="gpu_queue_scaler.engine")
    server, client = await start_server()
    so = ref("llama", {"backend": "vllm", "serverAddress": "http://127.0.0.1:9", "model": "m"})
    spec = await client.stub.GetMetricSpec(so)
    assert spec.metricSpecs[0].metricName == "vllm-m"
    for call in (
        client.stub.GetMetrics(pb.GetMetricsRequest(scaledObjectRef=so, metricName="vllm-m")),
        client.stub.IsActive(so),
    ):
        details = await expect_error(call, grpc.StatusCode.UNAVAILABLE)
        assert "team-a/llama" in details and "http://127.0.0.1:9" in details, details
        assert "refused" in details and "internal error" not in details, details
    [workload] = server.engine._workloads.values()
    assert workload.task is not None and not workload.task.done()  # still polling the backend
    crashed = [r.getMessage() for r in caplog.records if "crashed" in r.getMessage()]
    assert crashed == []


async def test_200_scaled_objects_polled_concurrently(start_server):
    # A production-like tick (1 s): each workload's warm start replays its policy memory
    # (the horizon, 210 s by default) tick for tick before its first answer.
    settings = ServerSettings(evaluation_interval_s=1.0, first_decision_timeout_s=20.0)
    _, client = await start_server(Config(server=settings))
    objects = {
        f"model-{i}": (
            peak := float(i % 40 + 1),
            ref(f"model-{i}", synthetic(syntheticPeakRps=str(peak))),
        )
        for i in range(200)
    }
    for _round in range(3):
        evaluations = await asyncio.gather(*(client.evaluate(so) for _, so in objects.values()))
        for (name, (peak, _)), evaluation in zip(objects.items(), evaluations, strict=True):
            assert evaluation.metric_name == f"s0-synthetic-{name}"
            assert evaluation.value == constant_replicas(peak, 2, 8), name
            assert evaluation.active


async def next_message(call: object, timeout: float) -> object:
    return await asyncio.wait_for(call.read(), timeout)  # type: ignore[attr-defined]


async def test_stream_is_active_pushes_true_on_each_activation_and_never_false(
    start_server, decision_log: DecisionLog
):
    # A 1 s wave: busy for 0.5 s, then idle; idle window 0.2 s, so it turns inactive each period.
    clock, interval = ManualClock(), 0.05
    store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=interval)))
    server, client = await start_server(store=store, engine=clock.engine(store))
    so = ref(
        "wave",
        synthetic(
            syntheticPattern="wave",
            syntheticPeriodSeconds="1",
            scaleToZeroIdleSeconds="0.2",
            scaleDownStabilizationSeconds="0",
        ),
    )
    call = client.stub.StreamIsActive(so)
    received: list[object] = []

    async def read_all() -> None:
        while True:
            received.append(await call.read())

    reading = asyncio.ensure_future(read_all())
    assert await poll(lambda: latest(server, "wave") is not None, TICK_WAIT_S)
    await step(clock, interval, "wave", server, ticks=70)  # 3.5 periods
    active = [d.active for d in decision_log.decisions if d.workload == "team-a/wave"]
    activations = sum(now and not before for before, now in itertools.pairwise([False, *active]))
    assert activations >= 3 and not all(active)  # it turned active in each period
    assert await poll(lambda: len(received) >= activations, TICK_WAIT_S)
    call.cancel()
    await asyncio.gather(reading, return_exceptions=True)
    assert len(received) == activations, "expected one push per activation"
    assert all(message.result is True for message in received)


async def test_stream_metric_spec_sends_on_open_and_stays_open(start_server):
    _, client = await start_server()
    call = client.stub.StreamMetricSpec(ref("llama", synthetic()))
    first = await next_message(call, 5.0)
    assert first.metricSpecs[0].metricName == "synthetic-llama"
    assert first.metricSpecs[0].targetSizeFloat == 1.0
    pending = asyncio.ensure_future(call.read())
    done, _ = await asyncio.wait({pending}, timeout=0.5)
    assert not done and not call.done()  # open and quiet: the spec does not change
    call.cancel()
    await asyncio.gather(pending, return_exceptions=True)


def open_streams() -> float:
    return sum(
        REGISTRY.get_sample_value("queue_scaler_open_streams", {"method": m}) or 0.0
        for m in ("StreamIsActive", "StreamMetricSpec")
    )


async def test_client_disconnecting_mid_stream_frees_the_stream(start_server):
    server, client = await start_server()
    before = open_streams()
    so = ref("llama", synthetic())
    calls = [client.stub.StreamIsActive(so), client.stub.StreamMetricSpec(so)]
    for call in calls:
        await next_message(call, 5.0)
    assert open_streams() == before + 2
    await client.channel.close()  # the whole connection goes away, as when KEDA restarts
    assert await poll(lambda: open_streams() == before, TICK_WAIT_S), open_streams()
    fresh = type(client)(f"127.0.0.1:{server.port}")
    try:
        assert (await fresh.evaluate(so)).value == 2.0
    finally:
        await fresh.close()


async def test_health_and_reflection(start_server):
    server, _ = await start_server()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "externalscaler.ExternalScaler"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def list_services() -> list[str]:  # what `grpcurl list` asks; a blocking client, so a thread
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            return list(ProtoReflectionDescriptorDatabase(channel).get_services())

    services = await asyncio.to_thread(list_services)
    assert "externalscaler.ExternalScaler" in services
    assert "grpc.health.v1.Health" in services


async def test_two_replicas_started_apart_give_the_same_answers(
    start_server, decision_log: DecisionLog
):
    """Warm start: a replica that starts later agrees with one that ran, tick for tick. Both run
    on one manual clock, moved a tick at a time once both decided the last one, so neither
    skips a tick (a loop stalled past a tick skips it: the claim's documented limit). The
    interval is one at which the policy's whole memory (600 s) fits a history read tick for
    tick (HISTORY_MAX_POINTS); below it the replay's grid is coarser than the ticks."""
    clock, interval, period = ManualClock(), 0.25, 4.0
    store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=interval)))
    metadata = synthetic(
        syntheticPattern="sine",
        syntheticPeriodSeconds=f"{period:g}",
        syntheticPeakRps="40",
        scaleDownStabilizationSeconds="1.5",
    )
    so = ref("sine", metadata)
    server_a, client_a = await start_server(store=store, engine=clock.engine(store))
    await client_a.evaluate(so)
    await step(clock, interval, "sine", server_a, ticks=6)
    # The second starts while the load falls (the sine peaks at a quarter of its period):
    # there the first holds a higher need in its window, which a replica that did not replay
    # that window would not, so a warm start that lost its state fails this test.
    for _ in range(round(period / interval)):
        if 0.3 <= (clock.now % period) / period < 0.4:
            break
        await step(clock, interval, "sine", server_a)
    server_b, client_b = await start_server(store=store, engine=clock.engine(store))
    await client_b.evaluate(so)
    await step(clock, interval, "sine", server_a, server_b, ticks=30)
    groups = decision_log.by_publisher("sine")
    assert len(groups) == 2, [len(g) for g in groups]  # one Workload per server
    seen_a, seen_b = ({round(d.at, 3): d.replicas for d in group} for group in groups)
    common = sorted(set(seen_a) & set(seen_b))
    assert len(common) == 31, (sorted(seen_a), sorted(seen_b))  # B's first tick and 30 more
    assert {t: seen_a[t] for t in common} == {t: seen_b[t] for t in common}
    assert len({seen_a[t] for t in common}) > 1, "the load should have moved the target"


async def test_workload_loop_stops_when_no_longer_asked_and_restarts(start_server):
    clock, interval, idle_s = ManualClock(), 0.25, 1.0
    settings = ServerSettings(evaluation_interval_s=interval, workload_idle_timeout_s=idle_s)
    store = ConfigStore(Config(server=settings))
    server, client = await start_server(store=store, engine=clock.engine(store))
    so = ref("llama", synthetic())
    await client.evaluate(so)
    assert len(server.engine) == 1
    await step(clock, interval, "llama", server, ticks=round(idle_s / interval))  # 1 s: not idle
    assert len(server.engine) == 1
    clock.advance(interval)  # the first tick past the idle timeout ends the loop
    assert await poll(lambda: len(server.engine) == 0, TICK_WAIT_S)
    assert (await client.evaluate(so)).value == 2.0
    assert len(server.engine) == 1


class FlakySource:
    """A source the test switches between answering and failing."""

    def __init__(self) -> None:
        self.in_flight: float | None = 40.0
        self.fail = False

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        if self.fail:
            raise SourceError("prometheus at http://127.0.0.1:9 refused the connection")
        return Signal(at=at, source="test", running=self.in_flight, waiting=0.0, arrival_rate=1.0)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


class SlowHistorySource(FlakySource):
    """Live reads answer at once; the history for the warm start takes `history_s` of `clock`."""

    def __init__(self, clock: ManualClock, history_s: float) -> None:
        super().__init__()
        self.clock = clock
        self.history_s = history_s

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        self.clock.advance(self.history_s)
        self.history_s = 0.0  # the first read is the slow one
        return []


async def test_a_warm_start_slower_than_the_idle_timeout_still_answers_the_caller(start_server):
    # The caller asked once and waits; the warm start outlasts workloadIdleTimeoutSeconds. The
    # loop must make its first decision before it can count as idle (it used to end with
    # UNAVAILABLE "no data"), then stop once nobody asks.
    clock, interval = ManualClock(), 0.05
    settings = ServerSettings(evaluation_interval_s=interval, workload_idle_timeout_s=0.2)
    store = ConfigStore(Config(server=settings))
    source = SlowHistorySource(clock, history_s=0.6)
    engine = clock.engine(store, sources=lambda _: source)
    server, client = await start_server(store=store, engine=engine)
    so = ref("llama", synthetic())
    # One call, as the first ask: it waits through the warm start (0.6 s of the engine's clock).
    reply = await client.stub.GetMetrics(
        pb.GetMetricsRequest(scaledObjectRef=so, metricName="synthetic-llama")
    )
    assert reply.metricValues[0].metricValueFloat == 5.0  # 40 in flight / 8
    clock.advance(0.2 + interval)  # nobody asks for longer than the idle timeout
    assert await poll(lambda: len(server.engine) == 0, TICK_WAIT_S)


class SegmentedHistorySource(FlakySource):
    """History reads that answer when the test says so, counting how many are in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.in_flight_reads = 0
        self.most_in_flight = 0
        self.answers: dict[float, asyncio.Future[list[Signal]]] = {}
        self.cancelled: list[float] = []

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        self.in_flight_reads += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight_reads)
        answer = self.answers[start] = asyncio.get_running_loop().create_future()
        try:
            return await answer
        except asyncio.CancelledError:
            self.cancelled.append(start)
            raise
        finally:
            self.in_flight_reads -= 1


def _spec() -> WorkloadSpec:
    return resolve(parse_trigger("team-a", "llama", synthetic()), Config())


def _signals(*ats: float) -> list[Signal]:
    return [Signal(at=at, source="test", running=1.0, waiting=0.0) for at in ats]


async def _reading_two_segments(source: SegmentedHistorySource) -> asyncio.Task[list[Signal]]:
    """`read_history` of an older and a recent segment, started and given time to send."""
    segments = (Segment(0.0, 100.0, 50.0), Segment(100.0, 110.0, 5.0))
    reading = asyncio.create_task(read_history(source, _spec(), segments))
    for _ in range(10):
        await asyncio.sleep(0)
    return reading


async def test_a_warm_starts_history_segments_are_read_at_once_and_joined_in_order() -> None:
    source = SegmentedHistorySource()
    reading = await _reading_two_segments(source)
    assert source.most_in_flight == 2  # both reads sent before either answered
    source.answers[100.0].set_result(_signals(100.0, 105.0))  # the newer part answers first
    source.answers[0.0].set_result(_signals(0.0, 50.0))
    history = await reading
    assert [s.at for s in history] == [0.0, 50.0, 100.0, 105.0]  # older part first


async def test_a_failed_history_segment_cancels_the_other_read() -> None:
    source = SegmentedHistorySource()
    reading = await _reading_two_segments(source)
    source.answers[100.0].set_exception(SourceError("prometheus answered 503"))
    with pytest.raises(SourceError, match="503"):
        await reading
    for _ in range(10):
        await asyncio.sleep(0)
    assert source.cancelled == [0.0]
    assert source.in_flight_reads == 0


async def test_fail_static_holds_the_last_target_then_hands_over_to_keda_fallback(start_server):
    clock, interval, stale_s = ManualClock(), 0.25, 2.1  # off the tick grid: no tie
    source = FlakySource()
    settings = ServerSettings(evaluation_interval_s=interval, stale_target_s=stale_s)
    store = ConfigStore(Config(server=settings))
    engine = clock.engine(store, sources=lambda _: source)
    server, client = await start_server(store=store, engine=engine)
    so = ref("llama", synthetic())
    assert (await client.evaluate(so)).value == 5.0  # 40 in flight / 8
    source.fail = True
    # Held while the last good target is younger than staleTargetSeconds: never lowered.
    for _ in range(int(stale_s / interval)):
        await step(clock, interval, "llama", server)
        held = await client.evaluate(so)
        assert (held.value, held.active) == (5.0, True)  # never lowered, still active
        decision = next(server.engine.decisions())
        assert decision.reason.value == "hold" and "refused" in decision.faults[0]
    # Then it is no target at all: KEDA's fallback takes over, told why.
    clock.advance(interval)
    assert await poll(lambda: latest(server, "llama") is None, TICK_WAIT_S)
    details = await expect_error(client.stub.IsActive(so), grpc.StatusCode.UNAVAILABLE)
    assert "refused" in details
    source.fail, source.in_flight = False, 80.0
    clock.advance(interval)  # recovers at the next tick
    assert await poll(lambda: latest(server, "llama") is not None, TICK_WAIT_S)
    assert (await client.evaluate(so)).value == 10.0


LLAMA_LABELS = (("metric", "synthetic-llama"), ("namespace", "team-a"), ("scaledobject", "llama"))


async def scrape_samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The scaler's /metrics, parsed: (name, sorted labels) -> value."""
    url = f"http://127.0.0.1:{port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


async def test_metrics_reason_label_is_the_decisions_reason(start_server):
    """The reason label follows the decision: capped by maxReplicas, /metrics says max_bound
    (and not current_need, the reason the other /metrics test sees)."""
    server, client = await start_server(metrics_address="127.0.0.1:0")
    assert (await client.evaluate(ref("llama", synthetic(maxReplicas="1")))).value == 1.0
    samples = await scrape_samples(server.metrics_port)
    reasons = {
        dict(labels)["reason"]: value
        for (name, labels), value in samples.items()
        if name == "queue_scaler_decision_reason" and dict(labels)["scaledobject"] == "llama"
    }
    assert reasons == {"max_bound": 1.0}, reasons


async def test_metrics_endpoint_shows_decisions(start_server):
    server, client = await start_server(metrics_address="127.0.0.1:0")
    await client.evaluate(ref("llama", synthetic()))
    samples = await scrape_samples(server.metrics_port)
    labels = LLAMA_LABELS
    assert samples[("queue_scaler_desired_replicas", labels)] == 2.0
    assert samples[("queue_scaler_active", labels)] == 1.0
    assert samples[("queue_scaler_needed_replicas", labels)] == 1.875
    reason = tuple(sorted((*labels, ("reason", "current_need"))))
    assert samples[("queue_scaler_decision_reason", reason)] == 1.0
    assert samples[("queue_scaler_rpcs_total", (("code", "OK"), ("method", "GetMetrics")))] >= 1
    # What it saw, next to what it decided: 6 req/s x 2 s running, 6 x 0.5 s waiting.
    assert samples[("queue_scaler_signal_running_requests", labels)] == 12.0
    assert samples[("queue_scaler_signal_waiting_requests", labels)] == 3.0
    assert samples[("queue_scaler_signal_arrival_rate_requests_per_second", labels)] == 6.0
    # Missing is reported as missing, never exported as 0.
    assert ("queue_scaler_signal_ttft_p99_seconds", labels) not in samples
    missing = tuple(sorted((*labels, ("field", "ttft_p99_s"))))
    assert samples[("queue_scaler_signal_missing", missing)] == 1.0


class BuggySource(FlakySource):
    """A source with a bug: it raises something no source should."""

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        if self.fail:
            raise KeyError("a bug in a source")
        return await super().read(spec, at)


async def test_a_source_bug_holds_the_target_instead_of_killing_the_loop(start_server):
    clock, interval = ManualClock(), 0.25
    source = BuggySource()
    store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=interval)))
    engine = clock.engine(store, sources=lambda _: source)
    server, client = await start_server(store=store, engine=engine)
    so = ref("llama", synthetic())
    assert (await client.evaluate(so)).value == 5.0
    source.fail = True
    await step(clock, interval, "llama", server)
    decision = next(server.engine.decisions())
    assert decision.reason.value == "hold" and "a bug in a source" in decision.faults[0]
    assert (await client.evaluate(so)).value == 5.0
    source.fail, source.in_flight = False, 16.0
    await step(clock, interval, "llama", server)  # recovers at the next tick
    decision = next(server.engine.decisions())
    # Stabilization keeps 5 while 2 are needed.
    assert (decision.reason.value, decision.replicas) == ("stabilization", 5)


async def test_decisions_endpoint_explains_each_target(start_server):
    server, client = await start_server(metrics_address="127.0.0.1:0")
    await client.evaluate(ref("llama", synthetic()))
    await client.evaluate(ref("idle", synthetic(syntheticPattern="zero")))
    base = f"http://127.0.0.1:{server.metrics_port}/decisions"

    def get(url: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    status, everything = await asyncio.to_thread(get, base)
    assert status == 200
    assert {d["workload"] for d in everything["decisions"]} == {"team-a/llama", "team-a/idle"}
    status, one = await asyncio.to_thread(get, base + "?workload=team-a/llama")
    [llama] = one["decisions"]
    assert (llama["replicas"], llama["active"], llama["reason"]) == (2, True, "current_need")
    assert "concurrency" in llama["detail"] and llama["signal"]["running"] == 12.0
    assert len(llama["decision_id"]) == 16
    status, none = await asyncio.to_thread(get, base + "?workload=team-a/nope")
    assert (status, none["decisions"]) == (404, [])


async def test_forecast_is_exported_next_to_the_decision(start_server):
    clock, interval = ManualClock(), 0.25
    store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=interval)))
    server, client = await start_server(
        store=store, engine=clock.engine(store), metrics_address="127.0.0.1:0"
    )
    so = ref("llama", synthetic(forecast="on", forecastStepSeconds="1", horizonSeconds="5"))
    await client.evaluate(so)
    for _ in range(round(1 / interval) + 1):  # the first outlook comes when the first bin closes
        decision = next(server.engine.decisions())
        if decision.outlook is not None:
            break
        await step(clock, interval, "llama", server)
    assert decision.outlook is not None
    # Constant load: the forecaster learns the offered load, 6 req/s x 2 s / 8 (the queue is not
    # demand), while the need now also holds what waits: 15 in flight / 8.
    assert decision.outlook.point_max == pytest.approx(1.5)
    samples = await scrape_samples(server.metrics_port)
    labels = LLAMA_LABELS
    point = tuple(sorted((*labels, ("bound", "point"))))
    q90 = tuple(sorted((*labels, ("bound", "q90"))))
    assert samples[("queue_scaler_forecast_needed_replicas", point)] == pytest.approx(1.5)
    assert samples[("queue_scaler_forecast_needed_replicas", q90)] >= 1.5
    decisions_url = f"http://127.0.0.1:{server.metrics_port}/decisions"
    found = await asyncio.to_thread(
        lambda: json.loads(urllib.request.urlopen(decisions_url, timeout=5).read())
    )
    assert found["decisions"][0]["forecast"]["horizon_s"] == 5.0


def test_tune_gc_freezes_the_start_up_heap_and_sets_the_thresholds() -> None:
    before = gc.get_threshold()
    try:
        tune_gc()
        assert gc.get_threshold() == GC_THRESHOLDS
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
