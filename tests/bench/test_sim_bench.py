"""The bench end to end on a short slice of the Azure conversation trace: deterministic,
conserving, the policies behave as their kind, the scaler goes through
gpu_queue_scaler.decision.policy.decide."""

from __future__ import annotations

import io
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_queue_scaler import cli
from gpu_queue_scaler.decision import decider as decider_module
from gpu_queue_scaler_bench.sim import policies
from gpu_queue_scaler_bench.sim import run as sim_run
from gpu_queue_scaler_bench.sim.policies import NAMES
from gpu_queue_scaler_bench.sim.profiles import get_profile
from gpu_queue_scaler_bench.sim.report import checks, measure, table, to_json
from gpu_queue_scaler_bench.sim.run import BenchResult, SimConfig, run_bench, simulate
from gpu_queue_scaler_bench.sim.workload import Requests, build_requests
from gpu_queue_scaler_bench.traces import load_trace

TRACE = (
    Path(__file__).resolve().parents[2]
    / "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
)
CONFIG = SimConfig(get_profile("llama3-8b-a100"), warm_window_s=120.0, drain_s=300.0)


def _bench(seed: int = 0) -> BenchResult:
    requests = build_requests(load_trace(TRACE), scale=2.0, seed=seed, duration_s=300.0)
    return run_bench(requests, CONFIG, 2.0)


@pytest.fixture(scope="module")
def bench() -> BenchResult:
    return _bench()


def test_same_seed_same_result(bench: BenchResult) -> None:
    assert to_json(_bench()) == to_json(bench)


def test_every_request_completes_or_is_dropped(bench: BenchResult) -> None:
    assert [run.name for run in bench.runs] == list(NAMES)
    for run in bench.runs:
        m = measure(run, CONFIG.slo_s)
        assert m.requests == bench.requests.count
        assert m.completed + m.dropped == m.requests
        done = np.isfinite(run.finish_t)
        assert not np.any(done & run.dropped)
        assert np.all(run.finish_t[done] >= run.first_token_t[done])
        assert np.all(run.first_token_t[done] >= run.admit_t[done])
        assert np.all(run.admit_t[done] >= run.arrivals_s[done] - 1e-9)


def test_always_on_never_scales(bench: BenchResult) -> None:
    run = next(r for r in bench.runs if r.name == "always-on")
    assert run.scale_events == 0
    assert set(run.replicas.tolist()) == {bench.always_on_replicas}


def test_no_policy_beats_the_oracle(bench: BenchResult) -> None:
    measures = [measure(run, CONFIG.slo_s) for run in bench.runs]
    oracle = next(m for m in measures if m.name == "oracle")
    assert oracle.slo_attainment >= 0.99
    for m in measures:
        if m.slo_attainment >= oracle.slo_attainment:
            assert m.gpu_hours >= oracle.gpu_hours - 1e-9, m.name
    assert not [c for c in checks(measures) if "not minimal" in c]


def test_the_starting_fleet_covers_the_oracles_refined_need() -> None:
    """Every policy starts on the fleet the oracle's (refined) need asks for over the pre-roll:
    a start sized before refinement is short wherever refinement raised the need, and a scaler
    would learn headroom from lateness its own sizing never caused."""
    requests = build_requests(load_trace(TRACE), scale=5.0, seed=0, duration_s=120.0)
    cfg = replace(CONFIG, policies=("oracle", "always-on"), warm_window_s=60.0)
    plan = sim_run.oracle_plan(requests, cfg)
    unrefined = sim_run.starting_fleet(plan.need, plan.lead, plan.pre_steps)
    _, refined = sim_run.oracle_run(requests, cfg, plan, unrefined, None)
    start = sim_run.starting_fleet(refined, plan.lead, plan.pre_steps)
    assert start > unrefined  # on this slice refinement raises the pre-roll's need
    assert run_bench(requests, cfg).initial_replicas == start


def test_the_scaler_policy_calls_the_real_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    real = decider_module.decide

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[3])
        return real(*args, **kwargs)

    monkeypatch.setattr(decider_module, "decide", spy)
    requests = build_requests(load_trace(TRACE), scale=1.0, duration_s=60.0)
    config = SimConfig(
        get_profile("llama3-8b-a100"), warm_window_s=30.0, drain_s=60.0, policies=("scaler",)
    )
    result = run_bench(requests, config)
    assert [r.name for r in result.runs] == ["scaler"]
    assert len(calls) >= 15  # every evaluationIntervalSeconds (5 s) over pre-roll and trace
    assert calls == sorted(calls)


def test_the_scaler_spec_comes_from_trigger_metadata() -> None:
    metadata = policies.scaler_metadata(40, 2.0, 180.0, 30, {"forecast": "on"})
    assert all(isinstance(v, str) for v in metadata.values())
    policy = policies.ScalerPolicy(metadata)
    assert policy.spec.target_concurrency == 40
    assert policy.spec.capacity.queue_time_slo_s == 2.0
    assert policy.spec.cold_start_s == 180.0
    assert policy.spec.forecast is True
    assert policy.spec.max_replicas == 30


