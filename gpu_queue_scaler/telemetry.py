"""The scaler's own /metrics: what it saw and what it decided, per workload.

Names follow Prometheus conventions: one prefix (`queue_scaler_`), base units, `_total` on
counters, no colons. Per-workload values are exported by a collector that reads the engine's
latest decisions at scrape time, so a workload that is dropped disappears from /metrics with it.
"""

from __future__ import annotations

import functools
import platform
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gpu_queue_scaler.version import version

if TYPE_CHECKING:
    from gpu_queue_scaler.decision.policy import Decision
    from gpu_queue_scaler.settings.spec import WorkloadSpec

PREFIX = "queue_scaler_"

CONFIG_RELOADS = Counter(
    PREFIX + "config_reloads",
    "ConfigMap reloads by result; a failure keeps the last good config in force",
    ["result"],
)
CONFIG_VALID = Gauge(PREFIX + "config_valid", "1 if the config file on disk is the one in force")
CONFIG_LAST_SUCCESS = Gauge(
    PREFIX + "config_last_success_timestamp_seconds", "When a config was last taken into force"
)
RPCS = Counter(
    PREFIX + "rpcs", "External-scaler RPCs answered, by method and status", ["method", "code"]
)
EVALUATIONS = Counter(
    PREFIX + "evaluations", "Per-workload evaluations by outcome (decided, held, none)", ["outcome"]
)


@functools.cache
def rpc_counter(method: str, code: str) -> Counter:
    """RPCS' child for one method and status, looked up once: `labels()` costs microseconds on
    every RPC, and both label sets are closed (the service's methods, gRPC's status codes)."""
    return RPCS.labels(method=method, code=code)


@functools.cache
def evaluation_counter(outcome: str) -> Counter:
    """EVALUATIONS' child for one outcome (decided, held, none), looked up once."""
    return EVALUATIONS.labels(outcome=outcome)


OPEN_STREAMS = Gauge(PREFIX + "open_streams", "Streaming RPCs open now", ["method"])

BUILD_INFO = Gauge(
    PREFIX + "build_info", "Always 1: the running version and Python", ["version", "python"]
)
BUILD_INFO.labels(version=version(), python=platform.python_version()).set(1)

LABELS = ["namespace", "scaledobject", "metric"]

# What the scaler decided: decision field -> (metric name, help), labelled with LABELS.
DECISION_METRICS = {
    "replicas": ("desired_replicas", "Replica target returned to KEDA"),
    "active": ("active", "1 if IsActive answers true"),
    "need": ("needed_replicas", "Replicas needed for the current load"),
    "offered": (
        "offered_replicas",
        "Replicas the arrivals alone need, without the queue: what the forecast forecasts",
    ),
    "headroom": (
        "headroom",
        "Multiplier the closed loop holds over the need's flow (1-1.6), from attainment measured",
    ),
    "headroom_surge": (
        "headroom_surge",
        "Part of the headroom learnt while replicas were on their way (fades once they serve)",
    ),
    "late_share": (
        "late_share_ratio",
        "Share of requests waiting past queueTimeSloSeconds, from the queue time's mean and p99",
    ),
    "in_flight": ("in_flight_requests", "Running + waiting requests seen"),
    "arrival": ("arrival_rate_requests_per_second", "Arrival rate seen"),
    "at": ("decision_timestamp_seconds", "Tick of the latest decision"),
}

# What the scaler saw, next to what it decided: signal field -> (metric name, help). Each help says
# how the catalog (`gpu_queue_scaler.catalog`) makes the value from the pods' metrics.
SIGNAL_METRICS = {
    "waiting": (
        "signal_waiting_requests",
        "Requests waiting in the servers' queues, summed over pods",
    ),
    "running": (
        "signal_running_requests",
        "Requests being served, summed over pods (Triton: compute time per second, Little's law)",
    ),
    "arrival_rate": (
        "signal_arrival_rate_requests_per_second",
        "Requests arriving per second, summed over pods (vLLM: completions + growth in flight)",
    ),
    "queue_time_mean_s": (
        "signal_queue_time_mean_seconds",
        "Mean time a request waited in the queue over the rate window, all pods",
    ),
    "queue_time_p99_s": (
        "signal_queue_time_p99_seconds",
        "p99 time in the queue over the rate window, all pods (Triton: the worst pod's summary)",
    ),
    "ttft_p99_s": (
        "signal_ttft_p99_seconds",
        "p99 time to first token over the rate window, all pods",
    ),
    "kv_cache_usage": ("signal_kv_cache_usage_ratio", "Mean KV-cache usage over pods, 0-1"),
    "ready_pods": ("signal_ready_pods", "Pods that report the queue gauge: the ready servers"),
    "service_time_s": (
        "signal_service_time_seconds",
        "Mean time a request holds a slot over the rate window (vLLM: prefill + decode)",
    ),
    "prompt_tokens_rate": (
        "signal_prompt_tokens_per_second",
        "Prompt tokens prefilled per second, summed over pods",
    ),
    "generation_tokens_rate": (
        "signal_generation_tokens_per_second",
        "Tokens generated per second, summed over pods",
    ),
    "age_s": ("signal_age_seconds", "Age of the newest underlying sample when read"),
}


