"""What the companion reads, parsed into values: the scaler's /decisions JSON and a workload's
placement (NodePool and GPUs per replica). Pure: no I/O, no clock (`now` is an argument).

Bad input never raises past the entry it is in: a malformed decision is skipped with an error
naming the field and what is accepted, so one broken workload cannot blind the companion to the
others. What is skipped is missing to the planner, and a missing demand holds its NodePool as it
is (fail static, `gpu_queue_scaler.companion.plan`), never scales it down.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from gpu_queue_scaler.companion.model import (
    GPU_RESOURCE,
    NODEPOOL_ANNOTATION,
    Placement,
    WorkloadDemand,
)

NODEPOOL_LABEL = "karpenter.sh/nodepool"
KEDA_DEFAULT_MAX_REPLICAS = 100  # a ScaledObject's spec.maxReplicaCount when unset
# A decision stamped further ahead than this is refused: a future `at` would never go stale, so
# a stuck scaler (or a skewed clock) would be trusted forever.
FUTURE_TOLERANCE_S = 60.0


class DecisionsError(ValueError):
    """The /decisions body is not JSON, or not {"decisions": [...]}: nothing can be read."""


class PlacementError(ValueError):
    """The workload's NodePool or GPUs per replica cannot be read; the message names the field."""


def _number(value: object) -> float | None:
    """A finite JSON number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _entry(index: int, raw: object, now: float) -> WorkloadDemand | str:
    """One decision -> a demand, or the error that skips it."""
    where = f"decisions[{index}]"
    if not isinstance(raw, Mapping):
        return f"{where}: expected an object, got {type(raw).__name__}"
    workload = raw.get("workload")
    if not isinstance(workload, str) or workload.count("/") != 1 or "" in workload.split("/"):
        return f"{where}: field 'workload' is {workload!r}; expected 'namespace/name'"
    where = f"{where} ({workload})"
    at = _number(raw.get("at"))
    if at is None:
        return f"{where}: field 'at' is {raw.get('at')!r}; expected a finite number (epoch s)"
    if at > now + FUTURE_TOLERANCE_S:
        return (
            f"{where}: field 'at' is {at:.0f}, {at - now:.0f}s in the future; accepted up to "
            f"{FUTURE_TOLERANCE_S:.0f}s ahead (clock skew between scaler and companion?)"
        )
    replicas = raw.get("replicas")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        return f"{where}: field 'replicas' is {replicas!r}; expected an integer >= 0"
    active = raw.get("active")
    if not isinstance(active, bool):
        return f"{where}: field 'active' is {active!r}; expected true or false"
    forecast = raw.get("forecast")
    forecast_replicas: float | None = None
    horizon_s: float | None = None
    if forecast is not None:
        if not isinstance(forecast, Mapping):
            return f"{where}: field 'forecast' is {forecast!r}; expected an object or null"
        forecast_replicas = _number(forecast.get("upper_max"))
        if forecast_replicas is None or forecast_replicas < 0:
            return (
                f"{where}: field 'forecast.upper_max' is {forecast.get('upper_max')!r}; "
                "expected a finite number >= 0"
            )
        horizon_s = _number(forecast.get("horizon_s"))
        if horizon_s is None or horizon_s <= 0:
            return (
                f"{where}: field 'forecast.horizon_s' is {forecast.get('horizon_s')!r}; "
                "expected a finite number > 0"
            )
    return WorkloadDemand(
        workload=workload,
        at=at,
        replicas=replicas,
        active=active,
        forecast_replicas=forecast_replicas,
        horizon_s=horizon_s,
    )


def parse_decisions(body: bytes | str, now: float) -> tuple[list[WorkloadDemand], list[str]]:
    """The scaler's GET /decisions body -> (demands, errors), one demand per good entry, in order.

    A workload with several triggers has one entry per metric; the planner merges them. Raises
    DecisionsError only when the body as a whole cannot be read.
    """
    try:
        doc: Any = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DecisionsError(f"/decisions body is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("decisions"), list):
        raise DecisionsError(
            f'/decisions body must be an object {{"decisions": [...]}}, got {json.dumps(doc)[:120]}'
        )
    demands: list[WorkloadDemand] = []
    errors: list[str] = []
    for index, raw in enumerate(doc["decisions"]):
        parsed = _entry(index, raw, now)
        if isinstance(parsed, str):
            errors.append(parsed)
        else:
            demands.append(parsed)
    return demands, errors


def _mapping(value: object, field: str) -> Mapping[str, Any]:
    """A JSON object at `field` (absent or null: empty), else PlacementError."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise PlacementError(f"{field} is {type(value).__name__}; expected an object")
    return value


