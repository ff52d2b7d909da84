"""`scaler check-config` and `scaler check`: lint tuning files and manifests before applying."""

from __future__ import annotations

import argparse

from gpu_queue_scaler.cli.options import Subcommands


def _check_config(args: argparse.Namespace) -> int:
    """Exit 0 when every file is a valid config, 1 on a problem in one, 2 when one cannot be
    read or is not YAML, as `scaler check` exits."""
    from gpu_queue_scaler.settings.config import (
        ConfigError,
        load_yaml_documents,
        parse_documents,
        read_config_bytes,
    )

    failed = unreadable = False
    for path in args.files:
        try:
            documents = load_yaml_documents(read_config_bytes(path), path)
        except ConfigError as exc:
            unreadable = True
            for problem in exc.problems:
                print(f"{path}: {problem}")
            continue
        try:
            config = parse_documents(documents, path)
        except ConfigError as exc:
            failed = True
            for problem in exc.problems:
                print(f"{path}: {problem}")
            continue
        print(f"{path}: ok ({len(config.profiles)} profiles)")
    return 2 if unreadable else 1 if failed else 0


def _check(args: argparse.Namespace) -> int:
    from gpu_queue_scaler.settings.check import run

    return run(args.files, args.config, args.scaler_address or "")


def register(sub: Subcommands) -> None:
    check = sub.add_parser(
        "check-config",
        help="validate tuning YAML files; exit 1 on a problem, 2 on a file that cannot be read "
        "or is not YAML",
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
