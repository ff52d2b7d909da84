"""The autoscaling policies of the bench, each deciding the Deployment's replica count.

Why these: always-on is what most GPU fleets run; an HPA on GPU utilization and KEDA's
Prometheus scaler are the usual autoscalers, on queue depth (the documented pitfall: it scales to
zero under running requests) and on requests in flight (the strongest plain reactive setup, at a
threshold a user would pick and at the best of a sweep in hindsight); the scaler is this project,
called through the very decision code that serves KEDA; the oracle bounds what any policy could
do, and must meet the SLO with nothing dropped (`gpu_queue_scaler_bench.sim.run` checks it).
`ReactiveBound` is a bound, not a policy anyone can run: given the oracle's exact need now, it
bounds what a reactive policy could do (its best headroom in hindsight is the bench's
`reactive-bound(hindsight)` row; `bench/reactive_bound.py` sweeps it).

Every policy sees the fleet only as a cluster would expose it: the scaler its `Signal` (built as
`gpu_queue_scaler.catalog` defines the fields), the baselines their Prometheus metrics at the last
15 s scrape. Replica counts go through `gpu_queue_scaler_bench.sim.autoscalers` (KEDA, HPA) except
for always-on (fixed) and the oracle (sets the Deployment directly, ahead of time).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.settings.config import Config
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler_bench.sim.autoscalers import (
    HPA_SYNC_S,
    SCALER_BEHAVIOR,
    Hpa,
    HpaBehavior,
    Keda,
    average_value_replicas,
    pods_metric_replicas,
)
from gpu_queue_scaler_bench.sim.cluster import Cluster, Phase
from gpu_queue_scaler_bench.sim.fleet import ServingFleet, StepStats
from gpu_queue_scaler_bench.sim.profiles import ServiceProfile
from gpu_queue_scaler_bench.sim.workload import Requests

IntArray = NDArray[np.int64]

PROTECTED_COST = 2**31 - 1  # the highest pod-deletion-cost: deleted last
PROMETHEUS_SCRAPE_S = 15.0  # the baselines read metrics as Prometheus last scraped them
GPU_UTIL_TARGET = 0.8
KEDA_INFLIGHT = "keda-inflight-70%"  # the threshold a user would pick: 70% of a replica's slots
KEDA_INFLIGHT_BEST = "keda-inflight-best(hindsight)"  # the best of a sweep, chosen afterwards
KEDA_INFLIGHT_SHARE = 0.7
KEDA_INFLIGHT_SWEEP = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)  # shares of a replica's slots
# A bound, not a policy anyone can run: the oracle's exact need now (no lag, no noise), x a
# headroom, held for the scaler's own scale-down window; the best headroom of the sweep chosen
# afterwards (`ReactiveBound`). What reading the present better could buy a reactive rule; where
# it misses a goal, only foresight reaches it.
REACTIVE_BEST = "reactive-bound(hindsight)"
REACTIVE_SWEEP = (1.0, 1.1, 1.2, 1.3, 1.5)  # headrooms over the exact need
NAMES = (
    "always-on",
    "hpa-gpu-util",
    "keda-prometheus",
    KEDA_INFLIGHT,
    KEDA_INFLIGHT_BEST,
    "scaler",
    REACTIVE_BEST,
    "oracle",
)


class Policy(Protocol):
    name: str

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        """After the step ending at `at`: the Deployment's new replica count, or None to keep."""
        ...


@dataclass
class AlwaysOn:
    """A fixed fleet sized for the trace's peak (the oracle's highest need)."""

    replicas: int
    name: str = "always-on"

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        return None


