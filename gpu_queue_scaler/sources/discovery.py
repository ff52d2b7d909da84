"""Find a workload's serving pods: EndpointSlices of its Service, or a static target list.

The kubernetes client is synchronous, so lists run in a worker thread; answers are cached for a few
seconds per (namespace, service), which is as fresh as the endpoints controller itself. Only ready
endpoints are scraped: a pod still loading its model is not serving and its queue is not ours yet.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from gpu_queue_scaler.sources import SourceError

CACHE_S = 5.0


class EndpointSliceDiscovery:
    def __init__(self, api_client: Any | None = None, cache_s: float = CACHE_S) -> None:
        self._api_client = api_client
        self._api: Any | None = None
        self._cache: dict[tuple[str, str], tuple[float, list[str]]] = {}
        self._cache_s = cache_s

    def _discovery_api(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            if self._api_client is None:
                try:
                    config.load_incluster_config()
                except config.ConfigException:
                    try:
                        config.load_kube_config()
                    except (config.ConfigException, OSError) as exc:
                        raise SourceError(f"no Kubernetes API configuration: {exc}") from None
                self._api_client = client.ApiClient()
            self._api = client.DiscoveryV1Api(self._api_client)
        return self._api

    def _list(self, namespace: str, service: str) -> list[str]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            slices = self._discovery_api().list_namespaced_endpoint_slice(
                namespace,
                label_selector=f"kubernetes.io/service-name={service}",
                _request_timeout=5,
            )
        except ApiException as exc:
            raise SourceError(
                f"kubernetes API: listing EndpointSlices of {namespace}/{service}: "
                f"{exc.status} {exc.reason}"
            ) from None
        except (HTTPError, OSError, ValueError) as exc:
            cause = getattr(exc, "reason", None) or exc
            raise SourceError(
                f"kubernetes API unreachable listing EndpointSlices of {namespace}/{service}: "
                f"{cause}"[:300]
            ) from None
        addresses: list[str] = []
        for item in slices.items or []:
            for endpoint in item.endpoints or []:
                conditions = endpoint.conditions
                if conditions is not None and conditions.ready is False:
                    continue
                addresses.extend(endpoint.addresses or [])
        return sorted(set(addresses))

    async def addresses(self, namespace: str, service: str) -> list[str]:
        key = (namespace, service)
        cached = self._cache.get(key)
        now = time.monotonic()
        if cached is not None and now - cached[0] < self._cache_s:
            return cached[1]
        found = await asyncio.to_thread(self._list, namespace, service)
        self._cache[key] = (now, found)
        return found
