"""The capacity model: each term on worked numbers, which term wins, and missing stays missing."""

from __future__ import annotations

import math

import pytest

from gpu_queue_scaler.decision import capacity
from gpu_queue_scaler.decision.capacity import (
    Fleet,
    backlog_ahead,
    loaded_service_time,
    need,
)
from gpu_queue_scaler.settings.spec import CapacitySpec
from gpu_queue_scaler.signals import Signal


def signal(**values: float | None) -> Signal:
    return Signal(at=0.0, source="test", **values)  # type: ignore[arg-type]


def test_concurrency_term():
    found = need(signal(running=12, waiting=20), CapacitySpec(target_concurrency=8))
    assert found is not None
    assert (found.replicas, found.term) == (4.0, "concurrency")


def test_littles_law_leads_the_queue_with_a_known_service_time():
    # 10 req/s x 4 s each = 40 slots / 8 per replica = 5 replicas, while only 16 are in flight.
    spec = CapacitySpec(target_concurrency=8, service_time_s=4.0)
    found = need(signal(running=16, waiting=0, arrival_rate=10.0), spec)
    assert found is not None
    assert (found.replicas, found.term) == (5.0, "littles_law")
    assert found.terms["concurrency"] == 2.0


def test_measured_service_time_never_exceeds_the_concurrency_term():
    found = need(
        signal(running=16, waiting=4, arrival_rate=4.0), CapacitySpec(target_concurrency=8)
    )
    assert found is not None
    assert found.terms["littles_law"] == pytest.approx(2.0)  # S = 16 / 4 = 4 s
    assert found.term == "concurrency"


def test_queue_slo_breach_adds_what_drains_the_queue_within_the_slo():
    # p99 queue time 6 s > SLO 2 s: serve 10 req/s and drain 30 queued in 2 s -> 25 req/s,
    # x S = 1 s / 4 per replica = 6.25 replicas.
    spec = CapacitySpec(target_concurrency=4, service_time_s=1.0, queue_time_slo_s=2.0)
    found = need(signal(running=8, waiting=30, arrival_rate=10.0, queue_time_p99_s=6.0), spec)
    assert found is not None
    assert (found.replicas, found.term) == (pytest.approx(9.5), "concurrency")  # 38 / 4
    assert found.terms["queue_slo"] == pytest.approx(6.25)
    fast = need(signal(running=8, waiting=30, arrival_rate=10.0, queue_time_p99_s=1.0), spec)
    assert fast is not None and "queue_slo" not in fast.terms  # within the SLO: no term


def test_queue_slo_term_wins_when_the_queue_is_long_and_slow():
    spec = CapacitySpec(target_concurrency=16, service_time_s=2.0, queue_time_slo_s=1.0)
    found = need(signal(running=16, waiting=40, arrival_rate=8.0, queue_time_mean_s=5.0), spec)
    assert found is not None
    assert found.term == "queue_slo"
    assert found.replicas == pytest.approx((8.0 + 40 / 1.0) * 2.0 / 16)


def test_kv_cache_pressure_raises_the_need():
    spec = CapacitySpec(target_concurrency=16, kv_cache_target=0.8)
    found = need(signal(running=8, waiting=0, kv_cache_usage=1.0, ready_pods=4), spec)
    assert found is not None
    assert (found.replicas, found.term) == (5.0, "kv_cache")  # 4 pods x 1.0 / 0.8
    calm = need(signal(running=8, waiting=0, kv_cache_usage=0.5, ready_pods=4), spec)
    assert calm is not None and calm.term == "concurrency"


def test_missing_is_missing():
    assert need(signal(), CapacitySpec(target_concurrency=8)) is None
    only_arrivals = need(signal(arrival_rate=3.0), CapacitySpec(target_concurrency=8))
    assert only_arrivals is None  # no service time known: arrivals alone give no replicas
    with_s = need(signal(arrival_rate=3.0), CapacitySpec(target_concurrency=8, service_time_s=8))
    assert with_s is not None and with_s.replicas == 3.0


def test_tiny_arrival_rate_does_not_blow_up_the_service_time():
    found = need(signal(running=2.0, waiting=0.0, arrival_rate=1e-300), CapacitySpec(0.1))
    assert found is not None
    assert found.replicas == 20.0 and "littles_law" not in found.terms


