"""A trigger compiled with the current ConfigMap into the one spec a decision reads.

Like Knative's DeciderSpec: every value a decision needs is resolved once per decision into a frozen
`WorkloadSpec`, so a ConfigMap reload in the middle of a decision can never mix old and new values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpu_queue_scaler.catalog import CATALOGS, QUERY_KEYS
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.fields import (
    AUTO,
    BY_KEY,
    DAILY_S,
    TUNING_KEYS,
    FieldError,
    check_bounds,
)
from gpu_queue_scaler.settings.trigger import TriggerSpec


class ResolveError(ValueError):
    """The trigger is valid alone but not with the current ConfigMap (e.g. unknown profile)."""

    def __init__(self, problems: list[FieldError]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class CapacitySpec:
    """The capacity model's inputs (`gpu_queue_scaler.decision.capacity`), from the trigger's
    capacity keys."""

    target_concurrency: float
    service_time_s: float | None = None
    queue_time_slo_s: float | None = None
    slo_attainment: float = 0.99  # share of requests within queue_time_slo_s (the objective)
    kv_cache_target: float | None = None
    prefill_tokens_per_s: float | None = None  # per replica at its target load
    decode_tokens_per_s: float | None = None


@dataclass(frozen=True)
class WorkloadSpec:
    trigger: TriggerSpec
    capacity: CapacitySpec
    min_replicas: int
    max_replicas: int
    cold_start_s: float
    polling_interval_s: float
    horizon_s: float
    forecast: bool  # a forecaster runs (`forecast: on` or `wake`)
    forecast_step_s: float
    season_period_s: float | None  # with season_auto, the period until one is found
    forecast_wakes_only: bool  # `forecast: wake`
    season_auto: bool  # `seasonPeriodSeconds: auto`
    scale_down_stabilization_s: float
    scale_down_max_percent: float
    replicas_per_node: int
    panic_threshold: float
    scale_to_zero_idle_s: float
    server_address: str | None
    signal_source: str  # "prometheus" | "scrape" | "none" (synthetic)
    namespace_label: str | None
    rate_window_s: float
    max_sample_age_s: float
    scrape_timeout_s: float
    query_timeout_s: float
    query_interval_s: float
    queries: Mapping[str, str]  # signal field -> user PromQL
    metrics_port: int | None
    config_digest: str

    @property
    def workload(self) -> str:
        return self.trigger.workload

    @property
    def target_concurrency(self) -> float:
        return self.capacity.target_concurrency

    @property
    def read_deadline_s(self) -> float:
        """The longest one read may take: a Prometheus query with its retries, or a scrape."""
        if self.signal_source == "prometheus":
            return self.query_timeout_s * 3 + 1.0
        return self.scrape_timeout_s + 5.0  # plus an EndpointSlice list on a cold cache


def _season_period(value: str | float) -> float | None:
    """The forecaster's period: with `auto`, the daily one until the demand shows another
    (`gpu_queue_scaler.decision.season`); 0 is none."""
    if value == AUTO:
        return DAILY_S
    return float(value) or None


def _scale_down_window(merged: dict[str, Any], given: set[str], horizon: float) -> float:
    """scaleDownStabilizationSeconds as given anywhere (`given`: the keys of the defaults, the
    profile and the trigger), else its default but at least the horizon: a replica released in a
    gap shorter than a cold start is back only after the load that returns has waited for it."""
    window = float(merged["scaleDownStabilizationSeconds"])
    return window if "scaleDownStabilizationSeconds" in given else max(window, horizon)


def resolve(trigger: TriggerSpec, config: Config) -> WorkloadSpec:
    problems: list[FieldError] = []
    profile: dict[str, Any] = {}
    if trigger.profile is not None:
        if trigger.profile in config.profiles:
            profile = dict(config.profiles[trigger.profile])
        else:
            known = ", ".join(sorted(config.profiles)) or "none defined"
            problems.append(
                FieldError(
                    "profile",
                    f"{trigger.profile!r} is not a profile in {config.source}; known: {known}",
                )
            )
    merged = {key: BY_KEY[key].default for key in TUNING_KEYS}
    given: set[str] = set()  # the keys set by the defaults, the profile or the trigger
    for layer in (config.defaults, profile, trigger.tuning()):
        merged.update(layer)
        given.update(layer)
    problems += check_bounds(merged, "")
    source = _signal_source(trigger, merged, problems)
    if problems:
        raise ResolveError(problems)
    horizon = merged["horizonSeconds"]
    if horizon is None:
        horizon = merged["coldStartSeconds"] + merged["pollingIntervalSeconds"]
    return WorkloadSpec(
        trigger=trigger,
        capacity=CapacitySpec(
            target_concurrency=merged["targetConcurrency"],
            service_time_s=merged["serviceTimeSeconds"],
            queue_time_slo_s=merged["queueTimeSloSeconds"],
            slo_attainment=merged["sloAttainment"],
            kv_cache_target=merged["kvCacheTarget"],
            prefill_tokens_per_s=merged["prefillTokensPerSecond"],
            decode_tokens_per_s=merged["decodeTokensPerSecond"],
        ),
        min_replicas=merged["minReplicas"],
        max_replicas=merged["maxReplicas"],
        cold_start_s=merged["coldStartSeconds"],
        polling_interval_s=merged["pollingIntervalSeconds"],
        horizon_s=horizon,
        forecast=merged["forecast"] != "off",
        forecast_wakes_only=merged["forecast"] == "wake",
        forecast_step_s=merged["forecastStepSeconds"],
        season_period_s=_season_period(merged["seasonPeriodSeconds"]),
        season_auto=merged["seasonPeriodSeconds"] == AUTO,
        scale_down_stabilization_s=_scale_down_window(merged, given, horizon),
        scale_down_max_percent=merged["scaleDownMaxPercent"],
        replicas_per_node=merged["replicasPerNode"],
        panic_threshold=merged["panicThreshold"],
        scale_to_zero_idle_s=merged["scaleToZeroIdleSeconds"],
        server_address=merged["serverAddress"],
        signal_source=source,
        namespace_label=merged["namespaceLabel"],
        rate_window_s=merged["rateWindowSeconds"],
        max_sample_age_s=merged["maxSampleAgeSeconds"],
        scrape_timeout_s=merged["scrapeTimeoutSeconds"],
        query_timeout_s=merged["queryTimeoutSeconds"],
        query_interval_s=merged["queryIntervalSeconds"],
        queries=MappingProxyType(
            {field: merged[key] for field, key in QUERY_KEYS.items() if merged[key]}
        ),
        metrics_port=trigger.values.get("metricsPort")
        or CATALOGS.get(trigger.backend, CATALOGS["custom"]).default_metrics_port,
        config_digest=config.digest,
    )


def _signal_source(
    trigger: TriggerSpec, merged: Mapping[str, Any], problems: list[FieldError]
) -> str:
    """Pick where live signals come from, or explain why no source fits."""
    if trigger.backend == "synthetic":
        return "none"
    scrape_ok = bool(trigger.scrape_targets or trigger.values.get("service"))
    prometheus_ok = bool(merged["serverAddress"])
    wanted = merged["signalSource"]
    if trigger.backend == "custom":
        if not (merged["waitingQuery"] or merged["runningQuery"]):
            problems.append(
                FieldError(
                    "waitingQuery",
                    "backend custom needs waitingQuery or runningQuery (PromQL), in the trigger "
                    "or its profile",
                )
            )
        if wanted == "scrape":
            problems.append(
                FieldError("signalSource", "backend custom reads PromQL: use prometheus or auto")
            )
        scrape_ok = False
    if wanted == "scrape" or (wanted == "auto" and scrape_ok):
        if not scrape_ok and trigger.backend != "custom":
            problems.append(
                FieldError("signalSource", "scrape needs scrapeTargets or service in the trigger")
            )
        return "scrape"
    if not prometheus_ok:
        needs = "serverAddress (Prometheus URL, in the trigger or its profile)"
        if trigger.backend != "custom":
            needs += ", scrapeTargets or service"
        problems.append(FieldError("serverAddress", f"backend {trigger.backend} needs {needs}"))
    return "prometheus"
