"""Reading the cluster into one `ClusterView`: four lists (NodePools, Nodes, live Pods, the
placeholder Deployments), summed by `aggregate`, then each demanded workload's ScaledObject and
Deployment read into its `Placement`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_queue_scaler.companion.inputs import NODEPOOL_LABEL, PlacementError, placement
from gpu_queue_scaler.companion.kube.aggregate import (
    LIVE_PHASES_SELECTOR,
    as_dict,
    inventory,
    pack_pods,
    workload_pods,
)
from gpu_queue_scaler.companion.kube.client import (
    KEDA_GROUP,
    KEDA_VERSION,
    NODEPOOL_PLURAL,
    SCALEDOBJECT_PLURAL,
    KubeClient,
)
from gpu_queue_scaler.companion.model import MANAGED_BY, MANAGED_BY_LABEL, NodePoolState, Placement
from gpu_queue_scaler.companion.packing import PackPod
from gpu_queue_scaler.companion.patches import NODEPOOL_GROUP, NODEPOOL_VERSION


@dataclass(frozen=True)
class ClusterView:
    """One consistent-enough read of the cluster: the planner's inputs plus what writes need."""

    pools: dict[str, NodePoolState]
    placements: dict[str, Placement]
    problems: tuple[str, ...] = ()  # per-workload placement errors (the workload is skipped)
    resource_versions: dict[str, str] = field(default_factory=dict)  # NodePool -> resourceVersion
    uids: dict[str, str] = field(default_factory=dict)  # NodePool -> uid (for Events)
    placeholder_names: dict[str, str] = field(default_factory=dict)  # NodePool -> Deployment
    # Live GPU pods bound to the known NodePools' nodes (not placeholders, not terminating), each
    # with the workload it belongs to if any: what packing (gpu_queue_scaler.companion.packing)
    # reads.
    pack_pods: tuple[PackPod, ...] = ()


class Reads(KubeClient):
    """The companion's reads. `read_sync` blocks; `read` runs it in a worker thread."""

    def read_sync(self, workloads: Iterable[str]) -> ClusterView:
        """NodePools, their Ready nodes' GPUs, the GPUs in use, placeholders, and where each
        of `workloads` ("namespace/name" of ScaledObjects) is placed, with its live pods."""
        s = self.settings
        nodepools = self._items(
            "listing NodePools (karpenter.sh/v1)",
            self._custom.list_cluster_custom_object,
            NODEPOOL_GROUP,
            NODEPOOL_VERSION,
            NODEPOOL_PLURAL,
        )
        nodes = self._items(
            "listing Nodes labelled karpenter.sh/nodepool",
            self._core.list_node,
            label_selector=NODEPOOL_LABEL,
        )
        pods = self._items(
            "listing Pending and Running Pods",
            self._core.list_pod_for_all_namespaces,
            field_selector=LIVE_PHASES_SELECTOR,
        )
        placeholders = self._items(
            f"listing placeholder Deployments in {s.namespace}",
            self._apps.list_namespaced_deployment,
            s.namespace,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
        )
        found = inventory(nodepools, nodes, pods, placeholders)
        known = set(found.pools)
        owners: dict[tuple[str, str], str] = {}
        placements, problems = self._placements(workloads, known, found.live, owners)
        return ClusterView(
            pools=found.pools,
            placements=placements,
            problems=tuple(problems),
            resource_versions=found.resource_versions,
            uids=found.uids,
            placeholder_names=found.placeholder_names,
            pack_pods=tuple(pack_pods(found.live, found.node_pool, known, owners)),
        )

    def _placements(
        self,
        workloads: Iterable[str],
        known: set[str],
        live_pods: Sequence[Mapping[str, Any]],
        owners: dict[tuple[str, str], str] | None = None,
    ) -> tuple[dict[str, Placement], list[str]]:
        """Each demanded workload's ScaledObject -> its Deployment's pod template -> Placement.
        A missing object or an unplaceable workload is a problem of that workload only. `owners`
        gets (namespace, pod name) -> workload for each placed workload's live pods (the first
        workload by name if two Deployments' selectors overlap)."""
        placements: dict[str, Placement] = {}
        problems: list[str] = []
        for workload in sorted(set(workloads)):
            namespace, _, name = workload.partition("/")
            scaled = self._get_or_none(
                f"reading ScaledObject {workload}",
                self._custom.get_namespaced_custom_object,
                KEDA_GROUP,
                KEDA_VERSION,
                namespace,
                SCALEDOBJECT_PLURAL,
                name,
            )
            if scaled is None:
                problems.append(f"{workload}: ScaledObject not found")
                continue
            target = as_dict(as_dict(scaled.get("spec")).get("scaleTargetRef"))
            kind = target.get("kind") or "Deployment"
            api_version = target.get("apiVersion") or "apps/v1"
            target_name = target.get("name")
            if kind != "Deployment" or api_version != "apps/v1" or not isinstance(target_name, str):
                problems.append(
                    f"{workload}: scaleTargetRef {api_version} {kind} {target_name!r} is not "
                    "supported; expected an apps/v1 Deployment"
                )
                continue
            deployment = self._get_or_none(
                f"reading Deployment {namespace}/{target_name}",
                self._apps.read_namespaced_deployment,
                target_name,
                namespace,
            )
            if deployment is None:
                problems.append(f"{workload}: Deployment {namespace}/{target_name} not found")
                continue
            spec = as_dict(deployment.get("spec"))
            mine = workload_pods(live_pods, namespace, as_dict(spec.get("selector")))
            try:
                placements[workload] = placement(
                    workload, scaled, as_dict(spec.get("template")), known, len(mine)
                )
            except PlacementError as exc:
                problems.append(str(exc))
                continue
            if owners is not None:
                for pod_name in mine:
                    owners.setdefault((namespace, pod_name), workload)
        return placements, problems

    async def read(self, workloads: Iterable[str]) -> ClusterView:
        import asyncio

        return await asyncio.to_thread(self.read_sync, list(workloads))
