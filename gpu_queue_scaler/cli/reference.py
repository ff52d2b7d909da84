"""`scaler reference`: the settings reference as Markdown."""

from __future__ import annotations

import argparse

from gpu_queue_scaler.cli.options import Subcommands


def _reference(args: argparse.Namespace) -> int:
    from gpu_queue_scaler.settings.reference import markdown

    print(markdown())
    return 0


def register(sub: Subcommands) -> None:
    ref = sub.add_parser("reference", help="print the settings reference (Markdown)")
    ref.set_defaults(run=_reference)
