"""Plans -> the request bodies the companion sends. Pure: no I/O; the kube side sends them as is.

A NodePool is someone else's object: the companion patches (JSON merge patch, RFC 7386) only
`spec.disruption.budgets`, `spec.limits["nvidia.com/gpu"]` and its own annotations, and records
the value it replaced (PREVIOUS_BUDGETS_ANNOTATION / PREVIOUS_LIMIT_ANNOTATION, JSON) the first
time it changes one, so a human can see and undo it and the companion can restore it. Those
annotations are also how the companion knows what it owns: it removes only a budget it added and
restores only a limit it set. A pool already as planned gives no patch at all (`None`), so a
second pass with no change sends nothing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from gpu_queue_scaler.companion.inputs import NODEPOOL_LABEL
from gpu_queue_scaler.companion.model import (
    GPU_RESOURCE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PEAK_BUDGET_REASONS,
    PREVIOUS_BUDGETS_ANNOTATION,
    PREVIOUS_LIMIT_ANNOTATION,
    NodePoolPlan,
    NodePoolState,
)
from gpu_queue_scaler.companion.plan import is_peak_budget

NODEPOOL_GROUP, NODEPOOL_VERSION = "karpenter.sh", "v1"
NODEPOOL_API_VERSION = f"{NODEPOOL_GROUP}/{NODEPOOL_VERSION}"  # the one definition; kube/ uses it
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
PLACEHOLDER_APP = "gpu-placeholder"
PLACEHOLDER_NODEPOOL_LABEL = "gpu-queue-scaler.io/placeholder-for"
# On the placeholder Deployment: a hash of the pod template the companion wrote. The API server
# defaults fields into a stored template (imagePullPolicy, terminationMessagePath, ...), so the
# stored one never equals what was sent; the hash of what was sent says whether the flags that
# shape it (image, priority class, taint key, GPUs per pod) changed since.
PLACEHOLDER_TEMPLATE_ANNOTATION = "gpu-queue-scaler.io/placeholder-template"


def peak_budget() -> dict[str, object]:
    """The companion's budget: no voluntary disruption of the pool's nodes for consolidation
    (Underutilized, Empty); Drifted is left to the user's budgets, since drift is a fix."""
    return {"nodes": "0", "reasons": list(PEAK_BUDGET_REASONS)}


def _restored_limit(annotation: str) -> str | None:
    """The user's limit recorded before the guard: a quantity, or None (there was none). An
    unreadable record restores no limit: a lost cap is safer than a pool stuck at 0 GPUs."""
    try:
        value = json.loads(annotation)
    except json.JSONDecodeError:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    return str(value)


def nodepool_patch(pool: NodePoolState, plan: NodePoolPlan) -> dict[str, Any] | None:
    """The merge patch that brings `pool` to `plan`, or None when it is there already.

    Budgets: merge patch replaces a list whole, so adding sends the user's budgets + ours and
    removing sends the user's without ours. Limit: `plan.gpu_limit` set -> that limit;
    `plan.gpu_limit` None -> the user's limit back (from PREVIOUS_LIMIT_ANNOTATION; null deletes
    it when there was none) if the companion had changed it, else untouched. Nulls in the body
    are deletions. apiVersion and kind are included so the body names what it patches.
    """
    annotations: dict[str, str | None] = {}
    spec: dict[str, Any] = {}

    ours_present = any(is_peak_budget(b) for b in pool.budgets)
    budget_recorded = PREVIOUS_BUDGETS_ANNOTATION in pool.annotations
    if plan.peak_budget and not ours_present:
        spec["disruption"] = {"budgets": [*pool.budgets, peak_budget()]}
        if not budget_recorded:
            annotations[PREVIOUS_BUDGETS_ANNOTATION] = json.dumps(list(pool.budgets))
    elif not plan.peak_budget and budget_recorded:
        if ours_present:
            first = next(i for i, b in enumerate(pool.budgets) if is_peak_budget(b))
            rest = [b for i, b in enumerate(pool.budgets) if i != first]
            spec["disruption"] = {"budgets": rest}
        annotations[PREVIOUS_BUDGETS_ANNOTATION] = None

    limit_recorded = PREVIOUS_LIMIT_ANNOTATION in pool.annotations
    if plan.gpu_limit is not None:
        if pool.gpu_limit != plan.gpu_limit:
            spec["limits"] = {GPU_RESOURCE: plan.gpu_limit}
            if not limit_recorded:
                annotations[PREVIOUS_LIMIT_ANNOTATION] = json.dumps(pool.gpu_limit)
    elif limit_recorded:
        previous = _restored_limit(pool.annotations[PREVIOUS_LIMIT_ANNOTATION])
        if pool.gpu_limit != previous:
            spec["limits"] = {GPU_RESOURCE: previous}
        annotations[PREVIOUS_LIMIT_ANNOTATION] = None

    if not spec and not annotations:
        return None
    body: dict[str, Any] = {"apiVersion": NODEPOOL_API_VERSION, "kind": "NodePool"}
    if annotations:
        body["metadata"] = {"annotations": annotations}
    if spec:
        body["spec"] = spec
    return body