# --- the queue where a replica asked now will find it (capacity.Fleet) ------------------------


def test_queue_term_counts_the_backlog_a_new_replica_would_find():
    # 2 ready x 8 slots / S = 2 s -> 8 req/s served; 20 req/s arrive; 3 more replicas asked,
    # serving in 60 s; H = 210 s. Until then the queue grows 12/s: 100 + 720 = 820. Then
    # 5 x 4 = 20 req/s served = arrivals: it stays at 820, drained over H on top of the flow.
    spec = CapacitySpec(target_concurrency=8)
    fleet = Fleet(horizon_s=210, ready=2, pending=3, pending_in_s=60)
    found = need(
        signal(running=16, waiting=100, arrival_rate=20.0, service_time_s=2.0), spec, fleet
    )
    assert found is not None and found.term == "queue"
    ahead = backlog_ahead(signal(waiting=100, arrival_rate=20.0), 8, 2.0, fleet)
    assert (ahead.pending_meet, ahead.new_meets) == (820, 820)
    # Today's queue is the pending replicas' to drain: all 820 go over a horizon.
    assert found.replicas == pytest.approx((20 * 2 + 820 * 2 / 210) / 8)
    assert "concurrency" not in found.terms


def test_a_queue_the_fleet_drains_before_a_new_replica_arrives_asks_for_nothing_more():
    # 100 queued, 4 ready drain 16 req/s against 6 arriving: gone in 10 s, long before H.
    spec = CapacitySpec(target_concurrency=8)
    fleet = Fleet(horizon_s=210, ready=4)
    loaded = signal(running=32, waiting=100, arrival_rate=6.0, service_time_s=2.0)
    found = need(loaded, spec, fleet)
    assert found is not None
    assert found.terms["queue"] == pytest.approx(32 / 8)  # what runs now, not 132 / 8
    reactive = need(loaded, spec)
    assert reactive is not None and reactive.replicas == pytest.approx(132 / 8)


def test_servers_batching_past_the_target_keep_the_ready_replicas_not_more():
    # 4 ready pods run 12 each against a target of 8 while 2 wait; arrivals (6 req/s at S = 2 s)
    # are within the 16 req/s they complete. The busy replicas kept while the queue drains are
    # the 4 that are ready, not 48 / 8 = 6: the overflow is the servers' batching, not demand.
    spec = CapacitySpec(target_concurrency=8)
    found = need(
        signal(running=48, waiting=2, arrival_rate=6.0, service_time_s=2.0),
        spec,
        Fleet(horizon_s=210, ready=4),
    )
    assert found is not None
    assert found.terms["queue"] == pytest.approx(4.0)


def test_kv_pressure_is_read_at_the_operating_points_service_time():
    # 4 pods at 95% KV against a 0.8 target hold 4.75 replicas of KV now, at the S their big
    # batch shows (10 s); at the operating point's S (8 s) the same arrivals hold a fifth less.
    # An S shown below the operating point's leaves the term as it reads.
    spec = CapacitySpec(target_concurrency=16, kv_cache_target=0.8)
    big = signal(running=60, waiting=0, kv_cache_usage=0.95, ready_pods=4, service_time_s=10.0)
    slowed = need(big, spec, operating_s=8.0)
    assert slowed is not None
    assert slowed.terms["kv_cache"] == pytest.approx(4 * 0.95 / 0.8 * 8.0 / 10.0)
    quick = need(big, spec, operating_s=12.0)
    assert quick is not None and quick.terms["kv_cache"] == pytest.approx(4 * 0.95 / 0.8)


def test_queue_term_needs_a_service_time_known_under_load():
    spec = CapacitySpec(target_concurrency=8)
    unknown = Fleet(horizon_s=210, ready=2)  # neither reported nor configured, and queued
    found = need(signal(running=16, waiting=100, arrival_rate=20.0), spec, unknown)
    assert found is not None and found.term == "concurrency"
    configured = CapacitySpec(target_concurrency=8, service_time_s=2.0)
    found = need(signal(running=16, waiting=100, arrival_rate=20.0), configured, unknown)
    assert found is not None and found.term == "queue"


