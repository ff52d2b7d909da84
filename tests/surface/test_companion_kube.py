"""The Karpenter companion's Kubernetes side against kmock's API emulator on loopback.

The real `kubernetes` client talks HTTP to a kmock KubernetesEmulator on 127.0.0.1 holding
NodePools, Nodes, Pods, Deployments, ScaledObjects and a Lease; the scaler's /decisions is served
by a stdlib HTTP server in a thread. The emulator is extended (`FakeApi`) with what the companion
relies on and kmock 0.8 does not do: resourceVersion (bumped per write; a stale one is 409), JSON
merge patches (RFC 7386: null deletes), Lease replacement (PUT) and injected faults (a status, a
count, a delay longer than the client's timeout). Every loop is bounded in count and time.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from gpu_queue_scaler.companion.kube import client as kube_client
from gpu_queue_scaler.companion.kube.aggregate import LIVE_PHASES_SELECTOR
from gpu_queue_scaler.companion.kube.client import KubeSettings
from gpu_queue_scaler.companion.kube.cluster import Kube
from gpu_queue_scaler.companion.kube.lease import micro_time, parse_time
from gpu_queue_scaler.companion.model import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PREVIOUS_BUDGETS_ANNOTATION,
    CompanionConfig,
)
from gpu_queue_scaler.companion.packing import DELETION_COST_ANNOTATION
from gpu_queue_scaler.companion.patches import peak_budget, placeholder_name
from gpu_queue_scaler.companion.run import Companion, PassResult, RunSettings
from tests.k8s_schema import merge_patch, validate_custom_resource, without_nulls
from tests.servers.base import write_reply

NODEPOOLS = "karpenter.sh/v1/nodepools"
NODES = "v1/nodes"
PODS = "v1/pods"
DEPLOYMENTS = "apps/v1/deployments"
SCALEDOBJECTS = "keda.sh/v1alpha1/scaledobjects"
LEASES = "coordination.k8s.io/v1/leases"
EVENTS = "v1/events"

COMPANION_NS = "gpu-scaler"
APP_NS = "inference"
POOL = "gpu-a"
WORKLOAD = f"{APP_NS}/llama"
USER_BUDGET = {"nodes": "10%"}
PLACEHOLDER = placeholder_name(POOL)
T0 = 1_700_000_000.0
MERGE_PATCH = "application/merge-patch+json"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback traffic never goes through a proxy from the environment."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


# --- the emulator ---------------------------------------------------------------------------------


@dataclass
class Fault:
    """Answer `status` (after `delay` s) to the next `times` requests that match."""

    method: str
    plural: str
    status: int
    times: int
    delay: float = 0.0

    def matches(self, request: Any) -> bool:
        resource = request.resource
        return (
            request.method == self.method
            and resource is not None
            and resource.plural == self.plural
        )


class FakeApi(kmock.KubernetesEmulator):
    """kmock's emulator, with resourceVersions, merge patches, Lease PUT and faults."""

    def setup(self) -> None:
        self.faults: list[Fault] = []
        self.version = 100

    def put(self, resource: str, obj: dict[str, Any]) -> None:
        meta = obj.setdefault("metadata", {})
        self.version += 1
        meta["resourceVersion"] = str(self.version)
        meta.setdefault("uid", f"uid-{meta['name']}")
        self.objects[resource, meta.get("namespace"), meta["name"]] = obj

    def get(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (kmock.resource(resource), namespace, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        found: dict[str, Any] = copy.deepcopy(self.objects[key].raw)
        return found

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        for fault in self.faults:
            if fault.times > 0 and fault.matches(request):
                fault.times -= 1
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                raise kmock.KubernetesError(
                    status=fault.status, reason="Injected", message=f"injected {fault.status}"
                )
        if request.resource is not None and request.method.value in ("POST", "PATCH", "PUT"):
            return self._write(request)
        return await super()._handle(request)

    def _write(self, request: Any) -> aiohttp.web.StreamResponse:
        res = request.resource
        resource = f"{res.group}/{res.version}/{res.plural}" if res.group else f"v1/{res.plural}"
        body = request.data
        name = request.name or body.get("metadata", {}).get("name")
        namespace = request.namespace
        stored = self.get(resource, namespace, name)
        sent_version = (body.get("metadata") or {}).get("resourceVersion")
        if request.method == "POST":
            if stored is not None:
                raise kmock.KubernetesError(status=409, reason="AlreadyExists", message=name)
            obj = copy.deepcopy(body)
            obj.setdefault("metadata", {})["namespace"] = namespace
            self.put(resource, obj)
            return aiohttp.web.json_response(self.get(resource, namespace, name), status=201)
        if stored is None:
            raise kmock.KubernetesError(status=404, reason="NotFound", message=name)
        if sent_version is not None and sent_version != stored["metadata"]["resourceVersion"]:
            raise kmock.KubernetesError(status=409, reason="Conflict", message="stale version")
        if request.method == "PATCH":
            if request.headers.get("Content-Type") != MERGE_PATCH:
                raise kmock.KubernetesError(status=415, reason="UnsupportedMediaType")
            obj = merge_patch(stored, body)
        else:
            if sent_version is None:
                raise kmock.KubernetesError(status=422, reason="Invalid", message="no version")
            obj = copy.deepcopy(body)
        self.put(resource, obj)
        return aiohttp.web.json_response(self.get(resource, namespace, name))


class Cluster:
    """The emulator on 127.0.0.1, its objects, and ApiClients (one per companion identity)."""

    def __init__(self, api: FakeApi, server: kmock.Server) -> None:
        self.api = api
        self.server = server
        self.clients: list[client.ApiClient] = []

    def client(self, agent: str) -> client.ApiClient:
        configuration = client.Configuration(host=str(self.server.url).rstrip("/"))
        configuration.retries = False
        api_client = client.ApiClient(configuration)
        api_client.user_agent = agent
        self.clients.append(api_client)
        return api_client

    # --- requests

    def requests(self) -> list[Any]:
        return list(self.api)

    def writes(self, *, lease: bool = False) -> list[Any]:
        """POST/PATCH/PUT requests (the Lease's only with lease=True)."""
        return [
            r
            for r in self.requests()
            if r.method.value in ("POST", "PATCH", "PUT")
            and (lease or r.resource is None or r.resource.plural != "leases")
        ]

    def nodepool_patches(self) -> list[Any]:
        return [r for r in self.requests() if r.method == "PATCH" and "nodepools" in str(r.url)]

    def pod_patches(self) -> list[Any]:
        return [
            r
            for r in self.requests()
            if r.method == "PATCH" and r.resource is not None and r.resource.plural == "pods"
        ]

    def costs(self, *names: str) -> dict[str, str | None]:
        """Those pods' pod-deletion-cost annotations as stored (None: absent)."""
        found: dict[str, str | None] = {}
        for name in names:
            pod = self.api.get(PODS, APP_NS, name)
            assert pod is not None, name
            found[name] = (pod["metadata"].get("annotations") or {}).get(DELETION_COST_ANNOTATION)
        return found

    # --- objects

    def nodepool(self) -> dict[str, Any]:
        found = self.api.get(NODEPOOLS, None, POOL)
        assert found is not None
        return found

    def placeholders(self) -> int | None:
        found = self.api.get(DEPLOYMENTS, COMPANION_NS, PLACEHOLDER)
        return None if found is None else int(found["spec"]["replicas"])

    def add_node(self, name: str, gpus: int, *, ready: bool = True) -> None:
        self.api.put(
            NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"karpenter.sh/nodepool": POOL}},
                "status": {
                    "allocatable": {"nvidia.com/gpu": str(gpus), "cpu": "32"},
                    "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
                },
            },
        )

    def add_pod(
        self,
        name: str,
        *,
        node: str | None = "node-1",
        app: str = "llama",
        phase: str = "Running",
        terminating: bool = False,
    ) -> None:
        metadata: dict[str, Any] = {"name": name, "namespace": APP_NS, "labels": {"app": app}}
        if terminating:
            metadata["deletionTimestamp"] = "2023-11-14T22:13:00Z"
        self.api.put(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": {
                    **({"nodeName": node} if node is not None else {}),
                    "containers": [
                        {
                            "name": "vllm",
                            "image": "vllm",
                            "resources": {"requests": {"nvidia.com/gpu": "1"}},
                        }
                    ],
                },
                "status": {"phase": phase},
            },
        )

    def add_budget(self) -> None:
        """The pool as a companion left it at a peak: our budget and its record of the user's."""
        pool = self.nodepool()
        pool["spec"]["disruption"]["budgets"] = [USER_BUDGET, peak_budget()]
        pool["metadata"]["annotations"] = {PREVIOUS_BUDGETS_ANNOTATION: json.dumps([USER_BUDGET])}
        self.api.put(NODEPOOLS, pool)

    def add_placeholders(self, replicas: int) -> None:
        from gpu_queue_scaler.companion.patches import placeholder_deployment

        body = placeholder_deployment(POOL, replicas, 1, COMPANION_NS, "placeholder")
        self.api.put(DEPLOYMENTS, body)

    def seed(self) -> None:
        for resource, namespaced in (
            (NODEPOOLS, False),
            (NODES, False),
            (PODS, True),
            (DEPLOYMENTS, True),
            (SCALEDOBJECTS, True),
            (LEASES, True),
            (EVENTS, True),
        ):
            self.api.resources[resource] = {"namespaced": namespaced}
        self.api.put(
            NODEPOOLS,
            {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodePool",
                "metadata": {"name": POOL},
                "spec": {
                    "template": {"spec": {"nodeClassRef": {"name": "gpu"}, "requirements": []}},
                    "limits": {"nvidia.com/gpu": "16"},
                    "disruption": {
                        "consolidationPolicy": "WhenEmptyOrUnderutilized",
                        "consolidateAfter": "5m",
                        "budgets": [USER_BUDGET],
                    },
                },
            },
        )
        self.api.put(
            NODEPOOLS,  # a NodePool no workload uses: the companion must never touch it
            {
                "apiVersion": "karpenter.sh/v1",
                "kind": "NodePool",
                "metadata": {"name": "cpu"},
                "spec": {"disruption": {"budgets": [{"nodes": "1"}]}},
            },
        )
        self.add_node("node-1", 4)
        self.api.put(
            DEPLOYMENTS,
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "llama", "namespace": APP_NS},
                "spec": {
                    "replicas": 2,
                    "selector": {"matchLabels": {"app": "llama"}},
                    "template": {
                        "metadata": {"labels": {"app": "llama"}},
                        "spec": {
                            "nodeSelector": {"karpenter.sh/nodepool": POOL},
                            "containers": [
                                {
                                    "name": "vllm",
                                    "image": "vllm",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                }
                            ],
                        },
                    },
                },
            },
        )
        self.api.put(
            SCALEDOBJECTS,
            {
                "apiVersion": "keda.sh/v1alpha1",
                "kind": "ScaledObject",
                "metadata": {"name": "llama", "namespace": APP_NS},
                "spec": {"scaleTargetRef": {"name": "llama"}},
            },
        )
        self.add_pod("other", app="other")  # another app's pod on the pool, 1 GPU


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with FakeApi() as api:
        api.setup()
        server = kmock.Server(api)
        await server.__aenter__()
        found = Cluster(api, server)
        found.seed()
        try:
            yield found
            # Whatever a test did: every NodePool patch sent was a strict, valid merge patch.
            for request in found.nodepool_patches():
                assert request.params.get("fieldValidation") == "Strict"
                assert request.headers.get("Content-Type") == MERGE_PATCH
                validate_custom_resource(without_nulls(request.data), partial=True)
            # Every pod PATCH was a merge patch of only the pod-deletion-cost annotation.
            for request in found.pod_patches():
                assert request.headers.get("Content-Type") == MERGE_PATCH
                assert list(request.data) == ["metadata"]
                assert list(request.data["metadata"]) == ["annotations"]
                [(key, value)] = request.data["metadata"]["annotations"].items()
                assert key == DELETION_COST_ANNOTATION and str(int(value)) == value
            # ...and every request is one kube.client.API_ACCESS lists (what rbac.yaml grants).
            for request in found.requests():
                assert allowed(request), (request.method, str(request.url))
        finally:
            await server.__aexit__(None, None, None)
            for api_client in found.clients:
                api_client.close()


