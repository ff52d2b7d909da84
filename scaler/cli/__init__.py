"""`scaler` command line: serve, check, check-config, signals, explain, demo, bench, reference."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from scaler.cli import bench, check, companion, demo, explain, reference, serve, signals
from scaler.version import version

# Each module adds its own sub-command(s); this order is the order `scaler --help` lists them.
BUILT_IN = (serve, check, demo, signals, explain, companion, reference, bench)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="scaler", description=__doc__)
    top.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = top.add_subparsers(dest="command", required=True)
    for module in BUILT_IN:
        module.register(sub)
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
