"""The companion's Kubernetes edge: read NodePools, Nodes, Pods, ScaledObjects; write patches.

Everything the planner needs is read into values (`ClusterView`); everything it wants is written
back as the smallest change: a JSON merge patch of the NodePool fields the companion owns (sent
with fieldValidation=Strict, so a misspelt field fails instead of being pruned) and the replicas of
one placeholder Deployment per NodePool. The sync `kubernetes` client runs in worker threads so
the event loop stays free; every request has a timeout.

Retries (tenacity, jittered exponential backoff, a few attempts): 409 Conflict, 429, 5xx, timeouts
and connection errors. Other 4xx are not retried: they will not heal by themselves. When retries
run out the pass stops with `KubeError`; the caller keeps its last good state and tries again next
pass. A retried NodePool patch re-reads the NodePool first and recomputes the patch, so a conflict
with another writer (or a patch that did land before a timeout) is never blindly re-sent.

Write order per NodePool, so that a failure between two writes leaves the cluster safe: when the
plan wants the peak budget (protection on), the NodePool patch goes first and the placeholders
after; otherwise (protection off, or none) the placeholders go first and the NodePool patch after.
So budgets are added before capacity moves and removed only after placeholders are scaled, and a
lowered GPU limit never lands before its placeholders are gone. A failure stops the pass.

Packing comes after every NodePool (`pack_sync`): per workload pod whose
controller.kubernetes.io/pod-deletion-cost differs from its node's fullness, a JSON merge patch of
only that annotation (scaler.companion.packing; at most CompanionConfig.pack_max_writes per pass),
retried as above; a pod gone since the read (404) is skipped. No Event per pod: a log line each.

Only the leader of a coordination.k8s.io/v1 Lease writes; on shutdown it gives the Lease up
(holderIdentity null) so a standby takes over at its next pass instead of after the lease
duration. With dry_run nothing is sent at all (not even the Lease): each write is printed as one
JSON line with its target.

Every API call this module makes is listed in `API_ACCESS` (group, resource, verb, scope);
deploy/companion/rbac.yaml grants exactly that set, and the tests check both sides: the manifest
against the constant (tests/test_manifests.py) and every request the companion sends to the API
emulator against it (tests/test_companion_kube.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from scaler.companion.inputs import NODEPOOL_LABEL, PlacementError, placement
from scaler.companion.model import (
    GPU_RESOURCE,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NODEPOOL_ANNOTATION,
    CompanionConfig,
    NodePoolPlan,
    NodePoolState,
    Placement,
)
from scaler.companion.packing import DELETION_COST_ANNOTATION, CostChange, PackPod
from scaler.companion.patches import (
    NODEPOOL_API_VERSION,
    NODEPOOL_GROUP,
    NODEPOOL_VERSION,
    PAUSE_IMAGE,
    nodepool_patch,
    placeholder_deployment,
    placeholder_scale_patch,
    placeholder_template_patch,
    written_template_hash,
)
from scaler.companion.plan import is_peak_budget

log = logging.getLogger(__name__)

NODEPOOL_PLURAL = "nodepools"
KEDA_GROUP, KEDA_VERSION, SCALEDOBJECT_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
MERGE_PATCH = "application/merge-patch+json"
STRICT = "Strict"
FIELD_MANAGER = MANAGED_BY

# Pods that hold or are getting GPUs; the API server filters the rest out (Unknown is kept for
# the list and dropped here).
LIVE_PHASES = ("Pending", "Running")
LIVE_PHASES_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"

# Scopes of API_ACCESS: where the permission must hold.
CLUSTER = "cluster"  # any namespace, or cluster-scoped objects (ClusterRole)
NAMESPACE = "namespace"  # the companion's --namespace only (Role there)
LEASE = "lease"  # the companion's --namespace, on the Lease named --lease-name only
EVENTS = "events"  # the --event-namespace only (Role there)
# Every request this module sends, as (API group, resource, verb, scope): RBAC must grant exactly
# these (deploy/companion/rbac.yaml; tests/test_manifests.py compares the two).
API_ACCESS: frozenset[tuple[str, str, str, str]] = frozenset(
    {
        # read_sync lists NodePools; a retried patch re-gets one; patches touch only the fields
        # the companion owns (patches.nodepool_patch).
        (NODEPOOL_GROUP, NODEPOOL_PLURAL, "list", CLUSTER),
        (NODEPOOL_GROUP, NODEPOOL_PLURAL, "get", CLUSTER),
        (NODEPOOL_GROUP, NODEPOOL_PLURAL, "patch", CLUSTER),
        ("", "nodes", "list", CLUSTER),  # Ready nodes per NodePool and their allocatable GPUs
        ("", "pods", "list", CLUSTER),  # live pods: GPUs in use, each workload's live replicas
        # the workloads' pods: a merge patch of only the pod-deletion-cost annotation (packing)
        ("", "pods", "patch", CLUSTER),
        (KEDA_GROUP, SCALEDOBJECT_PLURAL, "get", CLUSTER),  # scaleTargetRef, maxReplicaCount
        ("apps", "deployments", "get", CLUSTER),  # a workload's pod template, in its namespace
        ("apps", "deployments", "list", NAMESPACE),  # the placeholder Deployments
        ("apps", "deployments", "create", NAMESPACE),
        ("apps", "deployments", "patch", NAMESPACE),  # placeholder replicas only
        ("coordination.k8s.io", "leases", "get", LEASE),
        ("coordination.k8s.io", "leases", "update", LEASE),  # renew, release
        ("coordination.k8s.io", "leases", "create", NAMESPACE),  # cannot be limited to a name
        ("", "events", "create", EVENTS),
    }
)


class KubeError(Exception):
    """A read or write against the Kubernetes API failed (after retries); names what and why."""


@dataclass(frozen=True)
class KubeSettings:
    """Where the companion lives and how hard it tries; the CLI's flags."""

    namespace: str
    identity: str
    lease_name: str = "gpu-queue-scaler-companion"
    lease_duration_s: int = 45  # the CLI's --lease-duration default and deploy/companion's
    placeholder_image: str = PAUSE_IMAGE
    priority_class: str = "gpu-placeholder"  # deploy/companion/priorityclass.yaml
    taint_key: str = GPU_RESOURCE
    # Events about a cluster-scoped NodePool go to `default`, as client-go's recorder puts them,
    # so `kubectl describe nodepool` shows them.
    event_namespace: str = "default"
    request_timeout_s: float = 10.0
    attempts: int = 4
    backoff_s: float = 0.5  # first jittered wait; doubles per attempt up to backoff_max_s
    backoff_max_s: float = 4.0
    dry_run: bool = False