def _list(value: object, field: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PlacementError(f"{field} is {type(value).__name__}; expected a list")
    return value


def _annotation(obj: Mapping[str, Any], field: str) -> str | None:
    metadata = _mapping(obj.get("metadata"), f"{field}.metadata")
    annotations = _mapping(metadata.get("annotations"), f"{field}.metadata.annotations")
    value = annotations.get(NODEPOOL_ANNOTATION)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise PlacementError(
            f"{field} annotation {NODEPOOL_ANNOTATION} is {value!r}; expected a NodePool name"
        )
    return value.strip()


def _affinity_nodepool(spec: Mapping[str, Any]) -> str | None:
    """The one NodePool required node affinity pins the pods to; None when it names none."""
    field = "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    affinity = _mapping(spec.get("affinity"), "spec.affinity")
    node = _mapping(affinity.get("nodeAffinity"), "spec.affinity.nodeAffinity")
    required = _mapping(node.get("requiredDuringSchedulingIgnoredDuringExecution"), field)
    values: list[str] = []
    for i, term in enumerate(
        _list(required.get("nodeSelectorTerms"), f"{field}.nodeSelectorTerms")
    ):
        term_field = f"{field}.nodeSelectorTerms[{i}]"
        term_map = _mapping(term, term_field)
        for expr in _list(term_map.get("matchExpressions"), f"{term_field}.matchExpressions"):
            expr_map = _mapping(expr, f"{term_field}.matchExpressions[]")
            if expr_map.get("key") != NODEPOOL_LABEL:
                continue
            if expr_map.get("operator") != "In":
                raise PlacementError(
                    f"{term_field}: {NODEPOOL_LABEL} with operator "
                    f"{expr_map.get('operator')!r} does not name one NodePool; use operator In "
                    f"with one value, or set the annotation {NODEPOOL_ANNOTATION}"
                )
            values.extend(str(v) for v in _list(expr_map.get("values"), f"{term_field}.values"))
    if not values:
        return None
    if len(set(values)) != 1:
        raise PlacementError(
            f"{field}: {NODEPOOL_LABEL} In {sorted(set(values))} does not name exactly one "
            f"NodePool; set the annotation {NODEPOOL_ANNOTATION} on the ScaledObject"
        )
    return values[0]


def _gpu_count(value: object, field: str) -> int:
    """An nvidia.com/gpu quantity: a whole number (extended resources take no fractions)."""
    if isinstance(value, bool):
        raise PlacementError(f"{field} is {value!r}; expected a whole number of GPUs")
    if isinstance(value, int):
        count = value
    elif isinstance(value, str) and value.strip().isdigit():
        count = int(value.strip())
    else:
        raise PlacementError(f"{field} is {value!r}; expected a whole number of GPUs")
    if count < 0:
        raise PlacementError(f"{field} is {value!r}; expected a whole number of GPUs")
    return count


def _gpus_per_replica(spec: Mapping[str, Any]) -> int:
    total = 0
    containers = _list(spec.get("containers"), "spec.containers")
    for i, container in enumerate(containers):
        field = f"spec.containers[{i}].resources"
        resources = _mapping(_mapping(container, f"spec.containers[{i}]").get("resources"), field)
        requests = _mapping(resources.get("requests"), f"{field}.requests")
        limits = _mapping(resources.get("limits"), f"{field}.limits")
        if GPU_RESOURCE in requests:
            total += _gpu_count(requests[GPU_RESOURCE], f"{field}.requests[{GPU_RESOURCE!r}]")
        elif GPU_RESOURCE in limits:
            total += _gpu_count(limits[GPU_RESOURCE], f"{field}.limits[{GPU_RESOURCE!r}]")
    if total <= 0:
        raise PlacementError(
            f"spec.containers[].resources: no container requests {GPU_RESOURCE} (requests or "
            "limits); expected a whole number > 0 of GPUs per replica"
        )
    return total


def _max_replicas(scaled_object: Mapping[str, Any]) -> int:
    """spec.maxReplicaCount of the ScaledObject (an integer >= 0), KEDA's default when unset."""
    spec = _mapping(scaled_object.get("spec"), "ScaledObject spec")
    value = spec.get("maxReplicaCount")
    if value is None:
        return KEDA_DEFAULT_MAX_REPLICAS
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise PlacementError(
            f"ScaledObject spec.maxReplicaCount is {value!r}; expected an integer >= 0"
        )
    return value


def placement(
    workload: str,
    scaled_object: Mapping[str, Any],
    pod_template: Mapping[str, Any],
    known_nodepools: set[str],
    live_pods: int,
) -> Placement:
    """Where `workload`'s replicas land: its NodePool, the GPUs each replica takes, and the most
    replicas it can have (the ScaledObject's spec.maxReplicaCount, KEDA's default 100 if unset).

    The NodePool comes from, in order: the annotation NODEPOOL_ANNOTATION on the ScaledObject,
    then on the pod template; the pod spec's nodeSelector karpenter.sh/nodepool; required node
    affinity on karpenter.sh/nodepool (operator In, one value). An explicit annotation wins
    because only a human knows where a pod that several NodePools could take will land.
    `pod_template` is the workload's spec.template (metadata + spec). Tolerations are not
    checked: a pod that does not tolerate the GPU taint would not run there either way.
    `live_pods` is the workload's pods that hold or are getting GPUs (Pending or Running, not
    terminating; see `Placement.live_pods`).
    """
    try:
        return _placement(workload, scaled_object, pod_template, known_nodepools, live_pods)
    except PlacementError as exc:
        raise PlacementError(f"{workload}: {exc}") from None


def _placement(
    workload: str,
    scaled_object: Mapping[str, Any],
    pod_template: Mapping[str, Any],
    known_nodepools: set[str],
    live_pods: int,
) -> Placement:
    if live_pods < 0:
        raise PlacementError(f"live_pods is {live_pods}; expected >= 0")
    max_replicas = _max_replicas(scaled_object)
    spec = _mapping(pod_template.get("spec"), "spec")
    nodepool: str | None = None
    source = ""
    for obj, field in ((scaled_object, "ScaledObject"), (pod_template, "pod template")):
        nodepool = _annotation(obj, field)
        if nodepool is not None:
            source = "annotation"
            break
    if nodepool is None:
        selector = _mapping(spec.get("nodeSelector"), "spec.nodeSelector")
        value = selector.get(NODEPOOL_LABEL)
        if value is not None:
            if not isinstance(value, str) or not value:
                raise PlacementError(
                    f"spec.nodeSelector[{NODEPOOL_LABEL!r}] is {value!r}; expected a NodePool name"
                )
            nodepool, source = value, "nodeSelector"
    if nodepool is None:
        nodepool = _affinity_nodepool(spec)
        source = "affinity"
    if nodepool is None:
        raise PlacementError(
            f"no NodePool found; set the annotation {NODEPOOL_ANNOTATION} on the "
            f"ScaledObject, or pin the pods with nodeSelector {NODEPOOL_LABEL}"
        )
    if nodepool not in known_nodepools:
        raise PlacementError(
            f"NodePool {nodepool!r} (from {source}) does not exist; known: "
            f"{', '.join(sorted(known_nodepools)) or 'none'}"
        )
    return Placement(
        workload=workload,
        nodepool=nodepool,
        gpus_per_replica=_gpus_per_replica(spec),
        live_pods=live_pods,
        source=source,
        max_replicas=max_replicas,
    )
