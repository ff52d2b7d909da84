"""The normalized signal model: what one workload's servers reported at one sample time.

Every backend (Triton, vLLM, custom PromQL, the synthetic generator) is reduced to this shape, so
everything downstream (forecast, policy) is backend-agnostic. Missing is `None`, never 0: a scaler
that reads "no data" as "no load" scales a busy model to zero during a metrics outage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple


class Signal(NamedTuple):
    """One sample. A NamedTuple, not a frozen dataclass: sources build one per read and a warm
    start one per replayed tick, and a frozen dataclass's __init__ costs several times as much."""

    at: float  # wall-clock time the sample describes (epoch seconds)
    source: str  # e.g. "synthetic", "prometheus", "scrape"
    waiting: float | None = None  # requests queued, not yet running
    running: float | None = None  # requests being served
    arrival_rate: float | None = None  # requests per second
    queue_time_mean_s: float | None = None
    queue_time_p99_s: float | None = None
    ttft_p99_s: float | None = None
    kv_cache_usage: float | None = None  # 0-1
    ready_pods: int | None = None
    service_time_s: float | None = None  # mean time a request holds a slot (not queued)
    prompt_tokens_rate: float | None = None  # prompt tokens prefilled per second
    generation_tokens_rate: float | None = None  # tokens generated per second
    age_s: float | None = None  # age of the newest underlying sample when read
    reasons: tuple[str, ...] = ()  # why any field above is missing

    @property
    def in_flight(self) -> float | None:
        """Running + waiting: the concurrency the fleet must hold. None when both are unknown."""
        if self.waiting is None and self.running is None:
            return None
        return (self.waiting or 0.0) + (self.running or 0.0)

    @property
    def busy(self) -> bool | None:
        """Anything in flight or arriving; None when nothing tells."""
        in_flight, rate = self.in_flight, self.arrival_rate
        if in_flight is None and rate is None:
            return None
        return (in_flight is not None and in_flight > 0) or (rate is not None and rate > 0)

    @classmethod
    def from_values(
        cls,
        at: float,
        source: str,
        values: Mapping[str, float | None],
        age_s: float | None = None,
        reasons: tuple[str, ...] = (),
    ) -> Signal:
        """Build from a mapping of signal field -> value (absent or None = missing)."""
        ready = values.get("ready_pods")
        return cls(
            at=at,
            source=source,
            waiting=values.get("waiting"),
            running=values.get("running"),
            arrival_rate=values.get("arrival_rate"),
            queue_time_mean_s=values.get("queue_time_mean_s"),
            queue_time_p99_s=values.get("queue_time_p99_s"),
            ttft_p99_s=values.get("ttft_p99_s"),
            kv_cache_usage=values.get("kv_cache_usage"),
            ready_pods=int(ready) if ready is not None else None,
            service_time_s=values.get("service_time_s"),
            prompt_tokens_rate=values.get("prompt_tokens_rate"),
            generation_tokens_rate=values.get("generation_tokens_rate"),
            age_s=age_s,
            reasons=reasons,
        )
