"""Sources read metrics (I/O) and return `Signal`s; nothing else in the scaler reads metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from scaler.signals import Signal

if TYPE_CHECKING:
    from scaler.sources.prometheus import PrometheusSource
    from scaler.sources.scrape import ScrapeSource
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


class ScrapeWithHistory:
    """Live signals by direct scrape; history, for the warm start, from Prometheus."""

    def __init__(self, live: ScrapeSource, past: PrometheusSource | None) -> None:
        self.live = live
        self.past = past

    async def read(self, spec: WorkloadSpec, at: float) -> Signal:
        return await self.live.read(spec, at)

    async def history(
        self, spec: WorkloadSpec, start: float, end: float, step: float
    ) -> list[Signal]:
        return [] if self.past is None else await self.past.history(spec, start, end, step)


class Sources:
    """One source object per kind (and per Prometheus URL), shared by the workloads using it."""

    def __init__(self, discovery: object | None = None) -> None:
        from scaler.sources.synthetic import SyntheticSource

        self._discovery = discovery
        self._synthetic = SyntheticSource()
        self._scrape: ScrapeSource | None = None
        self._prometheus: dict[str, PrometheusSource] = {}

    def _prometheus_for(self, url: str | None) -> PrometheusSource | None:
        from scaler.sources.prometheus import PrometheusSource

        if url is None:
            return None
        if url not in self._prometheus:
            self._prometheus[url] = PrometheusSource(url)
        return self._prometheus[url]

    def __call__(self, spec: WorkloadSpec) -> Source:
        if spec.signal_source == "none":
            return self._synthetic
        if spec.signal_source == "scrape":
            from scaler.sources.discovery import EndpointSliceDiscovery
            from scaler.sources.scrape import ScrapeSource

            if self._scrape is None:
                discovery = self._discovery
                if not isinstance(discovery, EndpointSliceDiscovery):
                    discovery = EndpointSliceDiscovery()
                self._scrape = ScrapeSource(discovery)
            return ScrapeWithHistory(self._scrape, self._prometheus_for(spec.server_address))
        source = self._prometheus_for(spec.server_address)
        if source is None:
            raise SourceError("the Prometheus source needs serverAddress")
        return source

    async def close(self) -> None:
        if self._scrape is not None:
            await self._scrape.close()