@dataclass(frozen=True)
class Held:
    """A placeholder Deployment as read: its name, replicas, GPUs per pod and template hash."""

    name: str
    replicas: int
    gpus: int
    template: str | None


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
    # with the workload it belongs to if any: what packing (scaler.companion.packing) reads.
    pack_pods: tuple[PackPod, ...] = ()


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


# --- small readers -------------------------------------------------------------------------------


def _dict(value: object) -> dict[str, Any]:
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
        resources = _dict(_dict(container).get("resources"))
        requests, limits = _dict(resources.get("requests")), _dict(resources.get("limits"))
        return _gpus(requests.get(GPU_RESOURCE, limits.get(GPU_RESOURCE)))

    spec = _dict(pod.get("spec"))
    running = sum(one(c) for c in spec.get("containers") or [])
    init = max((one(c) for c in spec.get("initContainers") or []), default=0)
    return max(running, init)


def _labels(obj: Mapping[str, Any]) -> dict[str, Any]:
    return _dict(_dict(obj.get("metadata")).get("labels"))


def _is_placeholder(obj: Mapping[str, Any]) -> bool:
    return _labels(obj).get(MANAGED_BY_LABEL) == MANAGED_BY


def _phase(pod: Mapping[str, Any]) -> object:
    return _dict(pod.get("status")).get("phase")


def _terminating(pod: Mapping[str, Any]) -> bool:
    return _dict(pod.get("metadata")).get("deletionTimestamp") is not None