class HpaGpuUtil:
    """A plain HPA (no KEDA, so never below 1) on DCGM's GPU utilization, Pods metric with an
    average target of 80%. Utilization is the share of time a kernel ran, averaged over each
    15 s scrape; pods still loading their model report 0, pending pods count as unready."""

    name = "hpa-gpu-util"

    def __init__(self, max_replicas: int, target: float = GPU_UTIL_TARGET) -> None:
        self.hpa = Hpa(1, max_replicas, HpaBehavior())
        self.target = target
        self.busy: dict[int, list[float]] = {}
        self.snapshot: dict[int, float] = {}
        self.next_scrape = -math.inf

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        for pod, busy in zip(cluster.serving().tolist(), stats.busy.tolist(), strict=True):
            acc = self.busy.setdefault(pod, [0.0, 0.0])
            acc[0] += busy
            acc[1] += 1.0
        if at + 1e-9 >= self.next_scrape:
            self.next_scrape = at + PROMETHEUS_SCRAPE_S
            self.snapshot = {p: s / n for p, (s, n) in self.busy.items() if n}
            self.busy = {}
        if not self.hpa.due(at):
            return None
        current = cluster.replicas
        values: list[float] = []
        unready = 0
        for pod in cluster.pods.values():
            if pod.phase is Phase.READY:
                values.append(self.snapshot.get(pod.id, 0.0))
            elif pod.phase is Phase.LOADING:
                values.append(0.0)
            elif pod.phase is Phase.PENDING:
                unready += 1
        proposal = pods_metric_replicas(
            current, np.asarray(values), unready, self.target, self.hpa.behavior.tolerance
        )
        return self.hpa.normalize(at, current, proposal)


class KedaAverageValue:
    """KEDA's Prometheus scaler with an AverageValue `threshold` per replica: the metric
    (`metric`, per subclass) as Prometheus last scraped it, KEDA's activation on its polls
    (minReplicaCount `min_replicas`) and the HPA it creates on its syncs (HPA defaults)."""

    name: str

    def __init__(self, min_replicas: int, max_replicas: int, threshold: float) -> None:
        self.keda = Keda(min_replicas)
        self.hpa = Hpa(1, max_replicas, HpaBehavior())
        self.threshold = threshold
        self.scraped = 0.0
        self.next_scrape = -math.inf

    def metric(self, stats: StepStats) -> float:
        raise NotImplementedError

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        if at + 1e-9 >= self.next_scrape:
            self.next_scrape = at + PROMETHEUS_SCRAPE_S
            self.scraped = self.metric(stats)
        current = cluster.replicas
        wanted = current
        if self.keda.due(at):
            wanted = self.keda.poll(at, current, self.scraped > 0.0)
        if wanted > 0 and current > 0 and self.hpa.due(at):
            proposal = average_value_replicas(
                current, self.scraped, self.threshold, self.hpa.behavior.tolerance
            )
            wanted = self.hpa.normalize(at, current, proposal)
        return wanted


class KedaInflight(KedaAverageValue):
    """KEDA's Prometheus scaler on requests in flight, the strongest plain reactive setup:
    `sum(vllm:num_requests_running + vllm:num_requests_waiting)` with metricType AverageValue
    and `threshold` per replica, minReplicaCount 1 (so KEDA's activation never scales to zero
    and the HPA it creates does the scaling: minReplicas 1, tolerance 0.1, 300 s scale-down
    stabilization, syncing every 15 s on the value Prometheus last scraped, every 15 s; KEDA's
    pollingInterval 30 s only drives activation). Running requests keep it up while they run,
    unlike the queue-depth pitfall."""

    def __init__(self, max_replicas: int, threshold: float, name: str = KEDA_INFLIGHT) -> None:
        super().__init__(1, max_replicas, threshold)
        self.name = name

    def metric(self, stats: StepStats) -> float:
        return float(stats.waiting + stats.running)


def keda_inflight_threshold(slots: int, share: float) -> float:
    """Requests in flight per replica for a share of its slots (at least one)."""
    return max(1.0, math.floor(share * slots))


class KedaPrometheus(KedaAverageValue):
    """The documented pitfall, kept as such: KEDA's Prometheus scaler on queue depth:
    `sum(vllm:num_requests_waiting)` with an AverageValue `threshold` per replica and
    activationThreshold 0; HPA defaults (tolerance 0.1, 300 s scale-down window),
    pollingInterval 30 s, cooldownPeriod 300 s, min 0. With nothing waiting for a cooldownPeriod
    it goes to zero even while requests run: the pitfall of a trigger on queue depth alone, kept
    because it is what the documented setup does."""

    name = "keda-prometheus"

    def __init__(self, max_replicas: int, threshold: float) -> None:
        super().__init__(0, max_replicas, threshold)

    def metric(self, stats: StepStats) -> float:
        return float(stats.waiting)


