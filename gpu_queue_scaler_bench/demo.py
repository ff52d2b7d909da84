"""`scaler demo`: the main job on embedded defaults, the README's headline figures.

It replays a real production trace shipped inside the package (`gpu_queue_scaler_bench/data`: Azure
LLM inference 2023, conversation service, one hour, CC BY 4.0, its license next to it) at 20
superimposed copies against the simulated vLLM fleet (`gpu_queue_scaler_bench.sim`), under the seven
policies of `scaler bench replay` (always-on, an HPA on GPU utilization, KEDA's Prometheus scaler on
queue depth (the documented pitfall) and on requests in flight (a fixed threshold and the best in
hindsight), this scaler through the same `Decider` that serves KEDA; and two bounds: the best
reactive rule in hindsight, given the exact need now, and an oracle with foresight), prints the SLO
/ GPU-hours / cost table with the scaler row's verdict against the goals
(`gpu_queue_scaler_bench.sim.verdict`: a goal missed is printed as MISSED), and writes the plots.
Deterministic (seed 0); about half a minute on two cores. `scaler bench replay` takes any trace.
"""

from __future__ import annotations

import importlib.util
import sys
from importlib import resources
from pathlib import Path

# Package data, so the demo runs from an installed wheel in any folder, not only from a clone. A
# wheel installs as files, so the resource is a real path (zip imports are not supported).
DEMO_TRACE = Path(
    str(resources.files("gpu_queue_scaler_bench") / "data" / "AzureLLMInferenceTrace_conv.csv")
)
DEMO_SCALE = 20.0
DEMO_COLD_START_S = 180.0
DEMO_PLOTS = "demo-output"


def run_demo(
    *,
    trace: str | Path = DEMO_TRACE,
    scale: float = DEMO_SCALE,
    cold_start_s: float = DEMO_COLD_START_S,
    duration_s: float | None = None,
    plots: str | None = DEMO_PLOTS,
    progress: bool = True,
) -> int:
    from gpu_queue_scaler_bench.sim.command import (  # numpy and the simulator: only here
        ReplayOptions,
        replay,
    )

    trace = Path(trace)
    if not trace.is_file():
        print(
            f"scaler demo: {trace} not found (the demo's own trace ships in the package, "
            "gpu_queue_scaler_bench/data; pass --trace FILE for another one)",
            file=sys.stderr,
        )
        return 2
    if plots is not None and importlib.util.find_spec("matplotlib") is None:
        print(
            "scaler demo: no plots (matplotlib missing: pip install -e '.[sim]'; ./dev demo "
            "installs it)",
            file=sys.stderr,
        )
        plots = None
    about = (
        f" (Azure LLM inference trace 2023, CC BY 4.0: {DEMO_TRACE.with_suffix('.LICENSE')})"
        if trace == DEMO_TRACE
        else ""
    )
    print(
        f"Replaying {trace.name}{about} x{scale:g} on a simulated Llama-3-8B / A100 fleet, "
        f"cold start {cold_start_s:g} s, under seven autoscaling policies and two bounds.\n",
        flush=True,
    )
    code = replay(
        ReplayOptions(
            trace=str(trace),
            scale=scale,
            cold_start_s=cold_start_s,
            duration_s=duration_s,
            plots=plots,
            progress=progress,
        )
    )
    if code != 0:
        return code
    print(
        "\nSLO wait / SLO ttft: share of requests whose queue wait / time to first token is "
        "within the SLO (dropped ones count as misses); p50/p99 in seconds; GPU-h and USD: what "
        "the nodes cost, cold starts included; zero-h: hours at zero nodes; events: replica "
        "changes; peak: most replicas.\n"
        "The scaler row is this project's decision code "
        "(gpu_queue_scaler.decision.decider.Decider) behind KEDA's "
        "polling and the HPA's arithmetic. Same path through the real gRPC server: "
        "`scaler bench replay --trace FILE --full-stack`. Other traces: `scaler bench replay "
        "--trace FILE [--scale F] [--cold-start S]`; all of them: bench/run_replay_all.sh."
    )
    return 0
