"""`scaler bench replay --full-stack`: the scaler row through the real gRPC server, its direct
scrape of the simulated replicas' vLLM /metrics on loopback, and a KEDA/HPA emulator over gRPC.
A step in load must make the fleet scale up, with every replica count coming over gRPC."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpu_queue_scaler import cli
from gpu_queue_scaler.sources.exposition import parse
from gpu_queue_scaler_bench.sim.autoscalers import SCALER_BEHAVIOR
from gpu_queue_scaler_bench.sim.fleet import ServingFleet
from gpu_queue_scaler_bench.sim.fullstack import (
    FULL_STACK_NAME,
    FullStackRun,
    VllmExporter,
    dilate_metadata,
    run_full_stack,
)
from gpu_queue_scaler_bench.sim.profiles import get_profile
from gpu_queue_scaler_bench.sim.report import measure, table, to_json
from gpu_queue_scaler_bench.sim.run import SimConfig
from gpu_queue_scaler_bench.sim.workload import Requests

TRACE = (
    Path(__file__).resolve().parents[2]
    / "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"
)
CONFIG = SimConfig(
    get_profile("llama3-8b-a100"), cold_start_s=60.0, warm_window_s=60.0, drain_s=120.0
)


def step_load(seed: int = 0) -> Requests:
    """5 req/s for two minutes, then 40 req/s for two minutes (Azure-like token counts)."""
    rng = np.random.default_rng(seed)
    arrivals = np.sort(np.concatenate([rng.uniform(0, 120, 600), rng.uniform(120, 240, 4800)]))
    n = arrivals.size
    return Requests(
        arrivals,
        np.full(n, 1000, dtype=np.int64),
        np.full(n, 130, dtype=np.int64),
        240.0,
        "step",
    )


@pytest.fixture(scope="module")
def full_stack() -> FullStackRun:
    import asyncio

    return asyncio.run(run_full_stack(step_load(), CONFIG, 1.0, speedup=10.0))


@pytest.mark.timeout(120)
def test_the_fleet_scales_up_through_grpc(full_stack: FullStackRun) -> None:
    run = full_stack  # bounded by the test's timeout; how fast it runs is no claim of a test
    bench = run.bench
    assert [r.name for r in bench.runs] == [FULL_STACK_NAME, "scaler", "oracle"]
    fs = bench.runs[0]
    # Scaled up under load: past the warm start, and every change came from a gRPC answer.
    assert int(fs.replicas.max()) > bench.initial_replicas
    ups = [
        p
        for p in run.polls
        if p.replicas_after is not None and p.replicas_after > p.replicas_before
    ]
    assert ups, run.polls
    behavior = SCALER_BEHAVIOR  # the HPA the simulator builds for the scaler's ScaledObject
    for poll in ups:
        assert poll.value is not None and poll.active
        answer = min(math.ceil(poll.value), bench.max_replicas)
        # Toward the answer, never past it; short of it only by the HPA's own scale-up policy
        # (max(100%, 4 pods) per 15 s): a slow machine's run can ask for more than double at once.
        rate_cap = max(
            poll.replicas_before + behavior.scale_up_pods,
            math.ceil(poll.replicas_before * (1.0 + behavior.scale_up_percent / 100.0)),
        )
        assert poll.replicas_before < poll.replicas_after <= min(answer, rate_cap), poll
    before = max(p.value or 0 for p in run.polls if p.at <= 120)
    after = max(p.value or 0 for p in run.polls if p.at > 120)
    assert after > before
    assert run.rpcs["GetMetricSpec OK"] == run.rpcs["GetMetrics OK"] == run.rpcs["IsActive OK"]
    assert run.rpcs["GetMetrics OK"] >= 15  # every 15 s of trace
    # The server decided on scraped signals from several replicas.
    assert run.scrapes > 50
    [decision] = run.decisions
    assert decision["signal_source"] == "scrape"
    assert decision["ready_pods"] >= 2
    m = measure(fs, CONFIG.slo_s)
    assert m.completed + m.dropped == m.requests == 5400


def test_the_output_says_it_is_the_full_stack_run(full_stack: FullStackRun) -> None:
    bench = full_stack.bench
    text = table(bench)
    assert "FULL-STACK run" in text
    assert FULL_STACK_NAME in text
    found = to_json(bench)
    assert found["full_stack"]["grpc_calls_ok"] > 0
    assert found["full_stack"]["trigger"]["coldStartSeconds"] == "6"


def test_time_settings_are_divided_by_the_speedup() -> None:
    metadata = {"backend": "vllm", "model": "m", "scrapeTargets": "127.0.0.1:9",
                "coldStartSeconds": "180", "pollingIntervalSeconds": "30",
                "scrapeTimeoutSeconds": "1"}  # fmt: skip
    out = dilate_metadata(metadata, 10.0)
    assert out["coldStartSeconds"] == "18"
    assert out["pollingIntervalSeconds"] == "3"
    assert out["rateWindowSeconds"] == "6"
    assert out["scaleDownStabilizationSeconds"] == "30"
    assert out["scrapeTimeoutSeconds"] == "1"  # wall time: not divided
    with pytest.raises(ValueError, match="pollingIntervalSeconds"):
        dilate_metadata({**metadata, "pollingIntervalSeconds": "5"}, 10.0)


def test_the_exported_text_parses_as_vllm_metrics() -> None:
    requests = step_load()
    fleet = ServingFleet(requests, CONFIG.profile.service, 1.0, 400, 600.0)
    exporter = VllmExporter(fleet, "m", speedup=10.0)
    pods = np.array([0, 1], dtype=np.int64)
    for t in range(130):
        exporter.before_step()
        fleet.step(float(t), pods)
        exporter.after_step(pods)
    done = 0.0
    samples: dict[tuple[str, str | None], float] = {}
    for pod in (0, 1):  # each replica is its own scrape target
        scrape = parse(exporter.render(pod))
        assert not scrape.problems
        samples = {
            (name, dict(labels).get("le")): v for (name, labels), v in scrape.samples.items()
        }
        done += samples[("vllm:request_success_total", None)]
        assert samples[("vllm:num_requests_running", None)] > 0
    assert done == int(np.isfinite(fleet.finish_t).sum()) > 0
    # Durations in wall units: the queue-time buckets are vLLM's bounds / 10.
    assert ("vllm:request_queue_time_seconds_bucket", "0.03") in samples


def test_the_cli_refuses_a_speedup_it_cannot_map(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(
        ["bench", "replay", "--trace", str(TRACE), "--full-stack", "--speedup", "50",
         "--duration", "60"]
    )  # fmt: skip
    assert code == 2
    assert "--speedup" in capsys.readouterr().err
