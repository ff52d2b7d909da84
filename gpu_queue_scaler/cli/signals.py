"""`scaler signals`: read a workload's signals once, as the server would."""

from __future__ import annotations

import argparse
import asyncio
import sys

from gpu_queue_scaler.cli.options import Subcommands, parse_metadata

# `scaler signals` fails (exit 1) when none of these was read: nothing to size a fleet from.
NO_SIGNAL_WITHOUT = ("waiting", "running", "arrival_rate")


def _signals(args: argparse.Namespace) -> int:
    """Read a workload's signals once, exactly as the server would, and print them; exit 1
    when there is no signal (no pod answered, Prometheus down, no series)."""
    import json
    import time

    from gpu_queue_scaler.settings.config import Config, ConfigError, load_config_file
    from gpu_queue_scaler.settings.spec import ResolveError, resolve
    from gpu_queue_scaler.settings.trigger import TriggerError, parse_trigger
    from gpu_queue_scaler.sources import SourceError, Sources

    metadata = parse_metadata(args.metadata)
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


def register(sub: Subcommands) -> None:
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
