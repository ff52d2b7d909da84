"""`scaler demo`: the bundled trace on a simulated fleet (needs the simulator, not in the image)."""

from __future__ import annotations

import argparse

from gpu_queue_scaler import logs
from gpu_queue_scaler.cli.options import Subcommands


def _demo(args: argparse.Namespace) -> int:
    from gpu_queue_scaler_bench.demo import run_demo

    logs.setup("warning", "text")
    return run_demo(
        trace=args.trace,
        scale=args.scale,
        cold_start_s=args.cold_start,
        duration_s=args.duration,
        plots=None if args.plots == "off" else args.plots,
        progress=not args.no_progress,
    )


def register(sub: Subcommands) -> None:
    from gpu_queue_scaler_bench.demo import DEMO_COLD_START_S, DEMO_PLOTS, DEMO_SCALE, DEMO_TRACE

    demo = sub.add_parser(
        "demo",
        help="replay a bundled real trace on a simulated GPU fleet under seven autoscaling "
        "policies and print the SLO / GPU-hours table (the figures in docs/bench.md)",
    )
    demo.add_argument(
        "--trace", default=str(DEMO_TRACE), metavar="FILE", help="default: %(default)s"
    )
    demo.add_argument("--scale", type=float, default=DEMO_SCALE, help="default %(default)s")
    demo.add_argument(
        "--cold-start",
        type=float,
        default=DEMO_COLD_START_S,
        metavar="S",
        help="default %(default)s",
    )
    demo.add_argument("--duration", type=float, metavar="S", help="only the first S seconds")
    demo.add_argument(
        "--plots",
        default=DEMO_PLOTS,
        metavar="DIR",
        help="PNG plots, or 'off' (default %(default)s)",
    )
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=_demo)
