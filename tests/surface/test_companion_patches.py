"""The companion's request bodies: valid against the real schemas, minimal, and idempotent.

Each NodePool patch is applied (RFC 7386, as the API server does) to a full NodePool, and the
patched object is read back into a NodePoolState: the same plan on it must send nothing, and the
patched object must still be a valid NodePool.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from gpu_queue_scaler.companion.model import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PREVIOUS_BUDGETS_ANNOTATION,
    PREVIOUS_LIMIT_ANNOTATION,
    NodePoolPlan,
    NodePoolState,
)
from gpu_queue_scaler.companion.patches import (
    nodepool_patch,
    placeholder_deployment,
    placeholder_scale_patch,
)
from tests.k8s_schema import (
    ManifestInvalidError,
    merge_patch,
    validate_core,
    validate_custom_resource,
    without_nulls,
)

OURS = {"nodes": "0", "reasons": ["Underutilized", "Empty"]}
USER_BUDGETS: list[dict[str, Any]] = [
    {"nodes": "10%"},
    {"nodes": "0", "schedule": "0 9 * * mon-fri", "duration": "8h", "reasons": ["Drifted"]},
]


def nodepool(
    budgets: list[dict[str, Any]] | None = None,
    gpu_limit: str | None = "64",
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A full NodePool as the API server stores it."""
    limits: dict[str, Any] = {"cpu": "1000"}
    if gpu_limit is not None:
        limits["nvidia.com/gpu"] = gpu_limit
    return {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {"name": "gpu", "annotations": dict(annotations or {"team": "ml"})},
        "spec": {
            "template": {
                "spec": {
                    "nodeClassRef": {
                        "group": "karpenter.k8s.aws",
                        "kind": "EC2NodeClass",
                        "name": "gpu",
                    },
                    "requirements": [
                        {
                            "key": "karpenter.k8s.aws/instance-family",
                            "operator": "In",
                            "values": ["g5"],
                        }
                    ],
                    "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
                }
            },
            "disruption": {
                "consolidationPolicy": "WhenEmpty",
                "consolidateAfter": "5m",
                "budgets": copy.deepcopy(USER_BUDGETS if budgets is None else budgets),
            },
            "limits": limits,
        },
    }


def state_of(obj: dict[str, Any]) -> NodePoolState:
    """What the kube side reads from a NodePool."""
    limit = obj["spec"].get("limits", {}).get("nvidia.com/gpu")
    return NodePoolState(
        name=obj["metadata"]["name"],
        ready_gpus=0,
        running_gpus=0,
        gpu_limit=None if limit is None else str(limit),
        budgets=tuple(obj["spec"]["disruption"].get("budgets", [])),
        annotations=dict(obj["metadata"].get("annotations", {})),
    )


def check(body: dict[str, Any] | None) -> dict[str, Any]:
    """The body validates against the Karpenter CRD (its deletions aside: the schema cannot
    express null) and touches only what the companion owns."""
    assert body is not None
    validate_custom_resource(without_nulls(body), partial=True)
    assert set(body) <= {"apiVersion", "kind", "metadata", "spec"}
    assert set(body.get("metadata", {})) <= {"annotations"}
    assert set(body.get("metadata", {}).get("annotations", {})) <= {
        PREVIOUS_BUDGETS_ANNOTATION,
        PREVIOUS_LIMIT_ANNOTATION,
    }
    assert set(body.get("spec", {})) <= {"disruption", "limits"}
    assert set(body.get("spec", {}).get("disruption", {})) <= {"budgets"}
    assert set(body.get("spec", {}).get("limits", {})) <= {"nvidia.com/gpu"}
    return body


