"""`scaler serve`: the KEDA external scaler gRPC server, TLS unless told otherwise."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gpu_queue_scaler import logs
from gpu_queue_scaler.cli.options import Subcommands


def _serve(args: argparse.Namespace) -> int:
    import logging
    from pathlib import Path

    from gpu_queue_scaler.serve.server import ScalerServer, serve
    from gpu_queue_scaler.serve.tls import TlsFiles
    from gpu_queue_scaler.settings.config import ConfigError, load_config_file
    from gpu_queue_scaler.settings.reload import ConfigStore

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
        logging.getLogger("gpu_queue_scaler.cli").warning(
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


def register(sub: Subcommands) -> None:
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
