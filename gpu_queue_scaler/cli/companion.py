"""`scaler companion`: the Karpenter companion's flags, their defaults taken from its settings."""

from __future__ import annotations

import argparse
import os

from gpu_queue_scaler.cli.options import Subcommands


def _companion(args: argparse.Namespace) -> int:
    """The Karpenter companion: the scaler's forecasts -> GPU node capacity."""
    from gpu_queue_scaler.companion.run import command

    return command(args)


def register(sub: Subcommands) -> None:
    from gpu_queue_scaler.companion.kube import KubeSettings
    from gpu_queue_scaler.companion.model import CompanionConfig

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