def test_a_service_time_under_load_is_configured_reported_or_measured_unqueued():
    spec = CapacitySpec(target_concurrency=8)
    assert loaded_service_time(signal(running=8, waiting=0, arrival_rate=4.0), spec) == 2.0
    queued = signal(running=16, waiting=30, arrival_rate=20.0)
    assert loaded_service_time(queued, spec) is None  # 16 / 20 would understate S
    assert loaded_service_time(signal(running=0.5, waiting=0, arrival_rate=4.0), spec) is None
    assert loaded_service_time(signal(running=8, arrival_rate=4.0), spec) is None
    reported = signal(running=16, waiting=30, arrival_rate=20.0, service_time_s=3.0)
    assert loaded_service_time(reported, spec) == 3.0
    configured = CapacitySpec(target_concurrency=8, service_time_s=1.5)
    assert loaded_service_time(reported, configured) == 1.5


def test_tokens_term_is_the_gpu_time_the_token_rates_take():
    # Long prompts, short answers: 12 req/s x 1,500 prompt tokens = 18,000 tokens/s against
    # 10,000 per replica = 1.8 replicas of prefill, + 12 x 13 = 156 generated tokens/s against
    # 2,000 per replica; while only ~3 requests hold slots (S = 0.25 s).
    spec = CapacitySpec(
        target_concurrency=8, prefill_tokens_per_s=10_000, decode_tokens_per_s=2_000
    )
    prefill_bound = signal(
        running=3,
        waiting=0,
        arrival_rate=12.0,
        prompt_tokens_rate=18_000.0,
        generation_tokens_rate=156.0,
    )
    found = need(prefill_bound, spec)
    assert found is not None and found.term == "tokens"
    assert found.replicas == pytest.approx(1.8 + 0.078)
    assert found.terms["concurrency"] == pytest.approx(3 / 8)
    # Without a configured capacity, or without the rates, there is no such term.
    assert "tokens" not in need(prefill_bound, CapacitySpec(target_concurrency=8)).terms  # type: ignore[union-attr]
    only_decode = need(signal(running=3, waiting=0, generation_tokens_rate=4_000.0), spec)
    assert only_decode is not None and only_decode.terms["tokens"] == pytest.approx(2.0)


def test_a_queue_the_fleet_cannot_drain_is_drained_within_one_service_time():
    # A server whose own batch limit (2 running) is below targetConcurrency (4) is saturated
    # there: 14 wait and do not drain. With nothing on its way, as the concurrency term would.
    spec = CapacitySpec(target_concurrency=4)
    fleet = Fleet(horizon_s=210, ready=1)
    stuck = signal(running=2, waiting=14, arrival_rate=1.0, service_time_s=2.0)
    found = need(stuck, spec, fleet)
    assert found is not None and found.term == "queue"
    assert found.replicas == pytest.approx((2 + 14) / 4)


def test_a_queue_due_within_an_slo_shorter_than_a_service_time_takes_a_slot_per_request():
    # An LLM fleet: 4 replicas run 100 each (targetConcurrency) at S = 20 s, as many arrive as
    # they complete (20 req/s), and 40 wait with a 2 s queue-time SLO. Admitting the 40 within
    # 2 s takes 40 more slots, each held for S: 0.4 of a replica, not 40 x 20 / 2 = 400 slots.
    spec = CapacitySpec(target_concurrency=100, queue_time_slo_s=2.0)
    stuck = signal(running=400, waiting=40, arrival_rate=20.0, service_time_s=20.0)
    found = need(stuck, spec, Fleet(horizon_s=210, ready=4))
    assert found is not None and found.term == "queue"
    assert found.replicas == pytest.approx((400 + 40) / 100)
    # Within an SLO longer than S a slot admits SLO / S requests in turn: 40 x 20 / 60 slots.
    patient = CapacitySpec(target_concurrency=100, queue_time_slo_s=60.0)
    found = need(stuck, patient, Fleet(horizon_s=210, ready=4))
    assert found is not None
    assert found.replicas == pytest.approx((400 + 40 * 20 / 60) / 100)


