"""The default decision on every replay case, fast: always-on, the scaler and the oracle only.

Usage: python bench/decision_cases.py [--seed 0 | --seeds 0,1,2] [--cold-start 180]
       [--cases conv,code,...] [--metadata KEY=VALUE ...] [--jobs 2]

`bench/run_replay_all.sh` runs every policy (the KEDA and reactive-bound sweeps, the companion
rows) on every case at two cold starts, in about half an hour; a change to the decision is judged
first on the scaler row alone, against the same oracle and always-on fleet, on the same cases.
The cases are read from that script (its CASES lines), so the two never disagree. It prints,
per case, the scaler's SLO attainment and GPU-hours, and their ratio to the oracle's GPU-hours
(the baseline, run in the same process on the same requests), then the mean attainment and
ratio over the traces that never idle (idle-bursts is a scale-from-zero case, judged apart).
With `--seeds` every case runs at each seed (the seed draws each request's prompt and output
lengths, so the same arrivals carry other work): a table per seed, then each case's mean over the
seeds. Which node a swing of the need launches or releases moves one trace by several percent
from one seed to the next, so a change to the decision is judged on more than one.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import shlex
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

from gpu_queue_scaler.cli import parser as cli_parser
from gpu_queue_scaler.cli.options import parse_metadata
from gpu_queue_scaler_bench.cli.bench import replay_options
from gpu_queue_scaler_bench.sim.command import ReplayOptions, load_requests, sim_config
from gpu_queue_scaler_bench.sim.report import measure
from gpu_queue_scaler_bench.sim.run import run_bench

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "run_replay_all.sh"
T = TypeVar("T")
IDLE = "idle-bursts"  # never in the mean: it idles between bursts


def cases() -> dict[str, ReplayOptions]:
    """name -> the replay's options for each of run_replay_all.sh's CASES lines, parsed by the
    `scaler bench replay` parser itself, so a case reads here as the script runs it."""
    top = cli_parser()
    found = {}
    for path, args in re.findall(r'^\s*"([^"|]+)\|([^"]*)"', SCRIPT.read_text(), re.MULTILINE):
        parsed = top.parse_args(
            ["bench", "replay", "--trace", str(ROOT / path), *shlex.split(args)]
        )
        found[Path(path).stem] = replay_options(parsed, {})
    if not found:
        raise SystemExit(f"no CASES lines found in {SCRIPT}")
    return found


def pick(name: str, known: list[str]) -> str:
    """The one case `name` names, exactly or as a unique part of it (`_conv`, `deepseek`)."""
    found = [k for k in known if name == k] or [k for k in known if name in k]
    if len(found) != 1:
        raise SystemExit(f"case {name!r} matches {found or 'none'}; known: {', '.join(known)}")
    return found[0]


def run_case(
    name: str, options: ReplayOptions
) -> tuple[str, dict[str, tuple[float, float]], float]:
    cfg = dataclasses.replace(sim_config(options), policies=("always-on", "scaler", "oracle"))
    started = time.monotonic()
    result = run_bench(load_requests(options), cfg, options.scale)
    out = {}
    for run in result.runs:
        m = measure(run, cfg.slo_s)
        out[run.name] = (m.slo_attainment, m.gpu_hours)
    return name, out, time.monotonic() - started


def case_parser(description: str, known: dict[str, ReplayOptions]) -> argparse.ArgumentParser:
    """The options every per-case bench script takes (`chosen` reads them)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cold-start", type=float, default=180.0)
    parser.add_argument("--cases", default=",".join(known), help=f"of: {', '.join(known)}")
    parser.add_argument("--jobs", type=int, default=2, help="cases run side by side")
    return parser


