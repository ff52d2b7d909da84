"""Sources read metrics (I/O) and return `Signal`s; nothing else in the scaler does I/O on them."""

from __future__ import annotations

from typing import Protocol

from scaler.signals import Signal
from scaler.workload import WorkloadSpec


class SourceError(RuntimeError):
    """Nothing could be read for this workload; the message says why (shown to operators)."""


class Source(Protocol):
    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        """The workload's signal at wall time `at` (the latest available for live sources)."""
        ...

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        """Signals on the grid start, start+step, ... < end, for warm start; [] if unknown."""
        ...


class Unavailable:
    """The source for a backend that this build cannot read: every read fails with the reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        raise SourceError(self.reason)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return []


def source_for(backend: str) -> Source:
    """The source that reads a backend's signals."""
    from scaler.sources.synthetic import SyntheticSource

    if backend == "synthetic":
        return SyntheticSource()
    return Unavailable(
        f"backend {backend!r}: the Prometheus and direct-scrape sources are not in this "
        "release yet (tracked in the signals issue); use backend synthetic"
    )
