"""The Karpenter companion in the simulated loop (issue 6): nodes pre-warmed from the forecast.

Why the real planner: the `scaler+prewarm` row is meant to show what the companion buys, so every
`COMPANION_INTERVAL_S` it calls `scaler.companion.plan.plan` on values built from the simulated
cluster exactly as `scaler.companion.kube` reads them from Kubernetes, and applies the plan's
placeholders with `Cluster.set_placeholders`:

- demand: the scaler's latest Decision (replicas, active, forecast = its Outlook's q90 maximum
  within the horizon, absent with forecast off);
- placement: one workload, one GPU per replica, live pods = every live replica of the
  simulated Deployment (pending, loading or serving; not draining, which is a deleted pod), as
  kube.py counts Pending and Running pods that are not terminating: a pending pod already makes
  Karpenter launch a node, so it is capacity on order, not a gap to pre-warm; max replicas = the
  scaler spec's max_replicas (the ScaledObject's maxReplicaCount);
- NodePool: ready GPUs on ready live nodes, GPUs of the pods bound to a ready node (loading,
  serving or draining: a loading pod already holds its GPU), no limit, no budgets (consolidation
  in the simulator is WhenEmpty only, so a peak budget changes nothing here).

The scaler under the companion runs with forecast=on (pre-warm follows the forecast), so the
bench also runs `scaler+forecast`, the same scaler without the companion: the gap between the two
rows is the pre-warm alone.
"""

from __future__ import annotations

import math

from scaler.companion.model import (
    CompanionConfig,
    CompanionState,
    NodePoolPlan,
    NodePoolState,
    Placement,
    WorkloadDemand,
)
from scaler.companion.plan import plan
from scaler.sim.cluster import Cluster, Phase
from scaler.sim.fleet import Fleet, StepStats
from scaler.sim.policies import ScalerPolicy

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
    """The scaler (KEDA + HPA as in `ScalerPolicy`) plus the companion placing placeholders."""

    name = PREWARM

    def __init__(
        self,
        scaler: ScalerPolicy,
        config: CompanionConfig | None = None,
        interval_s: float = COMPANION_INTERVAL_S,
    ) -> None:
        self.scaler = scaler
        self.config = config or CompanionConfig()
        if self.config.placeholder_gpus != 1:
            raise ValueError("the simulator's placeholders hold one GPU each")
        self.interval_s = interval_s
        self.state = CompanionState()
        self.next_pass = -math.inf
        self.plans: list[NodePoolPlan] = []

    def act(self, at: float, fleet: Fleet, cluster: Cluster, stats: StepStats) -> int | None:
        wanted = self.scaler.act(at, fleet, cluster, stats)
        if at + 1e-9 >= self.next_pass:
            self.next_pass = at + self.interval_s
            pool_plan = self.companion_pass(at, cluster)
            cluster.set_placeholders(at, pool_plan.placeholders)
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
