"""The per-workload decider: one tick is `decide` folded over the signals with the forecaster fed
the demand behind each decision; a replay decides as live ticks did; its state is a value that can
be handed out and taken back; and the engine and the simulator both run this very tick (the
simulator without importing the asyncio engine)."""

from __future__ import annotations

import asyncio
import importlib
import math
import pkgutil
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gpu_queue_scaler.decision.bank import ForecastBanks
from gpu_queue_scaler.decision.decider import Decider
from gpu_queue_scaler.decision.outlook import NeedForecast
from gpu_queue_scaler.decision.policy import Decision, PolicyState, Reason, decide
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler.signals import Signal
from gpu_queue_scaler_bench.sim import policies
from gpu_queue_scaler_bench.sim.profiles import get_profile
from gpu_queue_scaler_bench.sim.run import SimConfig, run_bench
from gpu_queue_scaler_bench.sim.workload import build_requests
from gpu_queue_scaler_bench.traces import load_trace
from tests.conftest import ManualClock, synthetic

T0 = 1_800_000_000.0
INTERVAL = 5.0
STALE_S = 60.0
ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "bench/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv"


def spec(**extra: str) -> WorkloadSpec:
    """A vLLM workload as the simulator's scaler row declares it (no I/O: only resolved)."""
    metadata = policies.scaler_metadata(8.0, 2.0, 60.0, 40, extra)
    return resolve(parse_trigger("team-a", "llama", metadata), Config())


def script(ticks: int = 160) -> list[Signal | None]:
    """A load that rises, holds, falls to nothing and comes back, read by a fleet that follows
    it a few ticks late; with reads that fail (None) and one without its queue fields."""
    signals: list[Signal | None] = []
    for k in range(ticks):
        at = T0 + k * INTERVAL
        if k in (30, 31, 95):
            signals.append(None)
            continue
        rate = max(0.0, 40.0 * math.sin(k / 25.0)) + (0.5 if k % 7 == 0 else 0.0)
        ready = max(1, math.ceil(max(0.0, 40.0 * math.sin((k - 4) / 25.0)) * 2.0 / 8.0))
        running = min(rate * 2.0, ready * 8.0)
        waiting = max(0.0, rate * 2.0 - running)
        if k == 60:
            signals.append(Signal(at, "scrape", arrival_rate=rate, reasons=("no queue",)))
            continue
        signals.append(
            Signal(
                at,
                "scrape",
                waiting=waiting,
                running=running,
                arrival_rate=rate,
                queue_time_mean_s=0.1 + waiting / 8.0,
                queue_time_p99_s=0.5 + waiting / 2.0,
                kv_cache_usage=min(1.0, running / (ready * 8.0)),
                ready_pods=ready,
                service_time_s=1.5 + 0.05 * running / ready,
                prompt_tokens_rate=rate * 500.0,
                generation_tokens_rate=rate * 200.0,
            )
        )
    return signals


def by_hand(
    workload: WorkloadSpec, signals: list[Signal | None], at0: float = T0
) -> list[Decision | None]:
    """`decide` folded over the signals, a NeedForecast of its own fed each fresh decision's
    demand (what a tick is, written out)."""
    state = PolicyState()
    forecast = NeedForecast(workload.forecast_step_s, workload.horizon_s, workload.season_period_s)
    made: list[Decision | None] = []
    for k, signal in enumerate(signals):
        at = at0 + k * INTERVAL
        decision, state = decide(
            workload,
            signal,
            state,
            at,
            STALE_S,
            outlook=forecast.outlook if workload.forecast else None,
        )
        if workload.forecast:
            fresh = decision is not None and decision.reason is not Reason.HOLD
            forecast.observe(at, decision.demand if fresh and decision else None)
        made.append(decision)
    return made


@pytest.mark.parametrize("forecast", ["off", "on"])
def test_ticks_are_decide_folded_by_hand(forecast: str) -> None:
    workload = spec(forecast=forecast, forecastStepSeconds="30")
    signals = script()
    decider = Decider(workload, stale_s=STALE_S)
    ticked = [decider.tick(signal, T0 + k * INTERVAL) for k, signal in enumerate(signals)]
    expected = by_hand(workload, signals)
    assert ticked == expected
    reasons = Counter(d.reason for d in ticked if d is not None)
    assert reasons[Reason.HOLD] >= 3 and len(reasons) >= 3, reasons  # the script means something
    assert len({d.replicas for d in ticked if d is not None}) >= 3
    if forecast == "on":
        assert any(d.outlook is not None for d in ticked if d is not None)


@pytest.mark.parametrize("forecast", ["off", "on"])
def test_a_replay_decides_the_next_tick_as_live_ticking_did(forecast: str) -> None:
    """A replay (explain off, the forecast on a private NeedForecast that then joins the bank)
    leaves the decider where live ticks leave it: the same state but for the detail text, the
    same forecast row, so the same decisions from then on, on a bank both share."""
    workload = spec(forecast=forecast, forecastStepSeconds="30")
    signals = [s for s in script() if s is not None]
    history, ahead = signals[:100], signals[100:]
    banks = ForecastBanks()
    live = Decider(workload, banks, STALE_S)
    for signal in history:
        live.tick(signal, signal.at)
    replayed = Decider(workload, banks, STALE_S)
    last = replayed.replay(history)
    assert last is not None and last.detail == ""
    assert replayed.state._replace(last_good=None) == live.state._replace(last_good=None)
    for signal in ahead:
        assert replayed.tick(signal, signal.at) == live.tick(signal, signal.at)
    if forecast == "on":
        assert replayed.forecast is not None and live.forecast is not None
        assert replayed.outlook() == live.outlook() is not None
    live.release()
    replayed.release()
    assert not list(banks)