def _node_ready(node: Mapping[str, Any]) -> bool:
    for condition in _dict(node.get("status")).get("conditions") or []:
        if _dict(condition).get("type") == "Ready":
            return _dict(condition).get("status") == "True"
    return False


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions) against labels, as the API server does.
    An empty selector matches nothing here: a Deployment always has one."""
    match_labels = _dict(selector.get("matchLabels"))
    expressions = [_dict(e) for e in selector.get("matchExpressions") or []]
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
    spec = _dict(_dict(_dict(deployment.get("spec")).get("template")).get("spec"))
    found = _dict(spec.get("nodeSelector")).get(NODEPOOL_LABEL)
    if found is None:
        found = _labels(deployment).get(NODEPOOL_LABEL)
    if found is None:
        meta = _dict(deployment.get("metadata"))
        found = _dict(meta.get("annotations")).get(NODEPOOL_ANNOTATION)
    return found if isinstance(found, str) and found else None


def _limit(value: object) -> str | None:
    return None if value is None else str(value)


def micro_time(at: float) -> str:
    """A Lease MicroTime (RFC 3339, microseconds, UTC). A whole second gets 1 µs: newer clients
    re-serialise it with isoformat(), which drops a zero fraction, and the API server's MicroTime
    parser requires one."""
    stamp = datetime.fromtimestamp(at, UTC)
    if stamp.microsecond == 0:
        stamp = stamp.replace(microsecond=1)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(value: object) -> float | None:
    """An RFC 3339 time as written by any client (Z or offset, with or without fraction)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _retryable(exc: BaseException) -> bool:
    """Conflicts, throttling, server errors, timeouts and connection errors may heal."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        return status in (409, 429) or status >= 500
    return isinstance(exc, HTTPError | OSError)


def _describe(what: str, exc: BaseException) -> KubeError:
    from kubernetes.client.exceptions import ApiException

    if isinstance(exc, ApiException):
        detail = ""
        try:
            detail = str(json.loads(exc.body or "{}").get("message") or "")
        except (ValueError, AttributeError):
            detail = ""
        text = f"kubernetes API: {what}: {exc.status} {exc.reason}"
        return KubeError(f"{text}: {detail}"[:400] if detail else text)
    cause = getattr(exc, "reason", None) or exc
    return KubeError(f"kubernetes API unreachable {what}: {type(exc).__name__}: {cause}"[:400])


# --- the client ----------------------------------------------------------------------------------


class Kube:
    """Reads and writes for one companion. Methods named `*_sync` block; the async ones run
    them in a worker thread."""

    def __init__(
        self,
        api_client: Any,
        settings: KubeSettings,
        *,
        out: Callable[[str], None] = print,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from kubernetes import client

        self.settings = settings
        self._out = out
        self._clock = clock
        # Any: bodies are sent as plain dicts (kept exactly as built and tested); newer clients
        # type them as models and convert a dict at the call.
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._core: Any = client.CoreV1Api(api_client)
        self._apps: Any = client.AppsV1Api(api_client)
        self._coordination: Any = client.CoordinationV1Api(api_client)
        self._leader_until = 0.0  # wall clock until which our Lease is known to be ours
        self.events_failed = 0  # Events that could not be created (best effort; counted)

    # --- plumbing

    def _retrying(self, what: str) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "attempt %d failed, retrying: %s",
                state.attempt_number,
                _describe(what, error) if error is not None else what,
                extra={"event": "kube_retry", "what": what, "attempt": state.attempt_number},
            )

        s = self.settings
        return Retrying(
            stop=stop_after_attempt(max(1, s.attempts)),
            wait=wait_random_exponential(multiplier=s.backoff_s, max=s.backoff_max_s),
            retry=retry_if_exception(_retryable),
            reraise=True,
            before_sleep=before_sleep,
        )

    def _call(self, what: str, fn: Callable[[int], Any], *, retry: bool = True) -> Any:
        """fn(attempt number), retried as documented above; any failure -> KubeError(what)."""
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            if not retry:
                return fn(1)
            for attempt in self._retrying(what):
                with attempt:
                    result = fn(attempt.retry_state.attempt_number)
                if not attempt.retry_state.outcome or not attempt.retry_state.outcome.failed:
                    return result
        except (ApiException, HTTPError, OSError, ValueError) as exc:
            raise _describe(what, exc) from None
        raise KubeError(f"kubernetes API: {what}: gave up")  # pragma: no cover (reraise=True)

    @staticmethod
    def _json(response: Any) -> dict[str, Any]:
        """The body of a `_preload_content=False` response as a dict."""
        found = json.loads(response.data or b"{}")
        if not isinstance(found, dict):
            raise ValueError(f"expected a JSON object, got {type(found).__name__}")
        return found

    def _get(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        timeout = self.settings.request_timeout_s
        found: dict[str, Any] = self._call(
            what,
            lambda _: self._json(
                fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            ),
        )
        return found

    def _items(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        return [_dict(item) for item in self._get(what, fn, *args, **kwargs).get("items") or []]

    # --- reads

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

        node_pool: dict[str, str] = {}
        ready: dict[str, int] = {}
        for node in nodes:
            pool = _labels(node).get(NODEPOOL_LABEL)
            name = _dict(node.get("metadata")).get("name")
            if not isinstance(pool, str) or not isinstance(name, str):
                continue
            node_pool[name] = pool
            if _node_ready(node):
                allocatable = _dict(_dict(node.get("status")).get("allocatable"))
                ready[pool] = ready.get(pool, 0) + _gpus(allocatable.get(GPU_RESOURCE))

        real = [p for p in pods if not _is_placeholder(p)]
        # GPUs in use on a pool: pods bound to its nodes (Running, or Pending while their
        # containers start: the GPU is allocated at admission), terminating ones too.
        used: dict[str, int] = {}
        for pod in (p for p in real if _phase(p) in LIVE_PHASES):
            pool = node_pool.get(str(_dict(pod.get("spec")).get("nodeName")))
            if pool is not None:
                used[pool] = used.get(pool, 0) + pod_gpus(pod)

        held: dict[str, Held] = {}
        for deployment in placeholders:
            pool = placeholder_nodepool(deployment)
            meta = _dict(deployment.get("metadata"))
            name = meta.get("name")
            if pool is None or not isinstance(name, str) or not _is_placeholder(deployment):
                continue
            replicas = _dict(deployment.get("spec")).get("replicas")
            template = _dict(_dict(deployment.get("spec")).get("template"))
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
            meta = _dict(nodepool.get("metadata"))
            name = meta.get("name")
            if not isinstance(name, str):
                continue
            pools[name] = self._pool_state(nodepool, ready.get(name, 0), used.get(name, 0), held)
            if isinstance(meta.get("resourceVersion"), str):
                versions[name] = meta["resourceVersion"]
            if isinstance(meta.get("uid"), str):
                uids[name] = meta["uid"]

        # A workload's live pods: Pending or Running, not terminating (Placement.live_pods).
        live = [p for p in real if _phase(p) in LIVE_PHASES and not _terminating(p)]
        owners: dict[tuple[str, str], str] = {}
        placements, problems = self._placements(workloads, set(pools), live, owners)
        return ClusterView(
            pools=pools,
            placements=placements,
            problems=tuple(problems),
            resource_versions=versions,
            uids=uids,
            placeholder_names={pool: found.name for pool, found in held.items()},
            pack_pods=tuple(self._pack_pods(live, node_pool, set(pools), owners)),
        )

    @staticmethod
    def _pack_pods(
        live: Sequence[Mapping[str, Any]],
        node_pool: Mapping[str, str],
        pools: set[str],
        owners: Mapping[tuple[str, str], str],
    ) -> list[PackPod]:
        """Live GPU pods bound to a known NodePool's node, sorted, with their workload (if one
        of the placed workloads' Deployments selects them) and their deletion cost as found."""
        found: list[PackPod] = []
        for pod in live:
            meta = _dict(pod.get("metadata"))
            namespace, name = meta.get("namespace"), meta.get("name")
            node = _dict(pod.get("spec")).get("nodeName")
            pool = node_pool.get(node) if isinstance(node, str) else None
            if (
                not isinstance(namespace, str)
                or not isinstance(name, str)
                or not isinstance(node, str)
                or pool not in pools
                or pod_gpus(pod) == 0
            ):
                continue
            cost = _dict(meta.get("annotations")).get(DELETION_COST_ANNOTATION)
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

    @staticmethod
    def _pool_state(
        nodepool: Mapping[str, Any],
        ready_gpus: int,
        running_gpus: int,
        held: Mapping[str, Held],
    ) -> NodePoolState:
        meta = _dict(nodepool.get("metadata"))
        name = str(meta.get("name"))
        spec = _dict(nodepool.get("spec"))
        budgets = _dict(spec.get("disruption")).get("budgets") or []
        found = held.get(name)
        return NodePoolState(
            name=name,
            ready_gpus=ready_gpus,
            running_gpus=running_gpus,
            gpu_limit=_limit(_dict(spec.get("limits")).get(GPU_RESOURCE)),
            budgets=tuple(_dict(b) for b in budgets),
            annotations={str(k): str(v) for k, v in _dict(meta.get("annotations")).items()},
            placeholders=None if found is None else found.replicas,
            placeholder_gpus=1 if found is None else found.gpus,
            placeholder_template=None if found is None else found.template,
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
            target = _dict(_dict(scaled.get("spec")).get("scaleTargetRef"))
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
            spec = _dict(deployment.get("spec"))
            selector = _dict(spec.get("selector"))
            mine = [
                str(_dict(pod.get("metadata")).get("name"))
                for pod in live_pods
                if _dict(pod.get("metadata")).get("namespace") == namespace
                and selector_matches(selector, _labels(pod))
            ]
            try:
                placements[workload] = placement(
                    workload, scaled, _dict(spec.get("template")), known, len(mine)
                )
            except PlacementError as exc:
                problems.append(str(exc))
                continue
            if owners is not None:
                for pod_name in mine:
                    owners.setdefault((namespace, pod_name), workload)
        return placements, problems

    def _raw_get(self, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        """One GET whose 404 is an answer (None); other errors raise as they are (retryable)."""
        from kubernetes.client.exceptions import ApiException

        try:
            response = fn(
                *args, _preload_content=False, _request_timeout=self.settings.request_timeout_s
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._json(response)

    def _get_or_none(self, what: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._call(what, lambda _: self._raw_get(fn, *args))
        return found

    async def read(self, workloads: Iterable[str]) -> ClusterView:
        import asyncio

        return await asyncio.to_thread(self.read_sync, list(workloads))

    # --- leader election

    def elect_sync(self, now: float) -> bool:
        """Acquire or renew the Lease; True while we lead. Optimistic concurrency: every update
        carries the resourceVersion read, so of two racing companions one gets 409 and follows."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        what = f"Lease {s.namespace}/{s.lease_name}"
        timeout = s.request_timeout_s
        try:
            response = self._coordination.read_namespaced_lease(
                s.lease_name, s.namespace, _preload_content=False, _request_timeout=timeout
            )
            lease: dict[str, Any] | None = self._json(response)
        except ApiException as exc:
            if exc.status != 404:
                self._leader_until = 0.0
                raise _describe(f"reading {what}", exc) from None
            lease = None
        except Exception as exc:
            self._leader_until = 0.0
            raise _describe(f"reading {what}", exc) from None

        spec = _dict((lease or {}).get("spec"))
        holder = spec.get("holderIdentity")
        duration = spec.get("leaseDurationSeconds")
        renewed = parse_time(spec.get("renewTime"))
        expired = (
            not holder
            or renewed is None
            or not isinstance(duration, int)
            or renewed + duration < now
        )
        if lease is not None and holder != s.identity and not expired:
            self._leader_until = 0.0
            return False

        mine = holder == s.identity
        acquired = spec.get("acquireTime") if mine and spec.get("acquireTime") else micro_time(now)
        transitions = int(spec.get("leaseTransitions") or 0)
        body: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": s.lease_name, "namespace": s.namespace},
            "spec": {
                "holderIdentity": s.identity,
                "leaseDurationSeconds": s.lease_duration_s,
                "acquireTime": acquired,
                "renewTime": micro_time(now),
                "leaseTransitions": transitions + (0 if mine or lease is None else 1),
            },
        }
        try:
            if lease is None:
                self._coordination.create_namespaced_lease(
                    s.namespace, body, _request_timeout=timeout
                )
            else:
                meta = _dict(lease.get("metadata"))
                body["metadata"]["resourceVersion"] = meta.get("resourceVersion")
                self._coordination.replace_namespaced_lease(
                    s.lease_name, s.namespace, body, _request_timeout=timeout
                )
        except ApiException as exc:
            self._leader_until = 0.0
            if exc.status == 409:  # another companion wrote it first: it leads
                return False
            raise _describe(f"writing {what}", exc) from None
        except Exception as exc:
            self._leader_until = 0.0
            raise _describe(f"writing {what}", exc) from None
        if holder != s.identity:
            log.info("leading", extra={"event": "lease_acquired", "lease": what})
        self._leader_until = now + s.lease_duration_s
        return True

    async def elect(self, now: float) -> bool:
        import asyncio

        return await asyncio.to_thread(self.elect_sync, now)

    def release_sync(self, now: float) -> bool:
        """Give the Lease up if we hold it: holderIdentity null (an empty holder is expired to
        every companion), so a standby takes over at its next pass instead of after
        leaseDurationSeconds. True when released; never raises (shutdown must go on), and does
        nothing in dry-run or when another holds it (a 409 means someone else wrote it)."""
        from kubernetes.client.exceptions import ApiException

        s = self.settings
        self._leader_until = 0.0
        if s.dry_run:
            return False
        what = f"Lease {s.namespace}/{s.lease_name}"
        timeout = s.request_timeout_s
        try:
            response = self._coordination.read_namespaced_lease(
                s.lease_name, s.namespace, _preload_content=False, _request_timeout=timeout
            )
            lease = self._json(response)
            spec = _dict(lease.get("spec"))
            if spec.get("holderIdentity") != s.identity:
                return False
            released: dict[str, Any] = {
                "leaseDurationSeconds": spec.get("leaseDurationSeconds") or s.lease_duration_s,
                "renewTime": micro_time(now),
                "leaseTransitions": int(spec.get("leaseTransitions") or 0),
            }
            if spec.get("acquireTime"):
                released["acquireTime"] = spec["acquireTime"]
            meta = _dict(lease.get("metadata"))
            body: dict[str, Any] = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": s.lease_name,
                    "namespace": s.namespace,
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "spec": released,  # no holderIdentity: released
            }
            self._coordination.replace_namespaced_lease(
                s.lease_name, s.namespace, body, _request_timeout=timeout
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                log.warning(
                    "%s", _describe(f"releasing {what}", exc), extra={"event": "lease_error"}
                )
            return False
        except Exception as exc:
            log.warning("%s", _describe(f"releasing {what}", exc), extra={"event": "lease_error"})
            return False
        log.info("released the Lease", extra={"event": "lease_released", "lease": what})
        return True

    async def release(self, now: float) -> bool:
        import asyncio

        return await asyncio.to_thread(self.release_sync, now)

    # --- writes

    def _guard(self) -> None:
        """Never write past the Lease: a pass slower than the lease must not race a successor."""
        if not self.settings.dry_run and self._clock() >= self._leader_until:
            raise KubeError("not the leader (or the Lease expired during this pass): not writing")

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
                current = self._pool_state(fresh, pool.ready_gpus, pool.running_gpus, {})
                current = dataclasses.replace(
                    current,
                    placeholders=pool.placeholders,
                    placeholder_gpus=pool.placeholder_gpus,
                )
                again = nodepool_patch(current, plan)
                if again is None:
                    return False
                version = _dict(fresh.get("metadata")).get("resourceVersion")
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
            meta = dict(_dict(body.get("metadata")))
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
            name = str(_dict(body.get("metadata")).get("name"))
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
        event = self.event_body(view, write, message, now)
        try:
            self._call(
                f"creating Event for NodePool {write.nodepool}",
                lambda _: self._core.create_namespaced_event(
                    self.settings.event_namespace,
                    event,
                    _request_timeout=self.settings.request_timeout_s,
                ),
                retry=False,
            )
        except KubeError as exc:
            self.events_failed += 1
            log.warning("%s", exc, extra={"event": "event_failed", "nodepool": write.nodepool})

    def event_body(
        self, view: ClusterView, write: Write, message: str, now: float
    ) -> dict[str, Any]:
        s = self.settings
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, Any] = {
            "apiVersion": NODEPOOL_API_VERSION,
            "kind": "NodePool",
            "name": write.nodepool,
        }
        if write.nodepool in view.uids:
            involved["uid"] = view.uids[write.nodepool]
        reason = "CompanionPatched" if write.kind == "nodepool_patch" else "CompanionPlaceholders"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{write.nodepool}.{time.time_ns():x}",
                "namespace": s.event_namespace,
            },
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": "Normal",
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": MANAGED_BY},
            "reportingComponent": MANAGED_BY,
            "reportingInstance": s.identity[:128],
        }
