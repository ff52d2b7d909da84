"""Writing the plan back as the smallest change: a JSON merge patch of the NodePool fields the
companion owns, the replicas of one placeholder Deployment per NodePool, and the workloads' pods'
deletion costs. With dry_run nothing is sent: each write is printed as one JSON line.

NodePool patches are sent with fieldValidation=Strict, so a misspelt field fails instead of being
pruned. A retried NodePool patch re-reads the NodePool first and recomputes the patch, so a
conflict with another writer (or a patch that did land before a timeout) is never blindly re-sent.

Write order per NodePool, so that a failure between two writes leaves the cluster safe: when the
plan wants the peak budget (protection on), the NodePool patch goes first and the placeholders
after; otherwise (protection off, or none) the placeholders go first and the NodePool patch after.
So budgets are added before capacity moves and removed only after placeholders are scaled, and a
lowered GPU limit never lands before its placeholders are gone. A failure stops the pass.

Packing comes after every NodePool (`pack_sync`): per workload pod whose
controller.kubernetes.io/pod-deletion-cost differs from its node's fullness, a JSON merge patch of
only that annotation (gpu_queue_scaler.companion.packing; at most CompanionConfig.pack_max_writes
per pass), retried as above; a pod gone since the read (404) is skipped. No Event per pod: a log
line each.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_queue_scaler.companion.kube.aggregate import as_dict, pool_state
from gpu_queue_scaler.companion.kube.client import (
    FIELD_MANAGER,
    MERGE_PATCH,
    NODEPOOL_PLURAL,
    STRICT,
    KubeError,
    log,
)
from gpu_queue_scaler.companion.kube.events import Events
from gpu_queue_scaler.companion.kube.lease import Leader
from gpu_queue_scaler.companion.kube.reads import ClusterView
from gpu_queue_scaler.companion.model import CompanionConfig, NodePoolPlan, NodePoolState
from gpu_queue_scaler.companion.packing import DELETION_COST_ANNOTATION, CostChange, PackPod
from gpu_queue_scaler.companion.patches import (
    NODEPOOL_API_VERSION,
    NODEPOOL_GROUP,
    NODEPOOL_VERSION,
    nodepool_patch,
    placeholder_deployment,
    placeholder_scale_patch,
    placeholder_template_patch,
    written_template_hash,
)
from gpu_queue_scaler.companion.plan import is_peak_budget


@dataclass(frozen=True)
class Write:
    """One write the companion sent (or, in dry-run, would send)."""

    # "nodepool_patch" | "placeholder_create" | "placeholder_scale" | "placeholder_resize" |
    # "placeholder_template" | "pod_deletion_cost"
    kind: str
    # e.g. "karpenter.sh/v1 NodePool gpu-a", "apps/v1 Deployment ns/name", "v1 Pod ns/name"
    target: str
    body: dict[str, Any]
    nodepool: str
    change: str  # "old -> new", for the log line and the Event

    def line(self) -> str:
        return json.dumps(
            {"kind": self.kind, "target": self.target, "body": self.body}, sort_keys=True
        )


class Writes(Leader, Events):
    """The companion's writes, each behind the Lease's guard and announced by a log line and an
    Event. `*_sync` block; the async ones run them in a worker thread."""

    def apply_sync(
        self,
        view: ClusterView,
        plans: Sequence[NodePoolPlan],
        config: CompanionConfig,
        now: float,
    ) -> list[Write]:
        """Send what differs between `view` and `plans`, in the documented order; the writes."""
        sent: list[Write] = []
        for plan in sorted(plans, key=lambda p: p.nodepool):
            pool = view.pools.get(plan.nodepool)
            if pool is None:
                log.warning(
                    "plan for NodePool %s, which was not read; skipped",
                    plan.nodepool,
                    extra={"event": "plan_unknown_nodepool", "nodepool": plan.nodepool},
                )
                continue
            sent.extend(self._apply_one(view, pool, plan, config, now))
        return sent

    def _apply_one(
        self,
        view: ClusterView,
        pool: NodePoolState,
        plan: NodePoolPlan,
        config: CompanionConfig,
        now: float,
    ) -> list[Write]:
        """One NodePool's writes: protection on -> NodePool first; otherwise placeholders first."""
        sent: list[Write] = []
        for step in (
            ("nodepool", "placeholders") if plan.peak_budget else ("placeholders", "nodepool")
        ):
            if step == "nodepool":
                write = self._nodepool(view, pool, plan)
            else:
                write = self._placeholders(view, pool, plan, config)
            if write is not None:
                sent.append(write)
                self._announce(view, write, plan, now)
        return sent

    async def apply(
        self,
        view: ClusterView,
        plans: Sequence[NodePoolPlan],
        config: CompanionConfig,
        now: float,
    ) -> list[Write]:
        import asyncio

        return await asyncio.to_thread(self.apply_sync, view, plans, config, now)

    def _nodepool(self, view: ClusterView, pool: NodePoolState, plan: NodePoolPlan) -> Write | None:
        patch = nodepool_patch(pool, plan)
        if patch is None:
            return None
        target = f"{NODEPOOL_API_VERSION} NodePool {pool.name}"
        first = self._nodepool_body(patch, view.resource_versions.get(pool.name))
        change = self._nodepool_change(pool, plan)
        if self.settings.dry_run:
            return self._print(Write("nodepool_patch", target, first, pool.name, change))
        timeout = self.settings.request_timeout_s
        sent: dict[str, Any] = {}

        def send(attempt: int) -> bool:
            body = first
            if attempt > 1:  # re-read: the last attempt may have landed, or someone else wrote
                fresh = self._raw_get(
                    self._custom.get_cluster_custom_object,
                    NODEPOOL_GROUP,
                    NODEPOOL_VERSION,
                    NODEPOOL_PLURAL,
                    pool.name,
                )
                if fresh is None:
                    raise KubeError(f"NodePool {pool.name} was deleted during the pass")
                current = pool_state(fresh, pool.ready_gpus, pool.running_gpus, {})
                current = dataclasses.replace(
                    current,
                    placeholders=pool.placeholders,
                    placeholder_gpus=pool.placeholder_gpus,
                )
                again = nodepool_patch(current, plan)
                if again is None:
                    return False
                version = as_dict(fresh.get("metadata")).get("resourceVersion")
                body = self._nodepool_body(again, version if isinstance(version, str) else None)
            self._guard()
            self._custom.patch_cluster_custom_object(
                NODEPOOL_GROUP,
                NODEPOOL_VERSION,
                NODEPOOL_PLURAL,
                pool.name,
                body,
                field_validation=STRICT,
                field_manager=FIELD_MANAGER,
                _content_type=MERGE_PATCH,
                _request_timeout=timeout,
            )
            sent["body"] = body
            return True

        if not self._call(f"patching NodePool {pool.name}", send):
            return None
        return Write("nodepool_patch", target, sent["body"], pool.name, change)

    @staticmethod
    def _nodepool_body(patch: Mapping[str, Any], version: str | None) -> dict[str, Any]:
        """The merge patch with apiVersion/kind (validatable, and the API server checks them) and
        the resourceVersion read: budgets are replaced whole, so a concurrent edit must 409."""
        body: dict[str, Any] = {"apiVersion": NODEPOOL_API_VERSION, "kind": "NodePool"}
        body.update(patch)
        if version is not None:
            meta = dict(as_dict(body.get("metadata")))
            meta["resourceVersion"] = version
            body["metadata"] = meta
        return body

    @staticmethod
    def _nodepool_change(pool: NodePoolState, plan: NodePoolPlan) -> str:
        parts = []
        if plan.gpu_limit is not None and plan.gpu_limit != pool.gpu_limit:
            parts.append(f"gpu limit {pool.gpu_limit} -> {plan.gpu_limit}")
        had = any(is_peak_budget(b) for b in pool.budgets)
        if had != plan.peak_budget:
            parts.append(
                f"peak budget {'on' if had else 'off'} -> {'on' if plan.peak_budget else 'off'}"
            )
        return "; ".join(parts) or "annotations"

    def _placeholders(
        self,
        view: ClusterView,
        pool: NodePoolState,
        plan: NodePoolPlan,
        config: CompanionConfig,
    ) -> Write | None:
        s = self.settings
        wanted, current = plan.placeholders, pool.placeholders
        body = placeholder_deployment(
            pool.name,
            wanted,
            config.placeholder_gpus,
            s.namespace,
            s.priority_class,
            s.placeholder_image,
            s.taint_key,
        )
        # A template written from other flags (image, priority class, taint key, GPUs per pod;
        # or by a companion that wrote no hash) is replaced: pods of another size would hold
        # the wrong number of GPUs (the plan counts config.placeholder_gpus each), and an old
        # priority class or toleration could leave them unschedulable or not preemptible.
        stale = current is not None and pool.placeholder_template != written_template_hash(body)
        if wanted == (current or 0) and not stale:
            return None
        change = f"placeholders {current or 0} -> {wanted}"
        timeout = s.request_timeout_s
        name = view.placeholder_names.get(pool.name)
        if current is None or name is None:
            name = str(as_dict(body.get("metadata")).get("name"))
            write = Write(
                "placeholder_create",
                f"apps/v1 Deployment {s.namespace}/{name}",
                body,
                pool.name,
                change,
            )
            if s.dry_run:
                return self._print(write)
            scale = placeholder_scale_patch(wanted)

            def create(_: int) -> None:
                from kubernetes.client.exceptions import ApiException

                self._guard()
                try:
                    self._apps.create_namespaced_deployment(
                        s.namespace,
                        body,
                        field_validation=STRICT,
                        field_manager=FIELD_MANAGER,
                        _request_timeout=timeout,
                    )
                except ApiException as exc:
                    if exc.status != 409:  # AlreadyExists: an earlier attempt landed; scale it
                        raise
                    self._patch_deployment(name, scale)

            self._call(f"creating placeholder Deployment {s.namespace}/{name}", create)
            return write

        scale = placeholder_scale_patch(wanted)
        kind = "placeholder_scale"
        if stale:
            scale = placeholder_template_patch(body)
            if pool.placeholder_gpus != config.placeholder_gpus:
                kind = "placeholder_resize"
                change = (
                    f"placeholders {current} x {pool.placeholder_gpus} GPU"
                    f" -> {wanted} x {config.placeholder_gpus} GPU"
                )
            else:
                kind = "placeholder_template"
                change += ", pod template replaced (image, priority class or taint key changed)"
        write = Write(kind, f"apps/v1 Deployment {s.namespace}/{name}", scale, pool.name, change)
        if s.dry_run:
            return self._print(write)

        def patch(_: int) -> None:
            self._guard()
            self._patch_deployment(name, scale)

        self._call(f"patching placeholder Deployment {s.namespace}/{name} ({change})", patch)
        return write

    def pack_sync(self, changes: Sequence[CostChange]) -> list[Write]:
        """A JSON merge patch of only the pod-deletion-cost annotation per changed pod (in the
        planner's order; printed in dry-run), each logged. A pod deleted since the read (404) is
        skipped; any other failure, after the retries, stops the pass (KubeError)."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        sent: list[Write] = []
        for c in changes:
            pod = c.pod
            body: dict[str, Any] = {
                "metadata": {"annotations": {DELETION_COST_ANNOTATION: c.value}}
            }
            write = Write(
                "pod_deletion_cost",
                f"v1 Pod {pod.namespace}/{pod.name}",
                body,
                pod.nodepool,
                c.change,
            )
            if s.dry_run:
                self._print(write)
            else:

                def patch(_: int, pod: PackPod = pod, body: dict[str, Any] = body) -> bool:
                    self._guard()
                    try:
                        self._core.patch_namespaced_pod(
                            pod.name,
                            pod.namespace,
                            body,
                            field_validation=STRICT,
                            field_manager=FIELD_MANAGER,
                            _content_type=MERGE_PATCH,
                            _request_timeout=s.request_timeout_s,
                        )
                    except ApiException as exc:
                        if exc.status == 404:  # gone since the read: nothing to order
                            return False
                        raise
                    return True

                if not self._call(f"patching Pod {pod.namespace}/{pod.name}", patch):
                    continue
            sent.append(write)
            log.info(
                "%s %s: %s (node %s)",
                "would send" if s.dry_run else "sent",
                write.target,
                c.change,
                pod.node,
                extra={
                    "event": "companion_write",
                    "kind": write.kind,
                    "nodepool": write.nodepool,
                    "change": write.change,
                    "dry_run": s.dry_run,
                },
            )
        return sent

    async def pack(self, changes: Sequence[CostChange]) -> list[Write]:
        import asyncio

        return await asyncio.to_thread(self.pack_sync, list(changes))

    def _patch_deployment(self, name: str, body: Mapping[str, Any]) -> None:
        s = self.settings
        self._apps.patch_namespaced_deployment(
            name,
            s.namespace,
            dict(body),
            field_validation=STRICT,
            field_manager=FIELD_MANAGER,
            _content_type=MERGE_PATCH,
            _request_timeout=s.request_timeout_s,
        )

    def _print(self, write: Write) -> Write:
        self._out(write.line())
        return write

    def _announce(self, view: ClusterView, write: Write, plan: NodePoolPlan, now: float) -> None:
        """A log line and a Kubernetes Event on the NodePool per change. The Event is best
        effort: losing it must not undo or fail a write that landed."""
        reasons = "; ".join(plan.reasons)
        message = f"{write.change} ({reasons})" if reasons else write.change
        log.info(
            "%s %s: %s",
            "would send" if self.settings.dry_run else "sent",
            write.target,
            message,
            extra={
                "event": "companion_write",
                "kind": write.kind,
                "nodepool": write.nodepool,
                "change": write.change,
                "dry_run": self.settings.dry_run,
            },
        )
        if self.settings.dry_run:
            return
        reason = "CompanionPatched" if write.kind == "nodepool_patch" else "CompanionPlaceholders"
        self._post_event(write.nodepool, view.uids.get(write.nodepool), reason, message, now)
