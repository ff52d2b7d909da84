"""The scaler's and the companion's /metrics as Prometheus would scrape them, for the naming and
dashboard tests: the real registries rendered with `generate_latest` and parsed back with
prometheus_client's own parser (never by hand).

Every family gets at least one sample, so its label names show: the scaler's per-workload families
from two decisions (one with every signal field, one with a field missing), the module-level
labelled metrics and the companion's with one child each (a zero child changes no value a test
reads: they are counters and gauges read by difference or set explicitly).
"""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler import telemetry
from gpu_queue_scaler.companion.run import CompanionMetrics
from gpu_queue_scaler.decision.outlook import Outlook
from gpu_queue_scaler.decision.policy import Decision, Reason
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal

AT = 1_700_000_000.0

FULL_SIGNAL = Signal(
    at=AT,
    source="test",
    waiting=3.0,
    running=12.0,
    arrival_rate=6.0,
    queue_time_mean_s=0.2,
    queue_time_p99_s=0.9,
    ttft_p99_s=1.1,
    kv_cache_usage=0.4,
    ready_pods=2,
    service_time_s=2.0,
    prompt_tokens_rate=900.0,
    generation_tokens_rate=300.0,
    age_s=1.0,
)


def decisions() -> list[Decision]:
    full = Decision(
        workload="team-a/llama",
        metric_name="s0-queue",
        at=AT,
        replicas=3,
        active=True,
        reason=Reason.FORECAST,
        need=1.875,
        in_flight=15.0,
        arrival_rate=6.0,
        detail="forecast q90 2.4 within 300s",
        signal=FULL_SIGNAL,
        outlook=Outlook(point_max=1.8, upper_max=2.4, model="ets", horizon_s=300.0, made_at=AT),
        offered=1.5,
        headroom=1.25,
        headroom_surge=1.1,
        late_share=0.02,
    )
    partial = Decision(
        workload="team-b/mistral",
        metric_name="s0-queue",
        at=AT,
        replicas=1,
        active=True,
        reason=Reason.CURRENT_NEED,
        need=0.5,
        in_flight=4.0,
        arrival_rate=2.0,
        detail="concurrency 4 / 8",
        signal=Signal(at=AT, source="test", waiting=0.0, running=4.0, arrival_rate=2.0),
    )
    return [full, partial]


def specs() -> list[WorkloadSpec]:
    """The first decision's workload, scraped from a Service with a queue-time SLO (exported for
    the SLO alerts); the second has no SLO, and exports none."""
    scraped = {"backend": "vllm", "service": "llama", "metricName": "queue"}
    return [
        resolve(
            parse_trigger("team-a", "llama", {**scraped, "queueTimeSloSeconds": "1"}), Config()
        ),
        resolve(parse_trigger("team-b", "mistral", {**scraped, "service": "mistral"}), Config()),
    ]


def _parse(text: str) -> list[Metric]:
    return list(text_string_to_metric_families(text))


def scaler_text() -> str:
    """What the scaler serves on /metrics: the default registry (module-level metrics, the
    process/platform collectors) and the per-workload collector (server.py registers it on the
    default registry; here on one of its own, so no other test's server can collide with it)."""
    telemetry.CONFIG_RELOADS.labels(result="success")
    telemetry.RPCS.labels(method="GetMetrics", code="OK")
    telemetry.EVALUATIONS.labels(outcome="decided")
    telemetry.OPEN_STREAMS.labels(method="StreamIsActive")
    registry = CollectorRegistry()
    registry.register(telemetry.DecisionCollector(decisions, specs))
    return generate_latest(REGISTRY).decode() + generate_latest(registry).decode()


def scaler_families() -> list[Metric]:
    """The scaler's own families (prefix `queue_scaler_`; not the process/python collectors)."""
    return [f for f in _parse(scaler_text()) if f.name.startswith(telemetry.PREFIX)]


def companion_text() -> str:
    registry = CollectorRegistry()
    metrics = CompanionMetrics(registry)
    metrics.passes.labels("ok").inc()
    metrics.writes.labels("nodepool_patch").inc()
    metrics.errors.labels("read")
    metrics.leader.set(1)
    metrics.placeholders.labels("gpu-spot").set(2)
    metrics.forecast.labels("gpu-spot").set(8)
    metrics.last_success.set(AT)
    return generate_latest(registry).decode()


def companion_families() -> list[Metric]:
    return _parse(companion_text())


def names(families: list[Metric]) -> set[str]:
    """Every name a PromQL query may use: family names and their sample names (`_total`...)."""
    return {f.name for f in families} | {s.name for f in families for s in f.samples}
