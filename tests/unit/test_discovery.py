"""EndpointSlice discovery through the real kubernetes client against kmock's API emulator.

kmock (0.8) runs a Kubernetes API emulator on a loopback port; the real `kubernetes` client talks
HTTP to it. The emulator stores objects but does not filter lists by `labelSelector`, so the LIST
reaction below does that the way the API server does (equality selectors), which is exactly what
lets the tests see whether discovery asks for the right Service.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import kmock
import pytest
from kubernetes import client

import gpu_queue_scaler.sources.discovery as discovery_module
from gpu_queue_scaler.sources import SourceError
from gpu_queue_scaler.sources.discovery import EndpointSliceDiscovery

RESOURCE = "discovery.k8s.io/v1/endpointslices"
NAMESPACE = "inference"
SERVICE = "llama"


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loopback traffic never goes through a proxy from the environment."""
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")


def endpoint_slice(
    name: str,
    endpoints: list[dict[str, Any]],
    *,
    service: str = SERVICE,
    namespace: str = NAMESPACE,
) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "metrics", "port": 8000, "protocol": "TCP"}],
    }


def ready(*addresses: str) -> dict[str, Any]:
    return {"addresses": list(addresses), "conditions": {"ready": True}}


def not_ready(*addresses: str) -> dict[str, Any]:
    return {"addresses": list(addresses), "conditions": {"ready": False}}


class Cluster:
    """A kmock Kubernetes emulator on 127.0.0.1 with an EndpointSlice LIST that honours
    `labelSelector`, a switch to answer 403, and a real kubernetes ApiClient pointed at it."""

    def __init__(self, handler: kmock.KubernetesEmulator, server: kmock.Server) -> None:
        self.handler = handler
        self.server = server
        self.forbidden = False
        self.running = True
        self.api = client.ApiClient(client.Configuration(host=str(server.url).rstrip("/")))
        handler[kmock.action.LIST, kmock.resource(RESOURCE)] << self._list

    def add(self, slice_: dict[str, Any]) -> None:
        meta = slice_["metadata"]
        self.handler.objects[RESOURCE, meta["namespace"], meta["name"]] = slice_

    def remove(self, namespace: str, name: str) -> None:
        del self.handler.objects[RESOURCE, namespace, name]

    def list_requests(self) -> list[Any]:
        return [r for r in self.handler if "endpointslices" in str(r.url)]

    def _list(self, request: Any) -> dict[str, Any]:
        if self.forbidden:
            raise kmock.KubernetesError(
                status=403,
                reason="Forbidden",
                message='endpointslices.discovery.k8s.io is forbidden: User "scaler" cannot list',
            )
        selector = request.params.get("labelSelector", "")
        wanted = dict(term.split("=", 1) for term in selector.split(",") if term)
        items = []
        for (resource, namespace, _), obj in self.handler.objects.items():
            if resource != RESOURCE or obj.deleted or namespace != request.namespace:
                continue
            labels = obj.raw.get("metadata", {}).get("labels", {})
            if all(labels.get(key) == value for key, value in wanted.items()):
                items.append(obj.raw)
        return {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSliceList",
            "metadata": {"resourceVersion": "1"},
            "items": items,
        }

    async def stop(self) -> None:
        if self.running:
            self.running = False
            await self.server.__aexit__(None, None, None)


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with kmock.KubernetesEmulator() as handler:
        server = kmock.Server(handler)
        await server.__aenter__()
        found = Cluster(handler, server)
        try:
            yield found
        finally:
            await found.stop()
            found.api.close()


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Discovery's cache clock, without touching the global `time` module (asyncio uses it)."""
    fake = FakeClock()
    monkeypatch.setattr(discovery_module, "time", SimpleNamespace(monotonic=fake.monotonic))
    return fake


async def addresses(discovery: EndpointSliceDiscovery) -> list[str]:
    """One lookup, bounded in time (the client itself times out after 5 s)."""
    return await asyncio.wait_for(discovery.addresses(NAMESPACE, SERVICE), timeout=15)


# --- what is returned ----------------------------------------------------------------------------


async def test_only_ready_endpoints_are_returned(cluster: Cluster) -> None:
    cluster.add(
        endpoint_slice(
            "llama-abc",
            [ready("10.0.0.2"), not_ready("10.0.0.3"), ready("10.0.0.1")],
        )
    )
    found = await addresses(EndpointSliceDiscovery(cluster.api, cache_s=0))
    assert found == ["10.0.0.1", "10.0.0.2"]
    # It asked the API server for this Service's slices in this namespace.
    request = cluster.list_requests()[-1]
    assert request.namespace == NAMESPACE
    assert request.params["labelSelector"] == f"kubernetes.io/service-name={SERVICE}"


async def test_endpoints_without_a_ready_condition_count_as_ready(cluster: Cluster) -> None:
    """The API says an unknown (nil) `ready` is to be read as ready."""
    cluster.add(
        endpoint_slice(
            "llama-abc",
            [
                {"addresses": ["10.0.0.7"]},
                {"addresses": ["10.0.0.8"], "conditions": {}},
                not_ready("10.0.0.9"),
            ],
        )
    )
    found = await addresses(EndpointSliceDiscovery(cluster.api, cache_s=0))
    assert found == ["10.0.0.7", "10.0.0.8"]


