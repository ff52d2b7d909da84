"""What several sub-commands share: the sub-parsers type and `--metadata KEY=VALUE` parsing."""

from __future__ import annotations

import argparse
import sys
from typing import TypeAlias

# What `register(sub)` receives: the top parser's sub-parsers, to `add_parser` a command to.
Subcommands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def parse_metadata(items: list[str]) -> dict[str, str] | None:
    """`--metadata KEY=VALUE` options as a dict, or None (after saying which is malformed)."""
    metadata = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"--metadata {item!r}: expected KEY=VALUE", file=sys.stderr)
            return None
        metadata[key] = value
    return metadata
