"""Pack scale-downs onto fewer nodes: `controller.kubernetes.io/pod-deletion-cost` per pod.

Why: when the HPA lowers a Deployment's replicas, the ReplicaSet controller picks which pods to
delete: unscheduled first, then pending, then not ready, then the LOWEST pod-deletion-cost, and
only then "doubled-up" pods (those sharing a node with more pods of the set). Without costs that
last rule deletes from the fullest nodes first, which spreads the fleet: after a partial
scale-down every GPU node stays part-full and Karpenter's WhenEmpty consolidation never removes
one (on the simulator, Azure conv x20: the scaler's nodes stayed at 6-7 where 4-5 would do). With
each pod's cost = the GPU pods on its node, the emptiest node's pods go first, so nodes empty
and the NodePool can drain, down to zero. (The annotation is beta and on by default since
Kubernetes 1.22.)

`pack(pods, limit)` is pure:

- every pod given (`PackPod`: the live, non-terminating, non-placeholder GPU pods bound to a node
  of a NodePool) counts towards its node's fullness, another app's pod too (it keeps the node up
  just the same); only the companion's workloads' pods (`workload` set) are ever annotated;
- the desired cost of a workload pod = the number of such pods on its node, as a decimal string;
- only pods whose annotation differs are returned (a missing or unparsable one differs), so a
  second pass with nothing changed returns nothing;
- at most `limit` changes per pass, the largest first: |desired - current| descending (a missing
  or unparsable annotation counts as 0, as the ReplicaSet reads it), then by NodePool, node,
  namespace and name. So a pod on a full node that is still unannotated, which the ReplicaSet
  would take for the emptiest, is fixed first, and the rest follow in later passes; a big
  cluster never gets more than `limit` PATCHes per pass.

Safe without fresh demand (fail static does not apply): the annotation scales nothing by itself.
It only orders the deletions the HPA has already decided (the replica count is KEDA's and the
HPA's), so a pod of a workload whose demand is unknown or stale is annotated as any other, and a
wrong or stale cost can at worst pick a worse pod to delete, never delete one more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpu_queue_scaler.companion.model import CompanionConfig

DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
MAX_COST_WRITES = CompanionConfig().pack_max_writes  # PATCHes per pass, by default


@dataclass(frozen=True)
class PackPod:
    """One live GPU pod bound to a NodePool's node, as read from Kubernetes."""

    namespace: str
    name: str
    node: str
    nodepool: str
    workload: str | None  # the companion's workload ("namespace/name" ScaledObject); None: other
    deletion_cost: str | None  # the annotation as found (None: absent)


@dataclass(frozen=True)
class CostChange:
    """A workload pod whose deletion cost must be written."""

    pod: PackPod
    cost: int  # the desired controller.kubernetes.io/pod-deletion-cost

    @property
    def value(self) -> str:
        return str(self.cost)

    @property
    def change(self) -> str:
        return f"deletion cost {self.pod.deletion_cost or 'unset'} -> {self.cost}"


def parse_cost(value: str | None) -> int | None:
    """The annotation as the ReplicaSet reads it: a 32-bit integer; None if absent or invalid."""
    if value is None:
        return None
    try:
        cost = int(value.strip())
    except ValueError:
        return None
    return cost if -(2**31) <= cost < 2**31 else None


def pack(pods: Iterable[PackPod], limit: int = MAX_COST_WRITES) -> list[CostChange]:
    """The workload pods whose deletion cost differs from their node's fullness, largest change
    first, at most `limit` (see the module's docstring)."""
    found = list(pods)
    per_node: dict[tuple[str, str], int] = {}
    for p in found:
        key = (p.nodepool, p.node)
        per_node[key] = per_node.get(key, 0) + 1
    changes: list[tuple[int, tuple[str, str, str, str], CostChange]] = []
    for p in found:
        if p.workload is None:
            continue
        cost = per_node[p.nodepool, p.node]
        if p.deletion_cost == str(cost):
            continue
        gap = abs(cost - (parse_cost(p.deletion_cost) or 0))
        changes.append((-gap, (p.nodepool, p.node, p.namespace, p.name), CostChange(p, cost)))
    changes.sort(key=lambda c: (c[0], c[1]))
    return [c for _, _, c in changes[: max(0, limit)]]