def apply(obj: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    patched: dict[str, Any] = merge_patch(obj, body)
    validate_custom_resource(patched)  # still a whole, valid NodePool
    return patched


def want(peak: bool = False, limit: str | None = None) -> NodePoolPlan:
    return NodePoolPlan(
        "gpu", placeholders=0, peak_budget=peak, gpu_limit=limit, forecast_gpus=0.0, reasons=()
    )


def test_validator_rejects_a_wrong_budget() -> None:
    """The CRD check is real: a budget the API server would refuse fails here."""
    bad = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool"}
    bad["spec"] = {"disruption": {"budgets": [{"nodes": "zero", "reasons": ["Idle"]}]}}
    with pytest.raises(ManifestInvalidError):
        validate_custom_resource(bad, partial=True)


def test_peak_budget_added_after_user_budgets_then_removed() -> None:
    obj = nodepool()
    body = check(nodepool_patch(state_of(obj), want(peak=True)))
    assert body["spec"]["disruption"]["budgets"] == [*USER_BUDGETS, OURS]
    assert json.loads(body["metadata"]["annotations"][PREVIOUS_BUDGETS_ANNOTATION]) == USER_BUDGETS
    assert "limits" not in body["spec"]
    obj = apply(obj, body)
    assert obj["metadata"]["annotations"]["team"] == "ml"  # other annotations untouched
    assert nodepool_patch(state_of(obj), want(peak=True)) is None

    body = check(nodepool_patch(state_of(obj), want(peak=False)))
    assert body["metadata"]["annotations"] == {PREVIOUS_BUDGETS_ANNOTATION: None}
    obj = apply(obj, body)
    assert obj == nodepool()  # exactly as the user had it
    assert nodepool_patch(state_of(obj), want(peak=False)) is None


def test_previous_budgets_recorded_once() -> None:
    """A budget removed by hand is added back, but the record of the user's value stays theirs."""
    record = json.dumps(USER_BUDGETS)
    obj = nodepool(annotations={PREVIOUS_BUDGETS_ANNOTATION: record})
    body = check(nodepool_patch(state_of(obj), want(peak=True)))
    assert body["spec"]["disruption"]["budgets"] == [*USER_BUDGETS, OURS]
    assert "metadata" not in body


def test_user_budget_identical_to_ours_is_not_ours_to_remove() -> None:
    obj = nodepool(budgets=[OURS])
    assert nodepool_patch(state_of(obj), want(peak=True)) is None
    assert nodepool_patch(state_of(obj), want(peak=False)) is None


def test_removing_our_only_budget_leaves_an_empty_list() -> None:
    obj = nodepool(budgets=[OURS], annotations={PREVIOUS_BUDGETS_ANNOTATION: "[]"})
    body = check(nodepool_patch(state_of(obj), want(peak=False)))
    assert body["spec"]["disruption"]["budgets"] == []


@pytest.mark.parametrize("user_limit", ["64", None])
def test_guard_sets_zero_records_the_user_limit_and_restores_it(user_limit: str | None) -> None:
    obj = nodepool(gpu_limit=user_limit)
    body = check(nodepool_patch(state_of(obj), want(limit="0")))
    assert body["spec"] == {"limits": {"nvidia.com/gpu": "0"}}
    assert json.loads(body["metadata"]["annotations"][PREVIOUS_LIMIT_ANNOTATION]) == user_limit
    obj = apply(obj, body)
    assert obj["spec"]["limits"]["cpu"] == "1000"  # the other limits untouched
    assert nodepool_patch(state_of(obj), want(limit="0")) is None

    body = check(nodepool_patch(state_of(obj), want(limit=None)))
    assert body["spec"] == {"limits": {"nvidia.com/gpu": user_limit}}  # None: delete the key
    obj = apply(obj, body)
    assert obj == nodepool(gpu_limit=user_limit)
    assert nodepool_patch(state_of(obj), want(limit=None)) is None


def test_user_limit_zero_is_left_alone() -> None:
    obj = nodepool(gpu_limit="0")
    assert nodepool_patch(state_of(obj), want(limit=None)) is None
    assert nodepool_patch(state_of(obj), want(limit="0")) is None


def test_unreadable_limit_record_lifts_the_limit() -> None:
    obj = nodepool(gpu_limit="0", annotations={PREVIOUS_LIMIT_ANNOTATION: "sixty-four"})
    body = check(nodepool_patch(state_of(obj), want(limit=None)))
    assert body["spec"] == {"limits": {"nvidia.com/gpu": None}}


def test_budget_and_guard_in_one_patch() -> None:
    obj = nodepool()
    body = check(nodepool_patch(state_of(obj), want(peak=True, limit="0")))
    assert set(body["metadata"]["annotations"]) == {
        PREVIOUS_BUDGETS_ANNOTATION,
        PREVIOUS_LIMIT_ANNOTATION,
    }
    obj = apply(obj, body)
    assert nodepool_patch(state_of(obj), want(peak=True, limit="0")) is None
    obj = apply(obj, check(nodepool_patch(state_of(obj), want())))
    assert obj == nodepool()


def test_placeholder_deployment_is_a_valid_pinned_preemptible_deployment() -> None:
    dep = placeholder_deployment("gpu-a10", 3, 2, "gpu-scaler", "gpu-placeholder")
    validate_core(dep)
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 3
    assert dep["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert dep["spec"]["template"]["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    assert pod["nodeSelector"] == {"karpenter.sh/nodepool": "gpu-a10"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert pod["priorityClassName"] == "gpu-placeholder"
    assert pod["terminationGracePeriodSeconds"] == 0
    (container,) = pod["containers"]
    assert container["image"] == "registry.k8s.io/pause:3.10"
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    # Two pools' placeholders never select each other's pods.
    other = placeholder_deployment("gpu-h100", 1, 8, "gpu-scaler", "gpu-placeholder")
    assert other["metadata"]["name"] != dep["metadata"]["name"]
    assert other["spec"]["selector"]["matchLabels"] != selector


def test_placeholder_deployment_options_and_bounds() -> None:
    dep = placeholder_deployment(
        "p", 0, 1, "ns", "pc", image="example.com/pause:1", taint_key="gpu.example.com/dedicated"
    )
    validate_core(dep)
    pod = dep["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "example.com/pause:1"
    assert pod["tolerations"][0]["key"] == "gpu.example.com/dedicated"
    with pytest.raises(ValueError, match="gpus"):
        placeholder_deployment("p", 1, 0, "ns", "pc")
    with pytest.raises(ValueError, match="replicas"):
        placeholder_deployment("p", -1, 1, "ns", "pc")


def test_placeholder_scale_patch() -> None:
    assert placeholder_scale_patch(4) == {"spec": {"replicas": 4}}
    dep = placeholder_deployment("p", 1, 1, "ns", "pc")
    scaled = merge_patch(dep, placeholder_scale_patch(0))
    validate_core(scaled)
    assert scaled["spec"]["replicas"] == 0
    with pytest.raises(ValueError, match="replicas"):
        placeholder_scale_patch(-1)


def test_placeholder_template_hash_follows_every_flag_but_not_the_count() -> None:
    """The hash names the template: every flag that shapes the pods changes it, the replica
    count does not (a scale is not a template change), and the template patch brings an old
    Deployment to the new template, count and hash."""
    from gpu_queue_scaler.companion.patches import (
        PLACEHOLDER_TEMPLATE_ANNOTATION,
        placeholder_template_patch,
    )

    def hash_of(dep: dict[str, Any]) -> str:
        return str(dep["metadata"]["annotations"][PLACEHOLDER_TEMPLATE_ANNOTATION])

    base = placeholder_deployment("p", 1, 1, "ns", "pc")
    assert hash_of(placeholder_deployment("p", 7, 1, "ns", "pc")) == hash_of(base)
    variants = [
        placeholder_deployment("p", 1, 2, "ns", "pc"),
        placeholder_deployment("p", 1, 1, "ns", "other-pc"),
        placeholder_deployment("p", 1, 1, "ns", "pc", image="example.com/pause:1"),
        placeholder_deployment("p", 1, 1, "ns", "pc", taint_key="gpu.example.com/dedicated"),
    ]
    assert len({hash_of(v) for v in variants} | {hash_of(base)}) == 5
    new = variants[1]
    updated = merge_patch(base, placeholder_template_patch(new))
    validate_core(updated)
    assert updated["spec"]["template"] == new["spec"]["template"]
    assert hash_of(updated) == hash_of(new)
