"""Signals -> replicas needed now: the capacity model, pure and documented.

Terms, each in replica units; the need is the largest, and the decision names which one set it:

- concurrency: (running + waiting) / targetConcurrency. What is in the servers now.
- littles_law: arrival_rate x S / targetConcurrency, where S is the mean time a request holds a
  slot (`serviceTimeSeconds`, or measured as running / arrival_rate when both are known). It moves
  with arrivals, before a queue forms.
- queue_slo: (arrival_rate + waiting / queueTimeSloSeconds) x S / targetConcurrency, only while
  the measured queue time (p99 if known, else the mean) exceeds `queueTimeSloSeconds`: the
  replicas that serve arrivals and also drain today's queue within the SLO.
- tokens: prompt_tokens_rate / prefillTokensPerSecond + generation_tokens_rate /
  decodeTokensPerSecond: the GPU time the token rates take, in replicas. Prefill-heavy traffic
  (long prompts, short answers) saturates a replica's compute while few requests hold slots, so
  neither concurrency nor Little's law sees it. Only with a capacity configured (a load test).
  While nothing waits, the servers' token counters are the demand itself (every arrival is being
  served), counted per iteration: this term then stands for the flow, and Little's law is not
  computed (`token_flow`).
- kv_cache: ready_pods x kv_cache_usage / kvCacheTarget, only while usage exceeds the target:
  memory-bound pods preempt before their concurrency target is reached.

queue_slo and kv_cache only ever raise the need (upward corrections); tokens needs a configured
capacity; none reads a missing signal as 0.

With a `Fleet` (what the policy knows: a cold-start horizon, the ready replicas, the replicas
asked for and not yet ready), the queue is counted where it will be when a
replica asked now can serve, instead of as concurrency now:

- queue: (arrival_rate x S + B_today x min(1, S / D) + B_later x min(1, S / H)) / targetConcurrency.
  B is the backlog a replica asked for now would meet when it serves, a horizon H from now
  (`backlog_ahead`). The part waiting today that the fleet will not drain is due within D
  (`queueTimeSloSeconds`, else one S), the rest within one more horizon. A backlog due within T
  takes min(1, S / T) slots per request, because a slot admits one request per S. While nothing
  waits, the arrivals are those the token counters stand for (`token_flow`). The term keeps the
  busy replicas while a queue drains, and the replicas on their way while the queue they will
  meet is not empty. It replaces `concurrency` and `queue_slo`: a reactive queue metric asks again
  and again during a cold start for work the replicas on their way will drain. Why each part is
  there, with the tests that pin it: docs/tuning.md, "Replicas on their way are not asked for
  twice". Without an S that holds under load (`loaded_service_time`) the concurrency term stands.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from gpu_queue_scaler.signals import Signal

if TYPE_CHECKING:  # annotations only: the decision imports no settings code at run time
    from gpu_queue_scaler.settings.spec import CapacitySpec

MIN_RATE = 1e-3  # req/s; below it running / arrival_rate says nothing about service time
DRAIN_SURPLUS = 1.1  # a fleet drains its queue when it completes 10% more than arrives


class Fleet(NamedTuple):
    """What the policy knows beyond one signal (see the module docstring). NamedTuples here,
    not frozen dataclasses: `decide` builds one of each on every tick (see `policy.Decision`)."""

    horizon_s: float  # from asking for a replica to it serving
    ready: int | None = None  # replicas serving now (None: unknown)
    pending: float = 0.0  # replicas asked for within the horizon and not yet ready
    pending_in_s: float = 0.0  # until the pending ones are expected to serve
    asked: int = 0  # the highest target asked for within the horizon
    # Requests per second the observed queue grew (negative: shrank) while the ready count stayed
    # as it is now, over the last few distinct observations (None: no such evidence yet).
    queue_trend: float | None = None
    # False when the queue is new and small (`policy.new_small_queue`): none on the observation
    # before, at this ready count, and fewer waiting than ready replicas. A request waiting a
    # moment (a prefill scheduled behind another, or a KV-full server making room) does not show
    # a saturated fleet; a queue seen twice, or one per replica, may (`standing_queue`).
    queue_held: bool = True


class Need(NamedTuple):
    replicas: float  # fractional replicas needed now
    term: str  # "concurrency" | "queue" | "littles_law" | "queue_slo" | "tokens" | "kv_cache"
    terms: dict[str, float]  # every term that could be computed
    # The need without what drains a backlog (the queue term's flow part only): what the
    # stabilization window remembers, so the replicas a drain keeps busy are not held for a
    # whole window after the queue is gone. Equal to `replicas` without a fleet.
    steady: float
    # The S that holds under load (`loaded_service_time`) this need was computed with, if any:
    # the policy's window of S (the forecaster's offered load) reads it from here.
    loaded_s: float | None = None
    # The replicas on their way that the queue term keeps while the queue they will meet is not
    # empty (0: none): a floor of what was already asked for, not demand, so the policy's
    # headroom multiplies the demand and not this (else each tick's headroom would compound on
    # the last tick's ask: a queue with replicas on their way ran the target to maxReplicas).
    floor: float = 0.0
    # The need without that floor (equal to `replicas` when the floor did not set it).
    demand: float | None = None

    def describe(self) -> str:
        shown = ", ".join(f"{name}={value:.2f}" for name, value in self.terms.items())
        return f"need={self.replicas:.2f} from {self.term} ({shown})"


def service_time(signal: Signal, spec: CapacitySpec) -> float | None:
    """Configured S, else the servers' own measure, else Little's law on the running requests:
    S = L / lambda."""
    if spec.service_time_s is not None:
        return spec.service_time_s
    reported = signal.service_time_s
    if reported is not None and math.isfinite(reported) and reported > 0:
        return reported
    if signal.running is not None and signal.arrival_rate and signal.arrival_rate >= MIN_RATE:
        measured = signal.running / signal.arrival_rate
        return measured if math.isfinite(measured) else None
    return None


def offered(signal: Signal, spec: CapacitySpec, steady_s: float | None = None) -> float | None:
    """Replicas the arrivals alone need: the larger of arrival_rate x S / targetConcurrency, with
    an S that holds under load (`steady_s`, the policy's mean over minutes, else this signal's),
    and the GPU time of their tokens (`token_work`); None when neither is known. Unlike the need
    it does not depend on the fleet (a short fleet queues, then drains), so it is the series
    worth forecasting. Both demand terms are in it: forecast from Little's law alone, a
    prefill-heavy workload (the tokens term sets its need) would read its need as far above the
    forecast on every tick, and panic."""
    s = steady_s if steady_s is not None else loaded_service_time(signal, spec)
    value = None
    if s is not None and signal.arrival_rate is not None:
        flow = signal.arrival_rate * s / spec.target_concurrency
        value = flow if math.isfinite(flow) else None
    work = token_work(signal, spec)
    if work is not None and math.isfinite(work) and (value is None or work > value):
        value = work
    return value


def token_work(signal: Signal, spec: CapacitySpec) -> float | None:
    """The `tokens` term: replicas of GPU time the token rates take, prompt tokens at the
    prefill capacity plus generated ones at the decode capacity (None without a configured
    capacity and its rate)."""
    prompt, prefill = signal.prompt_tokens_rate, spec.prefill_tokens_per_s
    generated, decode = signal.generation_tokens_rate, spec.decode_tokens_per_s
    work = None
    if prompt is not None and prefill is not None:
        work = prompt / prefill
    if generated is not None and decode is not None:
        work = (work or 0.0) + generated / decode
    return work


def standing_queue(signal: Signal, fleet: Fleet | None) -> bool:
    """A request or more waits, and not as a new small queue (`Fleet.queue_held`). Every reading
    of a fleet short of its demand asks this: the servers' own batch limit (`backlog_ahead`),
    arrivals raised to the queue's growth (`arrivals_seen`, through `queue_term`), the busy
    replicas kept as a floor under the queue (`queue_term`) and the token counters' flow set
    aside (`token_flow`)."""
    return (signal.waiting or 0.0) >= 1.0 and (fleet is None or fleet.queue_held)


def token_flow(signal: Signal, work: float | None, fleet: Fleet | None = None) -> float | None:
    """The flow in replicas from the token counters (`work`: this signal's `token_work`), when
    they measure demand: with a capacity configured and nothing waiting, what the servers
    generate and prefill per second is what arrives, so the work is the replicas the arrivals
    need. It is preferred to Little's law
    there because arrival_rate x S needs S at the operating point, extrapolated by the policy's
    fit from the batch the fleet runs, while the counters need no model (how far apart the two
    read on the replay bench: bench/results/decision.md). While a request waits the counters
    show what the fleet serves, not what arrives (a short fleet serves less than the demand), so
    the arrivals' flow stands; None then, and without a configured capacity or a finite rate.
    A new small queue (`Fleet.queue_held` False) is not a short fleet: the counters
    stay the flow through it (read as arrivals x S instead, one request waiting on 48 replicas
    moved the demo trace's need from the counters' 41 to 48, a node).
    Capacities set too high size the fleet short here until a queue forms; then the queue term
    and the closed loop's headroom take over (docs/tuning.md)."""
    if signal.waiting is None or standing_queue(signal, fleet) or work is None:
        return None
    return work if math.isfinite(work) else None


def loaded_service_time(signal: Signal, spec: CapacitySpec) -> float | None:
    """An S that holds under load, for the queue term: configured, or reported by the servers,
    or Little's law on the running requests only while nothing waits (a saturated fleet's
    running count is capped by its slots, so running / arrival_rate would understate S)."""
    if spec.service_time_s is not None or signal.service_time_s is not None:
        return service_time(signal, spec)
    return measured_service_time(signal)


def measured_service_time(signal: Signal) -> float | None:
    """The S the servers show at this tick's batch, for the policy's fit of S against the batch
    (`policy.operating_service_time`): reported, else Little's law on the running requests while
    nothing waits (a saturated fleet's running count is capped by its slots)."""
    reported = signal.service_time_s
    if reported is not None and math.isfinite(reported) and reported > 0:
        return reported
    running, rate = signal.running, signal.arrival_rate
    if signal.waiting is None or signal.waiting >= 1.0 or running is None or running < 1.0:
        return None
    if rate is None or rate < MIN_RATE:
        return None
    measured = running / rate
    return measured if math.isfinite(measured) else None


@dataclass(frozen=True)
class Backlog:
    """The queue ahead (requests): what the pending replicas meet when they start serving, and
    what a replica asked for now would meet a horizon from now."""

    pending_meet: float
    new_meets: float
    ready_rate: float = 0.0  # requests per second the ready replicas complete (modelled)


def backlog_ahead(
    signal: Signal, per_replica: float, s: float, fleet: Fleet, arrivals: float | None = None
) -> Backlog:
    """The queue grows or drains at arrivals minus the ready replicas' throughput until the
    pending ones serve, then at arrivals minus the throughput of all of them until a replica asked
    now would serve. A replica's throughput is its concurrency over S: targetConcurrency, or the
    running requests per pod when a queue waits while pods run fewer (a server whose own batch
    limit is below the target is saturated there), unless that queue is new and small
    (`Fleet.queue_held`): read as saturation, a request that waits a moment on a long-context
    fleet running a third of its slots had the whole horizon's arrivals queue behind it, and
    asked for a node every few minutes that never served. `arrivals` defaults to the signal's
    rate."""
    arrivals = (signal.arrival_rate or 0.0) if arrivals is None else arrivals
    ready = fleet.ready or 0
    concurrency = per_replica
    if ready and standing_queue(signal, fleet) and signal.running is not None:
        concurrency = min(concurrency, max(signal.running / ready, 1e-9))
    per_replica_rate = concurrency / s
    now_rate = ready * per_replica_rate
    first = min(fleet.pending_in_s, fleet.horizon_s)
    met = max(0.0, (signal.waiting or 0.0) + (arrivals - now_rate) * first)
    later_rate = now_rate + fleet.pending * per_replica_rate
    final = max(0.0, met + (arrivals - later_rate) * (fleet.horizon_s - first))
    return Backlog(
        pending_meet=met if fleet.pending > 0 else 0.0, new_meets=final, ready_rate=now_rate
    )


def arrivals_seen(
    arrivals: float, waiting: float, ready_rate: float, queue_trend: float | None
) -> float:
    """The arrival rate, raised to what the observed queue implies while one waits: a saturated
    fleet completes `ready_rate`, so arrivals are at least ready_rate + the queue's growth.

    A counter's rate is a window's average (rateWindowSeconds, a minute by default), so for a
    window after load rises it reads low while the queue says otherwise; trusted alone, it makes
    a queue that is not shrinking look as if it drains, and the fleet stays short for a whole
    window (16 closed-loop clients on a one-replica vLLM read 1.8 req/s against 4.3 completed).
    The observed trend only ever raises the rate: a queue seen to shrink at the modelled pace
    agrees with the counter, and without a trend (no two observations at this ready count) the
    counter stands."""
    if queue_trend is None or waiting < 1.0:
        return arrivals
    return max(arrivals, ready_rate + queue_trend)


def queue_term(
    signal: Signal,
    spec: CapacitySpec,
    fleet: Fleet,
    s: float | None,
    tokens: float | None = None,
) -> tuple[float, float, float] | None:
    """The `queue` term, its steady part (the flow) and the floor of replicas on their way it
    keeps (`Need.floor`) at service time `s`, or None when it
    cannot be computed (no ready-pod count, no horizon, no `s`, no arrivals or queue known).
    `need` passes the S that holds under load (`loaded_service_time`), or Little's law's S while
    less than a request waits, and `tokens`, the flow from the token counters while nothing
    waits (`token_flow`): the arrivals are then those it stands for at `s`.

    The backlog a replica asked now would meet (`backlog_ahead`) is split: with nothing on its
    way, the part waiting today that the fleet will not clear drains within D (the queue-time
    SLO, else one S, as the concurrency term would); the rest (what builds during a cold start,
    or what the replicas on their way leave) within a horizon. A backlog due within T takes
    min(1, S / T) slots per request: a slot admits one request per S, so within a T shorter
    than S each request needs a slot of its own. A saturated fleet in steady state
    (a closed loop of clients) neither grows nor drains its queue, arrivals equal to its
    throughput within measurement noise, so only a clear surplus (DRAIN_SURPLUS) counts as
    draining, and a queue seen not to shrink does not (`arrivals_seen`). Busy replicas are kept
    while a queue drains (`running`, up to the ready replicas), and the replicas on their way
    while the queue they will meet is not empty. A new small queue (`Fleet.queue_held` False)
    is none of these: its growth is not taken for arrivals and it keeps no busy floor, so one
    request waiting a moment on a fleet at its target asks for no replica (a whole node)."""
    arrivals, waiting = signal.arrival_rate, signal.waiting
    if fleet.ready is None or fleet.horizon_s <= 0 or not s or arrivals is None or waiting is None:
        return None
    if tokens is not None:
        # The arrivals the counters' work stands for at this S: with the flow from the counters,
        # the backlog model compares the same work against the ready replicas' throughput, so
        # a fleet keeping up (nothing waits) is not modelled as falling behind by an S read high.
        arrivals = tokens * spec.target_concurrency / s
    ahead = backlog_ahead(signal, spec.target_concurrency, s, fleet, arrivals)
    standing = standing_queue(signal, fleet)
    trend = fleet.queue_trend if standing else None  # a moment's queue: no surge
    evident = arrivals_seen(arrivals, waiting, ahead.ready_rate, trend)
    if evident > arrivals:
        ahead = backlog_ahead(signal, spec.target_concurrency, s, fleet, evident)
    backlog = ahead.new_meets
    if fleet.pending > 0:
        today = 0.0
    elif ahead.ready_rate >= DRAIN_SURPLUS * evident:
        today = min(waiting, backlog)
    else:
        today = waiting
        backlog = max(backlog, today)
    drain_s = spec.queue_time_slo_s if spec.queue_time_slo_s is not None else s
    flow = arrivals * s
    # The busy replicas while a queue waits (at most the ready ones: servers batching past
    # targetConcurrency are still that many replicas; their overflow is in the flow already).
    busy = min(signal.running or 0.0, fleet.ready * spec.target_concurrency)
    draining = busy if standing else 0.0
    slots = (
        max(flow, draining)
        + today * min(1.0, s / drain_s)
        + (backlog - today) * min(1.0, s / fleet.horizon_s)
    )
    queue = slots / spec.target_concurrency
    floor = float(fleet.ready + fleet.pending) if ahead.pending_meet > 0 else 0.0
    return queue, flow / spec.target_concurrency, floor


def need(
    signal: Signal,
    spec: CapacitySpec,
    fleet: Fleet | None = None,
    operating_s: float | None = None,
) -> Need | None:
    """Replicas needed for this signal, or None when no term can be computed. `operating_s`: S
    at the operating point (a replica holding targetConcurrency requests, fitted by the policy
    from the servers' own counters); without a configured S it stands for the S this signal
    shows, which moves with the fleet's own size (see `policy.operating_service_time`)."""
    per_replica = spec.target_concurrency
    terms: dict[str, float] = {}
    in_flight = signal.in_flight
    if spec.service_time_s is None and operating_s is not None:
        s: float | None = operating_s
        loaded: float | None = operating_s
    else:
        s = service_time(signal, spec)
        loaded = loaded_service_time(signal, spec)
    work = token_work(signal, spec)
    tokens = token_flow(signal, work, fleet)
    queued = queue_term(signal, spec, fleet, loaded, tokens) if fleet is not None else None
    steady_queue: float | None = None
    floor = 0.0
    if queued is not None:
        terms["queue"], steady_queue, floor = queued
        s = loaded
    elif in_flight is not None:
        terms["concurrency"] = in_flight / per_replica
        if fleet is not None and (signal.waiting or 0.0) >= 1.0:
            # No S that holds under load, so the concurrency term stands; but never below the
            # queue term on Little's law's S, the one it uses while less than a request waits:
            # more waiting never needs fewer replicas, and the replicas on their way are kept.
            calm = queue_term(signal, spec, fleet, s)
            if calm is not None:
                terms["queue"], steady_queue, floor = calm
    if s is not None and signal.arrival_rate is not None and tokens is None:
        terms["littles_law"] = signal.arrival_rate * s / per_replica
    queue_time = (
        signal.queue_time_p99_s
        if signal.queue_time_p99_s is not None
        else (signal.queue_time_mean_s)
    )
    if (
        queued is None  # with a fleet, the queue term drains within the SLO already
        and spec.queue_time_slo_s is not None
        and queue_time is not None
        and queue_time > spec.queue_time_slo_s
        and s is not None
        and signal.waiting is not None
    ):
        drain = (signal.arrival_rate or 0.0) + signal.waiting / spec.queue_time_slo_s
        terms["queue_slo"] = drain * s / per_replica
    if work is not None:
        terms["tokens"] = work
    if (
        spec.kv_cache_target is not None
        and signal.kv_cache_usage is not None
        and signal.ready_pods
        and signal.kv_cache_usage > spec.kv_cache_target
    ):
        held = signal.ready_pods * signal.kv_cache_usage / spec.kv_cache_target
        shown_s = service_time(signal, spec)  # the S of the batch the fleet runs now
        if operating_s is not None and shown_s is not None and shown_s > operating_s:
            # A batch past the operating point holds each request longer (S grows with the
            # batch), so it holds more of them, and more KV, at the same arrivals: at the
            # operating point's S the same arrivals hold that much less.
            held *= operating_s / shown_s
        terms["kv_cache"] = held
    for name in [name for name, value in terms.items() if not math.isfinite(value)]:
        del terms[name]  # what is left keeps its order: the first of equal terms names the need
    if not terms:
        return None
    if steady_queue is not None and not math.isfinite(steady_queue):
        steady_queue = None  # a flow from a NaN rate: the other terms stand, as in `terms`
    demand = max(terms.values())
    if floor > terms.get("queue", 0.0):
        terms["queue"] = floor
    term = max(terms, key=terms.__getitem__)
    if steady_queue is None:
        return Need(terms[term], term, terms, steady=terms[term], loaded_s=loaded, demand=demand)
    lasting = [v for name, v in terms.items() if name not in ("queue", "queue_slo")]
    steady = max([steady_queue, *lasting])
    return Need(
        terms[term],
        term,
        terms,
        steady=min(steady, demand),
        loaded_s=loaded,
        floor=floor,
        demand=demand,
    )