async def test_addresses_are_merged_sorted_and_deduplicated_across_slices(
    cluster: Cluster,
) -> None:
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.5"), ready("10.0.0.1", "10.0.0.4")]))
    cluster.add(endpoint_slice("llama-2", [ready("10.0.0.4"), ready("10.0.0.2")]))
    cluster.add(endpoint_slice("llama-3", [ready("10.0.0.1"), not_ready("10.0.0.6")]))
    found = await addresses(EndpointSliceDiscovery(cluster.api, cache_s=0))
    assert found == ["10.0.0.1", "10.0.0.2", "10.0.0.4", "10.0.0.5"]


async def test_slices_of_other_services_and_namespaces_are_ignored(cluster: Cluster) -> None:
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.1")]))
    cluster.add(endpoint_slice("mistral-1", [ready("10.0.1.1")], service="mistral"))
    cluster.add(endpoint_slice("llama-x", [ready("10.0.2.1")], namespace="other-team"))
    found = await addresses(EndpointSliceDiscovery(cluster.api, cache_s=0))
    assert found == ["10.0.0.1"]


async def test_a_service_without_slices_has_no_addresses(cluster: Cluster) -> None:
    cluster.add(endpoint_slice("mistral-1", [ready("10.0.1.1")], service="mistral"))
    assert await addresses(EndpointSliceDiscovery(cluster.api, cache_s=0)) == []


async def test_a_slice_with_no_endpoints_has_no_addresses(cluster: Cluster) -> None:
    """A Service scaled to zero: its slice exists with `endpoints: null`."""
    slice_ = endpoint_slice("llama-1", [])
    slice_["endpoints"] = None
    cluster.add(slice_)
    assert await addresses(EndpointSliceDiscovery(cluster.api, cache_s=0)) == []


# --- caching -------------------------------------------------------------------------------------


async def test_answers_are_cached_for_cache_s(cluster: Cluster, clock: FakeClock) -> None:
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.1")]))
    discovery = EndpointSliceDiscovery(cluster.api, cache_s=5.0)
    assert await addresses(discovery) == ["10.0.0.1"]
    assert len(cluster.list_requests()) == 1

    # A new pod becomes ready; within cache_s the old answer stands and the API is not asked.
    cluster.add(endpoint_slice("llama-2", [ready("10.0.0.2")]))
    clock.now += 4.9
    assert await addresses(discovery) == ["10.0.0.1"]
    assert len(cluster.list_requests()) == 1

    # After cache_s the API is asked again and the new pod appears.
    clock.now += 0.2
    assert await addresses(discovery) == ["10.0.0.1", "10.0.0.2"]
    assert len(cluster.list_requests()) == 2


async def test_the_cache_is_per_namespace_and_service(cluster: Cluster, clock: FakeClock) -> None:
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.1")]))
    cluster.add(endpoint_slice("mistral-1", [ready("10.0.1.1")], service="mistral"))
    discovery = EndpointSliceDiscovery(cluster.api, cache_s=60.0)
    assert await addresses(discovery) == ["10.0.0.1"]
    found = await asyncio.wait_for(discovery.addresses(NAMESPACE, "mistral"), timeout=15)
    assert found == ["10.0.1.1"]
    assert len(cluster.list_requests()) == 2


async def test_with_cache_s_zero_every_lookup_asks_the_api(cluster: Cluster) -> None:
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.1")]))
    discovery = EndpointSliceDiscovery(cluster.api, cache_s=0)
    assert await addresses(discovery) == ["10.0.0.1"]
    cluster.remove(NAMESPACE, "llama-1")
    assert await addresses(discovery) == []
    assert len(cluster.list_requests()) == 2


# --- errors --------------------------------------------------------------------------------------


async def test_forbidden_raises_source_error_naming_the_service(
    cluster: Cluster, clock: FakeClock
) -> None:
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.1")]))
    cluster.forbidden = True
    discovery = EndpointSliceDiscovery(cluster.api, cache_s=5.0)
    with pytest.raises(SourceError) as caught:
        await addresses(discovery)
    message = str(caught.value)
    assert f"{NAMESPACE}/{SERVICE}" in message
    assert "403" in message

    # A failure is not cached: once RBAC is fixed the next lookup succeeds at once.
    cluster.forbidden = False
    assert await addresses(discovery) == ["10.0.0.1"]


async def gone_error(cluster: Cluster) -> tuple[SourceError, float]:
    """The API server answers once, then stops: the next lookup's error and how long it took."""
    cluster.add(endpoint_slice("llama-1", [ready("10.0.0.1")]))
    discovery = EndpointSliceDiscovery(cluster.api, cache_s=0)
    assert await addresses(discovery) == ["10.0.0.1"]
    await cluster.stop()
    started = time.monotonic()
    with pytest.raises(SourceError) as caught:
        await addresses(discovery)
    return caught.value, time.monotonic() - started


async def test_api_server_gone_raises_source_error(cluster: Cluster) -> None:
    error, elapsed = await gone_error(cluster)
    assert elapsed < 10
    assert "kubernetes API" in str(error)


async def test_api_server_gone_error_names_the_service(cluster: Cluster) -> None:
    """Like the 403 message, this one must say whose endpoints could not be listed. Today it is
    `kubernetes API unreachable: ` + urllib3's MaxRetryError text (the URL-encoded request path),
    cut at 300 characters, which also cuts off the cause (`Connection refused`)."""
    error, _ = await gone_error(cluster)
    message = str(error)
    assert f"{NAMESPACE}/{SERVICE}" in message, message
    assert "refused" in message.lower(), message
