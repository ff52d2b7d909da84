"""The simulation loop: one fixed-step run per policy, same requests, same seed, same start.

Why a fixed step: every controller in the loop (KEDA's 30 s poll, the HPA's 15 s sync, the
scaler's 5 s evaluation, Karpenter, the servers) acts on a clock anyway; a step of `dt` (1 s by
default) with per-request work vectorised keeps a one-hour trace at tens of GPUs for five policies
well under a minute, and every loop has a bound. Step k covers [k dt, (k + 1) dt): the cluster
advances (nodes, model loads, drains, consolidation, billing), the fleet admits and serves, then
the policy sees the end-of-step state and may change the Deployment's replica count.

Every run starts warm: the first `warm_window_s` of the trace is replayed once before t = 0 (a
pre-roll, unbilled and unmeasured) on the starting fleet, so at t = 0 queues, rate windows, the
HPA's recommendations and the scaler's stabilization window hold a real history, as they do in a
cluster that was already running (the scaler's engine replays Prometheus history for the same
reason). After the trace ends the run keeps serving (unbilled) for up to `drain_s` so requests in
flight finish; whatever is still queued or running then counts as dropped. Billing covers the
trace's span.

With `SimConfig.companion` three rows follow the scaler's: `scaler+companion` (the scaler as
configured, forecast wake by default, plus the Karpenter companion: placeholders for its
target and pod-deletion-cost packing; the product's default), `scaler+forecast` (the scaler with
forecast=on) and `scaler+prewarm` (the same plus the companion: placeholders for the forecast,
and packing; `gpu_queue_scaler_bench.sim.prewarm`), so the effect of the companion, the forecast and
the pre-warm each show.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler_bench.sim.cluster import WHEN_UNDERUTILIZED, Cluster, ClusterConfig
from gpu_queue_scaler_bench.sim.fleet import ServingFleet, StepStats
from gpu_queue_scaler_bench.sim.policies import (
    KEDA_INFLIGHT,
    KEDA_INFLIGHT_BEST,
    KEDA_INFLIGHT_SHARE,
    KEDA_INFLIGHT_SWEEP,
    NAMES,
    REACTIVE_BEST,
    REACTIVE_SWEEP,
    AlwaysOn,
    HpaGpuUtil,
    KedaInflight,
    KedaPrometheus,
    Oracle,
    Policy,
    ReactiveBound,
    ScalerPolicy,
    bump_need,
    keda_inflight_threshold,
    keda_threshold,
    oracle_need,
    oracle_schedule,
    replica_slots,
    scaler_metadata,
)
from gpu_queue_scaler_bench.sim.prewarm import COMPANION, FORECAST, PREWARM, Prewarm, with_forecast
from gpu_queue_scaler_bench.sim.profiles import Profile, ServiceProfile
from gpu_queue_scaler_bench.sim.verdict import GOAL_ATTAINMENT
from gpu_queue_scaler_bench.sim.workload import Requests

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]
# The table's rows: the policies, with the companion and forecast rows before the oracle.
# The bounds (the best reactive rule in hindsight, the oracle) come last.
ROWS = (*NAMES[:-2], COMPANION, FORECAST, PREWARM, *NAMES[-2:])
Progress = Callable[[int], None]


class SimulationError(RuntimeError):
    """A sanity check failed: a bug in the simulator, not a finding about a policy."""


@dataclass(frozen=True)
class SimConfig:
    profile: Profile
    cold_start_s: float = 180.0  # node launch + model load for a replica that needs a new node
    slo_s: float = 2.0  # queue wait and TTFT objective
    dt: float = 1.0
    seed: int = 0
    max_wait_s: float = 600.0  # a client gives up after this long in the queue (dropped)
    drain_s: float = 900.0
    consolidate_after_s: float = 60.0  # the NodePool's consolidateAfter
    # NodePool spec.disruption.consolidationPolicy: WhenEmptyOrUnderutilized is Karpenter v1's
    # default and what its docs' NodePools set, so what most clusters run
    # (gpu_queue_scaler_bench.sim.cluster).
    consolidation: str = WHEN_UNDERUTILIZED
    # The Deployment's terminationGracePeriodSeconds: a deleted or evicted pod stops getting
    # requests and drains its running ones for this long, then SIGKILL drops what is left (as
    # Kubernetes does). Kubernetes' default is 30 s; inference servers are given longer to
    # drain (NVIDIA Dynamo's graceful-shutdown guide: 60 s default, 180 s in its example), so
    # 180 s here. Only the oracle, with foresight, never deletes a pod that would not drain.
    termination_grace_s: float = 180.0
    warm_window_s: float = 300.0  # the starting fleet covers the oracle's need over this span
    # Refinements of the oracle's schedule (bounded): with KV preemption a KV-bound trace (Mooncake
    # at a 60 s cold start) takes more than 8 to reach 0.999.
    oracle_iterations: int = 16
    # The oracle's sanity check: it must reach this attainment with no request dropped, or the
    # run fails (SimulationError): a floor that misses the SLO judges nothing.
    oracle_min_attainment: float = 0.999
    max_replicas: int | None = None  # default: twice the always-on fleet
    # A pod whose running requests outgrow its KV cache preempts the newest ones, which prefill
    # again ahead of new requests (vLLM's scheduler, recompute mode); off, the cache reads full
    # and the overflow is served for free, which favours the fleets that run KV-full.
    preemption: bool = True
    scaler_metadata: Mapping[str, str] = field(default_factory=dict)  # extra trigger keys
    policies: tuple[str, ...] = NAMES
    # Also run the scaler with the Karpenter companion (scaler+companion), and with forecast=on
    # alone and with the companion pre-warming nodes (scaler+forecast, scaler+prewarm); the
    # companion also packs scale-downs with pod-deletion-cost (gpu_queue_scaler_bench.sim.prewarm).
    companion: bool = False
    # The price of a node-hour instead of the profile's on-demand price (e.g. a Spot price read
    # off the EC2 Spot price history for your zone).
    node_usd_per_hour: float | None = None

    @property
    def usd_per_node_hour(self) -> float:
        if self.node_usd_per_hour is not None:
            return self.node_usd_per_hour
        return self.profile.node.on_demand_usd_per_hour

    @property
    def model_load_s(self) -> float:
        return min(self.profile.service.model_load_s, self.cold_start_s)

    @property
    def node_launch_s(self) -> float:
        return self.cold_start_s - self.model_load_s


@dataclass
class PolicyRun:
    """One policy's outcome: per-request times and the fleet over time."""

    name: str
    arrivals_s: FloatArray
    admit_t: FloatArray
    first_token_t: FloatArray
    finish_t: FloatArray
    dropped: NDArray[np.bool_]
    gpu_seconds: float
    zero_node_seconds: float
    scale_events: int
    replicas: IntArray  # Deployment replicas at the end of each step
    ready: IntArray
    nodes: IntArray
    waiting: IntArray
    gpus_per_node: int
    usd_per_node_hour: float
    notes: list[str] = field(default_factory=list)
    # creation -> ready of each pod created during the trace (what a scale-up waits)
    replica_starts_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    # first arrival at zero serving replicas -> a replica serving, per scale-from-zero episode
    zero_waits_s: FloatArray = field(default_factory=lambda: np.zeros(0))
    evictions: int = 0  # pods WhenEmptyOrUnderutilized consolidation evicted (each restarted)
    preemptions: int = 0  # requests preempted for KV (SimConfig.preemption), each recomputed

    @property
    def queue_wait_s(self) -> FloatArray:
        return self.admit_t - self.arrivals_s

    @property
    def ttft_s(self) -> FloatArray:
        return self.first_token_t - self.arrivals_s


