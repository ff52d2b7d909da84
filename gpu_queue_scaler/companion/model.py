"""The companion's values: what it reads (demand, placement, NodePool state) and what it decides.

The companion is the second surface of the scaler: the scaler's decisions and
forecasts -> GPU node capacity for Karpenter. Data flows one way, like the scaler's:

    kube/reads.py, inputs.py (I/O: read)
        ->  plan.py (pure: values in, a plan out, time an argument)
        ->  kube/writes.py (I/O: merge patches of only the fields the companion owns)

Everything here is a frozen value so a plan can be logged, compared, tested and replayed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GPU_RESOURCE = "nvidia.com/gpu"
# Annotations the companion writes on what it patches (the previous value, for a human or a
# rollback) and reads on a ScaledObject / Deployment (an explicit NodePool for the workload).
ANNOTATION_PREFIX = "gpu-queue-scaler.io/"
NODEPOOL_ANNOTATION = ANNOTATION_PREFIX + "nodepool"
PREVIOUS_LIMIT_ANNOTATION = ANNOTATION_PREFIX + "previous-gpu-limit"
PREVIOUS_BUDGETS_ANNOTATION = ANNOTATION_PREFIX + "previous-budgets"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpu-queue-scaler-companion"
PEAK_BUDGET_REASONS = ("Underutilized", "Empty")


@dataclass(frozen=True)
class WorkloadDemand:
    """One workload as the scaler last decided it (from GET /decisions on the scaler)."""

    workload: str  # "namespace/name" of the ScaledObject
    at: float  # the decision's tick, wall-clock seconds
    replicas: int  # the scaler's current target
    active: bool
    # The q90 forecast of replicas within the horizon (Outlook.upper_max), None with forecast off.
    forecast_replicas: float | None
    horizon_s: float | None  # the horizon that forecast covers (None with forecast off)


@dataclass(frozen=True)
class Placement:
    """Where one workload's replicas land, read from Kubernetes."""

    workload: str  # "namespace/name" of the ScaledObject
    nodepool: str  # Karpenter NodePool name
    gpus_per_replica: int  # the pod template's nvidia.com/gpu request (limits if no request)
    # Pods of the workload that hold or are getting their GPUs: phase Pending or Running and not
    # terminating (no deletionTimestamp); placeholders never count. A Pending GPU pod already
    # makes Karpenter launch a node for it, so it is capacity on order, not a gap to pre-warm.
    live_pods: int
    source: str  # how the NodePool was found: "annotation" | "nodeSelector" | "affinity"
    # The ScaledObject's spec.maxReplicaCount (KEDA's default 100 when unset): the HPA never
    # creates more pods, so a forecast above it buys nothing. None: no cap known.
    max_replicas: int | None = None


@dataclass(frozen=True)
class NodePoolState:
    """One Karpenter NodePool and what runs on it, read from Kubernetes."""

    name: str
    ready_gpus: int  # allocatable nvidia.com/gpu on Ready nodes labelled karpenter.sh/nodepool=name
    # nvidia.com/gpu of the non-placeholder pods bound to those nodes (Running, or Pending while
    # their containers start), i.e. GPUs in use
    running_gpus: int
    gpu_limit: str | None  # spec.limits["nvidia.com/gpu"] as stored (None: unset)
    budgets: tuple[dict[str, object], ...]  # spec.disruption.budgets as stored
    annotations: dict[str, str] = field(default_factory=dict)
    placeholders: int | None = None  # the placeholder Deployment's replicas (None: absent)
    placeholder_gpus: int = 1  # nvidia.com/gpu per placeholder pod
    # The placeholder Deployment's template hash (PLACEHOLDER_TEMPLATE_ANNOTATION; None: absent)
    placeholder_template: str | None = None


@dataclass(frozen=True)
class CompanionConfig:
    """Tuning, from the companion's flags / ConfigMap (defaults documented in docs/companion.md)."""

    placeholder_gpus: int = 1  # GPUs per placeholder pod
    max_placeholders: int = 16  # per NodePool: a bound on what a bad forecast can buy
    # Peak protection: add the budget while forecast GPUs rise by at least this fraction over the
    # ready GPUs, or exceed `peak_high_fraction` of the limit; keep it `peak_hold_s` after.
    peak_rise_fraction: float = 0.0
    peak_hold_s: float = 600.0
    # Hard guard: outside these UTC hours [start, end) the NodePool's GPU limit is 0, unless a
    # workload on it is active. None: no guard.
    active_hours_utc: tuple[int, int] | None = None
    stale_after_s: float = 120.0  # demand older than this is unknown: hold, never scale down
    # Packing (gpu_queue_scaler.companion.packing): each workload pod's controller.kubernetes.io/
    # pod-deletion-cost = the GPU pods on its node, so scale-downs empty the least-used nodes
    # first; at most `pack_max_writes` pod PATCHes per pass. Off: --no-pack.
    pack: bool = True
    pack_max_writes: int = 100


@dataclass(frozen=True)
class NodePoolPlan:
    """What the companion wants for one NodePool, and why (for logs, Events and metrics)."""

    nodepool: str
    placeholders: int  # placeholder pods wanted (each placeholder_gpus GPUs)
    peak_budget: bool  # the companion's `nodes: "0"` budget present
    gpu_limit: str | None  # the nvidia.com/gpu limit wanted (None: leave as the user set it)
    forecast_gpus: float  # GPUs the workloads on this pool are forecast to need at the horizon
    reasons: tuple[str, ...]
    # Fail static: some workload's demand is missing or stale, so nothing was lowered this pass.
    held: bool = False


@dataclass(frozen=True)
class CompanionState:
    """What the planner remembers between passes (pure; passed in and returned)."""

    peak_until: dict[str, float] = field(default_factory=dict)  # nodepool -> hold the budget until
    last_forecast_gpus: dict[str, float] = field(default_factory=dict)  # nodepool -> last pass
    last_demand_at: dict[str, float] = field(default_factory=dict)  # workload -> last fresh demand
    # nodepool -> the workloads' target GPUs at the last pass: only a target already asked for
    # then and still without pods is pre-warmed (the HPA's lag outlasted a pass; plan.py, rule 3)
    last_target_gpus: dict[str, float] = field(default_factory=dict)
