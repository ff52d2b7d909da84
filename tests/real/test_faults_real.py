"""Real faults, fail static: the serving process dies mid-load and comes back.

A test-local Triton (not the session fixture: this test kills it) serves the toy model under a
closed-loop load; the scaler reads it by direct scrape. Killing Triton's process group leaves the
scaler holding the last good target (reason `hold`, never lowered, IsActive still true) and saying
so in its decision, its `/metrics` and its log; Triton restarted on the same ports is back in the
decision within one evaluation. The Prometheus outage (kill and restart of a real Prometheus) is
tests/real/test_signals_real.py::test_prometheus_outage_holds_the_target_and_recovers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.logs import JsonFormatter
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler.sources import SourceError
from gpu_queue_scaler.sources.httpclient import async_client
from tests.conftest import DecisionLog, latest, ref, synthetic, wait_decision
from tests.servers.base import LoadTally
from tests.servers.triton import TritonServer, require_install, triton_load

FAST = Config(server=ServerSettings(evaluation_interval_s=0.2, first_decision_timeout_s=15.0))
TRITON = {"backend": "triton", "model": "toy", "targetConcurrency": "4", "maxReplicas": "50"}


async def scaler_metrics(port: int, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """One family of the scaler's own /metrics: sorted labels -> value."""
    async with async_client(timeout=2) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


async def toy_metrics_served(http: httpx.AsyncClient, url: str) -> bool:
    """Triton's metrics port answers with the toy model's queue gauge (data is back)."""
    try:
        response = await http.get(url)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and 'nv_inference_pending_request_count{model="toy"' in (
        response.text
    )


@pytest.mark.real_servers
@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_triton_killed_mid_load_holds_the_target_and_recovers_on_restart(
    start_server, caplog: pytest.LogCaptureFixture, decision_log: DecisionLog
):
    await asyncio.to_thread(require_install)
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.engine")
    triton = TritonServer()
    await asyncio.to_thread(triton.start)
    stop = asyncio.Event()
    load: asyncio.Task[LoadTally] | None = None
    result = LoadTally()
    try:
        server, client = await start_server(FAST, metrics_address="127.0.0.1:0")
        so = ref("toy", {**TRITON, "scrapeTargets": triton.metrics_target})
        assert (await client.evaluate(so)).value <= 1
        # 32 clients; while Triton is down each failed request costs a worker 50 ms, so the
        # request budget is well above what the whole test sends.
        load = asyncio.create_task(
            triton_load(
                triton.http_url, concurrency=32, duration_s=180, max_requests=400_000, stop=stop
            )
        )
        raised = await wait_decision(
            server, "toy", lambda d: d.reason.value != "hold" and d.replicas >= 2, 30
        )
        await wait_decision(  # mid-load: Triton has been serving it for a while
            server, "toy", lambda d: d.signal is not None and (d.signal.arrival_rate or 0) > 5, 15
        )
        assert raised.signal is not None and raised.signal.source == "scrape"
        assert raised.active

        pid = triton.pid
        held_before = await scaler_metrics(server.metrics_port, "queue_scaler_evaluations_total")
        killed_wall = time.time()
        await asyncio.to_thread(triton.kill)  # SIGKILL to our own process group, mid-load
        dead_at = time.time()  # from here on every read is refused
        assert triton.proc is not None and triton.proc.returncode is not None, pid
        # The first tick after the kill holds (a refused connection fails at once): judged by
        # tick, not by this test's clock (see DecisionLog).
        held = await decision_log.wait_within(
            "toy", dead_at, lambda d: d.reason.value == "hold", ticks=1, timeout_s=10
        )
        print(f"triton killed: held by the tick {held.at - dead_at:.2f}s later")
        good = held.replicas  # the last good target, from the last tick that read Triton
        assert good >= raised.replicas and held.active  # never lowered, still active
        assert any(triton.metrics_target in fault for fault in held.faults), held.faults
        assert any("no pod answered" in fault for fault in held.faults), held.faults

        # While it lasts (a few ticks): every answer KEDA gets is the held target, active.
        for _ in range(5):
            evaluation = await client.evaluate(so)
            assert (evaluation.value, evaluation.active) == (float(good), True)
            decision = latest(server, "toy")
            assert decision is not None and decision.reason.value == "hold"
            assert decision.replicas == good
            await asyncio.sleep(0.2)

        labels = (("metric", held.metric_name), ("namespace", "team-a"), ("scaledobject", "toy"))
        reasons = await scaler_metrics(server.metrics_port, "queue_scaler_decision_reason")
        assert reasons.get((*labels[:2], ("reason", "hold"), labels[2])) == 1.0, reasons
        desired = await scaler_metrics(server.metrics_port, "queue_scaler_desired_replicas")
        assert desired[labels] == good
        active = await scaler_metrics(server.metrics_port, "queue_scaler_active")
        assert active[labels] == 1.0
        held_total = await scaler_metrics(server.metrics_port, "queue_scaler_evaluations_total")
        held_ticks = held_total[(("outcome", "held"),)]
        assert held_ticks - held_before.get((("outcome", "held"),), 0.0) >= 5

        formatter = JsonFormatter()
        # Only the outage's records: a scrape slowed past its timeout before the kill, on a
        # loaded machine, logs a failure and recovery of its own.
        failed = [
            json.loads(formatter.format(r))
            for r in caplog.records
            if getattr(r, "event", None) == "source_failed" and r.created >= killed_wall
        ]
        assert len(failed) == 1, failed  # once when it starts, not on every tick
        assert failed[0]["level"] == "warning" and failed[0]["workload"] == "team-a/toy"
        assert failed[0]["held"] == good
        assert triton.metrics_target in str(failed[0]["error"])

        # Triton comes back on the same ports; note when its metrics answer again.
        restart = asyncio.create_task(asyncio.to_thread(triton.restart))
        back_at = None
        async with async_client(timeout=0.5) as http:
            deadline = time.monotonic() + 90
            while back_at is None and time.monotonic() < deadline:
                if await toy_metrics_served(http, triton.metrics_url):
                    back_at = time.time()
                    break
                if restart.done():
                    restart.result()  # a failed restart raises here
                await asyncio.sleep(0.02)
        assert back_at is not None, "Triton's metrics never came back"
        # The first tick after its metrics answer again decides from them (judged by tick):
        # one evaluation (0.2 s) later, far within KEDA's poll.
        recovered = await decision_log.wait_within(
            "toy", back_at, lambda d: d.reason.value != "hold", ticks=1, timeout_s=10
        )
        print(f"triton back: decided by the tick {recovered.at - back_at:.2f}s later")
        assert recovered.signal is not None and recovered.signal.ready_pods == 1
        assert recovered.replicas >= 1 and recovered.active
        await asyncio.wait_for(restart, 90)
        evaluation = await client.evaluate(so)
        assert evaluation.active and evaluation.value >= 1
        events = [getattr(r, "event", None) for r in caplog.records]
        assert "source_recovered" in events
    finally:
        stop.set()
        if load is not None:
            result = await asyncio.wait_for(load, 60)  # errors are counted, never raised
            print(f"load: {result.ok} ok, {result.errors} errors in {result.seconds:.1f}s")
        await asyncio.to_thread(triton.stop)
    assert result.ok > 0 and result.errors > 0  # served before the kill, refused while down


