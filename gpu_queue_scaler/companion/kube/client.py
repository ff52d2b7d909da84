"""The plumbing every Kubernetes request goes through: the API groups, timeouts, retries, errors
as `KubeError`, and `API_ACCESS`, the list of every request the companion sends (what RBAC grants).

Retries (tenacity, jittered exponential backoff, a few attempts): 409 Conflict, 429, 5xx, timeouts
and connection errors. Other 4xx are not retried: they will not heal by themselves. When retries
run out the pass stops with `KubeError`; the caller keeps its last good state and tries again next
pass. The sync `kubernetes` client runs in worker threads so the event loop stays free.

deploy/companion/rbac.yaml grants exactly `API_ACCESS`, and the tests check both sides: the
manifest against the constant (tests/surface/test_manifests.py) and every request the companion
sends to the API emulator against it (tests/surface/test_companion_kube.py).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from gpu_queue_scaler.companion.model import GPU_RESOURCE, MANAGED_BY
from gpu_queue_scaler.companion.patches import NODEPOOL_GROUP, PAUSE_IMAGE

# One logger for the package (its JSON lines name "<package>.companion.kube", as one module did).
log = logging.getLogger(__package__)

NODEPOOL_PLURAL = "nodepools"
KEDA_GROUP, KEDA_VERSION, SCALEDOBJECT_PLURAL = "keda.sh", "v1alpha1", "scaledobjects"
MERGE_PATCH = "application/merge-patch+json"
STRICT = "Strict"
FIELD_MANAGER = MANAGED_BY

# Scopes of API_ACCESS: where the permission must hold.
CLUSTER = "cluster"  # any namespace, or cluster-scoped objects (ClusterRole)
NAMESPACE = "namespace"  # the companion's --namespace only (Role there)
LEASE = "lease"  # the companion's --namespace, on the Lease named --lease-name only
EVENTS = "events"  # the --event-namespace only (Role there)
# Every request the companion sends, as (API group, resource, verb, scope): RBAC must grant
# exactly these (deploy/companion/rbac.yaml; tests/surface/test_manifests.py compares the two).
API_ACCESS: frozenset[tuple[str, str, str, str]] = frozenset(
    {
        # reads list NodePools; a retried patch re-gets one; patches touch only the fields
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


def _retryable(exc: BaseException) -> bool:
    """Conflicts, throttling, server errors, timeouts and connection errors may heal."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        return status in (409, 429) or status >= 500
    return isinstance(exc, HTTPError | OSError)


def describe(what: str, exc: BaseException) -> KubeError:
    """The failure of `what` as one bounded line: the API's status and message, or the cause."""
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


def as_json(response: Any) -> dict[str, Any]:
    """The body of a `_preload_content=False` response as a dict."""
    found = json.loads(response.data or b"{}")
    if not isinstance(found, dict):
        raise ValueError(f"expected a JSON object, got {type(found).__name__}")
    return found


class KubeClient:
    """The API groups of one companion and the calls through them: every request has a timeout,
    is retried as documented above and fails as `KubeError`. Reads, the Lease, writes and Events
    build on it (`gpu_queue_scaler.companion.kube.cluster.Kube`)."""

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

    def _retrying(self, what: str) -> Retrying:
        def before_sleep(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            log.warning(
                "attempt %d failed, retrying: %s",
                state.attempt_number,
                describe(what, error) if error is not None else what,
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
            raise describe(what, exc) from None
        raise KubeError(f"kubernetes API: {what}: gave up")  # pragma: no cover (reraise=True)

    def _get(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
        timeout = self.settings.request_timeout_s
        found: dict[str, Any] = self._call(
            what,
            lambda _: as_json(
                fn(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            ),
        )
        return found

    def _items(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> list[Any]:
        items = self._get(what, fn, *args, **kwargs).get("items") or []
        return [item if isinstance(item, dict) else {} for item in items]

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
        return as_json(response)

    def _get_or_none(self, what: str, fn: Callable[..., Any], *args: Any) -> dict[str, Any] | None:
        found: dict[str, Any] | None = self._call(what, lambda _: self._raw_get(fn, *args))
        return found
