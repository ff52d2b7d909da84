"""Simulator building blocks: the service model, nodes, the HPA/KEDA arithmetic, trace replay."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu_queue_scaler_bench.sim.autoscalers import (
    SCALER_BEHAVIOR,
    Hpa,
    HpaBehavior,
    Keda,
    average_value_replicas,
    pods_metric_replicas,
)
from gpu_queue_scaler_bench.sim.cluster import WHEN_EMPTY, Cluster, ClusterConfig, Phase
from gpu_queue_scaler_bench.sim.fleet import ServingFleet, fill_least_loaded
from gpu_queue_scaler_bench.sim.profiles import LLAMA3_8B_A100, P4D_24XLARGE, PROFILES
from gpu_queue_scaler_bench.sim.workload import Requests, build_requests
from gpu_queue_scaler_bench.traces import Trace

SVC = LLAMA3_8B_A100


def _requests(arrivals: list[float], inputs: list[int], outputs: list[int]) -> Requests:
    return Requests(
        arrivals_s=np.asarray(arrivals, dtype=np.float64),
        input_tokens=np.asarray(inputs, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        duration_s=60.0,
        name="hand-made",
    )


def _serve(requests: Requests, pods: int = 1, steps: int = 60, dt: float = 1.0) -> ServingFleet:
    fleet = ServingFleet(requests, SVC, dt, steps, max_wait_s=600.0)
    serving = np.arange(pods, dtype=np.int64)
    for k in range(steps):
        fleet.step(k * dt, serving)
    return fleet


@pytest.mark.parametrize("dt", [1.0, 0.25])
def test_one_request_alone_takes_prefill_plus_decode(dt: float) -> None:
    fleet = _serve(_requests([0.3], [1000], [100]), dt=dt, steps=int(20 / dt))
    prefill = 1000 / SVC.prefill_tokens_per_s
    assert fleet.first_token_t[0] == pytest.approx(0.3 + prefill, abs=1e-9)
    assert fleet.finish_t[0] == pytest.approx(0.3 + prefill + 99 * SVC.decode_step_s(1), abs=1e-9)
    assert fleet.admit_t[0] == pytest.approx(0.3)


def test_token_counters_rise_per_iteration_as_vllm_counts_them() -> None:
    # One long answer: vLLM counts the prompt when prefill completes and a generated token per
    # decode iteration, so rate(generation_tokens_total) over the answer is the decode speed,
    # not a jump when it completes (which the need's token term would read as a surge).
    fleet = _serve(_requests([0.0], [1000], [3000]), steps=60)
    decode_s = 2999 * SVC.decode_step_s(1)
    generated = np.diff(fleet.h_generated[:60])  # tokens per 1 s step
    during = generated[2 : int(decode_s) - 1]
    assert during.size > 30
    assert np.allclose(during, 1.0 / SVC.decode_step_s(1), rtol=1e-6)
    assert fleet.h_prompt[0] == 1000 and fleet.h_prompt[59] == 1000
    assert fleet.h_generated[59] == pytest.approx(3000)  # every token once, the first included


def test_batching_slows_each_requests_decode() -> None:
    alone = _serve(_requests([0.0], [10], [400]))
    many = _serve(_requests([0.0] * 32, [10] * 32, [400] * 32))
    e2e_alone = alone.finish_t[0] - alone.first_token_t[0]
    e2e_many = many.finish_t - many.first_token_t
    assert np.all(e2e_many > e2e_alone * 1.5)
    assert e2e_alone == pytest.approx(399 * SVC.decode_step_s(1), rel=1e-6)
    # but the batch finishes far sooner than 32 requests one after the other
    assert np.nanmax(many.finish_t) < 32 * alone.finish_t[0] / 4


def test_prefill_is_first_come_first_served() -> None:
    fleet = _serve(_requests([0.0, 0.0, 0.0], [2000, 2000, 2000], [2, 2, 2]))
    ttft = fleet.first_token_t
    assert ttft[0] < ttft[1] < ttft[2]
    assert ttft[2] == pytest.approx(6000 / SVC.prefill_tokens_per_s, rel=0.05)


def test_slots_full_means_waiting_and_signals_follow_the_catalog() -> None:
    n = SVC.max_num_seqs + 40
    fleet = ServingFleet(_requests([0.0] * n, [10] * n, [2000] * n), SVC, 1.0, 100, 600.0)
    serving = np.arange(1, dtype=np.int64)
    for k in range(70):
        fleet.step(float(k), serving)
    assert fleet.running == SVC.max_num_seqs
    signal = fleet.signal(70.0)
    assert signal.waiting == 40
    assert signal.running == SVC.max_num_seqs
    assert signal.ready_pods == 1
    assert signal.kv_cache_usage is not None and 0 < signal.kv_cache_usage <= 1
    assert signal.arrival_rate is not None and signal.arrival_rate >= 0
    assert signal.queue_time_p99_s is None  # nobody admitted within the last 60 s


def test_no_replicas_means_the_queue_grows_and_clients_give_up() -> None:
    fleet = ServingFleet(_requests([0.0, 1.0, 50.0], [10] * 3, [10] * 3), SVC, 1.0, 100, 30.0)
    for k in range(60):
        fleet.step(float(k), np.zeros(0, dtype=np.int64))
    assert fleet.dropped.tolist() == [True, True, False]
    assert fleet.waiting == 1


def test_fill_least_loaded_levels_the_replicas() -> None:
    take = fill_least_loaded(np.array([0, 5, 10]), np.array([100, 100, 100]), 12)
    assert take.tolist() == [9, 3, 0]  # levels 9, 8, 10: as even as the loads allow
    assert take.sum() == 12
    assert fill_least_loaded(np.array([0, 0]), np.array([1, 0]), 5).tolist() == [1, 0]


def _cluster(launch: float = 120.0, load: float = 60.0, consolidate: float = 60.0) -> Cluster:
    """WhenEmpty: these tests are about nodes emptied by scale-downs (repacking by eviction,
    WhenEmptyOrUnderutilized, is tested in test_sim_fairness.py)."""
    config = ClusterConfig(
        P4D_24XLARGE, launch, load, consolidate_after_s=consolidate, consolidation=WHEN_EMPTY
    )
    return Cluster(config)


def _run_cluster(cluster: Cluster, start: float, end: float) -> None:
    t = start
    while t < end:
        cluster.tick(t, 1.0, {})
        t += 1.0


def test_a_replica_waits_for_node_launch_then_model_load() -> None:
    cluster = _cluster()
    cluster.scale_to(0.0, 1)
    _run_cluster(cluster, 0.0, 179.0)
    assert cluster.ready == 0 and cluster.live_nodes == 1
    _run_cluster(cluster, 179.0, 181.0)
    assert cluster.ready == 1
    # A second replica fits on the node already up: only the model load.
    cluster.scale_to(181.0, 2)
    _run_cluster(cluster, 181.0, 240.0)
    assert cluster.ready == 1
    _run_cluster(cluster, 240.0, 242.0)
    assert cluster.ready == 2 and cluster.live_nodes == 1


def test_consolidate_after_removes_empty_nodes_and_billing_stops() -> None:
    cluster = _cluster(consolidate=60.0)
    cluster.warm(9)  # two 8-GPU nodes
    assert cluster.live_nodes == 2 and cluster.ready == 9
    # The ReplicaSet deletes doubled-up pods first: the full node empties, the lone pod stays.
    cluster.scale_to(0.0, 1)
    _run_cluster(cluster, 0.0, 10.0)
    assert cluster.live_nodes == 2  # the emptied node waits for consolidateAfter
    _run_cluster(cluster, 10.0, 70.0)
    assert cluster.live_nodes == 1
    billed = cluster.gpu_seconds
    _run_cluster(cluster, 70.0, 80.0)
    assert cluster.gpu_seconds - billed == pytest.approx(8 * 10.0)
    cluster.scale_to(80.0, 0)
    _run_cluster(cluster, 80.0, 145.0)
    assert cluster.live_nodes == 0 and cluster.zero_node_seconds > 0


def test_deletion_costs_make_a_scale_down_empty_the_least_used_node() -> None:
    # 10 replicas on two 8-GPU nodes (8 + 2), down to 8. The ReplicaSet's own order deletes
    # doubled-up pods first, from the full node: both nodes stay, each part-full, paid for.
    # With the companion's deletion costs (pods on fuller nodes cost more) it deletes the two
    # on the emptier node, which consolidateAfter then removes.
    spread = _cluster(consolidate=60.0)
    spread.warm(10)
    spread.scale_to(0.0, 8)
    _run_cluster(spread, 0.0, 120.0)
    assert spread.live_nodes == 2 and spread.replicas == 8
    packed = _cluster(consolidate=60.0)
    packed.warm(10)
    packed.pack()
    assert sorted(p.deletion_cost for p in packed.pods.values()) == [2, 2] + [8] * 8
    packed.scale_to(0.0, 8)
    _run_cluster(packed, 0.0, 120.0)
    assert packed.live_nodes == 1 and packed.replicas == 8 and packed.ready == 8


def test_scale_down_removes_pods_not_ready_first_and_drains_ready_ones() -> None:
    cluster = _cluster()
    cluster.warm(2)
    cluster.scale_to(0.0, 3)
    _run_cluster(cluster, 0.0, 2.0)
    assert sum(p.phase is Phase.LOADING for p in cluster.pods.values()) == 1
    cluster.scale_to(2.0, 2)
    assert cluster.ready == 2 and len(cluster.pods) == 2
    cluster.scale_to(3.0, 1)
    assert [p.phase for p in cluster.pods.values()].count(Phase.DRAINING) == 1
    killed = cluster.tick(4.0, 1.0, {cluster.draining()[0].item(): 3})
    assert killed.size == 0
    killed = cluster.tick(40.0, 1.0, {cluster.draining()[0].item(): 3})  # grace (30 s) is over
    assert killed.size == 1


def test_hpa_tolerance_ignores_small_changes() -> None:
    assert average_value_replicas(20, 21.0, 1.0, 0.1) == 20  # +1 above 10 replicas: ignored
    assert average_value_replicas(20, 21.0, 1.0, 0.0) == 21
    assert average_value_replicas(10, 12.0, 1.0, 0.1) == 12
    assert average_value_replicas(0, 3.0, 1.0, 0.1) == 3
    # Pods metric (GPU utilization, target 0.8)
    util = np.full(10, 0.84)
    assert pods_metric_replicas(10, util, 0, 0.8, 0.1) == 10
    assert pods_metric_replicas(10, np.full(10, 1.0), 0, 0.8, 0.1) == 13
    # unready pods count as 0 when scaling up
    assert pods_metric_replicas(11, np.full(10, 1.0), 1, 0.8, 0.1) == 13
    assert pods_metric_replicas(14, np.full(10, 1.0), 4, 0.8, 0.1) == 14


def test_hpa_scale_down_stabilization_holds_the_highest_recent_recommendation() -> None:
    hpa = Hpa(1, 100, HpaBehavior())
    assert hpa.normalize(0.0, 10, 10) == 10
    assert hpa.normalize(15.0, 10, 4) == 10  # held by the 300 s window
    assert hpa.normalize(200.0, 10, 4) == 10
    assert hpa.normalize(301.0, 10, 4) == 4  # the 10 at t=0 left the window
    # scale up is immediate, limited to max(100%, 4 pods) per 15 s
    hpa = Hpa(1, 100, HpaBehavior())
    assert hpa.normalize(0.0, 2, 50) == 6
    assert hpa.normalize(15.0, 6, 50) == 12
    # the scaler's behavior: no window, no tolerance
    hpa = Hpa(1, 100, SCALER_BEHAVIOR)
    assert hpa.normalize(0.0, 10, 10) == 10
    assert hpa.normalize(15.0, 10, 7) == 7


def test_hpa_syncs_every_15_seconds_and_keda_activates_and_cools_down() -> None:
    hpa = Hpa(1, 10)
    due = [t for t in range(0, 61) if hpa.due(float(t))]
    assert due == [0, 15, 30, 45, 60]
    keda = Keda(0, polling_s=30.0, cooldown_s=300.0)
    assert keda.poll(0.0, 0, True) == 1
    assert keda.poll(30.0, 5, False) == 5
    assert keda.poll(299.0, 5, False) == 5
    assert keda.poll(300.0, 5, False) == 0


def test_scale_superimposes_seeded_copies_and_is_deterministic() -> None:
    trace = Trace(
        name="t",
        kind="requests",
        arrivals_s=np.arange(0.0, 100.0, 0.5),
        input_tokens=np.full(200, 100, dtype=np.int64),
        output_tokens=np.full(200, 10, dtype=np.int64),
    )
    one = build_requests(trace, scale=1.0, seed=1)
    three = build_requests(trace, scale=3.0, seed=1)
    again = build_requests(trace, scale=3.0, seed=1)
    half = build_requests(trace, scale=2.5, seed=1)
    assert three.count == 3 * one.count
    assert np.array_equal(three.arrivals_s, again.arrivals_s)
    assert np.all(np.diff(three.arrivals_s) >= 0)
    assert three.arrivals_s.max() < three.duration_s
    assert 2.3 * one.count < half.count < 2.7 * one.count


def test_rate_traces_expand_with_gamma_interarrivals_of_their_cv() -> None:
    windows = 40
    trace = Trace(
        name="r",
        kind="rates",
        window_s=600.0,
        rates=np.array([10.0] * windows),
        cv=np.array([3.0] * windows),
    )
    requests = build_requests(trace, seed=3, compress=10.0)
    assert requests.duration_s == pytest.approx(windows * 60.0)
    assert requests.count == pytest.approx(10.0 * windows * 60.0, rel=0.15)
    gaps = np.diff(requests.arrivals_s)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(3.0, rel=0.25)
    assert requests.input_tokens.min() >= 1


def test_profiles_name_their_sources() -> None:
    for profile in PROFILES.values():
        assert profile.service.source and profile.node.source
        assert profile.node.gpus in (1, 8)  # a one-GPU shape for small fleets, 8 for large
        assert math.isfinite(profile.node.on_demand_usd_per_hour)
        assert 0 < profile.service.prefill_share(10) < 1


def _outgrow(preemption: bool) -> ServingFleet:
    """Four long prompts that fit one pod's KV cache on admission, then outgrow it decoding."""
    prompt = SVC.kv_capacity_tokens // 4 - 2000
    n, steps = 4, 900
    fleet = ServingFleet(
        _requests([0.0, 0.1, 0.2, 0.3], [prompt] * n, [6000] * n),
        SVC,
        1.0,
        steps,
        600.0,
        preemption=preemption,
    )
    for k in range(steps):
        fleet.step(float(k), np.zeros(1, dtype=np.int64))
    return fleet


def test_a_pod_that_outgrows_its_kv_cache_preempts_its_newest_request_and_recomputes_it() -> None:
    # vLLM (recompute mode): the most recently scheduled request gives its KV back, waits ahead
    # of new requests, prefills its prompt and what it had generated again, then finishes. Its
    # queue wait and first token were counted once; the prompt counter counts it once.
    free, preempting = _outgrow(False), _outgrow(True)
    assert free.preemptions == 0 and preempting.preemptions >= 1
    assert np.isfinite(preempting.finish_t).all() and not preempting.dropped.any()
    np.testing.assert_array_equal(preempting.first_token_t, free.first_token_t)
    np.testing.assert_array_equal(preempting.admit_t, free.admit_t)
    assert preempting.prompt_tokens == free.prompt_tokens == 4 * preempting.req.input_tokens[0]
    # The newest request pays for the recompute; the oldest never gives its place up.
    assert preempting.finish_t[3] > free.finish_t[3] + 1.0
    assert preempting.finish_t[0] <= free.finish_t[0] + 1e-9
    assert preempting.generated_tokens == pytest.approx(free.generated_tokens)