@dataclass
class BenchResult:
    trace: str
    scale: float
    config: SimConfig
    requests: Requests
    runs: list[PolicyRun]
    slots: int
    target_concurrency: float
    always_on_replicas: int
    initial_replicas: int
    dt: float
    notes: list[str] = field(default_factory=list)
    max_replicas: int = 0
    scaler_metadata: dict[str, str] = field(default_factory=dict)  # the scaler's trigger
    full_stack: dict[str, object] | None = None  # what the full-stack replay measured
    # The oracle's need per step on the trace's clock (its refined one: `bump_need`), and the
    # seconds of pre-roll replayed before t = 0 (the warm start): what `ReactiveBound` reads.
    oracle_need: IntArray | None = None
    preroll_s: float = 0.0


class Simulation:
    """One policy's run, step by step: `simulate` drives it in a plain loop; the full-stack
    replay (`gpu_queue_scaler_bench.sim.fullstack`) awaits the real gRPC server between steps."""

    def __init__(self, requests: Requests, cfg: SimConfig, initial_replicas: int) -> None:
        dt = cfg.dt
        self.requests = requests
        self.cfg = cfg
        self.dt = dt
        self.trace_steps = math.ceil(requests.duration_s / dt)
        self.pre_steps = math.ceil(min(cfg.warm_window_s, requests.duration_s) / dt)
        self.pre_s = self.pre_steps * dt
        self.replay = with_preroll(requests, self.pre_s)
        self.n_pre = self.replay.count - requests.count
        self.max_steps = self.pre_steps + self.trace_steps + math.ceil(cfg.drain_s / dt)
        svc, node = cfg.profile.service, cfg.profile.node
        self.fleet = ServingFleet(
            self.replay, svc, dt, self.max_steps, cfg.max_wait_s, preemption=cfg.preemption
        )
        self.cluster = Cluster(
            ClusterConfig(
                node=node,
                node_launch_s=cfg.node_launch_s,
                model_load_s=cfg.model_load_s,
                consolidate_after_s=cfg.consolidate_after_s,
                termination_grace_s=cfg.termination_grace_s,
                consolidation=cfg.consolidation,
            )
        )
        self.cluster.warm(initial_replicas, -self.pre_s)
        self.series = np.zeros((4, self.max_steps), dtype=np.int64)
        self.zero_waits: list[float] = []
        self._zero_from: float | None = None  # first arrival while nothing serves
        self.events = 0
        self.k = 0  # the next step
        self.done = False

    def time(self, k: int) -> float:
        """Trace time at the start of step k (negative during the pre-roll)."""
        return (k - self.pre_steps) * self.dt

    def advance(self) -> tuple[float, StepStats]:
        """Run step k: the cluster, then the fleet. Returns the step's end time and stats."""
        t = self.time(self.k)
        cluster, fleet = self.cluster, self.fleet
        draining = cluster.draining()
        running = dict(
            zip(draining.tolist(), fleet.running_per_pod(draining).tolist(), strict=True)
        )
        billed = self.pre_steps <= self.k < self.pre_steps + self.trace_steps
        killed = cluster.tick(t, self.dt if billed else 0.0, running)
        fleet.kill(killed)
        serving = cluster.serving()
        if t >= 0.0:
            self._watch_zero(t, serving.size)
        return t + self.dt, fleet.step(t, serving)

    def _watch_zero(self, t: float, serving: int) -> None:
        """Scale-from-zero episodes on the step clock: a request arriving in [t, t + dt) with
        nothing serving opens one; the first step with a replica serving closes it."""
        if serving:
            if self._zero_from is not None:
                self.zero_waits.append(t - self._zero_from)
                self._zero_from = None
        elif self._zero_from is None:
            arrivals = self.requests.arrivals_s
            i = int(np.searchsorted(arrivals, t, side="left"))
            if i < arrivals.size and arrivals[i] < t + self.dt:
                self._zero_from = float(arrivals[i])

    def apply(self, at: float, wanted: int | None, stats: StepStats) -> None:
        """The policy's answer after step k (at its end, `at`); then the next step."""
        cluster, k = self.cluster, self.k
        if wanted is not None and wanted != cluster.replicas:
            cluster.scale_to(at, wanted)
            self.events += 1
        self.series[:, k] = (cluster.replicas, cluster.ready, cluster.live_nodes, stats.waiting)
        self.k = k + 1
        fleet = self.fleet
        self.done = self.k >= self.max_steps or (
            k >= self.pre_steps + self.trace_steps
            and fleet.head >= self.replay.count
            and fleet.running == 0
        )

    def result(self, name: str) -> PolicyRun:
        """The run's outcome; whatever is still queued or running counts as dropped."""
        fleet, cfg = self.fleet, self.cfg
        unfinished = ~np.isfinite(fleet.finish_t) & ~fleet.dropped
        fleet.dropped[unfinished] = True
        fleet.admit_t[fleet.dropped] = np.nan
        fleet.first_token_t[fleet.dropped] = np.nan
        fleet.finish_t[fleet.dropped] = np.nan
        completed = int(np.isfinite(fleet.finish_t).sum())
        if completed + int(fleet.dropped.sum()) != self.replay.count:
            raise SimulationError(
                f"{name}: {completed} completed + {int(fleet.dropped.sum())} dropped != "
                f"{self.replay.count} requests"
            )
        measured = slice(self.n_pre, None)
        starts = np.asarray(self.cluster.starts, dtype=np.float64).reshape(-1, 2)
        created = (starts[:, 0] >= 0.0) & (starts[:, 0] < self.requests.duration_s)
        kept = slice(self.pre_steps, max(self.k, self.pre_steps))
        return PolicyRun(
            name=name,
            arrivals_s=self.requests.arrivals_s,
            admit_t=fleet.admit_t[measured],
            first_token_t=fleet.first_token_t[measured],
            finish_t=fleet.finish_t[measured],
            dropped=fleet.dropped[measured],
            gpu_seconds=self.cluster.gpu_seconds,
            zero_node_seconds=self.cluster.zero_node_seconds,
            scale_events=self.events,
            replicas=self.series[0, kept],
            ready=self.series[1, kept],
            nodes=self.series[2, kept],
            waiting=self.series[3, kept],
            gpus_per_node=cfg.profile.node.gpus,
            usd_per_node_hour=cfg.usd_per_node_hour,
            replica_starts_s=starts[created, 1] - starts[created, 0],
            zero_waits_s=np.asarray(self.zero_waits, dtype=np.float64),
            evictions=self.cluster.evictions,
            preemptions=self.fleet.preemptions,
        )


