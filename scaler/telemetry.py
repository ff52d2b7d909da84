"""The scaler's own /metrics: what it saw and what it decided, per workload.

Names follow Prometheus conventions: one prefix (`queue_scaler_`), base units, `_total` on
counters, no colons. Per-workload values are exported by a collector that reads the engine's
latest decisions at scrape time, so a workload that is dropped disappears from /metrics with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from scaler.policy import Decision

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

OPEN_STREAMS = Gauge(PREFIX + "open_streams", "Streaming RPCs open now", ["method"])

LABELS = ["namespace", "scaledobject", "metric"]


class DecisionCollector(Collector):
    """Exports the latest decision of every tracked workload."""

    def __init__(self, decisions: Callable[[], Iterable[Decision]]) -> None:
        self._decisions = decisions

    def collect(self) -> Iterator[GaugeMetricFamily]:
        families = {
            "replicas": GaugeMetricFamily(
                PREFIX + "desired_replicas", "Replica target returned to KEDA", labels=LABELS
            ),
            "active": GaugeMetricFamily(
                PREFIX + "active", "1 if IsActive answers true", labels=LABELS
            ),
            "need": GaugeMetricFamily(
                PREFIX + "needed_replicas", "Replicas needed for the current load", labels=LABELS
            ),
            "in_flight": GaugeMetricFamily(
                PREFIX + "in_flight_requests", "Running + waiting requests seen", labels=LABELS
            ),
            "arrival": GaugeMetricFamily(
                PREFIX + "arrival_rate_requests_per_second", "Arrival rate seen", labels=LABELS
            ),
            "at": GaugeMetricFamily(
                PREFIX + "decision_timestamp_seconds", "Tick of the latest decision", labels=LABELS
            ),
            "reason": GaugeMetricFamily(
                PREFIX + "decision_reason",
                "1 for the term that set the target (bounded set of reasons)",
                labels=[*LABELS, "reason"],
            ),
        }
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
                ("in_flight", d.in_flight),
                ("arrival", d.arrival_rate),
            ):
                if value is not None:
                    families[key].add_metric(labels, value)
        yield from families.values()
        workloads = GaugeMetricFamily(PREFIX + "workloads", "Workloads with a decision")
        workloads.add_metric([], count)
        yield workloads