def test_the_scaler_fills_the_nodes_it_pays_for(bench: BenchResult) -> None:
    # The bench's workload has its NodePool to itself, one GPU per replica: the scaler row is
    # told how many replicas a node holds, and every target it returns fills whole nodes.
    gpus = CONFIG.profile.node.gpus
    assert bench.scaler_metadata["replicasPerNode"] == str(gpus)
    policy = policies.ScalerPolicy(bench.scaler_metadata)
    assert policy.spec.replicas_per_node == gpus
    requests = build_requests(load_trace(TRACE), scale=2.0, seed=0, duration_s=300.0)
    simulate(policy, requests, CONFIG, bench.initial_replicas)
    targets = {d.replicas for d in policy.decisions}
    assert targets and all(n % gpus == 0 or n == policy.spec.max_replicas for n in targets), targets


def test_json_shape(bench: BenchResult) -> None:
    found = json.loads(json.dumps(to_json(bench)))
    assert isinstance(found["trace"], str)
    for key in ("scale", "cold_start_s", "slo_s"):
        assert isinstance(found[key], float)
    assert [p["name"] for p in found["policies"]] == list(NAMES)
    types = {
        "name": str,
        "slo_attainment": float,
        "p99_queue_wait_s": float,
        "p99_ttft_s": float,
        "gpu_hours": float,
        "cost_usd": float,
        "requests": int,
        "completed": int,
        "dropped": int,
        "scale_events": int,
    }
    for policy in found["policies"]:
        for key, kind in types.items():
            assert isinstance(policy[key], kind), (policy["name"], key)
        assert 0.0 <= policy["slo_attainment"] <= 1.0
    assert "always-on" in table(bench)


def test_the_table_states_the_scalers_verdict_against_the_goals(bench: BenchResult) -> None:
    # What the demo's first screen says of the scaler against always-on follows the measures.
    m = {run.name: measure(run, CONFIG.slo_s) for run in bench.runs}
    text = table(bench)
    assert "verdict: the scaler row against the project's goals" in text
    costlier = m["scaler"].gpu_hours > m["always-on"].gpu_hours
    assert ("vs always-on (the smallest fixed fleet that meets the goal)" in text) and (
        ("MORE GPU-hours: MISSED" in text) == costlier
    )
    ratio = m["scaler"].gpu_hours / m["oracle"].gpu_hours
    assert f"GPU-hours: {ratio:.2f}x the oracle's" in text


