"""`scaler bench replay`: load, run every policy, print the table or JSON, write the plots.

Why a module of its own: the CLI stays a thin parser, and tests call this with plain arguments.
matplotlib and tqdm (the `sim` extra) are imported only when plots or a progress bar are asked for.
With `full_stack` the scaler row goes through the real gRPC server in real time instead
(`gpu_queue_scaler_bench.sim.fullstack`), on a short slice of the trace. With `companion` the scaler
also runs with forecast=on, alone and with the Karpenter companion pre-warming nodes
(`gpu_queue_scaler_bench.sim.prewarm`).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_queue_scaler_bench.sim.cluster import WHEN_UNDERUTILIZED
from gpu_queue_scaler_bench.sim.profiles import DEFAULT_PROFILE, get_profile
from gpu_queue_scaler_bench.sim.report import plot, table, to_json
from gpu_queue_scaler_bench.sim.run import (
    BenchResult,
    SimConfig,
    SimulationError,
    run_bench,
    total_steps,
)
from gpu_queue_scaler_bench.sim.workload import Requests, build_requests
from gpu_queue_scaler_bench.traces import Trace, TraceError, load_trace


@dataclass(frozen=True)
class ReplayOptions:
    trace: str
    scale: float = 1.0
    profile: str = DEFAULT_PROFILE
    cold_start_s: float = 180.0
    seed: int = 0
    slo_s: float = 2.0
    duration_s: float | None = None
    compress: float = 1.0
    json: bool = False
    plots: str | None = None
    progress: bool = True
    metadata: Mapping[str, str] = field(default_factory=dict)
    full_stack: bool = False
    speedup: float = 5.0
    companion: bool = False
    node_price: float | None = None  # USD per node-hour instead of the profile's on-demand
    consolidation: str = WHEN_UNDERUTILIZED  # the NodePool's consolidationPolicy
    preemption: bool = True  # KV preemption in the simulated vLLM (SimConfig.preemption)


FULL_STACK_DURATION_S = 600.0  # trace seconds a full-stack replay takes by default


def _progress_bar(total: int, enabled: bool) -> tuple[Callable[[int], None] | None, Any]:
    """A tqdm bar on stderr when it is a terminal and tqdm is installed, else nothing."""
    if not enabled or not sys.stderr.isatty():
        return None, None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, None
    bar = tqdm(total=total, unit="step", file=sys.stderr, leave=False, desc="replay")

    def update(steps: int) -> None:
        bar.update(steps)

    return update, bar


def first_windows(trace: Trace, duration_s: float | None, compress: float) -> Trace:
    """A rate trace cut to the windows a replay of `duration_s` (after compression) reaches, so
    a two-day slice of a 14-day file is not expanded into requests in full first."""
    if trace.kind != "rates" or duration_s is None or trace.rates is None or not trace.window_s:
        return trace
    if not (math.isfinite(duration_s) and duration_s > 0 and compress > 0):
        return trace  # build_requests names the problem
    n = max(1, math.ceil(duration_s * compress / trace.window_s))
    cv = trace.cv[:n] if trace.cv is not None else None
    return dataclasses.replace(trace, rates=trace.rates[:n], cv=cv)


def _full_stack(requests: Requests, config: SimConfig, options: ReplayOptions) -> BenchResult:
    import asyncio

    from gpu_queue_scaler import logs
    from gpu_queue_scaler_bench.sim.fullstack import announce, check_options, run_full_stack

    check_options(requests, config, options.speedup)
    logs.setup("error", "text")  # the server's own warnings (a pod out of endpoints) are noise
    announce(requests, config, options.speedup)
    run = asyncio.run(run_full_stack(requests, config, options.scale, options.speedup))
    return run.bench


def load_requests(options: ReplayOptions) -> Requests:
    """The requests a replay runs: the trace, cut to the windows the duration reaches (full
    stack: FULL_STACK_DURATION_S unless given), scaled, compressed and seeded. Raises TraceError
    or ValueError naming what is wrong."""
    duration = options.duration_s
    if options.full_stack and duration is None:
        duration = FULL_STACK_DURATION_S
    return build_requests(
        first_windows(load_trace(options.trace), duration, options.compress),
        scale=options.scale,
        seed=options.seed,
        duration_s=duration,
        compress=options.compress,
    )


def sim_config(options: ReplayOptions) -> SimConfig:
    """The simulator's configuration for these options (every policy; ValueError on an unknown
    profile)."""
    return SimConfig(
        get_profile(options.profile),
        cold_start_s=options.cold_start_s,
        slo_s=options.slo_s,
        node_usd_per_hour=options.node_price,
        seed=options.seed,
        scaler_metadata=dict(options.metadata),
        companion=options.companion,
        consolidation=options.consolidation,
        preemption=options.preemption,
    )


def replay(options: ReplayOptions) -> int:
    """Run the bench and print it; 2 on bad input (the message names what is wrong)."""
    try:
        config = sim_config(options)
        requests = load_requests(options)
        if options.companion and options.full_stack:
            raise ValueError("--companion runs offline only; drop --full-stack")
    except (TraceError, ValueError) as exc:
        print(f"scaler bench replay: {exc}", file=sys.stderr)
        return 2
    started = time.monotonic()
    if options.full_stack:
        try:
            result = _full_stack(requests, config, options)
        except ValueError as exc:
            print(f"scaler bench replay: {exc}", file=sys.stderr)
            return 2
    else:
        update, bar = _progress_bar(total_steps(requests, config), options.progress)
        try:
            result = run_bench(requests, config, options.scale, update)
        except ValueError as exc:
            print(f"scaler bench replay: {exc}", file=sys.stderr)
            return 2
        except SimulationError as exc:  # a sanity check failed: the figures would mislead
            print(f"scaler bench replay: sanity check failed: {exc}", file=sys.stderr)
            return 1
        finally:
            if bar is not None:
                bar.close()
    elapsed = time.monotonic() - started
    written = plot(result, options.plots) if options.plots else []
    if options.json:
        print(json.dumps(to_json(result)))
    else:
        print(table(result))
        print(f"{'full-stack replay' if options.full_stack else 'simulated'} in {elapsed:.1f} s")
        for path in written:
            print(f"plot: {path}")
    return 0
