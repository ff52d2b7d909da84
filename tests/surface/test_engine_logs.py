"""A persisting source failure is logged when it starts, at most once a minute while it lasts,
and when it clears; the evaluation counters still count every failed tick."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import pytest
from prometheus_client import REGISTRY

from gpu_queue_scaler.decision import decider as decider_module
from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.policy import Decision, Reason, decide
from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.engine import faults as faults_module
from gpu_queue_scaler.engine.evaluation import log_if_changed
from gpu_queue_scaler.logs import JsonFormatter
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from tests.conftest import synthetic

SETTINGS = ServerSettings(
    evaluation_interval_s=0.05, workload_idle_timeout_s=3600.0, first_decision_timeout_s=5.0
)


class BuggySource:
    def __init__(self) -> None:
        self.fail = False
        self.reads = 0

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        self.reads += 1
        if self.fail:
            raise KeyError("a bug in a source")
        return Signal(at=at, source="test", running=40.0, waiting=0.0, arrival_rate=1.0)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


def held() -> float:
    return REGISTRY.get_sample_value("queue_scaler_evaluations_total", {"outcome": "held"}) or 0.0


async def wait_reads(source: BuggySource, count: int) -> None:
    start = source.reads
    for _ in range(400):
        if source.reads >= start + count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {source.reads - start} reads, expected {count}")


def source_events(caplog: pytest.LogCaptureFixture) -> list[dict[str, object]]:
    """The engine's source_* log lines, as the JSON lines `scaler serve` writes."""
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(record)) for record in caplog.records]
    return [line for line in lines if str(line.get("event", "")).startswith("source_")]


async def test_a_persisting_source_failure_is_logged_once_then_throttled(monkeypatch, caplog):
    monkeypatch.setattr(faults_module, "SOURCE_FAILURE_LOG_EVERY_S", 0.4)
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.engine")
    source = BuggySource()
    engine = Engine(ConfigStore(Config(server=SETTINGS)), sources=lambda _: source)
    trigger = parse_trigger("team-a", "llama", synthetic())
    try:
        assert (await engine.decision(trigger)).replicas == 5
        before = held()
        source.fail = True
        await wait_reads(source, 20)  # about 1 s of failing ticks
        source.fail = False
        await wait_reads(source, 3)
        events = source_events(caplog)
    finally:
        await engine.close()

    kinds = [line["event"] for line in events]
    assert kinds[0] == "source_failed" and kinds[-1] == "source_recovered", kinds
    assert kinds.count("source_failed") == 1 and kinds.count("source_recovered") == 1
    repeats = [line for line in events if line["event"] == "source_failing"]
    first, recovered = events[0], events[-1]
    assert first["level"] == "error" and first["workload"] == "team-a/llama"
    assert "a bug in a source" in str(first["error"]) and "KeyError" in str(first["exc"])
    assert "exc" not in repeats[0]  # the traceback is shown once, when the failure starts
    counts = [int(str(line["failures"])) for line in events]
    assert counts == sorted(counts) and counts[0] == 1 and counts[-1] >= 20
    assert recovered["level"] == "info"
    failing_s = float(str(recovered["failing_s"]))  # about 1 s: 20 ticks of 0.05 s
    assert 1 <= len(repeats) <= failing_s / 0.4 + 1, kinds  # at most one line per 0.4 s
    assert held() - before == recovered["failures"]  # the counter counted every failed tick


async def test_a_new_failure_after_recovery_is_logged_again(caplog):
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.engine")
    source = BuggySource()
    engine = Engine(ConfigStore(Config(server=SETTINGS)), sources=lambda _: source)
    trigger = parse_trigger("team-a", "llama", synthetic())
    try:
        await engine.decision(trigger)
        for _ in range(2):
            source.fail = True
            await wait_reads(source, 3)
            source.fail = False
            await wait_reads(source, 2)
        events = source_events(caplog)
    finally:
        await engine.close()
    assert [line["event"] for line in events] == [
        "source_failed",
        "source_recovered",
        "source_failed",
        "source_recovered",
    ]


async def test_a_decision_log_line_carries_the_decision_id_of_the_decision_it_logs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The JSON line of a changed target joins `/decisions` and the other replica's logs by
    `decision_id` (the same workload and tick give the same id everywhere)."""
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.engine")
    made: list[Decision] = []

    def recording_decide(*args: Any, **kwargs: Any) -> Any:
        decision, state = decide(*args, **kwargs)
        if decision is not None:
            made.append(decision)
        return decision, state

    monkeypatch.setattr(decider_module, "decide", recording_decide)
    source = BuggySource()
    engine = Engine(ConfigStore(Config(server=SETTINGS)), sources=lambda _: source)
    trigger = parse_trigger("team-a", "llama", synthetic())
    try:
        await engine.decision(trigger)
        await wait_reads(source, 3)
        formatter = JsonFormatter()
        lines = [json.loads(formatter.format(record)) for record in caplog.records]
    finally:
        await engine.close()
    logged = [line for line in lines if line.get("event") == "decision"]
    assert logged, "no decision line"
    by_id = {d.decision_id: d for d in made}
    first = logged[0]
    assert re.fullmatch(r"[0-9a-f]{16}", str(first["decision_id"]))
    assert first["decision_id"] == made[0].decision_id  # the first decision is always logged
    for line in logged:
        decision = by_id[str(line["decision_id"])]
        assert (line["workload"], line["replicas"], line["reason"]) == (
            decision.workload,
            decision.replicas,
            decision.reason.value,
        )


def test_a_decision_is_logged_when_its_replicas_activity_or_reason_change(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """One line per change an operator acts on, not one per tick: a decision with the replicas,
    activity and reason of the one published before is not logged again."""
    caplog.set_level(logging.INFO, logger="gpu_queue_scaler.engine")
    spec = resolve(parse_trigger("team-a", "llama", synthetic()), Config())
    signal = Signal(at=1000.0, source="test", running=40.0, waiting=0.0, arrival_rate=1.0)
    first = Decider(spec).tick(signal, signal.at)
    assert first is not None
    later = first._replace(at=first.at + 5.0)
    changes = [
        (None, first),
        (first, later),  # the same replicas, activity and reason: not logged
        (first, first._replace(replicas=first.replicas + 1)),
        (first, first._replace(active=not first.active)),
        (first, first._replace(reason=Reason.HOLD)),
    ]
    for previous, decision in changes:
        log_if_changed(previous, decision)
    formatter = JsonFormatter()
    lines = [json.loads(formatter.format(record)) for record in caplog.records]
    logged = [
        (x["replicas"], x["active"], x["reason"]) for x in lines if x.get("event") == "decision"
    ]
    assert logged == [(d.replicas, d.active, d.reason.value) for _, d in changes if d is not later]