def test_state_handed_out_and_taken_back_gives_the_same_next_decision() -> None:
    workload = spec()
    signals = [s for s in script() if s is not None]
    decider = Decider(workload, stale_s=STALE_S)
    for signal in signals[:80]:
        decider.tick(signal, signal.at)
    kept = decider.state
    first = [decider.tick(signal, signal.at) for signal in signals[80:90]]
    assert decider.state != kept  # the ticks moved it on
    decider.state = kept  # taken back: the same decisions again
    assert [decider.tick(signal, signal.at) for signal in signals[80:90]] == first
    elsewhere = Decider(workload, stale_s=STALE_S, state=kept)  # handed to another decider
    assert [elsewhere.tick(signal, signal.at) for signal in signals[80:90]] == first


def test_a_held_tick_changes_nothing_and_goes_stale() -> None:
    workload = spec()
    decider = Decider(workload, stale_s=STALE_S)
    assert decider.hold(T0, ("down",)) is None  # nothing to hold yet
    signal = next(s for s in script() if s is not None and s.arrival_rate)
    made = decider.tick(signal, T0)
    assert made is not None
    state = decider.state
    held = decider.hold(T0 + INTERVAL, ("down",))
    assert held is not None and held.reason is Reason.HOLD and held.replicas == made.replicas
    assert held.faults == ("down",) and decider.state == state
    assert decider.hold(T0 + STALE_S + 1.0, ("down",)) is None


def test_the_engine_and_the_simulator_run_the_same_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """One tick implementation: `Decider.tick`, counted by who called it, is what an engine's
    warm start and live tick run and what the simulator's scaler row runs; neither the engine
    nor the simulator keeps a `decide` of its own to call."""
    import gpu_queue_scaler.engine

    engine_modules = [
        importlib.import_module(f"gpu_queue_scaler.engine.{module.name}")
        for module in pkgutil.iter_modules(gpu_queue_scaler.engine.__path__)
    ]
    calls: Counter[str] = Counter()
    real = Decider.tick

    def counted(self: Decider, *args: Any, **kwargs: Any) -> Decision | None:
        caller = sys._getframe(1).f_globals["__name__"]
        calls[
            "gpu_queue_scaler.engine" if caller.startswith("gpu_queue_scaler.engine.") else caller
        ] += 1  # one package
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Decider, "tick", counted)
    assert len(engine_modules) > 1 and not hasattr(policies, "decide")
    assert [m.__name__ for m in engine_modules if hasattr(m, "decide")] == []

    async def one_engine_tick() -> None:
        clock = ManualClock()
        store = ConfigStore(Config(server=ServerSettings(evaluation_interval_s=1.0)))
        engine = clock.engine(store)
        try:
            await asyncio.wait_for(engine.decision(parse_trigger("a", "b", synthetic())), 30)
        finally:
            await engine.close()

    asyncio.run(one_engine_tick())
    assert calls["gpu_queue_scaler.engine"] > 1  # the warm start's replay and the first live tick
    requests = build_requests(load_trace(TRACE), scale=1.0, duration_s=30.0)
    config = SimConfig(
        get_profile("llama3-8b-a100"), warm_window_s=30.0, drain_s=30.0, policies=("scaler",)
    )
    run_bench(requests, config)
    # every 5 s over the pre-roll and the trace
    assert calls["gpu_queue_scaler_bench.sim.policies"] >= 6
    assert set(calls) == {"gpu_queue_scaler.engine", "gpu_queue_scaler_bench.sim.policies"}


def test_the_simulator_does_not_import_the_engine() -> None:
    """The simulator (all but the full-stack run, which starts the real server on purpose) and
    the decider import neither the asyncio engine nor the server."""
    code = textwrap.dedent(
        """
        import sys
        import gpu_queue_scaler.decision.decider
        assert "asyncio" not in sys.modules, "the decider pulled in asyncio"
        from gpu_queue_scaler_bench.sim import command, policies, prewarm, report, run
        apart = ("gpu_queue_scaler.engine", "gpu_queue_scaler.serve")
        found = [m for m in apart if m in sys.modules]
        assert not found, found
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr


def test_the_decision_loads_no_settings_loader_or_io_module() -> None:
    # The spec reaches the decision as a value: importing the decider and the policy in a fresh
    # interpreter must not load the ConfigMap's loader, YAML, the spec module or any I/O stack
    # (the import-linter contracts say the same of the import graph; this checks what runs).
    code = textwrap.dedent(
        """
        import sys
        import gpu_queue_scaler.decision.decider, gpu_queue_scaler.decision.policy
        banned = ("yaml", "gpu_queue_scaler.settings.config", "gpu_queue_scaler.settings.spec",
                  "gpu_queue_scaler.settings.reload", "asyncio", "grpc", "httpx", "urllib3",
                  "kubernetes", "socket")
        print(",".join(m for m in banned if m in sys.modules))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.strip() == "", done.stdout