def placeholder_name(pool_name: str) -> str:
    """The placeholder Deployment of a NodePool (one per pool, in the companion's namespace)."""
    return f"{PLACEHOLDER_APP}-{pool_name}"


def placeholder_deployment(
    pool_name: str,
    replicas: int,
    gpus: int,
    namespace: str,
    priority_class: str,
    image: str = PAUSE_IMAGE,
    taint_key: str = GPU_RESOURCE,
) -> dict[str, Any]:
    """The placeholder Deployment for `pool_name`: pause pods that hold `gpus` GPUs each.

    Pinned to the pool (nodeSelector karpenter.sh/nodepool) and tolerating its GPU taint, so
    Karpenter launches that pool's nodes for them; a negative-priority PriorityClass, so any real
    pod preempts them at once; no grace period, so the preemption frees the GPU at once.
    Strategy Recreate: a rolling update's surge pods would buy extra GPU nodes.
    """
    if replicas < 0:
        raise ValueError(f"placeholder replicas is {replicas}; expected >= 0")
    if gpus < 1:
        raise ValueError(f"placeholder gpus is {gpus}; expected >= 1")
    selector = {"app.kubernetes.io/name": PLACEHOLDER_APP, PLACEHOLDER_NODEPOOL_LABEL: pool_name}
    labels = {**selector, MANAGED_BY_LABEL: MANAGED_BY}
    quantity = {GPU_RESOURCE: str(gpus)}
    template = {
        "metadata": {"labels": labels},
        "spec": {
            "priorityClassName": priority_class,
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "nodeSelector": {NODEPOOL_LABEL: pool_name},
            "tolerations": [{"key": taint_key, "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "pause",
                    "image": image,
                    "resources": {"requests": quantity, "limits": dict(quantity)},
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "readOnlyRootFilesystem": True,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": placeholder_name(pool_name),
            "namespace": namespace,
            "labels": labels,
            "annotations": {PLACEHOLDER_TEMPLATE_ANNOTATION: template_hash(template)},
        },
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            "strategy": {"type": "Recreate"},
            "template": template,
        },
    }


def written_template_hash(deployment: Mapping[str, Any]) -> str | None:
    """The template hash a placeholder Deployment carries (None: absent, or not a string)."""
    metadata = deployment.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    if not isinstance(annotations, Mapping):
        return None
    value = annotations.get(PLACEHOLDER_TEMPLATE_ANNOTATION)
    return value if isinstance(value, str) else None


def template_hash(template: Mapping[str, Any]) -> str:
    """A short, stable hash of a pod template as written (keys sorted)."""
    raw = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def placeholder_template_patch(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that brings a placeholder Deployment to `deployment`'s pod template,
    replica count and template hash (a merge patch replaces the template's lists whole; strategy
    Recreate then swaps the pods without surge pods buying extra nodes)."""
    metadata, spec = deployment["metadata"], deployment["spec"]
    return {
        "metadata": {"annotations": dict(metadata["annotations"])},
        "spec": {"replicas": spec["replicas"], "template": spec["template"]},
    }


def placeholder_scale_patch(replicas: int) -> dict[str, Any]:
    """The merge patch (Deployment or its scale subresource) setting the placeholder count."""
    if replicas < 0:
        raise ValueError(f"placeholder replicas is {replicas}; expected >= 0")
    return {"spec": {"replicas": replicas}}