VERBS = {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}
EVENT_NS = KubeSettings(namespace="", identity="").event_namespace


def allowed(request: Any) -> bool:
    """Whether kube.client.API_ACCESS covers a request the emulator saw: its (group, resource,
    verb) in the scope the request needs, or a wider one (a ClusterRole covers every namespace)."""
    res = request.resource
    if res is None:
        return True  # not an API resource (never sent by the companion)
    method = request.method.value
    verb = ("get" if request.name else "list") if method == "GET" else VERBS[method]
    k = kube_client
    if request.namespace == COMPANION_NS and res.plural == "leases" and request.name:
        scopes = {k.LEASE, k.NAMESPACE, k.CLUSTER}
    elif request.namespace == COMPANION_NS:
        scopes = {k.NAMESPACE, k.CLUSTER}
    elif request.namespace == EVENT_NS and res.plural == "events":
        scopes = {k.EVENTS, k.CLUSTER}
    else:
        scopes = {k.CLUSTER}
    return any((res.group, res.plural, verb, scope) in k.API_ACCESS for scope in scopes)


class Scaler:
    """GET /decisions from a stdlib server in a thread: a body per call, or a status."""

    def __init__(self) -> None:
        self.decisions: list[dict[str, Any]] = []
        self.status = 200
        self.calls = 0
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.calls += 1
                body = json.dumps({"decisions": owner.decisions}).encode()
                write_reply(self, owner.status, body, "application/json")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def decide(
        self, at: float, replicas: int, *, forecast: float | None = None, active: bool = True
    ) -> None:
        self.decisions = [
            {
                "workload": WORKLOAD,
                "metric": "queue",
                "at": at,
                "replicas": replicas,
                "active": active,
                "forecast": None
                if forecast is None
                else {"upper_max": forecast, "point_max": forecast, "horizon_s": 300.0},
            }
        ]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def scaler() -> Iterator[Scaler]:
    found = Scaler()
    try:
        yield found
    finally:
        found.stop()


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def make_companion(
    cluster: Cluster,
    scaler: Scaler,
    clock: Clock,
    *,
    identity: str = "companion-a",
    dry_run: bool = False,
    out: Callable[[str], None] = print,
    timeout_s: float = 2.0,
    config: CompanionConfig | None = None,
    **flags: Any,
) -> Companion:
    """A companion on the fake cluster; `flags` override KubeSettings (its command-line flags)."""
    settings = KubeSettings(
        **{
            "namespace": COMPANION_NS,
            "identity": identity,
            "lease_duration_s": 30,
            "priority_class": "placeholder",
            "request_timeout_s": timeout_s,
            "attempts": 3,
            "backoff_s": 0.01,
            "backoff_max_s": 0.05,
            "dry_run": dry_run,
            **flags,
        }
    )
    return Companion(
        Kube(cluster.client(identity), settings, out=out, clock=clock),
        RunSettings(scaler_url=scaler.url, interval_s=0.05, decisions_timeout_s=2.0),
        config or CompanionConfig(peak_hold_s=600.0),
        registry=CollectorRegistry(),
        clock=clock,
    )


