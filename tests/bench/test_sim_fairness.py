"""The bench as a fair judge: an oracle that meets the SLO with nothing dropped on every shipped
trace, KEDA's in-flight scaler as KEDA and the HPA run it, Karpenter's repacking consolidation,
and a one-GPU node shape for small workloads."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpu_queue_scaler_bench.sim.cluster import (
    WHEN_EMPTY,
    WHEN_UNDERUTILIZED,
    Cluster,
    ClusterConfig,
    Phase,
)
from gpu_queue_scaler_bench.sim.command import first_windows
from gpu_queue_scaler_bench.sim.policies import (
    KEDA_INFLIGHT,
    KEDA_INFLIGHT_BEST,
    REACTIVE_BEST,
    REACTIVE_SWEEP,
    AlwaysOn,
    KedaInflight,
    Oracle,
    ReactiveBound,
    oracle_need,
    replica_slots,
)
from gpu_queue_scaler_bench.sim.profiles import G6_XLARGE, P4D_24XLARGE, get_profile
from gpu_queue_scaler_bench.sim.report import measure
from gpu_queue_scaler_bench.sim.run import SimConfig, SimulationError, run_bench, simulate
from gpu_queue_scaler_bench.sim.workload import Requests, build_requests
from gpu_queue_scaler_bench.traces import load_trace

ROOT = Path(__file__).resolve().parents[2] / "bench/traces"
A100 = get_profile("llama3-8b-a100")
# Every shipped trace, a few thousand requests of it: (file, scale, compress, seconds).
SLICES = [
    ("azure-llm-2023/AzureLLMInferenceTrace_code.csv", 4.0, 1.0, 600.0),
    ("azure-llm-2023/AzureLLMInferenceTrace_conv.csv", 2.0, 1.0, 600.0),
    ("mooncake/conversation_trace.jsonl", 3.0, 1.0, 600.0),
    ("servegen/aggregate_rate_language_m-large.csv", 0.05, 24.0, 600.0),
    ("servegen/aggregate_rate_language_m-small.csv", 0.02, 24.0, 600.0),
    ("servegen/aggregate_rate_multimodal_mm-image.csv", 1.0, 24.0, 600.0),
    ("servegen/aggregate_rate_reason_deepseek-r1.csv", 0.4, 24.0, 600.0),
]


def _slice(name: str, scale: float, compress: float, seconds: float) -> Requests:
    trace = first_windows(load_trace(ROOT / name), seconds, compress)
    return build_requests(trace, scale=scale, seed=0, duration_s=seconds, compress=compress)


@pytest.mark.parametrize("cold_start", [60.0, 180.0])
@pytest.mark.parametrize(("name", "scale", "compress", "seconds"), SLICES)
def test_the_oracle_meets_the_slo_with_nothing_dropped_on_every_shipped_trace(
    name: str, scale: float, compress: float, seconds: float, cold_start: float
) -> None:
    requests = _slice(name, scale, compress, seconds)
    assert 500 <= requests.count <= 8000  # a short slice, yet real load
    cfg = SimConfig(A100, cold_start_s=cold_start, policies=("always-on", "oracle"))
    result = run_bench(requests, cfg, scale)
    found = {run.name: measure(run, cfg.slo_s) for run in result.runs}
    oracle, always_on = found["oracle"], found["always-on"]
    assert oracle.slo_attainment >= 0.999
    assert oracle.dropped == 0
    # a lower bound: no more than the fixed fleet sized for its peak, no less than the work
    assert oracle.gpu_hours <= always_on.gpu_hours + 1e-9
    svc = A100.service
    slots = replica_slots(requests, svc)
    work = (
        requests.input_tokens / svc.prefill_tokens_per_s
        + np.maximum(requests.output_tokens - 1, 0) * svc.decode_step_s(slots) / slots
    )
    assert oracle.gpu_hours * 3600.0 >= float(work.sum())


def test_the_always_on_row_is_the_fewest_whole_nodes_that_meet_the_goal() -> None:
    """A fixed fleet as a user sizes it from a load test: the oracle's refined peak can be a node
    above what a fixed fleet needs (its refinement adds 10% near late requests and never takes
    it back), and a baseline a node too large flatters every policy compared with it. The row
    meets the goal; a fleet one node smaller does not; and the oracle, which could hold that
    fleet with foresight, costs no more than it."""
    requests = _slice(*SLICES[2])  # Mooncake x3: the refined peak is above four nodes' 32
    cfg = SimConfig(A100, cold_start_s=180.0, policies=("always-on", "oracle"))
    result = run_bench(requests, cfg, 3.0)
    found = {run.name: measure(run, cfg.slo_s) for run in result.runs}
    fixed, per_node = result.always_on_replicas, A100.node.gpus
    peak = int(result.oracle_need.max())
    assert fixed < peak and fixed % per_node == 0  # a whole node under the oracle's peak
    assert found["always-on"].slo_attainment >= 0.99
    smaller = simulate(AlwaysOn(fixed - per_node), requests, cfg, fixed - per_node)
    assert measure(smaller, cfg.slo_s).slo_attainment < 0.99
    assert found["oracle"].gpu_hours <= found["always-on"].gpu_hours + 1e-9
    assert any(
        note.startswith(f"always-on: {fixed} replicas, chosen after") for note in result.notes
    )


def test_a_run_whose_oracle_misses_fails_its_sanity_check() -> None:
    requests = _slice(*SLICES[0])
    cfg = SimConfig(A100, cold_start_s=60.0, policies=("oracle",))
    run_bench(requests, cfg, 4.0)  # its refinements bring it to 0.999
    unrefined = SimConfig(A100, cold_start_s=60.0, policies=("oracle",), oracle_iterations=0)
    with pytest.raises(SimulationError, match=r"the oracle reached 0\.9"):
        run_bench(requests, unrefined, 4.0)


def _long_requests(n: int, output_tokens: int, at: float = 0.5, span: float = 60.0) -> Requests:
    return Requests(
        arrivals_s=np.full(n, at),
        input_tokens=np.full(n, 100, dtype=np.int64),
        output_tokens=np.full(n, output_tokens, dtype=np.int64),
        duration_s=at + span,
        name="long",
    )


class _ScaleTo:
    """Asks for `replicas` from `at` on (a plain controller: no foresight)."""

    name = "scale-to"

    def __init__(self, at: float, replicas: int) -> None:
        self.at, self.replicas = at, replicas

    def act(self, at: float, *_: object) -> int | None:
        return self.replicas if at >= self.at else None


def test_the_oracle_never_deletes_a_pod_that_would_not_drain_in_its_grace_period() -> None:
    # Two requests of ~270 s each (20,000 tokens at ~13.3 ms) on two pods, grace 180 s.
    requests = _long_requests(2, 20_000)
    cfg = SimConfig(A100, cold_start_s=60.0, warm_window_s=0.0, drain_s=600.0)
    schedule = np.zeros(1000, dtype=np.int64)  # the schedule says: nothing needed
    oracle = simulate(Oracle(schedule, 1.0, grace_s=cfg.termination_grace_s), requests, cfg, 2)
    assert not oracle.dropped.any() and np.isfinite(oracle.finish_t).all()
    # kept while a drain would outlast the grace (266 s left at first), deleted once it fits
    assert oracle.replicas[50] == 2 and oracle.replicas[-1] == 0
    # What Kubernetes does to a controller that deletes them: SIGKILL after the grace period.
    plain = simulate(_ScaleTo(10.0, 0), requests, cfg, 2)  # type: ignore[arg-type]
    assert plain.dropped.all()


def test_keda_inflight_raises_replicas_to_inflight_over_threshold_within_a_polling_interval() -> (
    None
):
    requests = _long_requests(
        60, 3000, at=100.5, span=900.0
    )  # a step: 60 in flight from t = 100.5 s
    cfg = SimConfig(A100, cold_start_s=60.0, warm_window_s=0.0, drain_s=900.0)
    run = simulate(KedaInflight(50, 10.0), requests, cfg, 1)
    wanted = math.ceil(60 / 10.0)  # 6: two HPA syncs from 1 (max(100%, 4 pods) per 15 s)
    assert run.replicas[:100].max() == 1  # nothing in flight yet: min 1, never zero
    assert run.replicas[100 + 30] == wanted  # one polling interval later
    # min 1, and the HPA's 300 s scale-down window: held, then down to 1, never to zero
    done = int(np.nanmax(run.finish_t))
    assert run.replicas[done + 200] == wanted
    assert run.replicas[done + 340 :].min() == 1


def test_the_keda_inflight_rows_exist_and_the_hindsight_row_is_the_best_of_its_sweep() -> None:
    requests = _slice(*SLICES[1])
    cfg = SimConfig(A100, policies=("keda-prometheus", KEDA_INFLIGHT, KEDA_INFLIGHT_BEST, "oracle"))
    result = run_bench(requests, cfg, 2.0)
    names = [run.name for run in result.runs]
    assert names == ["keda-prometheus", KEDA_INFLIGHT, KEDA_INFLIGHT_BEST, "oracle"]
    note = next(n for n in result.notes if n.startswith(KEDA_INFLIGHT_BEST))
    assert "chosen after the runs" in note
    # the sweep is 50-100% of the slots: the 70% row is one of its runs
    assert all(f"{share}%" in note for share in (50, 60, 70, 80, 90, 100))
    fixed, best = (measure(r, 2.0) for r in result.runs[1:3])
    if fixed.slo_attainment >= 0.99:
        assert best.slo_attainment >= 0.99 and best.gpu_hours <= fixed.gpu_hours
    else:
        assert best.slo_attainment >= fixed.slo_attainment


def test_the_reactive_bound_row_reads_the_oracles_refined_need_and_is_the_best_of_its_sweep():
    """The bound's row is a hindsight pick of x1.0-x1.5 over the need the oracle ran on (its
    refined need, never below the first one), and no headroom of the sweep that meets 0.99
    does so for fewer GPU-hours."""
    requests = _slice(*SLICES[1])
    cfg = SimConfig(A100, policies=("scaler", REACTIVE_BEST, "oracle"))
    result = run_bench(requests, cfg, 2.0)
    assert [run.name for run in result.runs] == ["scaler", REACTIVE_BEST, "oracle"]
    note = next(n for n in result.notes if n.startswith(REACTIVE_BEST))
    assert "chosen after the runs" in note and all(f"x{h:g} " in note for h in REACTIVE_SWEEP)
    assert result.oracle_need is not None
    steps = round(requests.duration_s / cfg.dt)
    slots = replica_slots(requests, A100.service)
    first = oracle_need(requests, A100.service, cfg.dt, steps, slots, slo_s=cfg.slo_s)
    assert np.all(result.oracle_need[:steps] >= first)  # the refinement only adds
    best = measure(result.runs[1], cfg.slo_s)
    window = 300.0  # the scaler's default scale-down window, which the bound holds for
    for headroom in REACTIVE_SWEEP:
        bound = ReactiveBound(result.oracle_need, cfg.dt, result.preroll_s, headroom, window)
        run = measure(simulate(bound, requests, cfg, result.initial_replicas), cfg.slo_s)
        if run.slo_attainment >= 0.99:
            assert best.slo_attainment >= 0.99 and best.gpu_hours <= run.gpu_hours
        else:
            assert best.slo_attainment >= 0.99 or best.slo_attainment >= run.slo_attainment


def _fragmented(policy: str) -> Cluster:
    """Three 8-GPU nodes, then a spread scale-down (the ReplicaSet's order) to 14: 5, 5, 4."""
    cluster = Cluster(
        ClusterConfig(P4D_24XLARGE, 120.0, 60.0, consolidate_after_s=60.0, consolidation=policy)
    )
    cluster.warm(24, 0.0)
    for node, n in zip(sorted(cluster.nodes), (3, 3, 4), strict=True):
        for pid in sorted(cluster.nodes[node].pods)[:n]:
            cluster.pods[pid].deletion_cost = -1  # these go first
    cluster.scale_to(1.0, 14)
    for t in range(1, 5):
        cluster.tick(float(t), 1.0, {})  # the deleted pods had nothing running: gone
    per_node = sorted(len(n.pods) for n in cluster.nodes.values())
    assert per_node == [4, 5, 5] and cluster.live_nodes == 3
    return cluster


def test_when_empty_or_underutilized_repacks_a_fragmented_fleet_by_eviction() -> None:
    cluster = _fragmented(WHEN_UNDERUTILIZED)
    for t in range(5, 62):
        cluster.tick(float(t), 1.0, {})
    assert cluster.live_nodes == 3  # not before consolidateAfter since the last pod change
    cluster.tick(62.0, 1.0, {})
    # the 4-pod node is disrupted: its pods evicted, replaced at once on the others' free GPUs
    assert cluster.evictions == 4
    assert cluster.replicas == 14
    for t in range(63, 66):
        cluster.tick(float(t), 1.0, {})
    assert cluster.live_nodes == 2
    live = [n for n in cluster.nodes.values() if n.terminated_at is None]
    assert sorted(len(n.pods) for n in live) == [6, 8]
    assert cluster.ready == 10  # the four replacements restart: model load
    loading = [p for p in cluster.pods.values() if p.phase is Phase.LOADING]
    assert len(loading) == 4
    for t in range(66, 130):
        cluster.tick(float(t), 1.0, {})
    assert cluster.ready == 14 and cluster.live_nodes == 2


def test_when_empty_leaves_a_fragmented_fleet_alone() -> None:
    cluster = _fragmented(WHEN_EMPTY)
    for t in range(5, 200):
        cluster.tick(float(t), 1.0, {})
    assert cluster.live_nodes == 3 and cluster.evictions == 0 and cluster.ready == 14


def test_do_not_disrupt_pods_are_not_repacked() -> None:
    cluster = _fragmented(WHEN_UNDERUTILIZED)
    cluster.do_not_disrupt = True
    for t in range(5, 200):
        cluster.tick(float(t), 1.0, {})
    assert cluster.live_nodes == 3 and cluster.evictions == 0


def test_the_replay_takes_a_consolidation_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_queue_scaler import cli

    argv = ["bench", "replay", "--trace", str(ROOT / SLICES[1][0]), "--duration", "60"]
    assert cli.main([*argv, "--consolidation", "WhenEmpty", "--no-progress"]) == 0
    assert "consolidation WhenEmpty," in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main([*argv, "--consolidation", "Sometimes"])


def test_a_one_gpu_node_profile_for_small_workloads() -> None:
    profile = get_profile("llama3-8b-l4")
    assert profile.node.gpus == 1 and profile.node.name == "g6.xlarge"
    assert profile.node.on_demand_usd_per_hour > 0 and "aws.amazon.com" in profile.node.source
    requests = _slice("azure-llm-2023/AzureLLMInferenceTrace_conv.csv", 0.05, 1.0, 600.0)
    cfg = SimConfig(profile, cold_start_s=60.0, policies=("always-on", "oracle"))
    result = run_bench(requests, cfg, 0.05)
    assert result.always_on_replicas <= 2
    oracle = measure(result.runs[-1], cfg.slo_s)
    assert oracle.slo_attainment >= 0.999
    # one or two GPUs billed, not a p4d's eight
    assert oracle.gpu_hours <= 2 * requests.duration_s / 3600 + 1e-9


def test_one_gpu_nodes_are_not_repacked_onto_empty_nodes() -> None:
    # Four one-GPU nodes, two pods deleted: their nodes empty and go; the pods left stay put
    # (moving one onto an empty node would only swap which node is removed).
    cluster = Cluster(ClusterConfig(G6_XLARGE, 120.0, 60.0, consolidation=WHEN_UNDERUTILIZED))
    cluster.warm(4, 0.0)
    cluster.scale_to(100.0, 2)
    for t in range(100, 300):
        cluster.tick(float(t), 1.0, {})
    assert cluster.evictions == 0 and cluster.live_nodes == 2 and cluster.ready == 2


def test_a_warm_hpa_holds_its_replicas_for_the_scale_down_window() -> None:
    # A warm start means the HPA has been running at the starting count: with nothing in flight
    # it keeps 3 for the 300 s window, then drops to KEDA's minReplicaCount 1 (not at once).
    requests = _long_requests(1, 10, at=700.0, span=100.0)
    cfg = SimConfig(A100, cold_start_s=60.0, warm_window_s=0.0, drain_s=60.0)
    run = simulate(KedaInflight(50, 10.0), requests, cfg, 3)
    assert run.replicas[:290].min() == 3
    assert run.replicas[320:690].max() == 1


def test_the_replay_exits_1_when_the_oracle_cannot_meet_the_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # One request generating 100,000 tokens (~22 min alone) cannot finish within the drain:
    # even the oracle drops it, so the run reports a failed sanity check, not figures.
    trace = tmp_path / "unservable.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n0.5,100,10\n30.0,100,100000\n")
    from gpu_queue_scaler import cli

    code = cli.main(["bench", "replay", "--trace", str(trace), "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert "sanity check failed" in err and "1 dropped" in err
