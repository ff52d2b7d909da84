"""The listed NodePools, Nodes, Pods and placeholder Deployments summed into the planner's values:
GPUs Ready and in use per NodePool, what each placeholder holds, each pod's workload and GPUs.
Pure: plain dicts (as the API sends them) in, values out; malformed fields count as absent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_queue_scaler.companion.inputs import NODEPOOL_LABEL
from gpu_queue_scaler.companion.model import (
    GPU_RESOURCE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODEPOOL_ANNOTATION,
    NodePoolState,
)
from gpu_queue_scaler.companion.packing import DELETION_COST_ANNOTATION, PackPod
from gpu_queue_scaler.companion.patches import written_template_hash

# Pods that hold or are getting GPUs; the API server filters the rest out (Unknown is kept for
# the list and dropped here).
LIVE_PHASES = ("Pending", "Running")
LIVE_PHASES_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


def as_dict(value: object) -> dict[str, Any]:
    """A field that should be an object; anything else reads as an empty one."""
    return value if isinstance(value, dict) else {}


def _gpus(value: object) -> int:
    """An nvidia.com/gpu quantity as stored ("4", 4); anything else counts as none."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return 0


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod holds: its containers' requests (limits when no request), or the largest init
    container's if more, as the scheduler counts it."""

    def one(container: object) -> int:
        resources = as_dict(as_dict(container).get("resources"))
        requests, limits = as_dict(resources.get("requests")), as_dict(resources.get("limits"))
        return _gpus(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE)))

    spec = as_dict(pod.get("spec"))
    running = sum(one(c) for c in spec.get("containers") or [])
    init = max((one(c) for c in spec.get("initContainers") or []), default=0)
    return max(running, init)


def _labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    return as_dict(as_dict(obj.get("metadata")).get("labels"))


def _is_placeholder(obj: Mapping[str, Any]) -> bool:
    return _labels(obj).get(MANAGED_BY_LABEL) == MANAGED_BY


def _phase(pod: Mapping[str, Any]) -> object:
    return as_dict(pod.get("status")).get("phase")


def _terminating(pod: Mapping[str, Any]) -> bool:
    return as_dict(pod.get("metadata")).get("deletionTimestamp") is not None


def _node_ready(node: Mapping[str, Any]) -> bool:
    for condition in as_dict(node.get("status")).get("conditions") or []:
        if as_dict(condition).get("type") == "Ready":
            return as_dict(condition).get("status") == "True"
    return False


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against labels, as the API server does.
    An empty selector matches nothing here: a Deployment always has one."""
    match_labels = as_dict(selector.get("matchLabels"))
    expressions = [as_dict(e) for e in selector.get("matchExpressions") or []]
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, op, values = str(expr.get("key")), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if (
            (op == "In" and (not present or labels[key] not in values))
            or (op == "NotIn" and present and labels[key] in values)
            or (op == "Exists" and not present)
            or (op == "DoesNotExist" and present)
        ):
            return False
    return True


def placeholder_nodepool(deployment: Mapping[str, Any]) -> str | None:
    """The NodePool a placeholder Deployment fills: its pods' nodeSelector, else its label or
    annotation."""
    spec = as_dict(as_dict(as_dict(deployment.get("spec")).get("template")).get("spec"))
    found = as_dict(spec.get("nodeSelector")).get(NODEPOOL_LABEL)
    if found is None:
        found = _labels(deployment).get(NODEPOOL_LABEL)
    if found is None:
        meta = as_dict(deployment.get("metadata"))
        found = as_dict(meta.get("annotations")).get(NODEPOOL_ANNOTATION)
    return found if isinstance(found, str) and found else None


def _limit(value: object) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Held:
    """A placeholder Deployment as read: its name, replicas, GPUs per pod and template hash."""

    name: str
    replicas: int
    gpus: int
    template: str | None


def pool_state(
    nodepool: Mapping[str, Any],
    ready_gpus: int,
    running_gpus: int,
    held: Mapping[str, Held],
) -> NodePoolState:
    """One NodePool object with its counted GPUs and its placeholder (if `held` has one)."""
    meta = as_dict(nodepool.get("metadata"))
    name = str(meta.get("name"))
    spec = as_dict(nodepool.get("spec"))
    budgets = as_dict(spec.get("disruption")).get("budgets") or []
    found = held.get(name)
    return NodePoolState(
        name=name,
        ready_gpus=ready_gpus,
        running_gpus=running_gpus,
        gpu_limit=_limit(as_dict(spec.get("limits")).get(GPU_RESOURCE)),
        budgets=tuple(as_dict(b) for b in budgets),
        annotations={str(k): str(v) for k, v in as_dict(meta.get("annotations")).items()},
        placeholders=None if found is None else found.replicas,
        placeholder_gpus=1 if found is None else found.gpus,
        placeholder_template=None if found is None else found.template,
    )


@dataclass(frozen=True)
class Inventory:
    """The four lists summed: each NodePool's state, what writes and Events need of it, and the
    live pods a workload's placement and packing read."""

    pools: dict[str, NodePoolState]
    resource_versions: dict[str, str]  # NodePool -> resourceVersion
    uids: dict[str, str]  # NodePool -> uid (for Events)
    placeholder_names: dict[str, str]  # NodePool -> Deployment
    node_pool: dict[str, str]  # node name -> its NodePool
    # Live workload pods: not placeholders, Pending or Running, not terminating.
    live: tuple[Mapping[str, Any], ...]