def scaler_metadata(
    target_concurrency: float,
    slo_s: float,
    cold_start_s: float,
    max_replicas: int,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Trigger metadata as KEDA sends it (all strings) for the simulated vLLM workload."""
    metadata = {
        "scalerAddress": "gpu-queue-scaler.gpu-queue-scaler.svc:6000",
        "backend": "vllm",
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "scrapeTargets": "10.0.0.1:8000",  # the simulator stands in for the scrape
        "targetConcurrency": f"{target_concurrency:g}",
        "queueTimeSloSeconds": f"{slo_s:g}",
        "coldStartSeconds": f"{cold_start_s:g}",
        "pollingIntervalSeconds": "30",
        "maxReplicas": str(max_replicas),
    }
    metadata.update(extra or {})
    return metadata


class ScalerPolicy:
    """This scaler: every evaluationIntervalSeconds one tick of the
    `gpu_queue_scaler.decision.decider.Decider` the server's engine runs (signal -> decide -> learn,
    the forecast seat included); KEDA polls IsActive (= decision.active) every 30 s with
    cooldownPeriod 300 s, and the HPA reads GetMetrics (= decision.replicas, AverageValue target 1)
    every 15 s with the behavior the project's ScaledObject examples set (tolerance 0, no
    stabilization windows)."""

    name = "scaler"

    def __init__(self, metadata: Mapping[str, str], config: Config | None = None) -> None:
        self.config = config or Config()
        trigger = parse_trigger("bench", "llama-3-8b", metadata)
        self.spec: WorkloadSpec = resolve(trigger, self.config)
        self.decider = Decider(self.spec, stale_s=self.config.server.stale_target_s)
        self.decision: Decision | None = None
        self.interval = self.config.server.evaluation_interval_s
        self.next_eval = -math.inf
        self.keda = Keda(0)
        self.hpa = Hpa(max(1, self.spec.min_replicas), self.spec.max_replicas, SCALER_BEHAVIOR)
        self.decisions: list[Decision] = []

    def evaluate(self, at: float, fleet: ServingFleet) -> Decision | None:
        """One engine tick (the engine's `Decider.tick`, on the signal the fleet exposes)."""
        return self.decider.tick(fleet.signal(at), at)

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        if at + 1e-9 >= self.next_eval:
            self.next_eval = at + self.interval
            self.decision = self.evaluate(at, fleet)
            if self.decision is not None:
                self.decisions.append(self.decision)
        current = cluster.replicas
        wanted = current
        decision = self.decision
        if decision is None:  # GetMetrics/IsActive fail: KEDA and the HPA change nothing
            return None
        if self.keda.due(at):
            wanted = self.keda.poll(at, current, decision.active)
        if wanted > 0 and current > 0 and self.hpa.due(at):
            proposal = average_value_replicas(current, float(decision.replicas), 1.0, 0.0)
            wanted = self.hpa.normalize(at, current, proposal)
        return wanted


@dataclass
class Oracle:
    """Perfect foresight: the Deployment follows a precomputed schedule (see `oracle_need` and
    `oracle_schedule`), asking for each replica a full cold start before it is needed and
    keeping it through any gap shorter than the cold start."""

    schedule: IntArray
    dt: float
    name: str = "oracle"
    origin_s: float = 0.0  # the time of schedule[0] (the pre-roll's start: negative)
    grace_s: float = math.inf  # the pods' termination grace period

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        # The floor packs its scale-downs onto the fewest nodes (pod-deletion-cost, as the
        # companion does): a lower bound must not pay for the ReplicaSet's spreading. Packed, it
        # leaves nothing to repack, so its pods say karpenter.sh/do-not-disrupt: no eviction
        # restarts a replica it has scheduled (with foresight it would not fragment).
        cluster.do_not_disrupt = True
        cluster.pack()
        k = min(max(0, round((at - self.origin_s) / self.dt)), self.schedule.size - 1)
        wanted = int(self.schedule[k])
        current = cluster.replicas
        if wanted >= current:
            return wanted
        # Nodes are billed whole: a replica on a node that stays up anyway is free, so it
        # scales down only by what empties nodes (its packed fleet fills them in order).
        gpus = cluster.cfg.node.gpus
        wanted = min(current, math.ceil(wanted / gpus) * gpus)
        if wanted >= current:
            return None
        # With foresight it deletes only pods that drain within the grace period (no request
        # killed): the others get the highest deletion cost, and the scale-down waits for them.
        ready = cluster.serving()
        slow = ready[fleet.drain_bound_s(ready) > self.grace_s]
        for pid in slow.tolist():
            cluster.pods[pid].deletion_cost = PROTECTED_COST
        return max(wanted, int(slow.size))


class ReactiveBound:
    """Everything but the future (`bench/reactive_bound.py`): every second it knows the need the
    oracle computes for that second (`oracle_need`: no rate window, no lag, no noise), asks for
    ceil(need x headroom) at once, holds the highest ask of the last `window_s` (a removed
    replica takes a cold start to come back), acts every HPA sync and packs its nodes as the
    oracle does. What measuring the present better can buy a reactive rule, at most; the rest of
    the oracle's lead is foresight. Before t = 0 it reads the need of the trace's first
    `pre_s` seconds, which the simulator replays there (the warm start)."""

    def __init__(
        self, need: IntArray, dt: float, pre_s: float, headroom: float, window_s: float
    ) -> None:
        self.need, self.dt, self.pre_s = need, dt, pre_s
        self.headroom, self.window_s = headroom, window_s
        self.name = f"reactive-bound x{headroom:g}, {window_s:g}s hold"
        self.asks: deque[tuple[float, int]] = deque()  # (at, ask), highest first
        self.next_sync = -math.inf

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        trace_at = at + self.pre_s if at < 0 else at
        k = min(max(0, round(trace_at / self.dt)), self.need.size - 1)
        ask = math.ceil(float(self.need[k]) * self.headroom - 1e-9)
        while self.asks and self.asks[-1][1] <= ask:
            self.asks.pop()
        self.asks.append((at, ask))
        while self.asks[0][0] <= at - self.window_s:
            self.asks.popleft()
        if at + 1e-9 < self.next_sync:
            return None
        self.next_sync = at + HPA_SYNC_S
        cluster.pack()
        return self.asks[0][1]


def replica_slots(requests: Requests, service: ServiceProfile) -> int:
    """Requests one replica holds at once on this trace: max_num_seqs, or fewer when the KV
    cache fills first (mean prompt + half the output resident per request)."""
    resident = float(np.mean(requests.input_tokens + requests.output_tokens / 2.0))
    by_kv = int(service.kv_capacity_tokens // max(resident, 1.0))
    return max(1, min(service.max_num_seqs, by_kv))


def oracle_need(
    requests: Requests,
    service: ServiceProfile,
    dt: float,
    n_steps: int,
    slots: int,
    window_s: float = 30.0,
    origin_s: float = 0.0,
    slo_s: float | None = None,
) -> IntArray:
    """Replicas each step needs so nobody queues, from the arrivals ahead; the larger of two
    bounds, each at a full replica (`slots` requests, the most work per GPU-second). Step k
    covers [origin_s + k dt, origin_s + (k + 1) dt): the simulator's timeline starts at the
    pre-roll (negative), so requests still in flight from it at t = 0 are in the need.

    - concurrency: requests in flight if each started on arrival and ran at a full replica's
      speed, divided by `slots`;
    - GPU time: GPU-seconds of work arriving per second (prompt tokens at the prefill rate,
      output tokens at a full batch's decode cost per request) over a centred `window_s`,
      averaged over the part of the window inside the timeline (cut at neither end);
    - with `slo_s`, bursts: work W arriving within any window of L seconds (1 s to 512 s,
      doubling) is served with at most `slo_s` of queueing only if W <= capacity x (L + slo_s),
      so every step inside that window needs W / (L + slo_s) replicas (of GPU time).

    At least one replica while anything is in flight. The run then refines it (`bump_need`)."""
    starts = requests.arrivals_s
    decode_s = np.maximum(requests.output_tokens - 1, 0) * service.decode_step_s(slots)
    prefill_s = requests.input_tokens / service.prefill_tokens_per_s
    ends = np.sort(starts + prefill_s + decode_s)
    edges = origin_s + np.arange(n_steps + 1) * dt
    begun = np.searchsorted(starts, edges[1:], side="left")
    over = np.searchsorted(ends, edges[:-1], side="right")
    in_flight = begun - over
    need = np.ceil(in_flight / slots).astype(np.int64)
    cost = prefill_s + decode_s / slots  # GPU-seconds per request on a full replica
    inside = (starts >= origin_s) & (starts < edges[-1])
    step = np.floor((starts[inside] - origin_s) / dt).astype(np.int64)
    step = np.clip(step, 0, n_steps - 1)
    work = np.bincount(step, weights=cost[inside], minlength=n_steps).astype(np.float64)
    width = max(1, min(n_steps, round(window_s / dt)))
    kernel = np.ones(width)
    covered = np.convolve(np.ones(n_steps), kernel, mode="same")
    gpu = np.convolve(work, kernel, mode="same") / (np.maximum(covered, 1.0) * dt)
    need = np.maximum(need, np.ceil(gpu - 1e-9).astype(np.int64))
    if slo_s is not None:
        need = np.maximum(need, _burst_need(work, dt, slo_s))
    need[(in_flight > 0) & (need < 1)] = 1
    return need


def _burst_need(work: NDArray[np.float64], dt: float, slo_s: float) -> IntArray:
    """Per step, the most GPU time any window of 1-512 s holding that step asks for: the work
    arriving in it over (its length + slo_s), as a replica count (see `oracle_need`)."""
    total = np.concatenate([[0.0], np.cumsum(work)])
    out = np.zeros(work.size)
    steps = 1
    while steps <= min(work.size, max(1, round(512.0 / dt))):
        rate = (total[steps:] - total[:-steps]) / (steps * dt + slo_s)  # windows from each step
        held = rate.copy()  # the window starting at s covers steps s .. s + steps - 1
        span = 1
        while span < steps:  # running max over the `steps` windows that cover each step
            shift = min(span, steps - span)
            held[shift:] = np.maximum(held[shift:], held[:-shift])
            span += shift
        padded = np.empty(work.size)
        padded[: held.size] = held
        # The last steps are covered by windows ending in them: they hold the last window's.
        padded[held.size :] = max(held[-1], 0.0)
        out = np.maximum(out, padded)
        steps *= 2
    return np.ceil(out - 1e-9).astype(np.int64)


def oracle_schedule(need: IntArray, lead_steps: int) -> IntArray:
    """Replicas to ask for at each step: the most needed within the next `lead_steps` (a cold
    start), so a replica is asked for a cold start early and kept through shorter gaps."""
    ahead = need.copy()
    for shift in range(1, min(lead_steps, need.size) + 1):
        np.maximum(ahead[:-shift], need[shift:], out=ahead[:-shift])
    return ahead


def bump_need(need: IntArray, late_steps: IntArray, width_steps: int) -> IntArray:
    """10% more (at least one) replica up to `width_steps` before each step where the oracle's
    run left a request late."""
    bumped = need.copy()
    marks = np.zeros(need.size + 1, dtype=np.int64)
    lo = np.clip(late_steps - width_steps, 0, need.size)
    hi = np.clip(late_steps + 1, 0, need.size)
    np.add.at(marks, lo, 1)
    np.add.at(marks, hi, -1)
    hit = np.cumsum(marks)[:-1] > 0
    bumped[hit] = np.maximum(bumped[hit] + 1, np.ceil(bumped[hit] * 1.1).astype(np.int64))
    return bumped


def keda_threshold(slots: int) -> float:
    """Waiting requests per replica the KEDA baseline targets: a tenth of a replica's slots, a
    typical hand-set value ("scale when ~10 requests queue per replica" at 100 slots)."""
    return max(1.0, math.floor(slots / 10))
