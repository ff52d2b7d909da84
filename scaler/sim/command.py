"""`scaler bench replay`: load, run every policy, print the table or JSON, write the plots.

Why a module of its own: the CLI stays a thin parser, and tests call this with plain arguments.
matplotlib and tqdm (the `sim` extra) are imported only when plots or a progress bar are asked for.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from scaler.sim.profiles import DEFAULT_PROFILE, get_profile
from scaler.sim.report import plot, table, to_json
from scaler.sim.run import SimConfig, run_bench, total_steps
from scaler.sim.workload import build_requests
from scaler.traces import TraceError, load_trace


@dataclass(frozen=True)
class ReplayOptions:
    trace: str
    scale: float = 1.0
    profile: str = DEFAULT_PROFILE
    cold_start_s: float = 180.0
    seed: int = 0
    slo_s: float = 2.0
    duration_s: float | None = None
    json: bool = False
    plots: str | None = None
    progress: bool = True
    metadata: Mapping[str, str] = field(default_factory=dict)


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


def replay(options: ReplayOptions) -> int:
    """Run the bench and print it; 2 on bad input (the message names what is wrong)."""
    try:
        profile = get_profile(options.profile)
        trace = load_trace(options.trace)
        requests = build_requests(
            trace, scale=options.scale, seed=options.seed, duration_s=options.duration_s
        )
        config = SimConfig(
            profile,
            cold_start_s=options.cold_start_s,
            slo_s=options.slo_s,
            seed=options.seed,
            scaler_metadata=dict(options.metadata),
        )
    except (TraceError, ValueError) as exc:
        print(f"scaler bench replay: {exc}", file=sys.stderr)
        return 2
    update, bar = _progress_bar(total_steps(requests, config), options.progress)
    started = time.monotonic()
    try:
        result = run_bench(requests, config, options.scale, update)
    except ValueError as exc:
        print(f"scaler bench replay: {exc}", file=sys.stderr)
        return 2
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.monotonic() - started
    written = plot(result, options.plots) if options.plots else []
    if options.json:
        print(json.dumps(to_json(result)))
    else:
        print(table(result))
        print(f"simulated in {elapsed:.1f} s")
        for path in written:
            print(f"plot: {path}")
    return 0
