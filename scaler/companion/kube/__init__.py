"""The companion's Kubernetes edge (being split by job; `writes` holds it all for now)."""

from scaler.companion.kube.writes import (
    API_ACCESS,
    CLUSTER,
    EVENTS,
    LEASE,
    LIVE_PHASES_SELECTOR,
    NAMESPACE,
    ClusterView,
    Kube,
    KubeError,
    KubeSettings,
    Write,
    micro_time,
    parse_time,
)

__all__ = [
    "API_ACCESS",
    "CLUSTER",
    "EVENTS",
    "LEASE",
    "LIVE_PHASES_SELECTOR",
    "NAMESPACE",
    "ClusterView",
    "Kube",
    "KubeError",
    "KubeSettings",
    "Write",
    "micro_time",
    "parse_time",
]
