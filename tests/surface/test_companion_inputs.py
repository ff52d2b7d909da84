"""The companion's inputs: the scaler's own /decisions JSON, and a workload's placement."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpu_queue_scaler.companion.inputs import (
    DecisionsError,
    PlacementError,
    parse_decisions,
    placement,
)
from gpu_queue_scaler.companion.model import NODEPOOL_ANNOTATION, Placement, WorkloadDemand
from gpu_queue_scaler.decision.outlook import Outlook
from gpu_queue_scaler.decision.policy import Decision, Reason
from gpu_queue_scaler.serve.http import decision_json

T0 = 1_700_000_000.0
POOLS = {"gpu-a10", "gpu-h100"}


def decision(
    workload: str = "team-a/llama",
    replicas: int = 3,
    active: bool = True,
    outlook: Outlook | None = None,
    at: float = T0,
    metric: str = "queue",
) -> Decision:
    return Decision(
        workload=workload,
        metric_name=metric,
        at=at,
        replicas=replicas,
        active=active,
        reason=Reason.FORECAST if outlook else Reason.CURRENT_NEED,
        need=2.5,
        in_flight=20.0,
        arrival_rate=4.0,
        detail="test",
        outlook=outlook,
    )


def body(*decisions: Decision) -> bytes:
    """Exactly what the scaler serves at GET /decisions."""
    return json.dumps({"decisions": [decision_json(d) for d in decisions]}).encode()


def test_real_decisions_become_demands() -> None:
    outlook = Outlook(point_max=4.2, upper_max=5.7, model="ets", horizon_s=90.0, made_at=T0)
    demands, errors = parse_decisions(
        body(
            decision(outlook=outlook),
            decision("team-b/idle", replicas=0, active=False, at=T0 - 30),
        ),
        now=T0 + 5,
    )
    assert errors == []
    assert demands == [
        WorkloadDemand("team-a/llama", T0, 3, True, forecast_replicas=5.7, horizon_s=90.0),
        WorkloadDemand("team-b/idle", T0 - 30, 0, False, forecast_replicas=None, horizon_s=None),
    ]


def test_str_body_and_empty_list() -> None:
    assert parse_decisions('{"decisions": []}', now=T0) == ([], [])


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"<html>502 Bad Gateway</html>", "not JSON"),
        (b"[]", "must be an object"),
        (b'{"decision": []}', "must be an object"),
        (b'{"decisions": {"a": 1}}', "must be an object"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_unreadable_body_raises(raw: bytes, message: str) -> None:
    with pytest.raises(DecisionsError, match=message):
        parse_decisions(raw, now=T0)


def _entry(**changes: Any) -> dict[str, Any]:
    outlook = Outlook(point_max=1.0, upper_max=2.0, model="ets", horizon_s=60.0, made_at=T0)
    entry = decision_json(decision(outlook=outlook))
    entry.update(changes)
    return entry


@pytest.mark.parametrize(
    ("entry", "field", "accepted"),
    [
        (_entry(workload="llama"), "'workload'", "'namespace/name'"),
        (_entry(workload=None), "'workload'", "'namespace/name'"),
        (_entry(at="soon"), "'at'", "finite number"),
        (_entry(at=float("nan")), "'at'", "finite number"),
        (_entry(at=T0 + 3600), "'at'", "in the future"),
        (_entry(replicas=-1), "'replicas'", "integer >= 0"),
        (_entry(replicas=2.5), "'replicas'", "integer >= 0"),
        (_entry(replicas=True), "'replicas'", "integer >= 0"),
        (_entry(active="yes"), "'active'", "true or false"),
        (_entry(forecast=[1, 2]), "'forecast'", "object or null"),
        (_entry(forecast={"upper_max": -1, "horizon_s": 60}), "'forecast.upper_max'", ">= 0"),
        (_entry(forecast={"horizon_s": 60}), "'forecast.upper_max'", "finite number"),
        (_entry(forecast={"upper_max": 1, "horizon_s": 0}), "'forecast.horizon_s'", "> 0"),
    ],
)
def test_malformed_entry_is_skipped_with_field_named(
    entry: dict[str, Any], field: str, accepted: str
) -> None:
    good = decision_json(decision("team-b/ok"))
    raw = json.dumps({"decisions": [entry, good]}, allow_nan=True)
    demands, errors = parse_decisions(raw, now=T0)
    assert [d.workload for d in demands] == ["team-b/ok"]
    assert len(errors) == 1
    assert errors[0].startswith("decisions[0]")
    assert field in errors[0]
    assert accepted in errors[0]


def test_non_object_entry() -> None:
    demands, errors = parse_decisions('{"decisions": [7]}', now=T0)
    assert demands == []
    assert errors == ["decisions[0]: expected an object, got int"]


# --- placement ------------------------------------------------------------------------------------


def template(
    annotations: dict[str, str] | None = None,
    node_selector: dict[str, str] | None = None,
    affinity: dict[str, Any] | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": containers
        if containers is not None
        else [
            {"name": "server", "resources": {"requests": {"nvidia.com/gpu": "2"}}},
            {"name": "sidecar", "resources": {"requests": {"cpu": "100m"}}},
        ]
    }
    if node_selector is not None:
        spec["nodeSelector"] = node_selector
    if affinity is not None:
        spec["affinity"] = affinity
    return {"metadata": {"annotations": annotations or {}}, "spec": spec}


def scaled_object(annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "team-a", "annotations": annotations}}


def required_affinity(*expressions: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": list(expressions)}]
            }
        }
    }


def place(so: dict[str, Any], tpl: dict[str, Any], live: int = 1) -> Placement:
    return placement("team-a/llama", so, tpl, POOLS, live_pods=live)


def test_annotation_on_scaled_object_wins() -> None:
    tpl = template(
        annotations={NODEPOOL_ANNOTATION: "gpu-a10"},
        node_selector={"karpenter.sh/nodepool": "gpu-a10"},
    )
    got = place(scaled_object({NODEPOOL_ANNOTATION: "gpu-h100"}), tpl, live=3)
    assert got == Placement("team-a/llama", "gpu-h100", 2, 3, "annotation", max_replicas=100)


def test_annotation_on_pod_template() -> None:
    tpl = template(annotations={NODEPOOL_ANNOTATION: "gpu-a10"})
    assert place(scaled_object(), tpl).nodepool == "gpu-a10"
    assert place(scaled_object(), tpl).source == "annotation"


def test_node_selector() -> None:
    tpl = template(node_selector={"karpenter.sh/nodepool": "gpu-a10", "zone": "a"})
    got = place(scaled_object(), tpl)
    assert (got.nodepool, got.source) == ("gpu-a10", "nodeSelector")


def test_required_affinity_with_one_value() -> None:
    tpl = template(
        affinity=required_affinity(
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a", "b"]},
            {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-h100"]},
        )
    )
    got = place(scaled_object(), tpl)
    assert (got.nodepool, got.source) == ("gpu-h100", "affinity")


@pytest.mark.parametrize(
    "expression",
    [
        {"key": "karpenter.sh/nodepool", "operator": "In", "values": ["gpu-a10", "gpu-h100"]},
        {"key": "karpenter.sh/nodepool", "operator": "NotIn", "values": ["gpu-a10"]},
    ],
)
def test_affinity_not_naming_one_pool_asks_for_the_annotation(expression: dict[str, Any]) -> None:
    with pytest.raises(PlacementError, match=NODEPOOL_ANNOTATION) as err:
        place(scaled_object(), template(affinity=required_affinity(expression)))
    assert "team-a/llama" in str(err.value)
    assert "nodeAffinity" in str(err.value)


def test_no_pool_anywhere() -> None:
    with pytest.raises(PlacementError, match="no NodePool found; set the annotation"):
        place(scaled_object(), template())


def test_unknown_pool_names_source_and_known_pools() -> None:
    tpl = template(node_selector={"karpenter.sh/nodepool": "gpu-b200"})
    known = r"'gpu-b200' \(from nodeSelector\) does not exist; known: gpu-a10, gpu-h100"
    with pytest.raises(PlacementError, match=known):
        place(scaled_object(), tpl)


def test_gpus_summed_over_containers_limits_when_no_request() -> None:
    tpl = template(
        annotations={NODEPOOL_ANNOTATION: "gpu-a10"},
        containers=[
            {"name": "a", "resources": {"requests": {"nvidia.com/gpu": 1}}},
            {"name": "b", "resources": {"limits": {"nvidia.com/gpu": "4"}}},
            {"name": "c"},
        ],
    )
    assert place(scaled_object(), tpl).gpus_per_replica == 5


@pytest.mark.parametrize(
    ("containers", "field"),
    [
        ([{"name": "a", "resources": {"requests": {"cpu": "1"}}}], "no container requests"),
        ([{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "0"}}}], "no container"),
        (
            [{"name": "a", "resources": {"requests": {"nvidia.com/gpu": "500m"}}}],
            r"spec.containers\[0\].resources.requests\['nvidia.com/gpu'\] is '500m'",
        ),
        (
            [{"name": "a", "resources": {"limits": {"nvidia.com/gpu": 1.5}}}],
            r"spec.containers\[0\].resources.limits\['nvidia.com/gpu'\] is 1.5",
        ),
        ([], "no container requests"),
    ],
)
def test_gpus_must_be_whole_and_positive(containers: list[dict[str, Any]], field: str) -> None:
    tpl = template(annotations={NODEPOOL_ANNOTATION: "gpu-a10"}, containers=containers)
    with pytest.raises(PlacementError, match=field):
        place(scaled_object(), tpl)


def test_wrong_shapes_name_the_field() -> None:
    with pytest.raises(PlacementError, match=r"spec.nodeSelector is list"):
        place(scaled_object(), {"spec": {"nodeSelector": ["karpenter.sh/nodepool"]}})
    with pytest.raises(PlacementError, match=r"ScaledObject annotation .*nodepool is ' '"):
        place(scaled_object({NODEPOOL_ANNOTATION: " "}), template())


def test_max_replicas_is_the_scaled_objects_max_replica_count_else_kedas_default() -> None:
    tpl = template(node_selector={"karpenter.sh/nodepool": "gpu-a10"})
    assert place(scaled_object(), tpl).max_replicas == 100  # KEDA's default when unset
    so = {**scaled_object(), "spec": {"maxReplicaCount": 40}}
    assert place(so, tpl).max_replicas == 40
    assert place({**so, "spec": {"maxReplicaCount": 0}}, tpl).max_replicas == 0


@pytest.mark.parametrize("value", [-1, "40", 4.5, True])
def test_a_bad_max_replica_count_is_a_placement_error(value: object) -> None:
    tpl = template(node_selector={"karpenter.sh/nodepool": "gpu-a10"})
    so = {**scaled_object(), "spec": {"maxReplicaCount": value}}
    with pytest.raises(PlacementError, match="maxReplicaCount"):
        place(so, tpl)


def test_no_nodepool_error_names_the_annotation() -> None:
    with pytest.raises(PlacementError) as info:
        place(scaled_object(), template())
    assert NODEPOOL_ANNOTATION in str(info.value)
    assert "{NODEPOOL_ANNOTATION}" not in str(info.value)
