"""Assemble and run the gRPC server: scaler service, health, reflection, /metrics, reload, signals.

Shutdown on SIGTERM/SIGINT, in this order: health turns NOT_SERVING and the server keeps answering
for `--drain-seconds` (while Kubernetes removes the pod from the Service and KEDA's resolver moves
to the other replica), open streams end with OK (KEDA reconnects elsewhere), in-flight unary calls
finish within the grace period, the per-workload loops stop, and the process exits 0. Calls that
arrive after the drain are refused by gRPC (UNAVAILABLE or CANCELLED) and KEDA retries them.
A loop that does not stop within STOP_LOOPS_S (a bug) is logged (`stop_timeout`) and the process
exits 1 instead of hanging until Kubernetes kills it.

Transport: TLS or mTLS with certificates reloaded on change when `tls` is given
(gpu_queue_scaler/serve/tls.py), else plaintext (the CLI allows that only with
`--insecure-plaintext`; in-process users such as the tests and the simulator listen on loopback).
`health_address` adds a plaintext port serving only grpc.health.v1, for Kubernetes' gRPC probes,
which cannot speak TLS.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Callable
from urllib.parse import urlsplit

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client import REGISTRY, CollectorRegistry

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from gpu_queue_scaler.engine import Engine
from gpu_queue_scaler.serve.http import HttpEndpoint
from gpu_queue_scaler.serve.service import ExternalScalerService, RejectUndecodable
from gpu_queue_scaler.serve.tls import CertificateReloader, TlsFiles
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.trigger import TriggerCache
from gpu_queue_scaler.telemetry import DecisionCollector

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ExternalScaler"].full_name
CONFIG_POLL_S = 2.0
STOP_LOOPS_S = 10.0
# The cyclic GC's thresholds in the serve process (CPython's default: 700, 10, 10). What the
# workload loops keep (each workload's latest decision, state, signal and the timer it sleeps
# on: ~20 objects an evaluation, freed a tick later) is freed about as fast as it is made, so the
# young generation's count, allocations minus deallocations, hardly moves while the objects in it
# pile up: at 700, a young collection walked the objects of seconds of evaluations, long enough to
# be the RPCs' p99 with 1,000 workloads. The RPCs' cyclic garbage (grpc.aio's per-call handler
# lookup) is what moves the count, so a low threshold means frequent short collections and, every
# 5, a middle one: the same total work in short pieces. Full collections, which walk all that is
# not frozen, come after 100 middle ones at the earliest. The figures: `scaler bench load`,
# docs/bench.md ("1,000 ScaledObjects polled like KEDA").
GC_THRESHOLDS = (200, 5, 100)
# gRPC sets SO_REUSEPORT on its listening sockets by default: a second `scaler serve` on a port in
# use would bind as well, log `serving`, and the kernel would split KEDA's connections between the
# two processes. Off, binding a port in use fails and the server refuses to start.
GRPC_OPTIONS = (("grpc.so_reuseport", 0),)


def tune_gc() -> None:
    """Before serving: move what is loaded by now (modules, classes, the gRPC stack: most of the
    heap) out of the collector's reach with gc.freeze, so a full collection walks only what the
    workloads hold, and set GC_THRESHOLDS.
    Nothing frozen here is ever garbage: it lives as long as the process."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def split_address(address: str) -> tuple[str, int]:
    """`HOST:PORT` or `[V6]:PORT` -> (host, port); port 0 picks a free one."""
    parts = urlsplit("//" + address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None:
        raise ValueError(f"address {address!r}: expected HOST:PORT, e.g. 0.0.0.0:6000")
    return parts.hostname, port


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen(what: str, address: str, add_port: Callable[[str], int]) -> int:
    """Bind one gRPC port; a port in use (or an address not on this host) is an OSError naming
    it. grpcio raises RuntimeError on a failed bind; older releases returned port 0."""
    host, port = split_address(address)
    try:
        bound = add_port(_bind(host, port))
    except RuntimeError:
        bound = 0
    if bound == 0:
        raise OSError(
            f"cannot listen on {address} ({what}): the port is in use (another scaler?) or the "
            "address is not this host's"
        )
    return bound


class ScalerServer:
    def __init__(
        self,
        store: ConfigStore,
        address: str = "127.0.0.1:0",
        *,
        engine: Engine | None = None,
        metrics_address: str | None = None,
        registry: CollectorRegistry | None = None,
        grace_s: float = 10.0,
        config_poll_s: float = CONFIG_POLL_S,
        drain_s: float = 0.0,
        tls: TlsFiles | None = None,
        health_address: str | None = None,
    ) -> None:
        self.store = store
        self.engine = engine if engine is not None else Engine(store)
        self.address = address
        self.metrics_address = metrics_address
        self.registry = registry if registry is not None else REGISTRY
        self.grace_s = grace_s
        self.config_poll_s = config_poll_s
        self.drain_s = drain_s
        self.tls = tls
        self.health_address = health_address
        self.tls_reloader: CertificateReloader | None = None
        self.health_port = 0
        self._health_server: grpc.aio.Server | None = None
        self._collector: DecisionCollector | None = None
        self.port = 0
        self.metrics_port = 0
        self._shutdown = asyncio.Event()
        self._stopped = asyncio.Event()
        self._stopping = False
        self._server = grpc.aio.server(interceptors=[RejectUndecodable()], options=GRPC_OPTIONS)
        self._health = health.aio.HealthServicer()
        self._tasks: list[asyncio.Task[None]] = []
        self._http: HttpEndpoint | None = None
        self.loops_stopped = True  # False if stop() gave up on workload loops that would not end

    async def start(self) -> None:
        """Bind every port, then serve. A port that cannot be bound raises OSError before
        anything is served, with whatever was bound released."""
        try:
            await self._start()
        except BaseException:
            await self._release()
            raise

    async def _release(self) -> None:
        """Undo a failed start. gRPC closes a bound port only when a started server stops, so a
        server that bound one is started and stopped at once (nothing is SERVING yet)."""
        for server, bound in ((self._server, self.port), (self._health_server, self.health_port)):
            if server is not None and bound:
                await server.start()
            if server is not None:
                await server.stop(None)
        if self._http is not None:
            self._http.stop()
            self._http = None
        if self._collector is not None:
            self.registry.unregister(self._collector)
            self._collector = None

    async def _start(self) -> None:
        split_address(self.address)  # a malformed address is a ValueError before anything binds
        service = ExternalScalerService(self.engine, TriggerCache(), self._shutdown)
        pb_grpc.add_ExternalScalerServicer_to_server(service, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)
        reflection.enable_server_reflection(
            (SERVICE_NAME, health.SERVICE_NAME, reflection.SERVICE_NAME), self._server
        )
        if self.tls is not None:  # first: unusable certificates are a startup error
            self.tls_reloader = CertificateReloader(self.tls)
            credentials = self.tls_reloader.credentials()
            self.port = _listen(
                "gRPC", self.address, lambda at: self._server.add_secure_port(at, credentials)
            )
        else:
            self.port = _listen("gRPC", self.address, self._server.add_insecure_port)
        if self.health_address is not None:
            self._health_server = grpc.aio.server(options=GRPC_OPTIONS)
            health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
            self.health_port = _listen(
                "health", self.health_address, self._health_server.add_insecure_port
            )
        if self.metrics_address is not None:
            mhost, mport = split_address(self.metrics_address)
            try:  # the stdlib server sets SO_REUSEADDR only: a port in use fails here
                self._http = HttpEndpoint(mhost, mport, self.registry, self.engine.decisions)
            except OSError as exc:
                raise OSError(
                    f"cannot listen on {self.metrics_address} (metrics): {exc.strerror or exc}"
                ) from None
            self._collector = DecisionCollector(self.engine.decisions, self.engine.specs)
            self.registry.register(self._collector)
            self._http.start()
            self.metrics_port = self._http.port
        await self._server.start()
        if self._health_server is not None:
            await self._health_server.start()
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        if self.store.path is not None:
            self._tasks.append(
                asyncio.create_task(self.store.watch(self.config_poll_s, self._shutdown))
            )
        log.info(
            "serving",
            extra={
                "event": "serving",
                "port": self.port,
                "metrics_port": self.metrics_port,
                "health_port": self.health_port,
                "transport": self.transport,
                **(
                    {"cert_sha256": self.tls_reloader.fingerprint}
                    if self.tls_reloader is not None
                    else {}
                ),
            },
        )

    @property
    def transport(self) -> str:
        """One of mtls, tls, plaintext."""
        if self.tls is None:
            return "plaintext"
        return "mtls" if self.tls.mutual else "tls"

    async def stop(self) -> None:
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        await self._health.enter_graceful_shutdown()
        if self.drain_s > 0:  # keep answering while endpoints and KEDA's resolver move away
            await asyncio.sleep(self.drain_s)
        self._shutdown.set()
        self.engine.release_watchers()
        await self._server.stop(self.grace_s)
        if self._health_server is not None:
            await self._health_server.stop(0)
        # Bounded: a stuck workload loop must not keep the process from exiting. Not
        # asyncio.wait_for: on timeout it cancels the close and then waits for it to finish,
        # which a loop that ignores cancellation never lets happen.
        closing = asyncio.ensure_future(self.engine.close())
        done, _ = await asyncio.wait({closing}, timeout=STOP_LOOPS_S)
        if not done:
            self.loops_stopped = False
            closing.cancel()
            log.error(
                "workload loops did not stop within %gs",
                STOP_LOOPS_S,
                extra={"event": "stop_timeout"},
            )
        elif closing.exception() is not None:
            log.error("closing the engine failed", exc_info=closing.exception())
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._http is not None:
            self._http.stop()
        if self._collector is not None:
            self.registry.unregister(self._collector)
        self._stopped.set()
        log.info("stopped", extra={"event": "stopped"})


async def serve(server: ScalerServer) -> int:
    """Run until SIGTERM or SIGINT, then shut down gracefully; the exit code."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tune_gc()  # before `serving`: its one full collection is no client's wait
    await server.start()
    await stop.wait()
    log.info("signal received; shutting down", extra={"event": "shutdown"})
    await server.stop()
    if not server.loops_stopped:  # asyncio.run would wait for them forever on the way out
        logging.shutdown()
        os._exit(1)
    return 0
