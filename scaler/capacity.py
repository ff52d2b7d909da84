"""Signals -> replicas needed now: the capacity model, pure and documented.

Four terms, each in replica units; the need is the largest, and the decision names which one set it:

- concurrency: (running + waiting) / targetConcurrency. What is in the servers now.
- littles_law: arrival_rate x S / targetConcurrency, where S is the mean time a request holds a
  slot (`serviceTimeSeconds`, or measured as running / arrival_rate when both are known). It moves
  with arrivals, before a queue forms.
- queue_slo: (arrival_rate + waiting / queueTimeSloSeconds) x S / targetConcurrency, only while
  the measured queue time (p99 if known, else the mean) exceeds `queueTimeSloSeconds`: the
  replicas that serve arrivals and also drain today's queue within the SLO.
- kv_cache: ready_pods x kv_cache_usage / kvCacheTarget, only while usage exceeds the target:
  memory-bound pods preempt before their concurrency target is reached.

The last two only ever raise the need (upward corrections); none reads a missing signal as 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scaler.signals import Signal

MIN_RATE = 1e-3  # req/s; below it running / arrival_rate says nothing about service time


@dataclass(frozen=True)
class CapacitySpec:
    target_concurrency: float
    service_time_s: float | None = None
    queue_time_slo_s: float | None = None
    kv_cache_target: float | None = None


@dataclass(frozen=True)
class Need:
    replicas: float  # fractional replicas needed now
    term: str  # "concurrency" | "littles_law" | "queue_slo" | "kv_cache"
    terms: dict[str, float]  # every term that could be computed

    def describe(self) -> str:
        shown = ", ".join(f"{name}={value:.2f}" for name, value in self.terms.items())
        return f"need={self.replicas:.2f} from {self.term} ({shown})"


def service_time(signal: Signal, spec: CapacitySpec) -> float | None:
    """Configured S, else Little's law on the running requests: S = L / lambda."""
    if spec.service_time_s is not None:
        return spec.service_time_s
    if signal.running is not None and signal.arrival_rate and signal.arrival_rate >= MIN_RATE:
        measured = signal.running / signal.arrival_rate
        return measured if math.isfinite(measured) else None
    return None


def need(signal: Signal, spec: CapacitySpec) -> Need | None:
    """Replicas needed for this signal, or None when no term can be computed."""
    per_replica = spec.target_concurrency
    terms: dict[str, float] = {}
    in_flight = signal.in_flight
    if in_flight is not None:
        terms["concurrency"] = in_flight / per_replica
    s = service_time(signal, spec)
    if s is not None and signal.arrival_rate is not None:
        terms["littles_law"] = signal.arrival_rate * s / per_replica
    queue_time = (
        signal.queue_time_p99_s
        if signal.queue_time_p99_s is not None
        else (signal.queue_time_mean_s)
    )
    if (
        spec.queue_time_slo_s is not None
        and queue_time is not None
        and queue_time > spec.queue_time_slo_s
        and s is not None
        and signal.waiting is not None
    ):
        drain = (signal.arrival_rate or 0.0) + signal.waiting / spec.queue_time_slo_s
        terms["queue_slo"] = drain * s / per_replica
    if (
        spec.kv_cache_target is not None
        and signal.kv_cache_usage is not None
        and signal.ready_pods
        and signal.kv_cache_usage > spec.kv_cache_target
    ):
        terms["kv_cache"] = signal.ready_pods * signal.kv_cache_usage / spec.kv_cache_target
    terms = {name: value for name, value in terms.items() if math.isfinite(value)}
    if not terms:
        return None
    term = max(terms, key=lambda name: terms[name])
    return Need(replicas=terms[term], term=term, terms=terms)
