"""Karpenter-like GPU nodes under the workload's Deployment: where cold starts and cost come from.

Why nodes and not just replicas: a GPU replica that needs a new node waits for the node (launch,
boot, device plugin) and then for its model to load; a replica that fits on a node already up waits
only for the model. And cost is paid per node-hour, whole nodes, from launch to termination, so a
fleet that shrinks from 9 replicas to 8 on 8-GPU nodes still pays for two nodes until the second
one is empty for `consolidateAfter`.

Consolidation (`ClusterConfig.consolidation`, a NodePool's `spec.disruption.consolidationPolicy`):
`WhenEmpty` removes a node once it has had no pods for `consolidateAfter`.
`WhenEmptyOrUnderutilized` (Karpenter v1's default) also repacks: a ready node whose pods have not
changed for `consolidateAfter` and whose pods (placeholders included) all fit on the free GPUs of
the other ready, non-empty nodes is disrupted: tainted (nothing new binds there), its pods evicted
(a ready pod drains like a deleted one, for the termination grace period; the ReplicaSet creates
a replacement at once, which binds to a free GPU elsewhere and loads the model again: the restart
the repack costs), then the node goes once its pods are gone. Candidates go fewest pods first,
several at once when their pods fit together (multi-node consolidation), within the disruption
budget (`nodes: 10%` of the NodePool's nodes, rounded up, Karpenter's default) and never while
pods are pending. An empty node is no destination (moving pods onto it rather than removing it
saves nothing). Not modelled: replacing nodes by a cheaper launch (one node type here, so a
replacement is never cheaper than the node it replaces, except k nodes by one new node, which is
left out) and PodDisruptionBudgets. A Deployment whose pods carry `karpenter.sh/do-not-disrupt`
(`Cluster.do_not_disrupt`) is never repacked.

Pods: a Deployment scale-up creates pending pods; they bind to free GPUs on ready nodes (then load
the model), or to free GPUs on nodes being launched, or Karpenter launches ceil(rest / GPUs per
node) new nodes. A scale-down deletes pods in the ReplicaSet controller's order (unscheduled
first, then not ready, then the lowest `pod-deletion-cost`, then ready pods on nodes with more
replicas of the set, newest first: so without deletion costs it spreads the fleet; `pack`); a
deleted ready pod stops receiving requests and drains its running ones for up to the termination
grace period (terminationGracePeriodSeconds), then SIGKILL drops anything left, as Kubernetes does.

Placeholders (`set_placeholders`, the companion's pre-warm): negative-priority pause pods of one
GPU each. They bind like pods (free GPUs, else Karpenter launches nodes for them), hold their
node against consolidation, and a real pod that finds no free GPU preempts one (ready nodes
first); the preempted placeholder pends again, so Karpenter launches a node for it, as with real
overprovisioning. Kept apart from `pods` so that with none the cluster runs exactly as without.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler.companion.packing import PackPod, pack
from gpu_queue_scaler_bench.sim.profiles import NodeType

IntArray = NDArray[np.int64]


class Phase(Enum):
    PENDING = "pending"  # no node yet, or bound to a node that is still launching
    LOADING = "loading"  # on a ready node, loading the model
    READY = "ready"  # serving
    DRAINING = "draining"  # deleted, finishing its running requests


@dataclass
class Pod:
    id: int
    created_at: float
    phase: Phase = Phase.PENDING
    node: int | None = None
    ready_at: float = math.inf
    deadline: float = math.inf  # draining: termination grace ends
    # The `controller.kubernetes.io/pod-deletion-cost` annotation (0 when absent): on scale-down
    # the ReplicaSet deletes lower costs first, after unscheduled and not-ready pods.
    deletion_cost: int = 0


@dataclass
class Placeholder:
    id: int
    created_at: float
    node: int | None = None  # None: pending


@dataclass
class Node:
    id: int
    launched_at: float
    ready_at: float
    pods: set[int] = field(default_factory=set)
    holders: set[int] = field(default_factory=set)  # placeholders bound here
    empty_since: float | None = None
    terminated_at: float | None = None
    last_change: float = -math.inf  # a pod bound or removed here (consolidateAfter's clock)
    disrupting: bool = False  # tainted by consolidation: its pods are being evicted


WHEN_EMPTY = "WhenEmpty"
WHEN_UNDERUTILIZED = "WhenEmptyOrUnderutilized"
CONSOLIDATION_POLICIES = (WHEN_EMPTY, WHEN_UNDERUTILIZED)
DISRUPTION_BUDGET = 0.1  # NodePool spec.disruption.budgets default: nodes "10%"


@dataclass(frozen=True)
class ClusterConfig:
    node: NodeType
    node_launch_s: float  # NodeClaim created -> node ready with nvidia.com/gpu allocatable
    model_load_s: float  # pod bound on a ready node -> serving
    consolidate_after_s: float = 60.0
    termination_grace_s: float = 30.0
    max_nodes: int = 1000  # NodePool limits
    consolidation: str = WHEN_UNDERUTILIZED  # NodePool spec.disruption.consolidationPolicy

    def __post_init__(self) -> None:
        if self.consolidation not in CONSOLIDATION_POLICIES:
            raise ValueError(
                f"consolidation {self.consolidation!r}: accepted "
                + ", ".join(CONSOLIDATION_POLICIES)
            )


class Cluster:
    def __init__(self, config: ClusterConfig) -> None:
        self.cfg = config
        self.pods: dict[int, Pod] = {}
        self.nodes: dict[int, Node] = {}
        self._next_pod = 0
        self._next_node = 0
        self.gpu_seconds = 0.0
        self.zero_node_seconds = 0.0
        self.dropped_by_kill = 0
        self.evictions = 0  # pods evicted by WhenEmptyOrUnderutilized consolidation
        # The pod template's `karpenter.sh/do-not-disrupt: "true"`: consolidation leaves nodes
        # running these pods alone (it still removes empty nodes).
        self.do_not_disrupt = False
        self.placeholders: dict[int, Placeholder] = {}
        self._next_placeholder = 0
        # (created_at, ready_at) of every pod that became ready in `tick` (warm pods excluded).
        self.starts: list[tuple[float, float]] = []

    # --- the Deployment -----------------------------------------------------------------------

    @property
    def replicas(self) -> int:
        """The Deployment's replica count: pods that are not being deleted."""
        return sum(1 for p in self.pods.values() if p.phase is not Phase.DRAINING)

    @property
    def ready(self) -> int:
        return sum(1 for p in self.pods.values() if p.phase is Phase.READY)

    @property
    def live_nodes(self) -> int:
        return sum(1 for n in self.nodes.values() if n.terminated_at is None)

    def serving(self) -> IntArray:
        ids = sorted(p.id for p in self.pods.values() if p.phase is Phase.READY)
        return np.asarray(ids, dtype=np.int64)

    def draining(self) -> IntArray:
        ids = sorted(p.id for p in self.pods.values() if p.phase is Phase.DRAINING)
        return np.asarray(ids, dtype=np.int64)

    def set_placeholders(self, at: float, n: int) -> None:
        """Want `n` placeholder pods: new ones bind at the next tick; fewer removes pending ones
        first, then those on the nodes with the fewest real pods, a node at a time (so those
        nodes can empty and be consolidated)."""
        held = list(self.placeholders.values())
        if n > len(held):
            for _ in range(n - len(held)):
                self.placeholders[self._next_placeholder] = Placeholder(self._next_placeholder, at)
                self._next_placeholder += 1
            return

        def order(h: Placeholder) -> tuple[int, int, int, int, int]:
            if h.node is None:
                return (0, 0, 0, 0, -h.id)
            node = self.nodes[h.node]
            return (1, len(node.pods), len(node.holders), node.id, -h.id)

        for h in sorted(held, key=order)[: len(held) - max(0, n)]:
            if h.node is not None:
                self._unbind_placeholder(h, at)
            del self.placeholders[h.id]

    def pack(self, limit: int | None = None) -> None:
        """Write the deletion costs the companion's own rule
        (`gpu_queue_scaler.companion.packing.pack`, at most `limit` changes; None: all) wants for
        the live pods: the real pods on their node. A scale-down then empties the least-used nodes
        first, so WhenEmpty consolidation can remove them, where the ReplicaSet's default order
        (doubled-up pods first) spreads the fleet and leaves every node part-full. Terminating pods
        are neither counted nor written."""
        live = [
            p for p in self.pods.values() if p.node is not None and p.phase is not Phase.DRAINING
        ]
        found = [
            PackPod(
                namespace="sim",
                name=str(p.id),
                node=str(p.node),
                nodepool="sim",
                workload="sim/workload",
                deletion_cost=str(p.deletion_cost) if p.deletion_cost else None,
            )
            for p in live
        ]
        for change in pack(found, len(found) if limit is None else limit):
            self.pods[int(change.pod.name)].deletion_cost = change.cost

    def warm(self, replicas: int, at: float = 0.0) -> None:
        """Start with `replicas` serving on ready nodes (the simulation's warm start)."""
        gpus = self.cfg.node.gpus
        for _ in range(math.ceil(replicas / gpus)):
            self._launch(at, ready_at=at)
        free = self._free_slots()
        for _ in range(replicas):
            pod = self._new_pod(at)
            node = free.pop(0)
            self._bind(pod, node, at)
            pod.phase, pod.ready_at = Phase.READY, at

    def scale_to(self, at: float, desired: int) -> None:
        """Set the Deployment's replicas: create pending pods or delete in ReplicaSet order."""
        live = [p for p in self.pods.values() if p.phase is not Phase.DRAINING]
        if desired > len(live):
            for _ in range(desired - len(live)):
                self._new_pod(at)
            return
        if desired == len(live):
            return
        per_node: dict[int | None, int] = {}
        for p in live:
            per_node[p.node] = per_node.get(p.node, 0) + 1
        rank = {Phase.PENDING: 0, Phase.LOADING: 1, Phase.READY: 2}

        def order(p: Pod) -> tuple[int, int, int, int, float, int]:
            return (
                0 if p.node is None else 1,
                rank[p.phase],
                p.deletion_cost,  # controller.kubernetes.io/pod-deletion-cost: lowest first
                -per_node.get(p.node, 0),  # doubled up: more pods of the set on its node first
                -p.ready_at if p.phase is Phase.READY else -p.created_at,  # newest first
                -p.id,
            )

        for pod in sorted(live, key=order)[: len(live) - desired]:
            if pod.phase is Phase.READY:
                pod.phase, pod.deadline = Phase.DRAINING, at + self.cfg.termination_grace_s
            else:
                self._remove(pod, at)

    # --- time ------------------------------------------------------------------------------------

    def tick(self, at: float, dt: float, running: dict[int, int]) -> IntArray:
        """Advance to `at`: nodes come up, models load, drained pods go, pending pods bind or
        make Karpenter launch nodes, empty nodes are consolidated; bill the step [at, at + dt).
        `running` is the running-request count per draining pod. Returns pods killed with
        requests still running (their requests drop)."""
        killed: list[int] = []
        for node in self.nodes.values():
            if node.terminated_at is None and node.ready_at <= at:
                for pid in node.pods:
                    pod = self.pods[pid]
                    if pod.phase is Phase.PENDING:
                        pod.phase = Phase.LOADING
                        pod.ready_at = max(node.ready_at, pod.created_at) + self.cfg.model_load_s
        for pod in list(self.pods.values()):
            if pod.phase is Phase.LOADING and pod.ready_at <= at:
                pod.phase = Phase.READY
                self.starts.append((pod.created_at, pod.ready_at))
            elif pod.phase is Phase.DRAINING:
                left = running.get(pod.id, 0)
                if left == 0 or at >= pod.deadline:
                    if left:
                        killed.append(pod.id)
                    self._remove(pod, at)
        self._provision(at)
        self._consolidate(at)
        alive = self.live_nodes
        self.gpu_seconds += alive * self.cfg.node.gpus * dt
        if alive == 0:
            self.zero_node_seconds += dt
        return np.asarray(killed, dtype=np.int64)

    def _provision(self, at: float) -> None:
        pending = [p for p in self.pods.values() if p.phase is Phase.PENDING and p.node is None]
        if pending:
            pending.sort(key=lambda p: p.id)
            slots: list[tuple[int, Placeholder | None]] = [(n, None) for n in self._free_slots()]
            slots += [(h.node, h) for h in self.placeholders.values() if h.node is not None]
            # Ready nodes first (the pod starts loading now), then nodes still launching; on
            # each, a free GPU before a placeholder's (preempting costs the placeholder a node).
            slots.sort(key=lambda s: self._slot_key(s[0], s[1], at))
            taken = 0
            while pending and taken < len(slots):
                (node, holder), pod = slots[taken], pending.pop(0)
                taken += 1
                if holder is not None:
                    self._unbind_placeholder(holder, at)
                self._bind(pod, node, at)
                if self.nodes[node].ready_at <= at:
                    pod.phase, pod.ready_at = Phase.LOADING, at + self.cfg.model_load_s
            self._launch_for(at, pending)
        waiting = sorted(
            (h for h in self.placeholders.values() if h.node is None), key=lambda h: h.id
        )
        if waiting:
            free = self._free_slots()
            free.sort(key=lambda n: self._slot_key(n, None, at))
            while waiting and free:
                self._bind_placeholder(waiting.pop(0), free.pop(0), at)
            self._launch_for(at, waiting)

    def _slot_key(
        self, node: int, holder: Placeholder | None, at: float
    ) -> tuple[bool, int, float, int, int]:
        n = self.nodes[node]
        return (
            n.ready_at > at,
            holder is not None,
            n.ready_at,
            node,
            -1 if holder is None else holder.id,
        )

    def _launch_for(self, at: float, pending: list[Pod] | list[Placeholder]) -> None:
        """Karpenter: ceil(pending / GPUs per node) new nodes, within the NodePool's limit."""
        if not pending:
            return
        room = self.cfg.max_nodes - self.live_nodes
        queue: list[Pod | Placeholder] = list(pending)
        for _ in range(min(room, math.ceil(len(queue) / self.cfg.node.gpus))):
            launched = self._launch(at, ready_at=at + self.cfg.node_launch_s)
            for _ in range(self.cfg.node.gpus):
                if not queue:
                    break
                item = queue.pop(0)
                if isinstance(item, Placeholder):
                    self._bind_placeholder(item, launched.id, at)
                else:
                    self._bind(item, launched.id, at)

    def _consolidate(self, at: float) -> None:
        for node in self.nodes.values():
            if node.terminated_at is not None:
                continue
            if node.pods or node.holders:
                node.empty_since = None
                continue
            if node.empty_since is None:
                node.empty_since = at
            if node.disrupting or (
                node.ready_at <= at and at - node.empty_since >= self.cfg.consolidate_after_s
            ):
                node.terminated_at = at
        if self.cfg.consolidation == WHEN_UNDERUTILIZED:
            self._repack(at)

    def _repack(self, at: float) -> None:
        """WhenEmptyOrUnderutilized: disrupt the nodes whose pods fit elsewhere (module doc)."""
        if self.do_not_disrupt:
            return
        if any(p.node is None for p in self.pods.values()) or any(
            h.node is None for h in self.placeholders.values()
        ):
            return  # pods pending: Karpenter provisions before it consolidates
        live = [n for n in self.nodes.values() if n.terminated_at is None]
        budget = math.ceil(DISRUPTION_BUDGET * len(live) - 1e-9)
        budget -= sum(1 for n in live if n.disrupting)
        if budget <= 0:
            return
        gpus = self.cfg.node.gpus
        ready = [n for n in live if not n.disrupting and n.ready_at <= at]
        # An empty node is no destination: moving pods onto it instead of removing it saves
        # nothing (on one-GPU nodes every repack would be such a swap).
        free = {n.id: gpus - len(n.pods) - len(n.holders) if n.pods or n.holders else 0
                for n in ready}  # fmt: skip
        candidates = sorted(
            (
                n
                for n in ready
                if (n.pods or n.holders) and at - n.last_change >= self.cfg.consolidate_after_s
            ),
            key=lambda n: (len(n.pods) + len(n.holders), n.id),
        )
        chosen: list[Node] = []
        moved = 0
        room = sum(free.values())
        for node in candidates:
            if len(chosen) >= budget:
                break
            load = len(node.pods) + len(node.holders)
            if moved + load <= room - free[node.id]:
                chosen.append(node)
                moved += load
                room -= free[node.id]
        for node in chosen:
            self._evict_node(node, at)

    def _evict_node(self, node: Node, at: float) -> None:
        """Taint the node and evict its pods: ready ones drain, the ReplicaSet replaces each
        evicted pod at once (pending, so it binds elsewhere and loads the model again);
        placeholders pend again (and rebind to a free GPU)."""
        node.disrupting = True
        for pid in sorted(node.pods):
            pod = self.pods[pid]
            if pod.phase is Phase.DRAINING:
                continue
            self.evictions += 1
            if pod.phase is Phase.READY:
                pod.phase, pod.deadline = Phase.DRAINING, at + self.cfg.termination_grace_s
            else:
                self._remove(pod, at)
            self._new_pod(at)
        for hid in sorted(node.holders):
            self._unbind_placeholder(self.placeholders[hid], at)
        if not node.pods:
            node.terminated_at = at

    # --- helpers ---------------------------------------------------------------------------------

    def _new_pod(self, at: float) -> Pod:
        pod = Pod(self._next_pod, at)
        self._next_pod += 1
        self.pods[pod.id] = pod
        return pod

    def _launch(self, at: float, ready_at: float) -> Node:
        node = Node(self._next_node, at, ready_at)
        self._next_node += 1
        self.nodes[node.id] = node
        return node

    def _bind(self, pod: Pod, node: int, at: float) -> None:
        pod.node = node
        self.nodes[node].pods.add(pod.id)
        self.nodes[node].empty_since = None
        self.nodes[node].last_change = at

    def _remove(self, pod: Pod, at: float) -> None:
        if pod.node is not None:
            node = self.nodes[pod.node]
            node.pods.discard(pod.id)
            node.last_change = at
            if not node.pods and not node.holders:
                node.empty_since = at
        del self.pods[pod.id]

    def _bind_placeholder(self, holder: Placeholder, node: int, at: float) -> None:
        holder.node = node
        self.nodes[node].holders.add(holder.id)
        self.nodes[node].empty_since = None
        self.nodes[node].last_change = at

    def _unbind_placeholder(self, holder: Placeholder, at: float) -> None:
        """Preempted or removed: off its node (which may now be empty), pending again."""
        assert holder.node is not None
        node = self.nodes[holder.node]
        node.holders.discard(holder.id)
        node.last_change = at
        if not node.pods and not node.holders:
            node.empty_since = at
        holder.node = None

    def _free_slots(self) -> list[int]:
        """One entry per free GPU on a live node (node ids, repeated)."""
        slots: list[int] = []
        for node in self.nodes.values():
            if node.terminated_at is None and not node.disrupting:
                slots += [node.id] * (self.cfg.node.gpus - len(node.pods) - len(node.holders))
        return slots