def chosen(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    known: dict[str, ReplayOptions],
    metadata: dict[str, str] | None = None,
    seed: int | None = None,
) -> dict[str, ReplayOptions]:
    """The cases --cases names, at --seed (or `seed`) and --cold-start (and the scaler's extra
    metadata)."""
    names = [n for n in args.cases.split(",") if n]
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(known)}")
    picked = {
        n: dataclasses.replace(
            known[n], seed=args.seed if seed is None else seed, cold_start_s=args.cold_start
        )
        for n in names
    }
    if metadata is None:
        return picked
    return {n: dataclasses.replace(o, metadata=metadata) for n, o in picked.items()}


def run_all(
    run: Callable[[str, ReplayOptions], T], cases: dict[str, ReplayOptions], jobs: int
) -> list[T]:
    """`run` on every case, `jobs` side by side (each in its own process), in the cases' order."""
    with ProcessPoolExecutor(max(1, jobs)) as pool:
        futures = [pool.submit(run, n, options) for n, options in cases.items()]
        return [f.result() for f in futures]


def main() -> None:
    known = cases()
    parser = case_parser(__doc__.splitlines()[0], known)
    parser.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--seeds", help="several seeds, comma separated (overrides --seed)")
    parser.add_argument(
        "--no-kv-preemption",
        action="store_true",
        help="serve the simulated pods' KV overflow for free (the replay's --no-kv-preemption)",
    )
    args = parser.parse_args()
    meta = parse_metadata(args.metadata)
    if meta is None:
        sys.exit(2)
    seeds = seed_list(parser, args.seeds) if args.seeds else [args.seed]
    by_case: dict[str, list[dict[str, tuple[float, float]]]] = {}
    for seed in seeds:
        picked = chosen(parser, args, known, meta, seed)
        if args.no_kv_preemption:
            picked = {n: dataclasses.replace(o, preemption=False) for n, o in picked.items()}
        results = run_all(run_case, picked, args.jobs)
        print(
            f"seed {seed}, cold start {args.cold_start:g} s, metadata {meta or 'none'}"
            f"{', no KV preemption' if args.no_kv_preemption else ''}"
        )
        table(results)
        for name, out, _ in results:
            by_case.setdefault(name, []).append(out)
        print()
    if len(seeds) > 1:
        print(f"mean over seeds {', '.join(map(str, seeds))}")
        table([(name, mean_out(outs), 0.0) for name, outs in by_case.items()], wall=False)


def seed_list(parser: argparse.ArgumentParser, text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds takes whole numbers separated by commas, not {text!r}")
    if not seeds:
        parser.error("--seeds: name at least one seed")
    return seeds


def mean_out(outs: list[dict[str, tuple[float, float]]]) -> dict[str, tuple[float, float]]:
    """Each policy's attainment and GPU-hours averaged over the seeds' runs."""
    return {
        policy: (
            sum(o[policy][0] for o in outs) / len(outs),
            sum(o[policy][1] for o in outs) / len(outs),
        )
        for policy in outs[0]
    }


def table(rows: list[tuple[str, dict[str, tuple[float, float]], float]], wall: bool = True) -> None:
    """The per-case table, and the mean over the traces that never idle."""
    print("| case | scaler | / oracle GPU-h | oracle | always-on |" + (" wall s |" if wall else ""))
    print("|---|--:|--:|--:|--:|" + ("--:|" if wall else ""))
    attained, ratios = [], []
    for name, out, seconds in rows:
        (sa, sg), (oa, og), (fa, fg) = out["scaler"], out["oracle"], out["always-on"]
        print(
            f"| {name} | {sa:.4f} / {sg:.2f} | {sg / og:.3f}x | {oa:.4f} / {og:.2f} "
            f"| {fa:.4f} / {fg:.2f} |" + (f" {seconds:.0f} |" if wall else "")
        )
        if name != IDLE:
            attained.append(sa)
            ratios.append(sg / og)
    if attained:
        n = len(attained)
        print(
            f"mean of {n} (all but {IDLE}): attainment {sum(attained) / n:.4f}, "
            f"GPU-h / oracle {sum(ratios) / n:.3f}"
        )


if __name__ == "__main__":
    main()