def test_a_saturated_fleet_whose_arrivals_match_its_throughput_keeps_its_queue():
    # Arrivals within 10% of what the ready replicas complete: neither drains nor grows as far as
    # the measurements can tell (a closed loop of clients). Today's queue is there to stay.
    spec = CapacitySpec(target_concurrency=4)
    fleet = Fleet(horizon_s=210, ready=1)
    steady = signal(running=2, waiting=14, arrival_rate=1.05, service_time_s=2.0)  # 1.0 served
    found = need(steady, spec, fleet)
    # flow 1.05 x 2 s, today's 14 within one S, the 0.05/s x 210 s it grows by over a horizon
    assert found is not None and found.replicas == pytest.approx((2.1 + 14 + 10.5 * 2 / 210) / 4)


def test_the_offered_load_counts_the_token_work_when_it_exceeds_littles_law() -> None:
    # A prefill-heavy workload: long prompts make the tokens term (GPU time) the need while few
    # requests hold slots. The offered load, which the forecaster learns, must be in the same
    # units as the need, or the need reads as far above the forecast on every tick (panic).
    spec = CapacitySpec(
        target_concurrency=8.0,
        service_time_s=2.0,
        prefill_tokens_per_s=10_000.0,
        decode_tokens_per_s=1_000.0,
    )
    signal = Signal(
        at=0.0,
        source="test",
        waiting=0.0,
        running=8.0,
        arrival_rate=4.0,  # x 2 s / 8 = 1 replica by Little's law
        prompt_tokens_rate=40_000.0,  # 4 replicas of prefill
        generation_tokens_rate=1_000.0,  # 1 of decode
    )
    need = capacity.need(signal, spec)
    assert need is not None and need.term == "tokens" and need.replicas == pytest.approx(5.0)
    assert capacity.offered(signal, spec) == pytest.approx(5.0)
    # Without token capacities the offered load is Little's law's, as before.
    plain = CapacitySpec(target_concurrency=8.0, service_time_s=2.0)
    assert capacity.offered(signal, plain) == pytest.approx(1.0)
    # A NaN rate leaves the other term standing.
    assert capacity.offered(signal._replace(arrival_rate=math.nan), spec) == pytest.approx(5.0)


def test_while_nothing_waits_the_token_counters_are_the_flow_and_a_queue_brings_arrivals_back():
    # S at the operating point is a fit's extrapolation (10 s at the target batch), so arrivals
    # x S reads 10 req/s x 10 s / 8 = 12.5 replicas; the servers generate 20,000 tokens/s against
    # 2,000 per replica: 10 replicas of work being done, and with nothing waiting, all of it is
    # the demand. The need follows the counters, and Little's law is not a term.
    spec = CapacitySpec(target_concurrency=8, decode_tokens_per_s=2_000)
    # 12 ready replicas would complete only 12 x 8 / 10 s = 9.6 req/s at that S, less than the
    # 10 arriving: the S read high would also model a backlog growing over the horizon. The
    # counters say the 12 do 10 replicas of work with nothing waiting, and no backlog is added.
    fleet = Fleet(horizon_s=195, ready=12)
    calm = signal(running=80, waiting=0, arrival_rate=10.0, generation_tokens_rate=20_000.0)
    found = need(calm, spec, fleet, operating_s=10.0)
    assert found is not None
    assert found.replicas == pytest.approx(10.0)
    assert found.terms["queue"] == pytest.approx(10.0)
    assert found.steady == pytest.approx(10.0)
    assert "littles_law" not in found.terms
    # A queue waits: the counters show what a short fleet serves, not what arrives, so the
    # arrivals' flow stands again (12.5) and the queue adds its drain on top.
    queued = need(calm._replace(waiting=40.0), spec, fleet, operating_s=10.0)
    assert queued is not None
    assert queued.terms["littles_law"] == pytest.approx(12.5)
    assert queued.steady >= 12.5
    assert queued.replicas > 12.5
    # Without a configured capacity the counters size nothing: Little's law as before, and at
    # that S the 12 ready fall behind (the backlog over the horizon: 0.4 req/s x 195 s x 10 s /
    # 195 s / 8 = 0.5 replica).
    plain = need(calm, CapacitySpec(target_concurrency=8), fleet, operating_s=10.0)
    assert plain is not None and plain.terms["littles_law"] == pytest.approx(12.5)
    assert plain.replicas == pytest.approx(13.0)
    # A non-finite counter rate is no flow: arrivals x S stands.
    broken = need(calm._replace(generation_tokens_rate=math.inf), spec, fleet, operating_s=10.0)
    assert broken is not None and broken.terms["littles_law"] == pytest.approx(12.5)
