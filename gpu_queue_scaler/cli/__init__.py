"""`scaler` command line: serve, check, check-config, signals, explain, demo, bench, reference."""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from collections.abc import Sequence

from gpu_queue_scaler.cli import check, companion, explain, reference, serve, signals
from gpu_queue_scaler.cli.options import Subcommands
from gpu_queue_scaler.version import version

# Each module adds its own sub-command(s); this order is the order `scaler --help` lists them.
BUILT_IN = (serve, check, signals, explain, companion, reference)

# Other distributions add commands here: each entry point names a `register(subparsers)`, and
# its name is the command it adds (so a missing one can be named when the user asks for it).
PLUGIN_GROUP = "gpu_queue_scaler.commands"


def _register_plugins(sub: Subcommands) -> list[str]:
    """Register the installed plugins' commands; return the names whose code is not installed.

    The runtime image ships the product alone: a plugin declared in its metadata whose module is
    absent is skipped, so the image's own commands still run.
    """
    missing = []
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            register = entry.load()
        except ModuleNotFoundError:
            missing.append(entry.name)
            continue
        register(sub)
    return missing


def _built_in() -> tuple[argparse.ArgumentParser, Subcommands]:
    """The top parser with the built-in commands, and its sub-parsers for the plugins' ones."""
    top = argparse.ArgumentParser(prog="scaler", description=__doc__)
    top.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = top.add_subparsers(dest="command", required=True)
    for module in BUILT_IN:
        module.register(sub)
    return top, sub


def parser() -> argparse.ArgumentParser:
    """The top parser with every command, the plugins' too."""
    top, sub = _built_in()
    _register_plugins(sub)
    return top


# 128 + SIGPIPE: what a shell reports for a command whose reader went away (`| head -1`).
BROKEN_PIPE_EXIT = 141


def main(argv: Sequence[str] | None = None) -> int:
    try:
        given = sys.argv[1:] if argv is None else list(argv)
        # The top parser has options only before the command: the first word is the command.
        command = next((word for word in given if not word.startswith("-")), None)
        top, sub = _built_in()
        # A built-in command given first runs without the plugins: their entry points are read
        # (and their modules imported) only for another command, or for a top-level option
        # before it (`scaler --help [serve]` lists them all).
        built_in = command in sub.choices and given[:1] == [command]
        if not built_in and command in _register_plugins(sub):
            print(
                f"scaler: '{command}' comes with the measuring package, which is not "
                "installed here",
                file=sys.stderr,
            )
            return 2
        args = top.parse_args(given)  # --help prints too
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
