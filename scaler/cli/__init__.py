"""`scaler` command line: serve, check, check-config, signals, explain, demo, bench, reference."""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
from collections.abc import Sequence

from scaler import logs
from scaler.version import version


def _serve(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from scaler.config import ConfigError, load_config_file
    from scaler.config_watch import ConfigStore
    from scaler.server import ScalerServer, serve
    from scaler.tls import TlsFiles

    logs.setup(args.log_level, args.log_format)
    tls_flags = [args.tls_cert, args.tls_key, args.tls_client_ca]
    if args.insecure_plaintext and any(tls_flags):
        print("scaler serve: --insecure-plaintext contradicts --tls-* flags", file=sys.stderr)
        return 2
    if not args.insecure_plaintext and not (args.tls_cert and args.tls_key):
        print(
            "scaler serve: the gRPC port needs TLS: pass --tls-cert FILE and --tls-key FILE "
            "(and --tls-client-ca FILE to require client certificates), or --insecure-plaintext "
            "to serve it unauthenticated",
            file=sys.stderr,
        )
        return 2
    tls = None
    if args.insecure_plaintext:
        logging.getLogger("scaler.cli").warning(
            "--insecure-plaintext: the gRPC port is unencrypted and unauthenticated; anyone who "
            "can reach it can call the scaler",
            extra={"event": "insecure_plaintext"},
        )
    else:
        tls = TlsFiles(
            Path(args.tls_cert),
            Path(args.tls_key),
            Path(args.tls_client_ca) if args.tls_client_ca else None,
        )
    try:
        config = load_config_file(args.config) if args.config else None
    except ConfigError as exc:
        for problem in exc.problems:
            print(f"{exc.source}: {problem}", file=sys.stderr)
        print("refusing to start with an invalid config", file=sys.stderr)
        return 2
    store = ConfigStore(config, args.config)
    metrics = None if args.metrics_address == "off" else args.metrics_address

    async def run() -> int:  # the gRPC server must be created inside the running loop
        server = ScalerServer(
            store,
            args.address,
            metrics_address=metrics,
            drain_s=args.drain_seconds,
            tls=tls,
            health_address=args.health_address,
        )
        return await serve(server)

    try:
        return asyncio.run(run())
    except (ValueError, OSError) as exc:
        print(f"scaler serve: {exc}", file=sys.stderr)
        return 2


def _check_config(args: argparse.Namespace) -> int:
    from scaler.config import ConfigError, load_config_file

    failed = False
    for path in args.files:
        try:
            config = load_config_file(path)
        except ConfigError as exc:
            failed = True
            for problem in exc.problems:
                print(f"{path}: {problem}")
            continue
        print(f"{path}: ok ({len(config.profiles)} profiles)")
    return 1 if failed else 0


def _check(args: argparse.Namespace) -> int:
    from scaler.check import run

    return run(args.files, args.config, args.scaler_address or "")


def _demo(args: argparse.Namespace) -> int:
    from scaler.demo import run_demo

    logs.setup("warning", "text")
    return run_demo(
        trace=args.trace,
        scale=args.scale,
        cold_start_s=args.cold_start,
        duration_s=args.duration,
        plots=None if args.plots == "off" else args.plots,
        progress=not args.no_progress,
    )


def _positive_price(text: str) -> float:
    """A price in USD: a finite number above 0 (argparse names the flag on error)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a price in USD above 0, got {text!r}")
    return value


def _metadata(items: list[str]) -> dict[str, str] | None:
    """`--metadata KEY=VALUE` options as a dict, or None (after saying which is malformed)."""
    metadata = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"--metadata {item!r}: expected KEY=VALUE", file=sys.stderr)
            return None
        metadata[key] = value
    return metadata


# `scaler signals` fails (exit 1) when none of these was read: nothing to size a fleet from.
NO_SIGNAL_WITHOUT = ("waiting", "running", "arrival_rate")


def _signals(args: argparse.Namespace) -> int:
    """Read a workload's signals once, exactly as the server would, and print them; exit 1
    when there is no signal (no pod answered, Prometheus down, no series)."""
    import json
    import time

    from scaler.config import Config, ConfigError, load_config_file
    from scaler.sources import SourceError, Sources
    from scaler.trigger import TriggerError, parse_trigger
    from scaler.workload import ResolveError, resolve

    metadata = _metadata(args.metadata)
    if metadata is None:
        return 2
    try:
        config = load_config_file(args.config) if args.config else Config()
        spec = resolve(parse_trigger(args.namespace, args.name, metadata), config)
    except (ConfigError, TriggerError, ResolveError) as exc:
        print(f"scaler signals: {exc}", file=sys.stderr)
        return 2

    async def read() -> tuple[dict[str, object], str | None]:
        """The signal's fields, and why there is no signal at all (None when there is one)."""
        sources = Sources()
        try:
            source = sources(spec)
            if spec.signal_source == "scrape":  # counters need two scrapes to become rates
                await source.read(spec, time.time())
                await asyncio.sleep(args.interval)
            signal = await source.read(spec, time.time())
        except SourceError as exc:
            return {"source": spec.signal_source, "reasons": [str(exc)]}, str(exc)
        finally:
            await sources.close()
        found = signal._asdict()
        if all(found[key] is None for key in NO_SIGNAL_WITHOUT):
            return found, f"no queue signal: {', '.join(NO_SIGNAL_WITHOUT)} all missing"
        return found, None

    found, failed = asyncio.run(read())
    if args.json:
        print(json.dumps(found))
    else:
        for key, value in found.items():
            if key == "reasons":
                for reason in value or []:  # type: ignore[attr-defined]
                    print(f"  missing: {reason}")
            else:
                print(f"{key:>18}: {'missing' if value is None else value}")
    if failed is not None:  # e.g. no pod answered: a script must not read this as success
        print(f"scaler signals: {failed}", file=sys.stderr)
        return 1
    return 0


def _explain(args: argparse.Namespace) -> int:
    """Print a running scaler's latest decision for NAMESPACE/NAME (from its /decisions)."""
    import json
    import urllib.error
    import urllib.parse
    import urllib.request

    if args.workload.count("/") != 1:
        print("scaler explain: expected NAMESPACE/NAME", file=sys.stderr)
        return 2
    query = urllib.parse.urlencode({"workload": args.workload})
    url = f"{args.address.rstrip('/')}/decisions?{query}"
    try:
        with urllib.request.urlopen(url, timeout=args.timeout) as response:  # noqa: S310
            found = json.loads(response.read())["decisions"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            print(f"scaler explain: {url}: HTTP {exc.code}", file=sys.stderr)
            return 1
        found = []
    except (urllib.error.URLError, OSError, ValueError, KeyError) as exc:
        print(f"scaler explain: cannot read {url}: {exc}", file=sys.stderr)
        return 1
    if not found:
        print(
            f"{args.workload}: no decision (KEDA has not asked about it, or it is not served here)"
        )
        return 1
    if args.json:
        print(json.dumps(found))
        return 0
    for d in found:
        state = "active" if d["active"] else "inactive"
        print(f"{d['workload']} [{d['metric']}] -> {d['replicas']} replicas, {state}")
        print(f"  reason: {d['reason']}: {d['detail']}")
        print(f"  decision {d['decision_id']} at {d['at']:.0f}")
        for fault in d["faults"]:
            print(f"  fault: {fault}")
        signal = d.get("signal") or {}
        for key in ("waiting", "running", "arrival_rate", "queue_time_p99_s", "kv_cache_usage"):
            if key in signal:
                shown = "missing" if signal[key] is None else f"{signal[key]:.3g}"
                print(f"  {key}: {shown}")
    return 0


def _reference(args: argparse.Namespace) -> int:
    from scaler.reference import markdown

    print(markdown())
    return 0


def _bench_forecast(args: argparse.Namespace) -> int:
    """Score forecasters on a recorded trace, walking forward (see scaler.bench.forecast)."""
    import json

    from scaler.bench.forecast import parse_horizons, parse_models, run_bench
    from scaler.traces import TraceError, load_trace

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


def _bench_replay(args: argparse.Namespace) -> int:
    """Replay a trace against a simulated fleet under every policy (see scaler.sim)."""
    from scaler.sim.command import ReplayOptions, replay

    metadata = _metadata(args.metadata)
    if metadata is None:
        return 2
    return replay(
        ReplayOptions(
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
        )
    )


def _bench_loadgen(args: argparse.Namespace) -> int:
    """Replay a trace against a real OpenAI-compatible or Triton endpoint (scaler.bench.loadgen)."""
    from scaler.bench.loadgen import options_from, run_command

    return run_command(options_from(args), as_json=args.json)


def _bench_load(args: argparse.Namespace) -> int:
    """N ScaledObjects polled like KEDA against the real server and a floor (scaler.bench.load)."""
    from scaler.bench.load import options_from, run_command

    return run_command(options_from(args), as_json=args.json)


def _companion(args: argparse.Namespace) -> int:
    """The Karpenter companion: the scaler's forecasts -> GPU node capacity."""
    from scaler.companion.run import command

    return command(args)


def _companion_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    import os

    from scaler.companion.kube import KubeSettings
    from scaler.companion.model import CompanionConfig

    k, c = KubeSettings(namespace="", identity=""), CompanionConfig()
    cp = sub.add_parser(
        "companion",
        help="Karpenter companion: pre-warm GPU NodePools from the scaler's forecasts "
        "(placeholder pods, peak disruption budgets, off-hours GPU limit) and pack "
        "scale-downs onto fewer nodes (pod-deletion-cost)",
    )
    cp.add_argument(
        "--scaler-url",
        default="http://127.0.0.1:9090",
        help="the scaler's metrics address, serving /decisions (default %(default)s)",
    )
    cp.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "default"),
        help="the companion's namespace: Lease and placeholders (default $POD_NAMESPACE or "
        "%(default)s)",
    )
    cp.add_argument(
        "--interval", type=float, default=15.0, metavar="S", help="between passes (default 15)"
    )
    cp.add_argument("--dry-run", action="store_true", help="print the writes, send none")
    cp.add_argument("--once", action="store_true", help="one pass, then exit")
    cp.add_argument("--lease-name", default=k.lease_name, help="default %(default)s")
    cp.add_argument(
        "--lease-duration",
        type=int,
        default=k.lease_duration_s,
        metavar="S",
        help="default %(default)s",
    )
    cp.add_argument("--identity", help="leader-election identity (default $HOSTNAME)")
    cp.add_argument("--placeholder-image", default=k.placeholder_image, help="default %(default)s")
    cp.add_argument("--priority-class", default=k.priority_class, help="default %(default)s")
    cp.add_argument("--placeholder-toleration-key", default=k.taint_key, help="default %(default)s")
    cp.add_argument(
        "--event-namespace", default=k.event_namespace, help="NodePool Events (default %(default)s)"
    )
    cp.add_argument(
        "--metrics-port", type=int, default=9091, help="own /metrics port, 0: off (default 9091)"
    )
    cp.add_argument("--kubeconfig", help="default: in-cluster config, else ~/.kube/config")
    cp.add_argument("--decisions-timeout", type=float, default=5.0, metavar="S")
    cp.add_argument(
        "--placeholder-gpus",
        type=int,
        default=c.placeholder_gpus,
        help="GPUs per placeholder pod (default %(default)s); existing placeholders of another "
        "size are resized",
    )
    cp.add_argument("--max-placeholders", type=int, default=c.max_placeholders)
    cp.add_argument("--peak-rise-fraction", type=float, default=c.peak_rise_fraction)
    cp.add_argument("--peak-hold", type=float, default=c.peak_hold_s, metavar="S")
    cp.add_argument("--active-hours", metavar="START-END", help="UTC hours; outside: GPU limit 0")
    cp.add_argument("--stale-after", type=float, default=c.stale_after_s, metavar="S")
    cp.add_argument(
        "--no-pack",
        action="store_true",
        help="do not set controller.kubernetes.io/pod-deletion-cost on the workloads' pods "
        "(default: each pod's cost = the GPU pods on its node, so a scale-down empties the "
        f"least-used node first and Karpenter can remove it; at most {c.pack_max_writes} pod "
        "patches per pass; it only orders deletions the HPA decided, never adds one)",
    )
    cp.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    cp.add_argument("--log-format", default="json", choices=["json", "text"])
    cp.set_defaults(run=_companion)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="scaler", description=__doc__)
    top.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = top.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the KEDA external scaler gRPC server")
    serve.add_argument(
        "--address", default="0.0.0.0:6000", help="gRPC HOST:PORT (default %(default)s)"
    )
    serve.add_argument(
        "--metrics-address",
        default="0.0.0.0:9090",
        help="Prometheus /metrics HOST:PORT, or 'off' (default %(default)s)",
    )
    serve.add_argument(
        "--health-address",
        metavar="HOST:PORT",
        help="also serve grpc.health.v1 alone, in plaintext, here: for Kubernetes' gRPC probes, "
        "which cannot use TLS (default: none)",
    )
    serve.add_argument("--tls-cert", metavar="FILE", help="server certificate chain (PEM)")
    serve.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    serve.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="CA bundle (PEM): require a client certificate signed by it (mTLS). The three files "
        "are reloaded when their content changes, without a restart",
    )
    serve.add_argument(
        "--insecure-plaintext",
        action="store_true",
        help="serve the gRPC port without TLS (unauthenticated; required when no --tls-cert)",
    )
    serve.add_argument("--config", help="tuning YAML (the mounted ConfigMap); reloaded on change")
    serve.add_argument(
        "--drain-seconds",
        type=float,
        default=3.0,
        help="on SIGTERM, keep answering (health NOT_SERVING) this long before stopping "
        "(default %(default)s)",
    )
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument("--log-format", default="json", choices=["json", "text"])
    serve.set_defaults(run=_serve)

    check = sub.add_parser(
        "check-config", help="validate tuning YAML files; non-zero on any problem"
    )
    check.add_argument("files", nargs="+", metavar="FILE")
    check.set_defaults(run=_check_config)
    lint = sub.add_parser(
        "check",
        help="lint manifests before applying them: ScaledObjects (KEDA's schema, the trigger "
        "metadata and tuning, the KEDA settings this scaler needs), the scaler's ConfigMap, "
        "config files; exit 1 on a problem, 2 on a file that is not YAML",
    )
    lint.add_argument("files", nargs="+", metavar="FILE", help="YAML, multi-document; - for stdin")
    lint.add_argument(
        "--config",
        metavar="FILE",
        help="the tuning config (the ConfigMap's config.yaml) to resolve triggers against "
        "(default: the first ConfigMap or config file among FILE)",
    )
    lint.add_argument(
        "--scaler-address",
        metavar="HOST:PORT",
        help="check only the external triggers whose scalerAddress is this (default: every "
        "external and external-push trigger)",
    )
    lint.set_defaults(run=_check)

    from scaler.demo import DEMO_COLD_START_S, DEMO_PLOTS, DEMO_SCALE, DEMO_TRACE

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
    sig = sub.add_parser(
        "signals", help="read a workload's signals once, as the server would, and print them"
    )
    sig.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="a trigger key"
    )
    sig.add_argument("--namespace", default="default", help="the ScaledObject's namespace")
    sig.add_argument("--name", default="workload", help="the ScaledObject's name")
    sig.add_argument("--config", help="tuning YAML for profiles and defaults")
    sig.add_argument("--json", action="store_true", help="one JSON object")
    sig.add_argument(
        "--interval",
        type=float,
        default=1.0,
        help="direct scrape: seconds between the two scrapes that make rates (default 1)",
    )
    sig.set_defaults(run=_signals)

    explain = sub.add_parser(
        "explain", help="print a running scaler's latest decision for NAMESPACE/NAME"
    )
    explain.add_argument("workload", metavar="NAMESPACE/NAME")
    explain.add_argument(
        "--address",
        default="http://127.0.0.1:9090",
        help="the scaler's metrics address (default %(default)s)",
    )
    explain.add_argument("--json", action="store_true", help="the decisions as JSON")
    explain.add_argument("--timeout", type=float, default=5.0, help="seconds (default 5)")
    explain.set_defaults(run=_explain)

    _companion_parser(sub)

    ref = sub.add_parser("reference", help="print the settings reference (Markdown)")
    ref.set_defaults(run=_reference)

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
    return top


# 128 + SIGPIPE: what a shell reports for a command whose reader went away (`| head -1`).
BROKEN_PIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)  # --help prints too
        code: int = args.run(args)
        sys.stdout.flush()  # here, so a reader that went away is seen inside the try
    except BrokenPipeError:
        # The reader closed the pipe (`scaler reference | head -1`): not an error to report.
        # Point stdout at /dev/null, so the interpreter's own flush at exit fails no more.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return BROKEN_PIPE_EXIT
    return code


if __name__ == "__main__":
    sys.exit(main())