class FailingSource:
    """A backend that is down: every read fails the way a source reports a fault."""

    def __init__(self) -> None:
        self.down = False
        self.reads = 0

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        self.reads += 1
        if self.down:
            raise SourceError("no pod answered: 127.0.0.1:9: ConnectError: refused")
        return Signal(at=at, source="test", running=40.0, waiting=0.0, arrival_rate=1.0)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []

    async def more_reads(self, n: int, timeout_s: float = 2.0) -> None:
        """Wait (bounded) until the engine has read n more times."""
        target = self.reads + n
        for _ in range(round(timeout_s / 0.01)):
            if self.reads >= target:
                return
            await asyncio.sleep(0.01)


async def test_a_backend_fault_is_logged_as_a_warning_with_the_held_target(caplog):
    """A fault the source reports (not a bug) is logged once when it starts, naming the fault and
    the target held, without a traceback, and once when it clears."""
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.engine")
    source = FailingSource()
    settings = ServerSettings(
        evaluation_interval_s=0.05, workload_idle_timeout_s=3600.0, first_decision_timeout_s=5.0
    )
    engine = Engine(ConfigStore(Config(server=settings)), sources=lambda _: source)
    trigger = parse_trigger("team-a", "llama", synthetic())
    try:
        assert (await engine.decision(trigger)).replicas == 5
        source.down = True
        await source.more_reads(10)
        decision = next(engine.decisions())
        assert (decision.reason.value, decision.replicas, decision.active) == ("hold", 5, True)
        source.down = False
        await source.more_reads(2)
    finally:
        await engine.close()
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(r)) for r in caplog.records]
    events = [line for line in lines if str(line.get("event", "")).startswith("source_")]
    assert [line["event"] for line in events] == ["source_failed", "source_recovered"], events
    first = events[0]
    assert first["level"] == "warning" and "exc" not in first
    assert first["held"] == 5 and "holding 5 replicas" in str(first["msg"])
    assert "no pod answered: 127.0.0.1:9" in str(first["error"])


class HangingSource(FailingSource):
    """A backend that stops answering: a read that never ends (the engine's deadline ends it)."""

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        if self.down:
            self.reads += 1
            await asyncio.Event().wait()
        return await super().read(spec, at)


async def test_a_read_past_its_deadline_is_a_fault_naming_the_timeout():
    """A timeout's own text is empty: the fault says what timed out and after how long, where it
    said only "team-a/llama: "."""
    source = HangingSource()
    settings = ServerSettings(
        evaluation_interval_s=0.05, workload_idle_timeout_s=3600.0, first_decision_timeout_s=5.0
    )
    engine = Engine(ConfigStore(Config(server=settings)), sources=lambda _: source)
    trigger = parse_trigger("team-a", "llama", synthetic(scrapeTimeoutSeconds="0.05"))
    try:
        assert (await engine.decision(trigger)).replicas == 5
        source.down = True
        for _ in range(300):  # the read deadline (the scrape timeout + 5 s), polled boundedly
            decision = next(engine.decisions())
            if decision.reason.value == "hold":
                break
            await asyncio.sleep(0.05)
    finally:
        await engine.close()
    assert decision.reason.value == "hold" and decision.replicas == 5
    assert decision.faults == ("team-a/llama: the synthetic read timed out after 5.05 s",)
