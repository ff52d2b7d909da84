"""A trigger compiled with the current ConfigMap into the one spec a decision reads.

Like Knative's DeciderSpec: every value a decision needs is resolved once per decision into a frozen
`WorkloadSpec`, so a ConfigMap reload in the middle of a decision can never mix old and new values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from scaler.config import Config
from scaler.fields import BY_KEY, TUNING_KEYS, FieldError, check_bounds
from scaler.trigger import TriggerSpec


class ResolveError(ValueError):
    """The trigger is valid alone but not with the current ConfigMap (e.g. unknown profile)."""

    def __init__(self, problems: list[FieldError]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class WorkloadSpec:
    trigger: TriggerSpec
    target_concurrency: float
    min_replicas: int
    max_replicas: int
    cold_start_s: float
    polling_interval_s: float
    horizon_s: float
    scale_down_stabilization_s: float
    scale_to_zero_idle_s: float
    server_address: str | None
    config_digest: str

    @property
    def workload(self) -> str:
        return self.trigger.workload


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
    merged.update(config.defaults)
    merged.update(profile)
    merged.update(trigger.tuning())
    problems += check_bounds(merged, "")
    if trigger.backend != "synthetic" and not (merged["serverAddress"] or trigger.scrape_targets):
        problems.append(
            FieldError(
                "serverAddress",
                f"backend {trigger.backend} needs serverAddress (Prometheus URL, in the trigger "
                "or its profile) or scrapeTargets",
            )
        )
    if problems:
        raise ResolveError(problems)
    horizon = merged["horizonSeconds"]
    if horizon is None:
        horizon = merged["coldStartSeconds"] + merged["pollingIntervalSeconds"]
    return WorkloadSpec(
        trigger=trigger,
        target_concurrency=merged["targetConcurrency"],
        min_replicas=merged["minReplicas"],
        max_replicas=merged["maxReplicas"],
        cold_start_s=merged["coldStartSeconds"],
        polling_interval_s=merged["pollingIntervalSeconds"],
        horizon_s=horizon,
        scale_down_stabilization_s=merged["scaleDownStabilizationSeconds"],
        scale_to_zero_idle_s=merged["scaleToZeroIdleSeconds"],
        server_address=merged["serverAddress"],
        config_digest=config.digest,
    )