def simulate(
    policy: Policy,
    requests: Requests,
    cfg: SimConfig,
    initial_replicas: int,
    progress: Progress | None = None,
) -> PolicyRun:
    """Run one policy over the whole trace (plus the drain) from a warm fleet."""
    sim = Simulation(requests, cfg, initial_replicas)
    reported = 0
    for _ in range(sim.max_steps):
        at, stats = sim.advance()
        sim.apply(at, policy.act(at, sim.fleet, sim.cluster, stats), stats)
        if progress is not None and sim.k - reported >= 100:
            progress(sim.k - reported)
            reported = sim.k
        if sim.done:
            break
    if progress is not None:
        progress(sim.max_steps - reported)  # the bar's full share
    return sim.result(policy.name)


def with_preroll(requests: Requests, pre_s: float) -> Requests:
    """The requests with the trace's first `pre_s` seconds replayed once before t = 0."""
    if pre_s <= 0:
        return requests
    first = requests.arrivals_s < pre_s
    return Requests(
        arrivals_s=np.concatenate([requests.arrivals_s[first] - pre_s, requests.arrivals_s]),
        input_tokens=np.concatenate([requests.input_tokens[first], requests.input_tokens]),
        output_tokens=np.concatenate([requests.output_tokens[first], requests.output_tokens]),
        duration_s=requests.duration_s,
        name=requests.name,
    )


