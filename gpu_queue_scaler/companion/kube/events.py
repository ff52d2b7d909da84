"""Kubernetes Events on a NodePool, one per change the companion made, so `kubectl describe
nodepool` says what it did and why. Best effort: a lost Event is counted, never fails a write.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from gpu_queue_scaler.companion.kube.client import KubeClient, KubeError, log
from gpu_queue_scaler.companion.model import MANAGED_BY
from gpu_queue_scaler.companion.patches import NODEPOOL_API_VERSION


class Events(KubeClient):
    """Creates the Events of one companion in --event-namespace; `events_failed` counts losses."""

    events_failed = 0  # Events that could not be created (best effort; counted per instance)

    def _post_event(
        self, nodepool: str, uid: str | None, reason: str, message: str, now: float
    ) -> None:
        """One Event, not retried (the next change brings another); a failure is logged."""
        event = self.event_body(nodepool, uid, reason, message, now)
        try:
            self._call(
                f"creating Event for NodePool {nodepool}",
                lambda _: self._core.create_namespaced_event(
                    self.settings.event_namespace,
                    event,
                    _request_timeout=self.settings.request_timeout_s,
                ),
                retry=False,
            )
        except KubeError as exc:
            self.events_failed += 1
            log.warning("%s", exc, extra={"event": "event_failed", "nodepool": nodepool})

    def event_body(
        self, nodepool: str, uid: str | None, reason: str, message: str, now: float
    ) -> dict[str, Any]:
        """A core/v1 Event on the NodePool (its uid when read), stamped `now`."""
        s = self.settings
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        involved: dict[str, Any] = {
            "apiVersion": NODEPOOL_API_VERSION,
            "kind": "NodePool",
            "name": nodepool,
        }
        if uid is not None:
            involved["uid"] = uid
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{nodepool}.{time.time_ns():x}",
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
