"""The companion in the simulator: placeholder pods in the cluster, the companion mode's rows,
the cold-start measures (node-hours, replica start, scale from zero)."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from gpu_queue_scaler import cli
from gpu_queue_scaler.companion.model import CompanionConfig
from gpu_queue_scaler.decision.outlook import Outlook
from gpu_queue_scaler.decision.policy import Decision, Reason
from gpu_queue_scaler_bench.sim.cluster import (
    WHEN_EMPTY,
    WHEN_UNDERUTILIZED,
    Cluster,
    ClusterConfig,
)
from gpu_queue_scaler_bench.sim.fleet import ServingFleet, StepStats
from gpu_queue_scaler_bench.sim.policies import ScalerPolicy, scaler_metadata
from gpu_queue_scaler_bench.sim.prewarm import COMPANION, FORECAST, PREWARM, Prewarm, with_forecast
from gpu_queue_scaler_bench.sim.profiles import P4D_24XLARGE, get_profile
from gpu_queue_scaler_bench.sim.report import measure, table, to_json
from gpu_queue_scaler_bench.sim.run import (
    BenchResult,
    PolicyRun,
    SimConfig,
    Simulation,
    companion_rows,
    run_bench,
    simulate,
)
from gpu_queue_scaler_bench.sim.workload import Requests, build_requests
from gpu_queue_scaler_bench.traces import load_trace

TRACE = (
    Path(__file__).resolve().parents[2]
    / "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
)
LAUNCH, LOAD = 120.0, 60.0


def _cluster() -> Cluster:
    return Cluster(ClusterConfig(P4D_24XLARGE, LAUNCH, LOAD, consolidate_after_s=60.0))


def _run(cluster: Cluster, start: float, end: float) -> None:
    t = start
    while t < end:
        cluster.tick(t, 1.0, {})
        t += 1.0


def _bound(cluster: Cluster) -> int:
    return sum(1 for h in cluster.placeholders.values() if h.node is not None)


def _target(replicas: int, at: float = 0.0, outlook: Outlook | None = None) -> Decision:
    """The bench scaler's decision of `replicas` at `at`, as the companion's pass reads it."""
    return Decision(
        workload="bench/llama-3-8b",
        metric_name="queue",
        at=at,
        replicas=replicas,
        active=True,
        reason=Reason.CURRENT_NEED,
        need=float(replicas),
        in_flight=None,
        arrival_rate=None,
        detail="",
        outlook=outlook,
    )


def test_placeholders_launch_a_node_ahead_so_a_replica_waits_only_for_its_model() -> None:
    cold, warm = _cluster(), _cluster()
    warm.set_placeholders(0.0, 1)
    _run(warm, 0.0, 200.0)
    assert warm.live_nodes == 1 and _bound(warm) == 1  # held: not consolidated while empty
    for cluster in (cold, warm):
        cluster.scale_to(200.0, 1)
        _run(cluster, 200.0, 400.0)
    assert cold.starts == [(200.0, 200.0 + LAUNCH + LOAD)]
    assert warm.starts == [(200.0, 200.0 + LOAD)]


def test_a_real_pod_preempts_a_placeholder_which_pends_and_gets_a_node() -> None:
    cluster = _cluster()
    gpus = P4D_24XLARGE.gpus
    cluster.scale_to(0.0, gpus - 1)
    cluster.set_placeholders(0.0, 1)
    _run(cluster, 0.0, 200.0)
    assert cluster.live_nodes == 1 and cluster.ready == gpus - 1 and _bound(cluster) == 1
    first = next(iter(cluster.nodes.values()))
    cluster.scale_to(200.0, gpus)  # the node is full: the new pod takes the placeholder's GPU
    cluster.tick(200.0, 1.0, {})
    newest = max(cluster.pods.values(), key=lambda p: p.id)
    assert newest.node == first.id and newest.ready_at == 200.0 + LOAD
    (holder,) = cluster.placeholders.values()
    assert holder.node is not None and holder.node != first.id  # re-pended, Karpenter launched
    assert cluster.live_nodes == 2 and cluster.nodes[holder.node].ready_at == 200.0 + LAUNCH


def test_fewer_placeholders_free_pending_ones_then_the_least_used_node() -> None:
    cluster = _cluster()
    gpus = P4D_24XLARGE.gpus
    cluster.scale_to(0.0, 2)
    cluster.set_placeholders(0.0, gpus)  # 6 beside the pods, 2 on a second node
    _run(cluster, 0.0, 10.0)
    assert cluster.live_nodes == 2 and _bound(cluster) == gpus
    cluster.set_placeholders(10.0, gpus + 3)  # 3 pending for a moment...
    cluster.set_placeholders(10.0, gpus - 2)  # ...go first, then the node with no real pod
    assert _bound(cluster) == gpus - 2 and len(cluster.placeholders) == gpus - 2
    empty = [n for n in cluster.nodes.values() if not n.pods and not n.holders]
    assert len(empty) == 1
    _run(cluster, 10.0, 10.0 + LAUNCH + 61.0)
    assert cluster.live_nodes == 1  # consolidated once ready and empty for consolidateAfter
    cluster.set_placeholders(200.0, 0)
    assert not cluster.placeholders and all(not n.holders for n in cluster.nodes.values())


def _same(a: PolicyRun, b: PolicyRun) -> None:
    for field in ("admit_t", "first_token_t", "finish_t", "replicas", "ready", "nodes"):
        assert np.array_equal(getattr(a, field), getattr(b, field), equal_nan=True), field
    assert a.gpu_seconds == b.gpu_seconds
    assert np.array_equal(a.replica_starts_s, b.replica_starts_s)


def test_a_companion_that_wants_no_placeholder_changes_nothing() -> None:
    requests = build_requests(load_trace(TRACE), scale=2.0, duration_s=300.0)
    cfg = SimConfig(get_profile("llama3-8b-a100"), warm_window_s=120.0, drain_s=300.0)
    result = run_bench(requests, cfg, 2.0)
    metadata = {**result.scaler_metadata, "forecast": "on"}
    alone = simulate(with_forecast(ScalerPolicy(metadata)), requests, cfg, result.initial_replicas)
    idle = Prewarm(ScalerPolicy(metadata), CompanionConfig(max_placeholders=0, pack=False))
    paired = simulate(idle, requests, cfg, result.initial_replicas)
    assert len(idle.plans) >= (120 + 300) // 15  # the companion did run, every 15 s
    _same(alone, paired)


def _ramp(duration_s: float, start: float, end: float, seed: int = 0) -> Requests:
    """A Poisson ramp from `start` to `end` req/s (thinning), long decodes."""
    rng = np.random.default_rng(seed)
    peak = max(start, end)
    t = np.cumsum(rng.exponential(1.0 / peak, int(peak * duration_s * 1.2)))
    t = t[t < duration_s]
    t = t[rng.random(t.size) < (start + (end - start) * t / duration_s) / peak]
    n = t.size
    return Requests(
        arrivals_s=t,
        input_tokens=np.full(n, 200, dtype=np.int64),
        output_tokens=np.full(n, 1000, dtype=np.int64),
        duration_s=duration_s,
        name="ramp",
    )


def test_on_a_ramp_the_forecast_leaves_nothing_to_prewarm_and_packing_replaces_repacking() -> None:
    """2 -> 40 req/s. With forecast=on the scaler's target already covers its q90 forecast
    (policy rule 2), so the companion finds no capacity nobody asked for: every placeholder it
    buys is for a target the HPA lagged a whole pass. What it changes is the packing: under
    WhenEmpty (no repack by Karpenter) the packed scale-downs of the ramp's dips empty nodes the
    spread fleet keeps, so it pays fewer GPU-hours; under WhenEmptyOrUnderutilized Karpenter's
    repack consolidates the spread fleet itself, by evicting serving replicas (each a restart),
    where the packed fleet leaves it none to evict. With targets in whole nodes
    (`replicasPerNode`) there is no part-filled node to pack or repack, so the scaler here runs
    as on a NodePool it shares (replicasPerNode 1)."""
    ramp = _ramp(900.0, 2.0, 40.0)
    runs: dict[str, dict[str, PolicyRun]] = {}
    for policy in (WHEN_EMPTY, WHEN_UNDERUTILIZED):
        cfg = SimConfig(
            get_profile("llama3-8b-a100"),
            drain_s=300.0,
            policies=("scaler",),
            companion=True,
            consolidation=policy,
            scaler_metadata={"replicasPerNode": "1"},
        )
        result = run_bench(ramp, cfg)
        assert [r.name for r in result.runs] == ["scaler", COMPANION, FORECAST, PREWARM]
        assert "forecast=on" in table(result)
        runs[policy] = {r.name: r for r in result.runs}
        m = {r.name: measure(r, cfg.slo_s) for r in result.runs}
        assert m[PREWARM].slo_attainment == m[FORECAST].slo_attainment == 1.0
        assert m[PREWARM].node_hours == pytest.approx(m[PREWARM].gpu_hours / P4D_24XLARGE.gpus)
        assert m[PREWARM].evictions == 0  # packed: nothing left for a repack to evict
    empty = {name: measure(run, 2.0) for name, run in runs[WHEN_EMPTY].items()}
    assert empty[PREWARM].gpu_hours < empty[FORECAST].gpu_hours
    default = {name: measure(run, 2.0) for name, run in runs[WHEN_UNDERUTILIZED].items()}
    assert default[FORECAST].evictions > 0  # Karpenter's own repack of the spread fleet
    assert default[FORECAST].gpu_hours < empty[FORECAST].gpu_hours  # ...which is what pays there


def test_a_target_the_hpa_applies_at_once_buys_no_placeholder_one_it_lags_does() -> None:
    """The HPA syncs in the very step of the companion's pass (both every 15 s): a scale-up
    from 14 to 24 replicas is being created, so the pass buys no placeholder for it (they would
    be preempted by the new pods, pend again and make Karpenter launch a second node for the
    same GPUs). If the pods are still missing at the next pass, the gap is pre-warmed."""
    scaler = ScalerPolicy(scaler_metadata(8.0, 2.0, 180.0, 40))
    scaler.decision = _target(24, 0.0)
    prewarm = Prewarm(scaler, CompanionConfig(max_placeholders=100))
    cluster = _cluster()
    cluster.warm(14)
    first = prewarm.companion_pass(0.0, cluster)
    assert first.placeholders == 0, first.reasons
    scaler.decision = _target(24, 15.0)
    lagging = prewarm.companion_pass(15.0, cluster)  # the HPA created none of the 10 pods
    assert lagging.placeholders == 10, lagging.reasons
    cluster.scale_to(15.0, 24)
    assert prewarm.companion_pass(30.0, cluster).placeholders == 0  # all 10 live: none needed


@dataclass
class _OffThenOn:
    """Scales to zero at once, back to one replica when a request waits."""

    name: str = "off-then-on"

    def act(self, at: float, fleet: ServingFleet, cluster: Cluster, stats: StepStats) -> int | None:
        return 1 if stats.waiting else 0


def test_scale_from_zero_is_first_arrival_at_zero_to_a_replica_serving() -> None:
    requests = Requests(
        arrivals_s=np.asarray([400.0, 401.0]),
        input_tokens=np.asarray([100, 100], dtype=np.int64),
        output_tokens=np.asarray([10, 10], dtype=np.int64),
        duration_s=600.0,
        name="one-burst",
    )
    cfg = SimConfig(get_profile("llama3-8b-a100"), warm_window_s=60.0, drain_s=300.0)
    run = simulate(_OffThenOn(), requests, cfg, 1)
    m = measure(run, cfg.slo_s)
    cold = cfg.node_launch_s + cfg.model_load_s  # the warm node was consolidated long before
    assert m.scale_from_zero_episodes == 1
    assert m.scale_from_zero_s == pytest.approx(cold + 1.0, abs=2.0)  # + the policy's one step
    assert run.replica_starts_s.tolist() == [cold]
    assert m.replica_start_p99_s == cold
    found = to_json(_single(run, requests, cfg))
    (row,) = found["policies"]
    assert row["scale_from_zero_episodes"] == 1 and row["replica_start_p50_s"] == cold


def _single(run: PolicyRun, requests: Requests, cfg: SimConfig) -> BenchResult:
    return BenchResult(requests.name, 1.0, cfg, requests, [run], 1, 1.0, 1, 1, cfg.dt)


def test_no_episode_means_nan_in_the_table_and_null_in_json() -> None:
    requests = build_requests(load_trace(TRACE), scale=1.0, duration_s=60.0)
    cfg = SimConfig(get_profile("llama3-8b-a100"), warm_window_s=30.0, drain_s=60.0)
    sim = Simulation(requests, cfg, 2)
    for _ in range(sim.max_steps):
        at, stats = sim.advance()
        sim.apply(at, None, stats)
        if sim.done:
            break
    run = sim.result("fixed")
    row = to_json(_single(run, requests, cfg))["policies"][0]
    assert row["scale_from_zero_s"] is None and row["scale_from_zero_episodes"] == 0
    assert row["replica_start_p50_s"] is None and row["node_hours"] > 0


def test_cli_companion_adds_the_rows_and_keys(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        [
            "bench", "replay", "--trace", str(TRACE), "--duration", "120", "--scale", "1",
            "--companion", "--json", "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    found = json.loads(capsys.readouterr().out)
    names = [p["name"] for p in found["policies"]]
    at = names.index("scaler")
    assert names[at : at + 4] == ["scaler", COMPANION, FORECAST, PREWARM]
    assert {"node_hours", "replica_start_p99_s", "scale_from_zero_s"} <= set(found["policies"][0])
    args = ["bench", "replay", "--trace", str(TRACE), "--companion", "--full-stack"]
    assert cli.main(args) == 2


def test_the_simulated_companion_counts_pending_replicas_and_caps_at_max_replicas() -> None:
    """3 replicas just created (Pending: the cluster is already launching nodes for them), the q90
    forecast says 12 but maxReplicas is 8: placeholders for 8 - 3 = 5 GPUs, not 12 or 8."""
    scaler = ScalerPolicy(scaler_metadata(8.0, 2.0, 180.0, 8, {"forecast": "on"}))
    assert scaler.spec.max_replicas == 8
    outlook = Outlook(point_max=10.0, upper_max=12.0, model="test", horizon_s=300.0, made_at=0.0)
    scaler.decision = _target(3, outlook=outlook)
    prewarm = Prewarm(scaler, CompanionConfig(max_placeholders=100))
    cluster = _cluster()
    cluster.scale_to(0.0, 3)
    assert cluster.live_nodes == 0  # the pods are Pending: no node is ready yet
    got = prewarm.companion_pass(0.0, cluster)
    assert got.forecast_gpus == 8.0
    assert got.placeholders == 5, got.reasons


# --- packing: pod-deletion-cost ---------------------------------------------------------------


def test_the_companion_packs_only_when_packing_is_on() -> None:
    for on in (True, False):
        prewarm = Prewarm(
            ScalerPolicy(scaler_metadata(8.0, 2.0, 180.0, 64)), CompanionConfig(pack=on)
        )
        prewarm.scaler.act = lambda *_: None  # type: ignore[method-assign]
        cluster = _cluster()
        cluster.warm(10)  # 8 pods on one node, 2 on another
        prewarm.act(0.0, None, cluster, None)  # type: ignore[arg-type]
        costs = sorted(p.deletion_cost for p in cluster.pods.values())
        assert costs == ([2, 2] + [8] * 8 if on else [0] * 10)


def test_scaler_with_the_companion_pays_less_on_a_ramp_down_at_the_same_slo() -> None:
    """40 -> 2 req/s over 15 min, under WhenEmpty consolidation: the default scaler alone
    deletes doubled-up pods first and ends on part-full nodes; with the companion (forecast
    off: no capacity to pre-warm beyond the target, and packing) the emptiest nodes' pods go
    first, their nodes are consolidated, and it ends on the fewest nodes its replicas fill, at
    the same SLO attainment. Under WhenEmptyOrUnderutilized Karpenter repacks the spread fleet
    itself, by evicting serving replicas, which the packed fleet never needs. The scaler runs
    as on a NodePool it shares (replicasPerNode 1): with targets in whole nodes no node is left
    part-filled for the packing to empty."""
    requests = _ramp(900.0, 40.0, 2.0)
    cfg = SimConfig(
        get_profile("llama3-8b-a100"),
        drain_s=300.0,
        policies=("scaler",),
        consolidation=WHEN_EMPTY,  # packing is what makes WhenEmpty consolidation pay
        scaler_metadata={"replicasPerNode": "1"},
    )
    result = run_bench(requests, cfg)
    (alone,) = result.runs
    assert result.scaler_metadata.get("forecast") is None  # the scaler's default: forecast off
    with_companion = SimConfig(cfg.profile, drain_s=300.0, policies=("scaler",), companion=True)
    make = companion_rows(with_companion, result.scaler_metadata)[COMPANION]
    paired = simulate(make(), requests, cfg, result.initial_replicas)
    a, p = measure(alone, cfg.slo_s), measure(paired, cfg.slo_s)
    assert p.slo_attainment == a.slo_attainment == 1.0 and p.dropped == a.dropped == 0
    assert p.gpu_hours < a.gpu_hours
    gpus = P4D_24XLARGE.gpus
    assert int(alone.nodes[-1]) > math.ceil(int(alone.replicas[-1]) / gpus)  # spread
    assert int(paired.nodes[-1]) < int(alone.nodes[-1])

    def spare_node_steps(run: PolicyRun) -> float:
        # Node-steps beyond the fewest nodes the replicas fill. Not the last step alone: while
        # the target still falls, a node emptied by packing waits consolidateAfter to go.
        return float(np.sum(run.nodes - np.ceil(run.replicas / gpus)))

    assert spare_node_steps(paired) < spare_node_steps(alone) / 3  # packed
    repacking = dataclasses.replace(cfg, consolidation=WHEN_UNDERUTILIZED)
    alone_repacked = simulate(
        ScalerPolicy(result.scaler_metadata), requests, repacking, result.initial_replicas
    )
    paired_repacked = simulate(make(), requests, repacking, result.initial_replicas)
    assert alone_repacked.evictions > 0 == paired_repacked.evictions
    assert alone_repacked.gpu_seconds < alone.gpu_seconds  # Karpenter's repack pays there