def inventory(
    nodepools: Sequence[Mapping[str, Any]],
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    placeholders: Sequence[Mapping[str, Any]],
) -> Inventory:
    """NodePools with their Ready nodes' allocatable GPUs, the GPUs their pods use, and their
    placeholder Deployment's replicas, GPUs per pod and template."""
    node_pool: dict[str, str] = {}
    ready: dict[str, int] = {}
    for node in nodes:
        pool = _labels(node).get(NODEPOOL_LABEL)
        name = as_dict(node.get("metadata")).get("name")
        if not isinstance(pool, str) or not isinstance(name, str):
            continue
        node_pool[name] = pool
        if _node_ready(node):
            allocatable = as_dict(as_dict(node.get("status")).get("allocatable"))
            ready[pool] = ready.get(pool, 0) + _gpus(allocatable.get(GPU_RESOURCE))

    real = [p for p in pods if not _is_placeholder(p)]
    # GPUs in use on a pool: pods bound to its nodes (Running, or Pending while their
    # containers start: the GPU is allocated at admission), terminating ones too.
    used: dict[str, int] = {}
    for pod in (p for p in real if _phase(p) in LIVE_PHASES):
        pool = node_pool.get(str(as_dict(pod.get("spec")).get("nodeName")))
        if pool is not None:
            used[pool] = used.get(pool, 0) + pod_gpus(pod)

    held: dict[str, Held] = {}
    for deployment in placeholders:
        pool = placeholder_nodepool(deployment)
        meta = as_dict(deployment.get("metadata"))
        name = meta.get("name")
        if pool is None or not isinstance(name, str) or not _is_placeholder(deployment):
            continue
        replicas = as_dict(deployment.get("spec")).get("replicas")
        template = as_dict(as_dict(deployment.get("spec")).get("template"))
        held[pool] = Held(
            name,
            replicas if isinstance(replicas, int) else 1,
            max(1, pod_gpus(template)),
            written_template_hash(deployment),
        )

    pools: dict[str, NodePoolState] = {}
    versions: dict[str, str] = {}
    uids: dict[str, str] = {}
    for nodepool in nodepools:
        meta = as_dict(nodepool.get("metadata"))
        name = meta.get("name")
        if not isinstance(name, str):
            continue
        pools[name] = pool_state(nodepool, ready.get(name, 0), used.get(name, 0), held)
        if isinstance(meta.get("resourceVersion"), str):
            versions[name] = meta["resourceVersion"]
        if isinstance(meta.get("uid"), str):
            uids[name] = meta["uid"]

    # A workload's live pods: Pending or Running, not terminating (Placement.live_pods).
    live = tuple(p for p in real if _phase(p) in LIVE_PHASES and not _terminating(p))
    return Inventory(
        pools=pools,
        resource_versions=versions,
        uids=uids,
        placeholder_names={pool: found.name for pool, found in held.items()},
        node_pool=node_pool,
        live=live,
    )


def workload_pods(
    live: Sequence[Mapping[str, Any]], namespace: str, selector: Mapping[str, Any]
) -> list[str]:
    """The names of the live pods in `namespace` that a Deployment's `selector` selects."""
    return [
        str(as_dict(pod.get("metadata")).get("name"))
        for pod in live
        if as_dict(pod.get("metadata")).get("namespace") == namespace
        and selector_matches(selector, _labels(pod))
    ]


def pack_pods(
    live: Sequence[Mapping[str, Any]],
    node_pool: Mapping[str, str],
    pools: set[str],
    owners: Mapping[tuple[str, str], str],
) -> list[PackPod]:
    """Live GPU pods bound to a known NodePool's node, sorted, with their workload (if one
    of the placed workloads' Deployments selects them) and their deletion cost as found."""
    found: list[PackPod] = []
    for pod in live:
        meta = as_dict(pod.get("metadata"))
        namespace, name = meta.get("namespace"), meta.get("name")
        node = as_dict(pod.get("spec")).get("nodeName")
        pool = node_pool.get(node) if isinstance(node, str) else None
        if (
            not isinstance(namespace, str)
            or not isinstance(name, str)
            or not isinstance(node, str)
            or pool not in pools
            or pod_gpus(pod) == 0
        ):
            continue
        cost = as_dict(meta.get("annotations")).get(DELETION_COST_ANNOTATION)
        found.append(
            PackPod(
                namespace=namespace,
                name=name,
                node=node,
                nodepool=str(pool),
                workload=owners.get((namespace, name)),
                deletion_cost=None if cost is None else str(cost),
            )
        )
    return sorted(found, key=lambda p: (p.nodepool, p.node, p.namespace, p.name))