def test_cli_replays_a_slice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        [
            "bench", "replay", "--trace", str(TRACE), "--duration", "120", "--scale", "1",
            "--cold-start", "120", "--json", "--plots", str(tmp_path), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    found = json.loads(capsys.readouterr().out)
    assert found["cold_start_s"] == 120.0
    assert [p["name"] for p in found["policies"]] == list(NAMES)
    assert (tmp_path / "fleet.png").stat().st_size > 0
    assert (tmp_path / "queue_wait.png").stat().st_size > 0
    assert cli.main(["bench", "replay", "--trace", str(TRACE), "--profile", "nope"]) == 2


def test_kv_preemption_is_on_by_default_and_counted_per_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["bench", "replay", "--trace", str(TRACE), "--duration", "120", "--scale", "4",
            "--cold-start", "120", "--no-progress"]  # fmt: skip
    assert cli.main([*args, "--json", "--no-kv-preemption"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert cli.main([*args, "--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert (off["kv_preemption"], on["kv_preemption"]) == (False, True)
    assert all(p["preemptions"] == 0 for p in off["policies"])
    preempted = {p["name"]: p["preemptions"] for p in on["policies"]}
    assert all(isinstance(n, int) and n >= 0 for n in preempted.values())
    assert cli.main(args) == 0
    text = capsys.readouterr().out
    assert "KV preemption on: requests preempted and recomputed per policy: always-on " in text


def test_zero_load_costs_nothing_under_scale_to_zero() -> None:
    # A minute of traffic, then an hour of silence. Under scale-to-zero, the scaler's fleet
    # goes to zero replicas (idle window 300 s, KEDA cooldown 300 s) and its nodes to zero
    # (consolidateAfter 60 s), and from then on costs nothing; always-on pays for the hour.
    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0.0, 60.0, 300))
    requests = Requests(
        arrivals_s=arrivals,
        input_tokens=np.full(arrivals.size, 512, dtype=np.int64),
        output_tokens=np.full(arrivals.size, 128, dtype=np.int64),
        duration_s=3600.0,
        name="minute-then-silence",
    )
    config = SimConfig(
        get_profile("llama3-8b-a100"),
        warm_window_s=60.0,
        drain_s=0.0,
        policies=("always-on", "scaler"),
        oracle_iterations=0,
    )
    result = run_bench(requests, config)
    runs = {run.name: run for run in result.runs}
    scaler, always_on = runs["scaler"], runs["always-on"]
    assert measure(scaler, config.slo_s).completed == requests.count
    # Zero nodes from at most idle + cooldown + polling + consolidateAfter + a node's drain
    # after the last request, until the end: no GPU-second is paid while nothing arrives.
    silent_from = 60 + 300 + 300 + 30 + 60 + 60
    assert np.all(scaler.nodes[silent_from:3600] == 0)
    assert np.all(scaler.replicas[silent_from:3600] == 0)
    assert scaler.zero_node_seconds >= 3600 - silent_from
    assert scaler.gpu_seconds <= silent_from * scaler.gpus_per_node * int(scaler.nodes.max())
    assert always_on.zero_node_seconds == 0.0
    assert always_on.gpu_seconds >= 3600 * always_on.gpus_per_node


def test_node_price_replaces_the_on_demand_price(capsys: pytest.CaptureFixture[str]) -> None:
    # A Spot price (or any negotiated one) is the user's to give; the cost follows it exactly.
    base = [
        "bench",
        "replay",
        "--trace",
        str(TRACE),
        "--duration",
        "120",
        "--json",
        "--no-progress",
    ]
    assert cli.main(base) == 0
    on_demand = json.loads(capsys.readouterr().out)["policies"]
    assert cli.main([*base, "--node-price", "9.5"]) == 0
    spot = json.loads(capsys.readouterr().out)["policies"]
    gpus_per_node = get_profile("llama3-8b-a100").node.gpus
    for paid, listed in zip(spot, on_demand, strict=True):
        assert paid["gpu_hours"] == listed["gpu_hours"]
        assert paid["cost_usd"] == pytest.approx(paid["gpu_hours"] / gpus_per_node * 9.5)
        assert listed["cost_usd"] == pytest.approx(listed["gpu_hours"] / gpus_per_node * 32.77)
    with pytest.raises(SystemExit):
        cli.main([*base, "--node-price", "free"])
    assert "--node-price: expected a price in USD above 0" in capsys.readouterr().err


class _Packed:
    """The part of a Cluster the reactive bound touches."""

    def __init__(self) -> None:
        self.packs = 0

    def pack(self, limit: int | None = None) -> None:
        self.packs += 1


def test_the_reactive_bound_asks_at_once_and_holds_for_its_window() -> None:
    # Need 10 for a minute, then 4; headroom 1.2, a 120 s hold, the trace's first 60 s
    # replayed before t = 0. The ask rises at once, holds ceil(10 x 1.2) = 12 for 120 s after
    # the need falls, then follows the need (ceil(4 x 1.2) = 5); it acts every 15 s and packs.
    need = np.array([10] * 60 + [4] * 600, dtype=np.int64)
    bound = policies.ReactiveBound(need, 1.0, 60.0, 1.2, 120.0)
    cluster = _Packed()
    asked: dict[int, int] = {}
    for t in range(-60, 400):
        wanted = bound.act(float(t), None, cluster, None)  # type: ignore[arg-type]
        if wanted is not None:
            asked[t] = wanted
    assert asked[-60] == 12  # before t = 0: the replayed first minute's need
    assert sorted(asked) == list(range(-60, 400, 15))
    assert all(asked[t] == 12 for t in asked if t < 60 + 120)
    assert all(asked[t] == 5 for t in asked if t >= 60 + 120)
    assert cluster.packs == len(asked)


def test_the_reactive_bound_runs_on_a_replay() -> None:
    # On the bench's slice, the exact need with no headroom pays no more than with 1.6x, and
    # misses more: the headroom is what a reactive rule buys its SLO with.
    requests = build_requests(load_trace(TRACE), scale=2.0, seed=0, duration_s=300.0)
    svc = CONFIG.profile.service
    need = policies.oracle_need(requests, svc, 1.0, 300, policies.replica_slots(requests, svc))
    config = replace(CONFIG, policies=("scaler",))
    runs = [
        simulate(policies.ReactiveBound(need, 1.0, 120.0, h, 180.0), requests, config, 1)
        for h in (1.0, 1.6)
    ]
    exact, roomy = (measure(run, CONFIG.slo_s) for run in runs)
    assert exact.completed + exact.dropped == requests.count
    assert exact.gpu_hours <= roomy.gpu_hours
    assert exact.slo_attainment <= roomy.slo_attainment
    assert roomy.slo_attainment >= 0.99


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_replay_shows_a_progress_bar_on_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a terminal the replay draws tqdm's bar on stderr (steps of every policy's run), and
    its JSON on stdout stays one object; --no-progress (above) draws none."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = ["bench", "replay", "--trace", str(TRACE), "--duration", "60", "--json"]
    assert cli.main(argv) == 0
    drawn = terminal.getvalue()
    # tqdm redraws at most every 0.1 s and erases the bar at the end (leave=False): a short
    # replay shows its start and at least one advance of the steps it counts
    counts = [int(n) for n in re.findall(r"replay:\s+\d+%\|[^|]*\| (\d+)/\d+", drawn)]
    assert counts and counts[0] == 0 and max(counts) > 0, drawn[-300:]
    assert json.loads(capsys.readouterr().out)["policies"]
