"""The Karpenter companion in the simulated loop: nodes pre-warmed, scale-downs packed.

Why the real planner: the companion rows are meant to show what the companion buys, so every
`COMPANION_INTERVAL_S` it calls `gpu_queue_scaler.companion.plan.plan` on values built from the
simulated cluster exactly as `gpu_queue_scaler.companion.kube` reads them from Kubernetes, applies
the plan's placeholders with `Cluster.set_placeholders`, and (unless `CompanionConfig.pack` is off)
packs: `Cluster.pack` writes each pod's `controller.kubernetes.io/pod-deletion-cost` by the
companion's own rule (`gpu_queue_scaler.companion.packing.pack`), so the HPA's next scale-downs
empty the least-used nodes first and WhenEmpty consolidation can remove them. Values:

- demand: the scaler's latest Decision (replicas, active, forecast = its Outlook's q90 maximum
  within the horizon, absent with forecast off);
- placement: one workload, one GPU per replica, live pods = every live replica of the
  simulated Deployment (pending, loading or serving; not draining, which is a deleted pod), as
  kube.py counts Pending and Running pods that are not terminating: a pending pod already makes
  Karpenter launch a node, so it is capacity on order, not a gap to pre-warm; max replicas = the
  scaler spec's max_replicas (the ScaledObject's maxReplicaCount);
- NodePool: ready GPUs on ready live nodes, GPUs of the pods bound to a ready node (loading,
  serving or draining: a loading pod already holds its GPU), no limit, no budgets (consolidation
  in the simulator defaults to WhenEmptyOrUnderutilized with Karpenter's default 10% budget,
  which the planner is not told about).

Rows (`gpu_queue_scaler_bench.sim.run.companion_rows`): `scaler+companion` is the product's default,
the scaler with its default metadata (forecast wake) plus the companion, whose placeholders then
stand only for a target the HPA lags by a whole pass, so what it buys there is the packing;
`scaler+forecast` is the scaler with forecast=on and `scaler+prewarm` the same plus the
companion (placeholders for the forecast q90 beyond the target, and packing): the gap between
those two is the companion on a forecasting scaler. This scaler's target already covers its own
q90 forecast, so there too the placeholders are rare and the packing is what differs.

The pass runs in the same step as the HPA's sync (both every 15 s from the first step) and reads
the cluster before the HPA's scale-up of that step lands: the worst case of the race a real
cluster has at random phases, which is why the planner does not pre-warm a target the HPA is
applying (`gpu_queue_scaler.companion.plan`, rule 3).
"""

from __future__ import annotations

import math

from gpu_queue_scaler.companion.model import (
    CompanionConfig,
    CompanionState,
    NodePoolPlan,
    NodePoolState,
    Placement,
    WorkloadDemand,
)
from gpu_queue_scaler.companion.plan import plan
from gpu_queue_scaler_bench.sim.cluster import Cluster, Phase
from gpu_queue_scaler_bench.sim.fleet import ServingFleet, StepStats
from gpu_queue_scaler_bench.sim.policies import ScalerPolicy

COMPANION = "scaler+companion"
FORECAST = "scaler+forecast"
PREWARM = "scaler+prewarm"
COMPANION_INTERVAL_S = 15.0  # the companion's default --interval
WORKLOAD = "bench/llama-3-8b"
NODEPOOL = "gpu"
RUNNING = (Phase.LOADING, Phase.READY, Phase.DRAINING)  # bound to a ready node: GPUs in use
LIVE = (Phase.PENDING, Phase.LOADING, Phase.READY)  # the Deployment's replicas, not terminating


def with_forecast(policy: ScalerPolicy, name: str = FORECAST) -> ScalerPolicy:
    """The scaler row renamed (its metadata must already say forecast=on)."""
    policy.name = name
    return policy


class Prewarm:
    """The scaler (KEDA + HPA as in `ScalerPolicy`) plus the companion placing placeholders and
    packing scale-downs."""

    def __init__(
        self,
        scaler: ScalerPolicy,
        config: CompanionConfig | None = None,
        interval_s: float = COMPANION_INTERVAL_S,
        name: str = PREWARM,
    ) -> None:
        self.name = name
        self.scaler = scaler
        self.config = config or CompanionConfig()
        if self.config.placeholder_gpus != 1:
            raise ValueError("the simulator's placeholders hold one GPU each")
        self.interval_s = interval_s
        self.state = CompanionState()
        self.next_pass = -math.inf
        self.plans: list[NodePoolPlan] = []

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        wanted = self.scaler.act(at, fleet, cluster, stats)
        if at + 1e-9 >= self.next_pass:
            self.next_pass = at + self.interval_s
            pool_plan = self.companion_pass(at, cluster)
            cluster.set_placeholders(at, pool_plan.placeholders)
            if self.config.pack:
                cluster.pack(self.config.pack_max_writes)
        return wanted

    def companion_pass(self, at: float, cluster: Cluster) -> NodePoolPlan:
        """One companion pass on the cluster as Kubernetes would show it at `at`."""
        decision = self.scaler.decision
        demands = []
        if decision is not None:
            outlook = decision.outlook
            demands.append(
                WorkloadDemand(
                    workload=WORKLOAD,
                    at=decision.at,
                    replicas=decision.replicas,
                    active=decision.active,
                    forecast_replicas=outlook.upper_max if outlook is not None else None,
                    horizon_s=outlook.horizon_s if outlook is not None else None,
                )
            )
        running = sum(1 for p in cluster.pods.values() if p.phase in RUNNING)
        live = sum(1 for p in cluster.pods.values() if p.phase in LIVE)
        ready_nodes = sum(
            1 for n in cluster.nodes.values() if n.terminated_at is None and n.ready_at <= at
        )
        placement = Placement(
            WORKLOAD, NODEPOOL, 1, live, "annotation", max_replicas=self.scaler.spec.max_replicas
        )
        pool = NodePoolState(
            name=NODEPOOL,
            ready_gpus=ready_nodes * cluster.cfg.node.gpus,
            running_gpus=running,
            gpu_limit=None,
            budgets=(),
            placeholders=len(cluster.placeholders),
            placeholder_gpus=self.config.placeholder_gpus,
        )
        plans, self.state = plan(demands, [placement], [pool], self.config, self.state, at)
        self.plans.append(plans[0])
        return plans[0]