def _late(run: PolicyRun, slo_s: float) -> NDArray[np.bool_]:
    wait = run.queue_wait_s
    return run.dropped | ~(np.nan_to_num(wait, nan=np.inf) <= slo_s + 1e-9)


def _late_steps(run: PolicyRun, slo_s: float, dt: float, origin_s: float = 0.0) -> IntArray:
    """Steps (of a timeline starting at `origin_s`) where a request arrived that was late."""
    return ((run.arrivals_s[_late(run, slo_s)] - origin_s) // dt).astype(np.int64)


def attainment(run: PolicyRun, slo_s: float) -> float:
    """Share of the run's requests admitted within the SLO (dropped ones are misses)."""
    n = run.arrivals_s.size
    return 1.0 - float(_late(run, slo_s).sum()) / n if n else 1.0


def pick_best(runs: Mapping[float, PolicyRun], slo_s: float, target: float) -> float:
    """The hindsight pick of a threshold sweep: the fewest GPU-hours among the runs that reach
    `target` attainment, else the highest attainment (ties: fewer GPU-hours)."""
    meeting = [share for share, run in runs.items() if attainment(run, slo_s) >= target]
    if meeting:
        return min(meeting, key=lambda share: (runs[share].gpu_seconds, share))
    return max(runs, key=lambda share: (attainment(runs[share], slo_s), -runs[share].gpu_seconds))


SWEEP_TARGET = GOAL_ATTAINMENT  # what a hindsight pick must reach: the goals' target


def hindsight_pick(
    sweep: Mapping[float, PolicyRun], name: str, slo_s: float, label: Callable[[float], str]
) -> tuple[float, PolicyRun, str]:
    """A sweep's pick after the runs (`pick_best` at SWEEP_TARGET), as the row `name`, and the
    words that say how it was chosen, with each setting's attainment / GPU-h (`label` names a
    setting), for the row's note."""
    best = pick_best(sweep, slo_s, SWEEP_TARGET)
    tried = ", ".join(
        f"{label(k)} {attainment(r, slo_s):.3f}/{r.gpu_seconds / 3600:.1f}"
        for k, r in sweep.items()
    )
    why = (
        f"chosen after the runs: the fewest GPU-h at >= {SWEEP_TARGET} of requests within the "
        f"SLO, else the highest attainment (sweep, attainment/GPU-h: {tried})"
    )
    return best, dataclasses.replace(sweep[best], name=name), why


TOKEN_LOAD = 0.85  # the share of a replica's GPU time the scaler's token term aims at
# The share of a replica's slots the bench configures as the scaler's `targetConcurrency`: the
# operating point a user picks from a load test, below the server's batch limit.
SLOT_SHARE = 0.8


def token_capacities(svc: ServiceProfile, target_concurrency: float) -> dict[str, str]:
    """What a user would read off a load test of one replica (`scaler bench loadgen`): prompt
    tokens prefilled and tokens generated per second at the target load, here from the profile
    (prefill at its rate; decode one token per running request per iteration at
    `targetConcurrency`), at TOKEN_LOAD of the GPU."""
    decode = target_concurrency / svc.decode_step_s(target_concurrency)
    return {
        "prefillTokensPerSecond": f"{TOKEN_LOAD * svc.prefill_tokens_per_s:.6g}",
        "decodeTokensPerSecond": f"{TOKEN_LOAD * decode:.6g}",
    }


def run_bench(
    requests: Requests, cfg: SimConfig, scale: float = 1.0, progress: Progress | None = None
) -> BenchResult:
    """Every policy in `cfg.policies` on the same requests, the oracle first (it sizes the
    always-on fleet and the warm start)."""
    unknown = [name for name in cfg.policies if name not in NAMES]
    if unknown:
        raise ValueError(f"unknown policies {unknown}; known: {', '.join(NAMES)}")
    if requests.count == 0:
        raise ValueError(f"{requests.name}: no requests to replay")
    dt = cfg.dt
    trace_steps = math.ceil(requests.duration_s / dt)
    svc = cfg.profile.service
    plan = oracle_plan(requests, cfg)
    need, lead, pre_steps, slots = plan.need, plan.lead, plan.pre_steps, plan.slots
    warm_steps = max(1, pre_steps)
    initial = starting_fleet(need, lead, warm_steps)
    notes: list[str] = []
    runs: dict[str, PolicyRun] = {}
    if "oracle" in cfg.policies:
        runs["oracle"], need = oracle_run(requests, cfg, plan, initial, progress)
        # Refinement only raises the need, so the refined schedule's start covers the first.
        initial = max(initial, starting_fleet(need, lead, warm_steps))
    # The (refined) need on the trace's clock and the pre-roll before it: what the reactive
    # bound reads, and what the result carries for `bench/reactive_bound.py`.
    trace_need, preroll_s = need[pre_steps:], pre_steps * dt
    peak = max(1, int(trace_need[:trace_steps].max(initial=1)))
    max_replicas = cfg.max_replicas or max(2 * peak, initial)
    target = max(1.0, math.floor(SLOT_SHARE * slots))
    metadata = scaler_metadata(
        target,
        cfg.slo_s,
        cfg.cold_start_s,
        max_replicas,
        {
            **token_capacities(svc, target),
            # One GPU per replica on nodes the workload has to itself (`replicasPerNode`).
            "replicasPerNode": str(cfg.profile.node.gpus),
            **cfg.scaler_metadata,
        },
    )
    fixed = peak
    if "always-on" in cfg.policies:
        fixed, runs["always-on"], why = fixed_fleet(requests, cfg, peak, progress)
        notes.append(f"always-on: {fixed} replicas, {why}")
        scheduled, fixed_run = runs.get("oracle"), runs["always-on"]
        if (
            scheduled is not None
            and meets_oracle_bar(fixed_run, cfg)
            and fixed_run.gpu_seconds < scheduled.gpu_seconds
        ):
            # With foresight the oracle would hold this fleet: it meets the oracle's own bar at
            # fewer GPU-hours than the schedule's scale-ups and node launches.
            runs["oracle"] = dataclasses.replace(fixed_run, name="oracle")
            notes.append(
                f"oracle: holds the fixed fleet of {fixed} replicas, cheaper than its schedule "
                f"({runs['oracle'].gpu_seconds / 3600:.2f} against "
                f"{scheduled.gpu_seconds / 3600:.2f} GPU-h) at the oracle's attainment"
            )
    factories: dict[str, Callable[[], Policy]] = {
        "hpa-gpu-util": lambda: HpaGpuUtil(max_replicas),
        "keda-prometheus": lambda: KedaPrometheus(max_replicas, keda_threshold(slots)),
        KEDA_INFLIGHT: lambda: KedaInflight(
            max_replicas, keda_inflight_threshold(slots, KEDA_INFLIGHT_SHARE)
        ),
        "scaler": lambda: ScalerPolicy(metadata),
    }
    for name in cfg.policies:
        if name in ("oracle", "always-on", KEDA_INFLIGHT_BEST, REACTIVE_BEST):
            continue
        runs[name] = simulate(factories[name](), requests, cfg, initial, progress)
    if KEDA_INFLIGHT_BEST in cfg.policies:
        sweep: dict[float, PolicyRun] = {}
        for share in KEDA_INFLIGHT_SWEEP:
            if share == KEDA_INFLIGHT_SHARE and KEDA_INFLIGHT in runs:
                sweep[share] = runs[KEDA_INFLIGHT]
                continue
            policy = KedaInflight(max_replicas, keda_inflight_threshold(slots, share))
            sweep[share] = simulate(policy, requests, cfg, initial, progress)
        share, runs[KEDA_INFLIGHT_BEST], why = hindsight_pick(
            sweep, KEDA_INFLIGHT_BEST, cfg.slo_s, lambda s: f"{s:.0%}"
        )
        notes.append(
            f"{KEDA_INFLIGHT_BEST}: threshold {share:.0%} of the replica's {slots} slots "
            f"({keda_inflight_threshold(slots, share):g} requests in flight per replica), {why}"
        )
    if REACTIVE_BEST in cfg.policies:
        window_s = ScalerPolicy(metadata).spec.scale_down_stabilization_s
        bound: dict[float, PolicyRun] = {}
        for headroom in REACTIVE_SWEEP:
            held = ReactiveBound(trace_need, dt, preroll_s, headroom, window_s)
            bound[headroom] = simulate(held, requests, cfg, initial, progress)
        headroom, runs[REACTIVE_BEST], why = hindsight_pick(
            bound, REACTIVE_BEST, cfg.slo_s, lambda h: f"x{h:g}"
        )
        bound_is = f"the oracle's exact need now x{headroom:g}, held {window_s:g} s"
        notes.append(f"{REACTIVE_BEST}: {bound_is}, {why}")
    for name, make in companion_rows(cfg, metadata).items():
        runs[name] = simulate(make(), requests, cfg, initial, progress)
    ordered = [runs[name] for name in ROWS if name in runs]
    return BenchResult(
        trace=requests.name,
        scale=scale,
        config=cfg,
        requests=requests,
        runs=ordered,
        slots=slots,
        target_concurrency=target,
        always_on_replicas=fixed,
        initial_replicas=initial,
        dt=dt,
        notes=notes,
        max_replicas=max_replicas,
        scaler_metadata=metadata,
        oracle_need=trace_need,
        preroll_s=preroll_s,
    )


@dataclass(frozen=True)
class OraclePlan:
    """The oracle's exact need before refinement, on the simulation's timeline: the pre-roll,
    the trace, the drain; so the warm-up's requests still in flight at t = 0, and the trace's
    last ones, are in it."""

    need: IntArray  # replicas per step from `origin_s`
    lead: int  # steps from asking for a replica to it serving (a cold start and a step)
    pre_steps: int  # the pre-roll's steps before t = 0
    origin_s: float  # the timeline's first step, on the trace's clock (-pre_steps x dt)
    slots: int  # requests one replica holds at once on this trace (`replica_slots`)


def oracle_plan(requests: Requests, cfg: SimConfig) -> OraclePlan:
    """See `OraclePlan`."""
    dt = cfg.dt
    pre_steps = math.ceil(min(cfg.warm_window_s, requests.duration_s) / dt)
    origin = -pre_steps * dt
    timeline = pre_steps + math.ceil(requests.duration_s / dt) + math.ceil(cfg.drain_s / dt)
    svc = cfg.profile.service
    slots = replica_slots(requests, svc)
    need = oracle_need(
        with_preroll(requests, -origin), svc, dt, timeline, slots, origin_s=origin, slo_s=cfg.slo_s
    )
    return OraclePlan(need, math.ceil(cfg.cold_start_s / dt) + 1, pre_steps, origin, slots)


def oracle_run(
    requests: Requests,
    cfg: SimConfig,
    plan: OraclePlan,
    initial: int,
    progress: Progress | None,
) -> tuple[PolicyRun, IntArray]:
    """The oracle's run and its need, refined (`bump_need`) where a request was late until it
    meets `cfg.oracle_min_attainment` with nothing dropped (at most `oracle_iterations` times);
    it must, or the bench fails its own sanity check. The other policies start on the refined
    need's fleet over the pre-roll (`starting_fleet`): a start sized on the unrefined need is
    short wherever refinement raised it (KV preemption does, on long contexts), and a scaler
    measuring that shortfall as lateness in its first minutes learns a headroom for a fleet it
    never sized. The oracle itself starts on `initial`, the unrefined need's smaller fleet: a
    floor from a shorter start is still a floor, and one started above the trace's peak would
    pay for more than a fixed fleet at that peak."""
    dt, need, lead, origin = cfg.dt, plan.need, plan.lead, plan.origin_s
    run: PolicyRun | None = None
    for i in range(max(1, cfg.oracle_iterations + 1)):
        schedule = oracle_schedule(need, lead)
        oracle = Oracle(schedule, dt, origin_s=origin, grace_s=cfg.termination_grace_s)
        run = simulate(oracle, requests, cfg, initial, progress)
        late = _late_steps(run, cfg.slo_s, dt, origin)
        if late.size == 0 or meets_oracle_bar(run, cfg):
            break
        if i < cfg.oracle_iterations:
            need = bump_need(need, late, max(1, math.ceil(30.0 / dt)))
    assert run is not None
    if not meets_oracle_bar(run, cfg):
        reached, dropped = attainment(run, cfg.slo_s), int(run.dropped.sum())
        late = np.flatnonzero(_late(run, cfg.slo_s))
        first = f"; first late at t = {run.arrivals_s[late[0]]:.0f} s" if late.size else ""
        raise SimulationError(
            f"{requests.name}: the oracle reached {reached:.4f} of requests within the SLO "
            f"(needs >= {cfg.oracle_min_attainment}) with {dropped} dropped after "
            f"{cfg.oracle_iterations} refinements{first}: not a floor that meets the SLO"
        )
    return run, need


def fixed_fleet(
    requests: Requests, cfg: SimConfig, peak: int, progress: Progress | None
) -> tuple[int, PolicyRun, str]:
    """The always-on row: the fixed fleet a user would size from a load test, the fewest
    replicas that meet the goal (SWEEP_TARGET within the SLO), tried at the oracle's peak and in
    whole nodes below it until one falls short (chosen after the runs, as the KEDA row's
    threshold is). Sized at the oracle's peak alone it would be a node too large wherever the
    oracle's refinement (bumps near late requests, never taken back) raised that peak."""
    per_node = cfg.profile.node.gpus
    sizes = [peak, *range((math.ceil(peak / per_node) - 1) * per_node, 0, -per_node)]
    sweep: dict[float, PolicyRun] = {}
    for size in sizes:
        run = simulate(AlwaysOn(size), requests, cfg, size, progress)
        sweep[size] = run
        if attainment(run, cfg.slo_s) < SWEEP_TARGET:  # the pick's own test (drops are misses)
            break
    size, run, why = hindsight_pick(sweep, "always-on", cfg.slo_s, lambda n: f"{n:g}")
    return int(size), run, why


def meets_oracle_bar(run: PolicyRun, cfg: SimConfig) -> bool:
    """`cfg.oracle_min_attainment` of requests within the SLO with nothing dropped: what the
    oracle must reach, and what a fixed fleet must reach to stand in for it."""
    return attainment(run, cfg.slo_s) >= cfg.oracle_min_attainment and not run.dropped.any()


def starting_fleet(need: IntArray, lead: int, warm_steps: int) -> int:
    """The replicas the oracle's schedule for `need` holds over the pre-roll's first
    `warm_steps`: the fleet every run starts warm on."""
    return max(1, int(oracle_schedule(need, lead)[:warm_steps].max()))


def companion_rows(cfg: SimConfig, metadata: Mapping[str, str]) -> dict[str, Callable[[], Policy]]:
    """The companion mode's rows: the scaler as configured with the companion (its default
    metadata: forecast wake), then the scaler with forecast=on without and with the companion.
    When the configured scaler already forecasts, scaler+companion would repeat scaler+prewarm
    and is left out, and so is scaler+forecast if the plain scaler row runs (it would repeat it)."""
    if not cfg.companion:
        return {}
    forecasting = {**metadata, "forecast": "on"}
    rows: dict[str, Callable[[], Policy]] = {}
    if metadata.get("forecast") != "on":
        rows[COMPANION] = lambda: Prewarm(ScalerPolicy(metadata), name=COMPANION)
    if metadata.get("forecast") != "on" or "scaler" not in cfg.policies:
        rows[FORECAST] = lambda: with_forecast(ScalerPolicy(forecasting))
    rows[PREWARM] = lambda: Prewarm(ScalerPolicy(forecasting))
    return rows


def total_steps(requests: Requests, cfg: SimConfig) -> int:
    """Steps a full bench may take (for a progress bar): every policy, the oracle's refinements."""
    pre = math.ceil(min(cfg.warm_window_s, requests.duration_s) / cfg.dt)
    per_run = pre + math.ceil(requests.duration_s / cfg.dt) + math.ceil(cfg.drain_s / cfg.dt)
    runs = len(cfg.policies) + (cfg.oracle_iterations if "oracle" in cfg.policies else 0)
    if KEDA_INFLIGHT_BEST in cfg.policies:
        runs += len(KEDA_INFLIGHT_SWEEP) - 1 - (KEDA_INFLIGHT in cfg.policies)
    if REACTIVE_BEST in cfg.policies:
        runs += len(REACTIVE_SWEEP) - 1
    runs += len(companion_rows(cfg, cfg.scaler_metadata))
    return per_run * runs
