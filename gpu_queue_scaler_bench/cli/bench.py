"""`scaler bench forecast|replay|loadgen|load`: offline benchmarks (need the simulator and
benches, not in the image; imported only when a bench runs)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from gpu_queue_scaler.cli.options import Subcommands, parse_metadata

if TYPE_CHECKING:  # the simulator is imported only when a bench runs
    from gpu_queue_scaler_bench.sim.command import ReplayOptions


def _positive_price(text: str) -> float:
    """A price in USD: a finite number above 0 (argparse names the flag on error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a price in USD above 0, got {text!r}")
    return value


def _bench_forecast(args: argparse.Namespace) -> int:
    """Score forecasters on a recorded trace, walking forward (see
    gpu_queue_scaler_bench.forecast)."""
    import json

    from gpu_queue_scaler_bench.forecast import parse_horizons, parse_models, run_bench
    from gpu_queue_scaler_bench.traces import TraceError, load_trace

    try:
        trace = load_trace(args.trace)
        options = {
            key: getattr(args, key)
            for key in ("max_origins", "refit_every", "season_s")
            if getattr(args, key) is not None
        }
        result = run_bench(
            trace,
            bin_s=args.bin_s,
            models=parse_models(args.models),
            horizons_s=parse_horizons(args.horizons),
            **options,
        )
    except (TraceError, ValueError) as exc:
        print(f"scaler bench forecast: {exc}", file=sys.stderr)
        return 2
    if args.write_json:
        with open(args.write_json, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=1)
            out.write("\n")
    if args.json:
        for note in result.notes:
            print(f"note: {note}", file=sys.stderr)
        print(json.dumps(result.to_json()))
    else:
        print(result.table())
    return 0


def replay_options(args: argparse.Namespace, metadata: dict[str, str]) -> ReplayOptions:
    """`scaler bench replay`'s parsed arguments as the replay's options (`bench/` scripts read
    `bench/run_replay_all.sh`'s cases through this and the CLI's own parser)."""
    from gpu_queue_scaler_bench.sim.command import ReplayOptions

    return ReplayOptions(
        trace=args.trace,
        scale=args.scale,
        profile=args.profile,
        cold_start_s=args.cold_start,
        seed=args.seed,
        slo_s=args.slo,
        duration_s=args.duration,
        json=args.json,
        plots=args.plots,
        progress=not args.no_progress,
        metadata=metadata,
        compress=args.compress,
        full_stack=args.full_stack,
        speedup=args.speedup,
        companion=args.companion,
        node_price=args.node_price,
        consolidation=args.consolidation,
        preemption=not args.no_kv_preemption,
    )


def _bench_replay(args: argparse.Namespace) -> int:
    """Replay a trace against a simulated fleet under every policy (see
    gpu_queue_scaler_bench.sim)."""
    from gpu_queue_scaler_bench.sim.command import replay

    metadata = parse_metadata(args.metadata)
    if metadata is None:
        return 2
    return replay(replay_options(args, metadata))


def _bench_loadgen(args: argparse.Namespace) -> int:
    """Replay a trace against a real OpenAI-compatible or Triton endpoint
    (gpu_queue_scaler_bench.load.traffic)."""
    from gpu_queue_scaler_bench.load.traffic import options_from, run_command

    return run_command(options_from(args), as_json=args.json)


def _bench_load(args: argparse.Namespace) -> int:
    """N ScaledObjects polled like KEDA against the real server and a floor
    (gpu_queue_scaler_bench.load.polls)."""
    from gpu_queue_scaler_bench.load.polls import options_from, run_command

    return run_command(options_from(args), as_json=args.json)


def register(sub: Subcommands) -> None:
    bench = sub.add_parser("bench", help="offline benchmarks on recorded traces")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True)
    fc = bench_sub.add_parser(
        "forecast",
        help="score forecasters on a trace, walking forward: pinball loss, MASE, coverage, CPU",
    )
    fc.add_argument("--trace", required=True, metavar="FILE", help="a trace file (bench/traces/)")
    fc.add_argument("--json", action="store_true", help="one JSON object")
    fc.add_argument(
        "--models",
        nargs="+",
        metavar="NAME[,NAME]",
        help="scaler, naive, moving_average, seasonal_naive, autoets, autoarima (default all)",
    )
    fc.add_argument(
        "--horizons",
        nargs="+",
        metavar="S[,S]",
        help="seconds (default 30,60,120,300; rate traces: 1, 2 and 3 windows)",
    )
    fc.add_argument(
        "--bin-s", type=float, help="bin width in seconds (default 10; rate traces: the window)"
    )
    fc.add_argument(
        "--max-origins",
        type=int,
        help="forecast origins walked, the last ones of the series (default 576)",
    )
    fc.add_argument(
        "--refit-every", type=int, help="statsforecast refits every N origins (default 12)"
    )
    fc.add_argument(
        "--season-s",
        type=float,
        help="season for seasonal_naive and the scaler's period, seconds (default 86400)",
    )
    fc.add_argument("--write-json", metavar="FILE", help="also write the JSON object to FILE")
    fc.set_defaults(run=_bench_forecast)

    rp = bench_sub.add_parser(
        "replay",
        help="replay a trace on a simulated GPU fleet under seven autoscaling policies: SLO, "
        "GPU-hours, cost",
    )
    rp.add_argument("--trace", required=True, metavar="FILE", help="a trace file (bench/traces/)")
    rp.add_argument(
        "--scale", type=float, default=1.0, help="load multiplier (default %(default)s)"
    )
    rp.add_argument(
        "--profile", default="llama3-8b-a100", help="service/node profile (default %(default)s)"
    )
    rp.add_argument(
        "--cold-start",
        type=float,
        default=180.0,
        metavar="S",
        help="node launch + model load, seconds (default %(default)s)",
    )
    rp.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    rp.add_argument(
        "--node-price",
        type=_positive_price,
        metavar="USD",
        help="price of a node-hour instead of the profile's on-demand price, e.g. the Spot "
        "price for your zone from the EC2 Spot price history (it moves; none is kept here)",
    )
    rp.add_argument(
        "--slo", type=float, default=2.0, help="queue wait / TTFT SLO, s (default %(default)s)"
    )
    rp.add_argument(
        "--duration",
        type=float,
        help="replay only the first S seconds (after --compress; --full-stack: default 600)",
    )
    rp.add_argument(
        "--compress",
        type=float,
        default=1.0,
        metavar="F",
        help="time-compress the trace F times at the same rate (rate files: each window lasts "
        "1/F as long; default %(default)s)",
    )
    rp.add_argument(
        "--full-stack",
        action="store_true",
        help="the scaler row through the real gRPC server (in-process, 127.0.0.1), its "
        "direct scrape of the fleet's vLLM /metrics and a KEDA/HPA emulator over gRPC, in real "
        "time at --speedup; next to the offline scaler and oracle on the same requests",
    )
    rp.add_argument(
        "--speedup",
        type=float,
        default=5.0,
        metavar="X",
        help="--full-stack: trace seconds per wall second, 1 to 10 (default %(default)s)",
    )
    rp.add_argument(
        "--companion",
        action="store_true",
        help="also run the scaler with the Karpenter companion (scaler+companion: default "
        "metadata, placeholders for its target, scale-downs packed with pod-deletion-cost), and "
        "with forecast=on alone (scaler+forecast) and with the companion pre-warming nodes with "
        "placeholder pods (scaler+prewarm): node-hours, replica start and scale-from-zero "
        "latency with and without the companion",
    )
    rp.add_argument(
        "--consolidation",
        choices=("WhenEmptyOrUnderutilized", "WhenEmpty"),
        default="WhenEmptyOrUnderutilized",
        help="the Karpenter NodePool's consolidationPolicy for every policy: "
        "WhenEmptyOrUnderutilized (Karpenter v1's default, what most clusters run) also repacks "
        "part-empty nodes by evicting their pods, which restart elsewhere; WhenEmpty only removes "
        "empty nodes (default %(default)s)",
    )
    rp.add_argument(
        "--no-kv-preemption",
        action="store_true",
        help="serve a simulated vLLM pod's KV-cache overflow for free; by default a pod whose "
        "running requests outgrow its KV cache preempts the newest ones, which prefill again "
        "ahead of new requests (vLLM's scheduler, recompute mode)",
    )
    rp.add_argument("--json", action="store_true", help="one JSON object")
    rp.add_argument("--plots", metavar="DIR", help="write PNG plots to DIR (needs matplotlib)")
    rp.add_argument("--no-progress", action="store_true", help="no progress bar")
    rp.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra trigger metadata for the scaler policy, e.g. forecast=on",
    )
    rp.set_defaults(run=_bench_replay)

    lg = bench_sub.add_parser(
        "loadgen",
        help="replay a trace's arrivals and token lengths against a real OpenAI-compatible "
        "(vLLM) or Triton endpoint, open loop: rate, errors, latency and TTFT",
    )
    lg.add_argument("--endpoint", required=True, metavar="URL", help="e.g. http://HOST:8000")
    lg.add_argument("--api", required=True, choices=["openai", "triton"], help="the endpoint's API")
    lg.add_argument("--trace", required=True, metavar="FILE", help="a trace file (bench/traces/)")
    lg.add_argument(
        "--scale", type=float, default=1.0, metavar="F", help="load multiplier (default 1)"
    )
    lg.add_argument(
        "--speedup",
        type=float,
        default=1.0,
        metavar="X",
        help="run the trace's clock X times faster",
    )
    lg.add_argument("--duration", type=float, metavar="S", help="send for S seconds at most")
    lg.add_argument(
        "--max-in-flight",
        type=int,
        default=256,
        metavar="N",
        help="outstanding requests at most; arrivals beyond are shed (default %(default)s)",
    )
    lg.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="per request (default 60)"
    )
    lg.add_argument(
        "--drain",
        type=float,
        default=30.0,
        metavar="S",
        help="after sending ends, wait at most S for answers (default 30)",
    )
    lg.add_argument("--model", help="model name (default: the endpoint's first model)")
    lg.add_argument(
        "--max-tokens", type=int, metavar="N", help="cap on each request's output tokens"
    )
    lg.add_argument("--max-input-tokens", type=int, metavar="N", help="cap on each prompt's tokens")
    lg.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="openai: do not send vLLM's ignore_eos (answers may end before max_tokens)",
    )
    lg.add_argument("--seed", type=int, default=0, help="random seed (default %(default)s)")
    lg.add_argument("--json", action="store_true", help="one JSON object")
    lg.add_argument("--no-progress", action="store_true", help="no live progress on stderr")
    lg.set_defaults(run=_bench_loadgen)

    ld = bench_sub.add_parser(
        "load",
        help="N ScaledObjects polled like KEDA (GetMetrics + IsActive per pollingInterval and "
        "HPA query) against the real server and a minimal grpc.aio floor: p50/p99, calls/s, CPU",
    )
    ld.add_argument("--objects", type=int, default=1000, help="ScaledObjects (default 1000)")
    ld.add_argument(
        "--duration", type=float, metavar="S", help="per server (default 60; --soak: 600)"
    )
    ld.add_argument(
        "--polling-interval", type=float, default=30.0, metavar="S", help="KEDA's (default 30)"
    )
    ld.add_argument(
        "--hpa-interval", type=float, default=15.0, metavar="S", help="HPA sync (default 15)"
    )
    ld.add_argument(
        "--jitter", type=float, default=0.1, metavar="F", help="+-F of each period (default 0.1)"
    )
    ld.add_argument(
        "--concurrency", type=int, default=1000, metavar="N", help="calls in flight at most"
    )
    ld.add_argument("--channels", type=int, default=1, metavar="N", help="connections (default 1)")
    ld.add_argument(
        "--soak",
        action="store_true",
        help="the scaler alone for --duration: RSS after warm-up and at the end, open fds",
    )
    ld.add_argument(
        "--sample-interval", type=float, default=10.0, metavar="S", help="RSS/fd samples"
    )
    ld.add_argument("--warmup", type=float, default=60.0, metavar="S", help="soak warm-up")
    ld.add_argument("--config", metavar="FILE", help="tuning YAML for the scaler server")
    ld.add_argument("--profile", metavar="FILE", help="cProfile the scaler server into FILE")
    ld.add_argument("--seed", type=int, default=0, help="schedule seed (default 0)")
    ld.add_argument(
        "--rounds",
        type=int,
        default=1,
        metavar="N",
        help="runs of each server, alternated and pooled (default 1): machine noise averages",
    )
    ld.add_argument("--json", action="store_true", help="one JSON object")
    ld.set_defaults(run=_bench_load)