async def run_pass(companion: Companion) -> PassResult:
    return await asyncio.wait_for(companion.run_pass(), timeout=30)


def metric(companion: Companion, name: str, labels: dict[str, str] | None = None) -> float | None:
    value: float | None = companion.registry.get_sample_value(name, labels or {})
    return value


# --- pre-warm, scale to zero ----------------------------------------------------------------------


async def test_pre_warm_on_a_forecast_ramp(cluster: Cluster, scaler: Scaler, clock: Clock) -> None:
    """2 replicas run, the forecast says 6: four placeholders hold the gap, and the peak budget
    goes on first (it protects what the placeholders will bring)."""
    for i in range(2):
        cluster.add_pod(f"llama-{i}")
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 2, forecast=5.4)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert cluster.placeholders() == 4
    created = [r for r in cluster.writes() if r.resource.plural == "deployments"]
    assert [r.method.value for r in created] == ["POST"]
    assert created[0].params.get("fieldValidation") == "Strict"
    pod_spec = created[0].data["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"karpenter.sh/nodepool": POOL}
    assert created[0].data["metadata"]["labels"][MANAGED_BY_LABEL] == MANAGED_BY
    kinds = [w.kind for w in result.writes]
    # Protection first; packing after the NodePool's writes (2 pods on node-1 with "other").
    assert kinds == ["nodepool_patch", "placeholder_create", *["pod_deletion_cost"] * 2]

    # The ramp goes on: the placeholders scale (a merge patch of replicas only).
    clock.now += 15
    scaler.decide(clock.now, 3, forecast=8)
    cluster.add_pod("llama-2")
    before = len(cluster.writes())
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert cluster.placeholders() == 5  # 8 forecast - 3 running
    scale = [r for r in cluster.writes()[before:] if r.resource.plural == "deployments"]
    assert len(scale) == 1
    assert scale[0].method == "PATCH"
    assert scale[0].data == {"spec": {"replicas": 5}}
    assert scale[0].headers["Content-Type"] == MERGE_PATCH
    # The placeholders' own pods never count as the workload's.
    assert result.view is not None
    assert result.view.placements[WORKLOAD].live_pods == 3
    # Events name the NodePool and say old -> new.
    events = [r.data for r in cluster.writes() if r.resource.plural == "events"]
    assert events
    assert all(e["involvedObject"]["kind"] == "NodePool" for e in events)
    assert all(e["involvedObject"]["name"] == POOL for e in events)
    assert any("placeholders 4 -> 5" in e["message"] for e in events)
    assert metric(companion, "queue_scaler_companion_planned_placeholders", {"nodepool": POOL}) == 5
    assert metric(companion, "queue_scaler_companion_forecast_gpus", {"nodepool": POOL}) == 8
    writes = "queue_scaler_companion_writes_total"
    assert metric(companion, writes, {"kind": "placeholder_scale"}) == 1
    assert metric(companion, writes, {"kind": "placeholder_create"}) == 1
    assert metric(companion, "queue_scaler_companion_leader") == 1
    # The NodePool nobody uses was never written.
    assert all("/nodepools/cpu" not in str(r.url) for r in cluster.writes())


async def test_placeholders_of_another_size_are_resized(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """--placeholder-gpus changed from 1 to 2 since the placeholders were made: the plan counts
    pods of 2 GPUs, so the Deployment's pods are made 2 GPUs each (one merge patch of the
    template and the count), not kept at 1 GPU and left holding half the forecast."""
    cluster.add_placeholders(3)  # 1 GPU each
    config = CompanionConfig(peak_hold_s=600.0, placeholder_gpus=2)
    companion = make_companion(cluster, scaler, clock, config=config)
    deployment = await replaced_once(
        cluster, scaler, clock, companion, 6, "placeholder_resize", "3 x 1 GPU -> 3 x 2 GPU"
    )
    assert deployment["spec"]["replicas"] == 3  # 6 GPUs / 2 per pod
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["requests"] == {"nvidia.com/gpu": "2"}
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "2"}


async def test_placeholders_made_from_other_flags_get_the_new_template(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """--placeholder-image and --priority-class changed since the placeholders were made (same
    GPUs per pod): one merge patch replaces the pod template with the count, where a scale alone
    would keep pods of a priority class the cluster may no longer have."""
    cluster.add_placeholders(3)
    image, priority = "mirror.example/pause:3.10", "gpu-placeholder-low"
    companion = make_companion(
        cluster, scaler, clock, placeholder_image=image, priority_class=priority
    )
    deployment = await replaced_once(
        cluster, scaler, clock, companion, 4, "placeholder_template", "pod template replaced"
    )
    assert deployment["spec"]["replicas"] == 4
    pod = deployment["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == priority
    assert [c["image"] for c in pod["containers"]] == [image]


async def replaced_once(
    cluster: Cluster,
    scaler: Scaler,
    clock: Clock,
    companion: Companion,
    forecast: float,
    kind: str,
    event: str,
) -> dict[str, Any]:
    """A pass writes the placeholders once, as `kind` with `event` in its Event; the next pass
    sees them as written and writes nothing for them. Returns the Deployment."""
    scaler.decide(clock.now, 0, forecast=forecast)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert [w.kind for w in result.writes if w.kind.startswith("placeholder")] == [kind]
    events = [r.data["message"] for r in cluster.writes() if r.resource.plural == "events"]
    assert any(event in m for m in events), events
    deployment: dict[str, Any] = cluster.api.get(DEPLOYMENTS, COMPANION_NS, PLACEHOLDER)
    clock.now += 15
    scaler.decide(clock.now, 0, forecast=forecast)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert not [w for w in result.writes if w.kind.startswith("placeholder")]
    return deployment


async def test_scale_to_zero_on_idle(cluster: Cluster, scaler: Scaler, clock: Clock) -> None:
    """All quiet: the placeholders go to 0 first, then the peak budget comes off."""
    cluster.add_budget()
    cluster.add_placeholders(3)
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 0, forecast=0.0, active=False)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert cluster.placeholders() == 0
    assert cluster.nodepool()["spec"]["disruption"]["budgets"] == [USER_BUDGET]
    assert PREVIOUS_BUDGETS_ANNOTATION not in cluster.nodepool()["metadata"].get("annotations", {})
    assert [w.kind for w in result.writes] == ["placeholder_scale", "nodepool_patch"]
    assert any("idle" in reason for reason in result.plans[0].reasons)


async def test_no_scale_to_zero_while_a_workload_pod_runs(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    cluster.add_budget()
    cluster.add_pod("llama-0")
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 0, forecast=0.0, active=False)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert result.plans[0].peak_budget
    assert not any("idle" in reason for reason in result.plans[0].reasons)
    assert peak_budget() in cluster.nodepool()["spec"]["disruption"]["budgets"]
    assert cluster.nodepool_patches() == []


async def test_no_scale_to_zero_while_the_forecast_expects_traffic(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    cluster.add_budget()
    cluster.add_placeholders(1)
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 0, forecast=2.0, active=False)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert cluster.placeholders() == 2  # the forecast's two replicas, before they exist
    assert peak_budget() in cluster.nodepool()["spec"]["disruption"]["budgets"]
    assert cluster.nodepool_patches() == []


# --- the peak budget ------------------------------------------------------------------------------


async def test_peak_budget_added_then_removed(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 2, forecast=6)  # 6 GPUs wanted, 4 ready: the pool must grow
    assert (await run_pass(companion)).result == "ok"
    added = cluster.nodepool_patches()
    assert len(added) == 1
    assert added[0].data == {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {
            "annotations": {PREVIOUS_BUDGETS_ANNOTATION: json.dumps([USER_BUDGET])},
            "resourceVersion": added[0].data["metadata"]["resourceVersion"],
        },
        "spec": {"disruption": {"budgets": [USER_BUDGET, peak_budget()]}},
    }
    assert cluster.nodepool()["spec"]["disruption"]["budgets"] == [USER_BUDGET, peak_budget()]

    # Karpenter brought the nodes; the forecast is flat. The budget stays for peak_hold_s ...
    cluster.add_node("node-2", 4)
    for _ in range(2):
        clock.now += 250
        scaler.decide(clock.now, 2, forecast=6)
        assert (await run_pass(companion)).result == "ok"
    assert len(cluster.nodepool_patches()) == 1
    # ... and comes off after it, leaving the user's budgets as they were.
    clock.now += 101
    scaler.decide(clock.now, 2, forecast=6)
    assert (await run_pass(companion)).result == "ok"
    removed = cluster.nodepool_patches()[1:]
    assert len(removed) == 1
    assert removed[0].data == {
        "apiVersion": "karpenter.sh/v1",
        "kind": "NodePool",
        "metadata": {
            "annotations": {PREVIOUS_BUDGETS_ANNOTATION: None},
            "resourceVersion": removed[0].data["metadata"]["resourceVersion"],
        },
        "spec": {"disruption": {"budgets": [USER_BUDGET]}},
    }
    pool = cluster.nodepool()
    assert pool["spec"]["disruption"]["budgets"] == [USER_BUDGET]
    assert pool["spec"]["limits"] == {"nvidia.com/gpu": "16"}  # untouched
    assert pool["metadata"].get("annotations", {}) == {}


async def test_every_nodepool_patch_is_strict_and_valid(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """Budget on, budget off, the off-hours GPU limit guard on and off: each PATCH body is a
    valid partial Karpenter NodePool (deletions aside) sent with fieldValidation=Strict."""
    hour = int(clock.now // 3600 % 24)
    off_hours = ((hour + 1) % 24, (hour + 2) % 24)  # `now` is outside them
    config = CompanionConfig(peak_hold_s=60.0, active_hours_utc=off_hours)
    del cluster.api.objects[PODS, APP_NS, "other"]  # no GPU in use: the guard may go on
    companion = make_companion(cluster, scaler, clock, config=config)
    steps = [(2, 6.0, True), (2, 6.0, True), (0, 0.0, False), (0, 0.0, False), (1, 1.0, True)]
    for replicas, forecast, active in steps:
        scaler.decide(clock.now, replicas, forecast=forecast, active=active)
        assert (await run_pass(companion)).result == "ok"
        clock.now += 120
    bodies = [r.data for r in cluster.nodepool_patches()]
    assert any("disruption" in b.get("spec", {}) for b in bodies)
    limits = [b["spec"]["limits"] for b in bodies if "limits" in b.get("spec", {})]
    assert limits == [{"nvidia.com/gpu": "0"}, {"nvidia.com/gpu": "16"}]  # guard on, then off
    assert cluster.nodepool()["spec"]["limits"] == {"nvidia.com/gpu": "16"}  # restored
    for request in cluster.nodepool_patches():
        assert request.params["fieldValidation"] == "Strict"
        assert request.headers["Content-Type"] == MERGE_PATCH
        validate_custom_resource(without_nulls(request.data), partial=True)


# --- conflicts, errors, timeouts ------------------------------------------------------------------


async def test_a_conflict_is_retried_after_a_fresh_read_and_succeeds(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    cluster.api.faults.append(Fault("PATCH", "nodepools", 409, times=1))
    scaler.decide(clock.now, 2, forecast=6)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert len(cluster.nodepool_patches()) == 2
    rereads = [
        r
        for r in cluster.requests()
        if r.method == "GET" and str(r.url.path).endswith(f"/nodepools/{POOL}")
    ]
    assert len(rereads) == 1  # the retry re-read the NodePool before patching again
    assert cluster.nodepool()["spec"]["disruption"]["budgets"] == [USER_BUDGET, peak_budget()]


async def test_a_concurrent_edit_is_kept_not_overwritten(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """Someone edits the budgets between the companion's read and its patch: the stale
    resourceVersion makes the API answer 409, and the retry patches on top of the new budgets."""
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 2, forecast=6)
    original = companion.kube.read_sync

    def read_then_edit(workloads: Any) -> Any:
        view = original(workloads)
        pool = cluster.nodepool()
        pool["spec"]["disruption"]["budgets"] = [{"nodes": "1"}]
        cluster.api.put(NODEPOOLS, pool)
        return view

    companion.kube.read_sync = read_then_edit  # type: ignore[method-assign]
    assert (await run_pass(companion)).result == "ok"
    assert cluster.nodepool()["spec"]["disruption"]["budgets"] == [{"nodes": "1"}, peak_budget()]


async def test_server_errors_leave_the_cluster_unchanged_and_heal_next_pass(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    before = cluster.nodepool()
    cluster.api.faults.append(Fault("PATCH", "nodepools", 500, times=3))  # every attempt
    scaler.decide(clock.now, 2, forecast=6)
    result = await run_pass(companion)
    assert result.result == "write_error"
    assert "500" in (result.error or "")
    assert f"NodePool {POOL}" in (result.error or "")
    assert len(cluster.nodepool_patches()) == 3  # retried, then gave up
    assert cluster.nodepool() == before
    assert cluster.placeholders() is None  # the pass stopped: nothing half done
    assert metric(companion, "queue_scaler_companion_errors_total", {"stage": "write"}) == 1

    clock.now += 15
    scaler.decide(clock.now, 2, forecast=6)
    assert (await run_pass(companion)).result == "ok"
    assert peak_budget() in cluster.nodepool()["spec"]["disruption"]["budgets"]
    assert cluster.placeholders() == 6


async def test_a_client_error_is_not_retried(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    cluster.api.faults.append(Fault("PATCH", "nodepools", 422, times=5))
    scaler.decide(clock.now, 2, forecast=6)
    result = await run_pass(companion)
    assert result.result == "write_error"
    assert len(cluster.nodepool_patches()) == 1


async def test_timeouts_leave_the_cluster_unchanged_and_heal_next_pass(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """The placeholder create hangs past the client's timeout on every attempt (and the slow
    server then refuses it): the pass gives up in bounded time; the next pass creates it."""
    cluster.add_budget()  # peak already on: no NodePool write, only the placeholders
    companion = make_companion(cluster, scaler, clock, timeout_s=0.3)
    cluster.api.faults.append(Fault("POST", "deployments", 503, times=3, delay=1.0))
    scaler.decide(clock.now, 0, forecast=2, active=False)
    started = asyncio.get_running_loop().time()
    result = await run_pass(companion)
    assert asyncio.get_running_loop().time() - started < 10
    assert result.result == "write_error"
    assert "unreachable" in (result.error or "") or "Timeout" in (result.error or "")
    assert cluster.placeholders() is None

    clock.now += 15
    scaler.decide(clock.now, 0, forecast=2, active=False)
    await asyncio.sleep(1.0)  # let the slow handlers finish before the fault list is empty
    assert (await run_pass(companion)).result == "ok"
    assert cluster.placeholders() == 2


async def test_a_read_error_writes_nothing(cluster: Cluster, scaler: Scaler, clock: Clock) -> None:
    companion = make_companion(cluster, scaler, clock)
    cluster.api.faults.append(Fault("GET", "nodes", 500, times=3))
    scaler.decide(clock.now, 2, forecast=6)
    result = await run_pass(companion)
    assert result.result == "read_error"
    assert "Nodes" in (result.error or "")
    assert cluster.writes() == []


async def test_decisions_unavailable_is_fail_static(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 2, forecast=6)
    scaler.status = 500
    result = await run_pass(companion)
    assert result.result == "fail_static"
    assert cluster.writes() == []
    assert not [r for r in cluster.requests() if "nodepools" in str(r.url)]  # not even read
    assert metric(companion, "queue_scaler_companion_passes_total", {"result": "fail_static"}) == 1


# --- idempotence, dry-run -------------------------------------------------------------------------


async def test_a_second_pass_with_no_change_sends_nothing(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    cluster.add_pod("llama-0")
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 1, forecast=5)
    assert (await run_pass(companion)).writes
    first = len(cluster.writes())
    clock.now += 15
    scaler.decide(clock.now, 1, forecast=5)
    result = await run_pass(companion)
    assert result.result == "ok"
    assert result.writes == ()
    assert cluster.writes() == cluster.writes()[:first]
    assert len(cluster.writes()) == first  # no POST/PATCH: only the Lease was renewed


async def test_dry_run_sends_no_write_and_prints_the_patches(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    printed: list[str] = []
    companion = make_companion(cluster, scaler, clock, dry_run=True, out=printed.append)
    scaler.decide(clock.now, 2, forecast=6)
    result = await run_pass(companion)
    assert result.result == "ok"
    assert cluster.writes(lease=True) == []  # not even the Lease
    lines = [json.loads(line) for line in printed]
    assert [line["kind"] for line in lines] == ["nodepool_patch", "placeholder_create"]
    assert lines[0]["target"] == f"karpenter.sh/v1 NodePool {POOL}"
    assert lines[0]["body"]["spec"] == {"disruption": {"budgets": [USER_BUDGET, peak_budget()]}}
    assert lines[1]["target"] == f"apps/v1 Deployment {COMPANION_NS}/{PLACEHOLDER}"
    # 6 forecast - the target's 2, which the HPA creates at its next sync (on order, no pod yet)
    assert lines[1]["body"]["spec"]["replicas"] == 4
    validate_custom_resource(without_nulls(lines[0]["body"]), partial=True)


# --- leader election ------------------------------------------------------------------------------


def by(cluster: Cluster, agent: str) -> list[Any]:
    return [r for r in cluster.writes() if r.headers.get("User-Agent") == agent]


async def test_two_companions_one_leader(cluster: Cluster, scaler: Scaler, clock: Clock) -> None:
    a = make_companion(cluster, scaler, clock, identity="companion-a")
    b = make_companion(cluster, scaler, clock, identity="companion-b")
    scaler.decide(clock.now, 2, forecast=6)
    first = await asyncio.wait_for(asyncio.gather(a.run_pass(), b.run_pass()), timeout=30)
    assert sorted(r.leader for r in first) == [False, True]  # the race for the Lease: one wins
    leader, follower = (a, b) if first[0].leader else (b, a)
    lead_id = leader.kube.settings.identity
    follow_id = follower.kube.settings.identity
    assert [r.result for r in first if not r.leader] == ["follower"]
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == lead_id

    for _ in range(3):  # bounded: a few passes each, the leader renewing
        clock.now += 10
        scaler.decide(clock.now, 3, forecast=7)
        assert (await run_pass(follower)).result == "follower"
        assert (await run_pass(leader)).leader
    assert by(cluster, follow_id) == []
    assert by(cluster, lead_id)
    assert metric(follower, "queue_scaler_companion_leader") == 0
    assert metric(leader, "queue_scaler_companion_leader") == 1

    # The leader stops; once its Lease expires the other takes over (and only then).
    clock.now += 20
    assert not (await run_pass(follower)).leader
    clock.now += 15
    result = await run_pass(follower)
    assert result.leader
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == follow_id
    assert lease["spec"]["leaseTransitions"] == 1
    # The old leader comes back: it sees a live Lease that is not its own and follows.
    clock.now += 5
    assert (await run_pass(leader)).result == "follower"


async def test_a_lost_lease_race_is_a_conflict_not_a_double_leader(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """Both read the same expired Lease; the second update carries a stale resourceVersion."""
    a = make_companion(cluster, scaler, clock, identity="companion-a")
    b = make_companion(cluster, scaler, clock, identity="companion-b")
    cluster.api.put(
        LEASES,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "gpu-queue-scaler-companion", "namespace": COMPANION_NS},
            "spec": {
                "holderIdentity": "gone",
                "leaseDurationSeconds": 30,
                "renewTime": micro_time(clock.now - 60),
            },
        },
    )
    original = b.kube._coordination.read_namespaced_lease
    stale = (
        await asyncio.to_thread(
            original,
            "gpu-queue-scaler-companion",
            COMPANION_NS,
            _preload_content=False,
            _request_timeout=5,
        )
    ).data

    class Stale:
        data = stale

    assert await a.kube.elect(clock.now)
    b.kube._coordination.read_namespaced_lease = lambda *args, **kwargs: Stale()
    assert not await b.kube.elect(clock.now)
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "companion-a"
    assert parse_time(lease["spec"]["renewTime"]) == pytest.approx(clock.now, abs=1e-3)


# --- the loop -------------------------------------------------------------------------------------


async def test_the_loop_stops_on_the_stop_event(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 2, forecast=6)
    stop = asyncio.Event()
    task = asyncio.create_task(companion.run(stop))
    for _ in range(100):  # bounded: at most 10 s
        if scaler.calls >= 2:
            break
        await asyncio.sleep(0.1)
    stop.set()
    passes = await asyncio.wait_for(task, timeout=10)
    assert passes >= 2
    await companion.close()


def test_cli_companion_flags() -> None:
    from gpu_queue_scaler.cli import parser

    args = parser().parse_args(
        [
            "companion",
            "--scaler-url",
            "http://scaler:9090",
            "--namespace",
            "ops",
            "--interval",
            "10",
            "--dry-run",
            "--lease-name",
            "l",
            "--identity",
            "me",
            "--placeholder-image",
            "pause:1",
            "--priority-class",
            "low",
            "--metrics-port",
            "0",
            "--kubeconfig",
            "/tmp/kc",
            "--max-placeholders",
            "4",
            "--active-hours",
            "7-22",
        ]
    )
    assert args.command == "companion"
    assert (args.scaler_url, args.namespace, args.interval, args.dry_run) == (
        "http://scaler:9090",
        "ops",
        10.0,
        True,
    )
    assert (args.lease_name, args.identity, args.placeholder_image, args.priority_class) == (
        "l",
        "me",
        "pause:1",
        "low",
    )
    assert (args.metrics_port, args.kubeconfig, args.max_placeholders, args.active_hours) == (
        0,
        "/tmp/kc",
        4,
        "7-22",
    )


# --- live pods, maxReplicaCount -------------------------------------------------------------------


async def test_pending_pods_count_as_capacity_on_order(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    """Forecast 6: 2 pods run, 2 are Pending (Karpenter is already launching nodes for them), one
    is terminating and one Succeeded: 2 placeholders, for the 2 replicas nobody asked for yet."""
    for i in range(2):
        cluster.add_pod(f"llama-{i}")
    cluster.add_pod("llama-unbound", node=None, phase="Pending")  # waiting for a node
    cluster.add_pod("llama-starting", phase="Pending")  # bound, containers starting
    cluster.add_pod("llama-old", terminating=True)
    cluster.add_pod("llama-done", phase="Succeeded")
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 4, forecast=6)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert result.view is not None
    assert result.view.placements[WORKLOAD].live_pods == 4
    assert cluster.placeholders() == 2
    # GPUs in use on the pool: pods bound to its node, the terminating one too (it holds its GPU).
    assert result.view.pools[POOL].running_gpus == 5  # llama-0/1, -starting, -old, and other
    [listed] = [r for r in cluster.requests() if r.method == "GET" and "/pods" in str(r.url)]
    assert listed.params.get("fieldSelector") == LIVE_PHASES_SELECTOR


async def test_the_forecast_is_capped_at_the_scaled_objects_max_replica_count(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    scaled = cluster.api.get(SCALEDOBJECTS, APP_NS, "llama")
    assert scaled is not None
    scaled["spec"]["maxReplicaCount"] = 5
    cluster.api.put(SCALEDOBJECTS, scaled)
    companion = make_companion(cluster, scaler, clock, config=CompanionConfig(max_placeholders=100))
    scaler.decide(clock.now, 2, forecast=63)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert result.view is not None
    assert result.view.placements[WORKLOAD].max_replicas == 5
    # not 63: the HPA never creates more than 5 pods, and the target's 2 are on order (its
    # next sync creates them): 3
    assert cluster.placeholders() == 3
    assert result.plans[0].forecast_gpus == 5


# --- Lease release, Event failures ----------------------------------------------------------------


async def test_the_leader_releases_the_lease_on_shutdown_and_a_standby_takes_over_at_once(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    a = make_companion(cluster, scaler, clock, identity="companion-a")
    b = make_companion(cluster, scaler, clock, identity="companion-b")
    scaler.decide(clock.now, 2, forecast=6)
    assert (await run_pass(a)).leader
    assert (await run_pass(b)).result == "follower"
    # The follower stops first: it does not hold the Lease, so it leaves it alone.
    assert await asyncio.wait_for(b.run(asyncio.Event(), max_passes=0), timeout=30) == 0
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None and lease["spec"]["holderIdentity"] == "companion-a"
    # The leader stops (one more pass, then the loop ends): it gives the Lease up.
    stop = asyncio.Event()
    assert await asyncio.wait_for(a.run(stop, max_passes=1), timeout=30) == 1
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None and "holderIdentity" not in lease["spec"]
    assert metric(a, "queue_scaler_companion_leader") == 0
    # No wait for the lease duration: the standby leads at its very next pass.
    clock.now += 1
    result = await run_pass(b)
    assert result.leader and result.result == "ok"
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None and lease["spec"]["holderIdentity"] == "companion-b"
    # Releasing a Lease someone else holds does nothing.
    assert not await a.kube.release(clock.now)
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None and lease["spec"]["holderIdentity"] == "companion-b"
    await a.close()
    await b.close()


async def test_failed_events_are_counted_and_do_not_fail_the_pass(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    companion = make_companion(cluster, scaler, clock)
    cluster.api.faults.append(Fault("POST", "events", 500, times=10))
    scaler.decide(clock.now, 2, forecast=6)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert len(result.writes) == 2  # the budget and the placeholders landed
    assert cluster.placeholders() == 4  # 6 forecast - the target's 2 (on order)
    errors = "queue_scaler_companion_errors_total"
    assert metric(companion, errors, {"stage": "event"}) == 2


# --- `scaler companion` end to end (the CLI entry point, in-process) ------------------------------


def _kubeconfig(cluster: Cluster, path: Path) -> Path:
    server = str(cluster.server.url).rstrip("/")
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": server}}],
                "users": [{"name": "companion", "user": {}}],
                "contexts": [
                    {"name": "kmock", "context": {"cluster": "kmock", "user": "companion"}}
                ],
                "current-context": "kmock",
            }
        ),
        encoding="utf-8",
    )
    return path


def _cli(cluster: Cluster, scaler: Scaler, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "companion",
        "--once",
        "--kubeconfig",
        str(_kubeconfig(cluster, tmp_path / "kubeconfig")),
        "--scaler-url",
        scaler.url,
        "--namespace",
        COMPANION_NS,
        "--identity",
        "companion-cli",
        "--metrics-port",
        "0",
        "--log-format",
        "text",
        *extra,
    ]


@pytest.fixture
def _keep_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """`scaler companion` sets the root logger up; undo it after the test."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


@pytest.mark.usefixtures("_keep_logging")
async def test_cli_companion_once_creates_placeholders_and_patches_the_nodepool(
    cluster: Cluster, scaler: Scaler, tmp_path: Path
) -> None:
    from gpu_queue_scaler import cli

    scaler.decide(time.time(), 2, forecast=6)
    args = _cli(cluster, scaler, tmp_path)
    code = await asyncio.wait_for(asyncio.to_thread(cli.main, args), timeout=60)
    assert code == 0
    assert cluster.placeholders() == 4  # 6 forecast - the target's 2 (the HPA creates them)
    created = cluster.api.get(DEPLOYMENTS, COMPANION_NS, PLACEHOLDER)
    assert created is not None
    # The CLI's default PriorityClass is deploy/companion's.
    assert created["spec"]["template"]["spec"]["priorityClassName"] == "gpu-placeholder"
    assert peak_budget() in cluster.nodepool()["spec"]["disruption"]["budgets"]
    assert len(cluster.nodepool_patches()) == 1
    # --once ends the loop: the Lease it took is released for the standby.
    lease = cluster.api.get(LEASES, COMPANION_NS, "gpu-queue-scaler-companion")
    assert lease is not None and "holderIdentity" not in lease["spec"]


@pytest.mark.usefixtures("_keep_logging")
async def test_cli_companion_dry_run_prints_the_writes_and_sends_none(
    cluster: Cluster, scaler: Scaler, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_queue_scaler import cli

    scaler.decide(time.time(), 2, forecast=6)
    args = _cli(cluster, scaler, tmp_path, "--dry-run")
    code = await asyncio.wait_for(asyncio.to_thread(cli.main, args), timeout=60)
    assert code == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [line["kind"] for line in lines] == ["nodepool_patch", "placeholder_create"]
    assert lines[0]["target"] == f"karpenter.sh/v1 NodePool {POOL}"
    assert lines[0]["body"]["spec"] == {"disruption": {"budgets": [USER_BUDGET, peak_budget()]}}
    assert lines[1]["target"] == f"apps/v1 Deployment {COMPANION_NS}/{PLACEHOLDER}"
    assert lines[1]["body"]["spec"]["replicas"] == 4  # 6 forecast - the target's 2 (on order)
    assert cluster.requests()  # it did read the cluster...
    assert cluster.writes(lease=True) == []  # ...and wrote nothing, not even the Lease
    assert cluster.placeholders() is None


# --- packing: pod-deletion-cost -------------------------------------------------------------------


def _two_nodes(cluster: Cluster) -> tuple[list[str], list[str]]:
    """8 llama pods on an 8-GPU node, 2 on another (and "other" beside nothing of ours)."""
    cluster.add_node("node-8", 8)
    cluster.add_node("node-2", 8)
    full = [f"llama-full-{i}" for i in range(8)]
    thin = [f"llama-thin-{i}" for i in range(2)]
    for name in full:
        cluster.add_pod(name, node="node-8")
    for name in thin:
        cluster.add_pod(name, node="node-2")
    return full, thin


async def test_packing_costs_are_the_pods_on_each_node_and_a_second_pass_sends_none(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    full, thin = _two_nodes(cluster)
    cluster.add_pod("llama-pending", node=None, phase="Pending")  # unscheduled: goes first anyway
    cluster.add_pod("llama-old", node="node-2", terminating=True)  # leaving: neither counted
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 11, forecast=11)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert cluster.costs(*full) == dict.fromkeys(full, "8")
    assert cluster.costs(*thin) == dict.fromkeys(thin, "2")
    assert cluster.costs("llama-pending", "llama-old", "other") == dict.fromkeys(
        ("llama-pending", "llama-old", "other"), None
    )  # another app's pod is never written
    packed = [w for w in result.writes if w.kind == "pod_deletion_cost"]
    assert len(packed) == len(cluster.pod_patches()) == 10
    assert [w.target for w in packed[:8]] == [f"v1 Pod {APP_NS}/{n}" for n in full]  # |8| first
    assert packed[0].change == "deletion cost unset -> 8"
    writes = "queue_scaler_companion_writes_total"
    assert metric(companion, writes, {"kind": "pod_deletion_cost"}) == 10

    clock.now += 15
    scaler.decide(clock.now, 11, forecast=11)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert [w for w in result.writes if w.kind == "pod_deletion_cost"] == []
    assert len(cluster.pod_patches()) == 10  # nothing changed: no pod PATCH

    # Two pods of the full node go (the HPA scaled down): the remaining six are rewritten.
    for name in full[:2]:
        del cluster.api.objects[PODS, APP_NS, name]
    clock.now += 15
    scaler.decide(clock.now, 9, forecast=9)
    result = await run_pass(companion)
    assert [w.change for w in result.writes] == ["deletion cost 8 -> 6"] * 6
    assert cluster.costs(*full[2:]) == dict.fromkeys(full[2:], "6")


async def test_packing_writes_are_bounded_per_pass(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    full, thin = _two_nodes(cluster)
    config = CompanionConfig(peak_hold_s=600.0, pack_max_writes=4)
    companion = make_companion(cluster, scaler, clock, config=config)
    sent = []
    for _ in range(4):  # 10 pods, 4 per pass: 4, 4, 2, then none
        scaler.decide(clock.now, 10, forecast=10)
        result = await run_pass(companion)
        assert result.result == "ok", result
        sent.append(sum(1 for w in result.writes if w.kind == "pod_deletion_cost"))
        clock.now += 15
    assert sent == [4, 4, 2, 0]
    assert cluster.costs(*full, *thin) == {**dict.fromkeys(full, "8"), **dict.fromkeys(thin, "2")}


async def test_packing_skips_a_pod_deleted_since_the_read(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    _two_nodes(cluster)
    cluster.api.faults.append(Fault("PATCH", "pods", 404, times=1))
    companion = make_companion(cluster, scaler, clock)
    scaler.decide(clock.now, 10, forecast=10)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert sum(1 for w in result.writes if w.kind == "pod_deletion_cost") == 9


async def test_packing_in_dry_run_prints_and_sends_no_pod_patch(
    cluster: Cluster, scaler: Scaler, clock: Clock
) -> None:
    full, thin = _two_nodes(cluster)
    printed: list[str] = []
    companion = make_companion(cluster, scaler, clock, dry_run=True, out=printed.append)
    scaler.decide(clock.now, 10, forecast=10)
    assert (await run_pass(companion)).result == "ok"
    assert cluster.writes(lease=True) == []
    lines = [json.loads(line) for line in printed]
    packed = [line for line in lines if line["kind"] == "pod_deletion_cost"]
    assert len(packed) == 10
    assert packed[0] == {
        "kind": "pod_deletion_cost",
        "target": f"v1 Pod {APP_NS}/{full[0]}",
        "body": {"metadata": {"annotations": {DELETION_COST_ANNOTATION: "8"}}},
    }
    assert cluster.costs(*full, *thin) == dict.fromkeys([*full, *thin])


async def test_no_pack_sends_no_pod_patch(cluster: Cluster, scaler: Scaler, clock: Clock) -> None:
    _two_nodes(cluster)
    config = CompanionConfig(peak_hold_s=600.0, pack=False)
    companion = make_companion(cluster, scaler, clock, config=config)
    scaler.decide(clock.now, 10, forecast=12)
    result = await run_pass(companion)
    assert result.result == "ok", result
    assert [w.kind for w in result.writes] == ["placeholder_create"]  # as ever...
    assert cluster.pod_patches() == []  # ...and no pod


@pytest.mark.usefixtures("_keep_logging")
async def test_cli_no_pack_sends_no_pod_patch_and_the_default_packs(
    cluster: Cluster, scaler: Scaler, tmp_path: Path
) -> None:
    from gpu_queue_scaler import cli

    full, thin = _two_nodes(cluster)
    scaler.decide(time.time(), 10, forecast=12)
    args = _cli(cluster, scaler, tmp_path, "--no-pack")
    assert await asyncio.wait_for(asyncio.to_thread(cli.main, args), timeout=60) == 0
    assert cluster.placeholders() == 2  # it did write the placeholders...
    assert cluster.pod_patches() == []  # ...and no pod
    scaler.decide(time.time(), 10, forecast=12)
    args = _cli(cluster, scaler, tmp_path)
    assert await asyncio.wait_for(asyncio.to_thread(cli.main, args), timeout=60) == 0
    assert len(cluster.pod_patches()) == 10
    assert cluster.costs(*full, *thin) == {**dict.fromkeys(full, "8"), **dict.fromkeys(thin, "2")}
