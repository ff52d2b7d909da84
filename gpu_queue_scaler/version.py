"""The installed package's version, from its metadata: one source of truth (pyproject.toml), read
by `scaler --version` and the `queue_scaler_build_info` metric."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "gpu-queue-scaler"


def version() -> str:
    """The installed distribution's version; "0+unknown" when run from a tree never installed
    (no metadata), so that a missing install never stops the server."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "0+unknown"