# Backends whose servers export a queue time the shipped SLO alerts read
# (deploy/monitoring/alerts.yaml): vLLM's histogram, Triton's cumulative queue duration.
SLO_BACKENDS = ("vllm", "triton")


class DecisionCollector(Collector):
    """Exports the latest decision of every tracked workload, and (given `specs`) each scraped
    workload's queue-time SLO, for the SLO alerts to join with the servers' own metrics."""

    def __init__(
        self,
        decisions: Callable[[], Iterable[Decision]],
        specs: Callable[[], Iterable[WorkloadSpec]] | None = None,
    ) -> None:
        self._decisions = decisions
        self._specs = specs

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            key: GaugeMetricFamily(PREFIX + name, text, labels=LABELS)
            for key, (name, text) in DECISION_METRICS.items()
        }
        families["reason"] = GaugeMetricFamily(
            PREFIX + "decision_reason",
            "1 for the term that set the target (bounded set of reasons)",
            labels=[*LABELS, "reason"],
        )
        signals = {
            field: GaugeMetricFamily(PREFIX + name, text, labels=LABELS)
            for field, (name, text) in SIGNAL_METRICS.items()
        }
        forecast = GaugeMetricFamily(
            PREFIX + "forecast_needed_replicas",
            "Highest forecast of needed replicas within the horizon (bound: point or q90)",
            labels=[*LABELS, "bound"],
        )
        model = GaugeMetricFamily(
            PREFIX + "forecast_model",
            "1 for the forecaster's current choice for the workload",
            labels=[*LABELS, "model"],
        )
        missing = GaugeMetricFamily(
            PREFIX + "signal_missing",
            "1 while a signal field is missing (no data is never read as zero)",
            labels=[*LABELS, "field"],
        )
        count = 0
        for d in self._decisions():
            count += 1
            namespace, _, name = d.workload.partition("/")
            labels = [namespace, name, d.metric_name]
            families["replicas"].add_metric(labels, d.replicas)
            families["active"].add_metric(labels, 1.0 if d.active else 0.0)
            families["at"].add_metric(labels, d.at)
            families["reason"].add_metric([*labels, d.reason.value], 1.0)
            for key, value in (
                ("need", d.need),
                ("offered", d.offered),
                ("headroom", d.headroom),
                ("headroom_surge", d.headroom_surge),
                ("late_share", d.late_share),
                ("in_flight", d.in_flight),
                ("arrival", d.arrival_rate),
            ):
                if value is not None:
                    families[key].add_metric(labels, value)
            if d.outlook is not None:
                forecast.add_metric([*labels, "point"], d.outlook.point_max)
                forecast.add_metric([*labels, "q90"], d.outlook.upper_max)
                model.add_metric([*labels, d.outlook.model], 1.0)
            if d.signal is not None:
                for field, family in signals.items():
                    value = getattr(d.signal, field)
                    if value is None:
                        missing.add_metric([*labels, field], 1.0)
                    else:
                        family.add_metric(labels, float(value))
        yield from families.values()
        yield from self._slos()
        yield from signals.values()
        yield missing
        yield forecast
        yield model
        workloads = GaugeMetricFamily(PREFIX + "workloads", "Workloads with a decision")
        workloads.add_metric([], count)
        yield workloads

    def _slos(self) -> Iterator[GaugeMetricFamily]:
        """`queue_time_slo_seconds` per workload with a `queueTimeSloSeconds`, a `service` and a
        backend in SLO_BACKENDS. Labelled with the Service (Prometheus gives the servers' series
        the same `service` label when a ServiceMonitor scrapes them) and `le`, the SLO spelt as a
        histogram bucket bound is (prometheus_client's float format, as vLLM's buckets are), so
        the alert can pick the bucket at the SLO with a label match."""
        slo = GaugeMetricFamily(
            PREFIX + "queue_time_slo_seconds",
            "The workload's queueTimeSloSeconds, for the SLO alerts",
            labels=[*LABELS, "service", "backend", "le"],
        )
        for spec in self._specs() if self._specs is not None else ():
            trigger, seconds = spec.trigger, spec.capacity.queue_time_slo_s
            service = trigger.values.get("service")
            if seconds is None or not service or trigger.backend not in SLO_BACKENDS:
                continue
            slo.add_metric(
                [
                    trigger.namespace,
                    trigger.name,
                    trigger.metric_name,
                    str(service),
                    trigger.backend,
                    floatToGoString(seconds),  # type: ignore[no-untyped-call]
                ],
                seconds,
            )
        yield slo
