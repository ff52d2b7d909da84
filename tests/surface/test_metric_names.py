"""The scaler's and the companion's /metrics follow the Prometheus naming conventions
(https://prometheus.io/docs/practices/naming/): one prefix, base units (seconds, bytes), `_total`
on counters and only there, HELP on every family, and a closed set of label names with bounded
values (workload, method, reason...; never a request, a pod or a timestamp).

The families come from the real registries, rendered and parsed back by prometheus_client
(tests/metric_scrapes.py): a metric added or renamed in the code is checked here without editing
this file, and one with a new label name fails until the label is reviewed and added below.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client.metrics_core import Metric

from gpu_queue_scaler import telemetry
from gpu_queue_scaler.companion.run import PREFIX as COMPANION_PREFIX
from gpu_queue_scaler.decision.policy import Reason
from tests.metric_scrapes import companion_families, scaler_families

# Bounded label names. Per workload: namespace/scaledobject/metric (one series per ScaledObject
# trigger), and closed sets: reason (policy.Reason), bound (point, q90), model (the forecaster's
# candidates), field (Signal's fields), method/code (the gRPC methods and status codes),
# outcome/result/kind/stage (fixed in the code), nodepool (the cluster's NodePools); for the SLO
# alerts' join, one per workload: service (the trigger's), backend (a closed set), le (its SLO as a
# bucket bound); build_info's version and python (one series).
SCALER_LABELS = {
    "service",
    "backend",
    "le",
    "version",
    "python",
    "namespace",
    "scaledobject",
    "metric",
    "reason",
    "bound",
    "model",
    "field",
    "method",
    "code",
    "outcome",
    "result",
}
COMPANION_LABELS = {"nodepool", "result", "kind", "stage"}

# Name parts that are a non-base unit (or a percentage) where a base unit belongs.
NON_BASE_UNITS = {
    "ms",
    "millis",
    "milliseconds",
    "us",
    "micros",
    "microseconds",
    "ns",
    "nanoseconds",
    "minutes",
    "hours",
    "days",
    "percent",
    "pct",
    "perc",
    "kb",
    "mb",
    "gb",
    "kib",
    "mib",
    "gib",
    "kilobytes",
    "megabytes",
    "gigabytes",
}
NAME = re.compile(r"[a-z_][a-z0-9_]*")  # lower snake case; no colons (reserved for rules)

SCALER = scaler_families()
COMPANION = companion_families()
ALL = [(telemetry.PREFIX, SCALER_LABELS, f) for f in SCALER] + [
    (COMPANION_PREFIX, COMPANION_LABELS, f) for f in COMPANION
]


def _id(entry: tuple[str, set[str], Metric]) -> str:
    return entry[2].name


def test_the_scrapes_hold_the_families_the_dashboard_reads() -> None:
    scaler = {f.name for f in SCALER}
    assert len(scaler) == len(SCALER), "a family is exported twice"
    for name in (
        "desired_replicas",
        "decision_reason",
        "forecast_needed_replicas",
        "offered_replicas",
        "signal_ready_pods",
        "signal_waiting_requests",
        "rpcs",
    ):
        assert telemetry.PREFIX + name in scaler
    assert {f.name for f in COMPANION} >= {
        COMPANION_PREFIX + "forecast_gpus",
        COMPANION_PREFIX + "planned_placeholders",
    }


@pytest.mark.parametrize("entry", ALL, ids=_id)
def test_family_follows_the_naming_conventions(entry: tuple[str, set[str], Metric]) -> None:
    prefix, allowed_labels, family = entry
    name = family.name
    assert name.startswith(prefix)
    assert NAME.fullmatch(name), f"{name}: not lower snake case"
    assert family.documentation.strip(), f"{name}: no HELP text"
    assert family.type in {"counter", "gauge", "histogram", "summary", "info", "stateset"}
    parts = name.split("_")
    assert not set(parts) & NON_BASE_UNITS, f"{name}: non-base unit {set(parts) & NON_BASE_UNITS}"
    if "timestamp" in parts:
        assert name.endswith("_timestamp_seconds"), f"{name}: a timestamp is in seconds"
    # A family with no sample would hide its label names: every family is exercised in the scrape.
    assert family.samples, f"{name}: no sample in the scrape (add one in tests/metric_scrapes.py)"
    for sample in family.samples:
        if family.type == "counter":
            # The parser strips `_total` from a counter's family name; its samples carry it.
            assert sample.name in {name + "_total", name + "_created"}, sample.name
        else:
            assert not sample.name.endswith("_total"), f"{sample.name}: `_total` on a {family.type}"
        extra = set(sample.labels) - allowed_labels
        assert not extra, f"{sample.name}: label(s) {extra} not in the bounded set"


def test_ratios_are_fractions_not_percentages() -> None:
    ratios = [s for f in SCALER if f.name.endswith("_ratio") for s in f.samples]
    assert ratios
    assert all(0.0 <= s.value <= 1.0 for s in ratios)


def test_the_reason_label_is_the_closed_set_and_one_reason_per_workload() -> None:
    [family] = [f for f in SCALER if f.name == telemetry.PREFIX + "decision_reason"]
    values = [s.labels["reason"] for s in family.samples]
    assert set(values) <= {r.value for r in Reason}
    workloads = [(s.labels["namespace"], s.labels["scaledobject"]) for s in family.samples]
    assert len(workloads) == len(set(workloads))  # the current reason only, value 1
    assert {s.value for s in family.samples} == {1.0}


def test_forecast_point_and_q90_target_and_ready_pods_are_per_workload() -> None:
    by_name = {f.name: f for f in SCALER}
    forecast = by_name[telemetry.PREFIX + "forecast_needed_replicas"].samples
    assert {(s.labels["scaledobject"], s.labels["bound"]): s.value for s in forecast} == {
        ("llama", "point"): 1.8,
        ("llama", "q90"): 2.4,
    }
    for name, value in (("desired_replicas", 3.0), ("signal_ready_pods", 2.0)):
        [sample] = [
            s
            for s in by_name[telemetry.PREFIX + name].samples
            if s.labels["scaledobject"] == "llama"
        ]
        assert sample.value == value
    [offered] = by_name[telemetry.PREFIX + "offered_replicas"].samples  # None is not exported
    assert (offered.labels["scaledobject"], offered.value) == ("llama", 1.5)


def test_the_closed_loops_headroom_and_the_late_share_it_reads_are_per_workload() -> None:
    """What the closed loop holds (1 until it has learnt anything), the part of it a surge
    taught, and the late share it read; a workload without a measured late share exports none."""
    by_name = {f.name: f for f in SCALER}

    def values(name: str) -> dict[str, float]:
        return {s.labels["scaledobject"]: s.value for s in by_name[telemetry.PREFIX + name].samples}

    assert values("headroom") == {"llama": 1.25, "mistral": 1.0}
    assert values("headroom_surge") == {"llama": 1.1, "mistral": 1.0}
    assert values("late_share_ratio") == {"llama": 0.02}
