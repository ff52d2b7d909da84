"""Sources read metrics (I/O) and return `Signal`s; nothing else in the scaler reads metrics."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from gpu_queue_scaler.signals import Signal

if TYPE_CHECKING:
    from gpu_queue_scaler.settings.spec import WorkloadSpec
    from gpu_queue_scaler.settings.trigger import TriggerSpec
    from gpu_queue_scaler.sources.prometheus import PrometheusSource
    from gpu_queue_scaler.sources.scrape import ScrapeSource


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


def user_key(trigger: TriggerSpec) -> str:
    """How sources name a workload: what they keep for it (windows, last reads) is under this."""
    return f"{trigger.workload}|{trigger.metric_name}"


MAX_PROMETHEUS_SERVERS = 16
"""Distinct Prometheus URLs read at once. Each has its own connection pool and threads (so a hung
one does not hold up the others); every `serverAddress` a trigger names would otherwise cost
threads of its own, and a cluster reads one or a few. A workload naming one more gets a fault
that names this bound, until a URL is released (its last workload gone)."""


class Sources:
    """One source object per kind (and per Prometheus URL), shared by the workloads using it.

    A Prometheus source is counted by the workloads reading it: it is closed (threads and
    connections released) when the last one is released (`release`: its loop ended) or moves to
    another URL. What a source keeps for one workload (a direct scrape's window, a last read) is
    dropped when that workload is released."""

    def __init__(self, discovery: object | None = None) -> None:
        from gpu_queue_scaler.sources.synthetic import SyntheticSource

        self._discovery = discovery
        self._synthetic = SyntheticSource()
        self._scrape: ScrapeSource | None = None
        self._prometheus: dict[str, PrometheusSource] = {}
        self._readers: dict[str, int] = {}  # Prometheus URL -> how many workloads read it
        self._reading: dict[str, str] = {}  # workload -> the Prometheus URL it reads

    def _prometheus_for(self, url: str | None, user: str) -> PrometheusSource | None:
        from gpu_queue_scaler.sources.prometheus import PrometheusSource

        if self._reading.get(user) != url:
            self._drop_reader(user)
        if url is None:
            return None
        if user not in self._reading:  # a new reader of this URL (counted once)
            if url not in self._prometheus:
                if len(self._prometheus) >= MAX_PROMETHEUS_SERVERS:
                    raise SourceError(
                        f"{MAX_PROMETHEUS_SERVERS} Prometheus servers are read already, the most "
                        "one scaler reads at once; this serverAddress is read once one is closed "
                        "(its last workload dropped)"
                    )
                self._prometheus[url] = PrometheusSource(url)
                self._readers[url] = 0
            self._readers[url] += 1
            self._reading[user] = url
        return self._prometheus[url]

    def _drop_reader(self, user: str) -> None:
        url = self._reading.pop(user, None)
        if url is None:
            return
        source = self._prometheus[url]
        source.forget(user)
        self._readers[url] -= 1
        if not self._readers[url]:
            del self._readers[url], self._prometheus[url]
            source.close()

    def __call__(self, spec: WorkloadSpec) -> Source:
        user = user_key(spec.trigger)
        if spec.signal_source == "none":
            self._drop_reader(user)
            return self._synthetic
        if spec.signal_source == "scrape":
            from gpu_queue_scaler.sources.discovery import EndpointSliceDiscovery
            from gpu_queue_scaler.sources.scrape import ScrapeSource

            if self._scrape is None:
                discovery = self._discovery
                if not isinstance(discovery, EndpointSliceDiscovery):
                    discovery = EndpointSliceDiscovery()
                self._scrape = ScrapeSource(discovery)
            return ScrapeWithHistory(self._scrape, self._prometheus_for(spec.server_address, user))
        source = self._prometheus_for(spec.server_address, user)
        if source is None:
            raise SourceError("the Prometheus source needs serverAddress")
        return source

    def release(self, trigger: TriggerSpec) -> None:
        """The workload's loop ended: drop what the sources keep for it, and close a Prometheus
        source it was the last to read."""
        user = user_key(trigger)
        self._drop_reader(user)
        if self._scrape is not None:
            self._scrape.forget(user)

    def __len__(self) -> int:
        """Prometheus sources open (each with its own threads)."""
        return len(self._prometheus)

    async def close(self) -> None:
        for url in list(self._prometheus):
            self._prometheus.pop(url).close()
        self._readers.clear()
        self._reading.clear()
        if self._scrape is not None:
            await self._scrape.close()
