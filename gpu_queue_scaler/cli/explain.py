"""`scaler explain`: a running scaler's latest decision for one workload, from its /decisions."""

from __future__ import annotations

import argparse
import sys

from gpu_queue_scaler.cli.options import Subcommands


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
        if d.get("headroom") is not None:  # a scaler older than the closed loop's export has none
            late = d.get("late_share")
            read = "not measured" if late is None else f"{late:.1%}"
            print(
                f"  closed loop: headroom x{d['headroom']:.2f} "
                f"(x{d.get('headroom_surge') or 1.0:.2f} of it from a surge), late share {read}"
            )
        for fault in d["faults"]:
            print(f"  fault: {fault}")
        signal = d.get("signal") or {}
        for key in ("waiting", "running", "arrival_rate", "queue_time_p99_s", "kv_cache_usage"):
            if key in signal:
                shown = "missing" if signal[key] is None else f"{signal[key]:.3g}"
                print(f"  {key}: {shown}")
    return 0


def register(sub: Subcommands) -> None:
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
