"""The KEDA external-scaler gRPC surface: a thin servicer over the engine's decision cache.

The replica target is returned as a metric with AverageValue semantics: `targetSize = 1` and
`metricValue = desired replicas`, so the HPA computes ceil(desired / 1) = desired. GetMetricSpec
depends only on the trigger metadata, never on the ConfigMap or a metrics backend, so it keeps
answering through outages and KEDA's `fallback` can engage (kedacore/keda#8056).

Status codes: INVALID_ARGUMENT for bad trigger metadata (the message names each key and what is
accepted), NOT_FOUND for a metric name this trigger does not serve, FAILED_PRECONDITION for a
trigger that does not fit the ConfigMap (e.g. an unknown profile), UNAVAILABLE while there is no
decision to give (no data yet, or data missing for longer than `staleTargetSeconds`).
INVALID_ARGUMENT too for a request that is not the method's protobuf message at all (`Undecodable`),
and for a name or namespace longer than Kubernetes allows. A status message echoes at most a short
piece of any input and is cut to what fits a status trailer (`bounded`).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from gpu_queue_scaler import telemetry
from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from gpu_queue_scaler.engine import Engine, Fault, NoDecisionError
from gpu_queue_scaler.settings.trigger import (
    PATH_SHOWN,
    TriggerCache,
    TriggerError,
    TriggerSpec,
    cut,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_FAULT_CODES = {
    Fault.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Fault.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}


# gRPC sends the status message in a trailer, percent-encoding every byte outside printable ASCII;
# a client drops trailers over 8-16 KiB and its caller sees RESOURCE_EXHAUSTED "Stream removed"
# instead of the message, so every message is cut to this many encoded bytes.
STATUS_MESSAGE_MAX = 4000
NAME_MAX, NAMESPACE_MAX = 253, 63  # Kubernetes: a DNS subdomain, a DNS label


def shown(text: str) -> str:
    """A piece of client input as echoed in a status message (cut as a trigger's problems are)."""
    return cut(text, PATH_SHOWN)


# The bytes a status trailer percent-encodes (3 bytes each): all but printable ASCII, and `%`.
_ENCODED_BYTES = bytes(b for b in range(256) if not 0x20 <= b <= 0x7E or b == ord("%"))


def bounded(message: str, limit: int = STATUS_MESSAGE_MAX) -> str:
    """`message` cut to `limit` bytes as a status trailer encodes it (3 per byte outside
    printable ASCII, and `%`). Every failed call's message passes here (a workload's fault on
    every poll while it lasts): one that fits is told so at C speed, not a character at a time.
    Its cost there is exact but for a lone surrogate (9 there, 3 as `replace` encodes it below),
    so one that fits by that count fits by the exact one."""
    if len(message) <= limit and message.isascii() and message.isprintable() and "%" not in message:
        return message
    encoded = message.encode("utf-8", "surrogatepass")
    plain = len(encoded.translate(None, _ENCODED_BYTES))
    if plain + 3 * (len(encoded) - plain) <= limit:
        return message
    cost = 0
    for index, char in enumerate(message):
        printable = " " <= char <= "~" and char != "%"
        cost += 1 if printable else 3 * len(char.encode("utf-8", "replace"))
        if cost > limit:
            return message[:index] + " ... (cut)"
    return message


class RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        message = bounded(message)
        super().__init__(message)
        self.code = code
        self.message = message


class Undecodable:
    """A request whose bytes are not the method's protobuf message."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _tolerant(deserialize: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as exc:  # any failure here is the client's bytes
            return Undecodable(exc)

    return parse


class RejectUndecodable(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """INVALID_ARGUMENT for a request that does not parse. Without it gRPC answers UNKNOWN
    ("Unexpected DecodeError"), which reads as a server bug. Unary requests only: this server
    has no client-streaming method. Each method's wrapped handler is built once and reused: the
    interceptor runs on every call (every KEDA poll and HPA query)."""

    def __init__(self) -> None:
        self._wrapped: dict[Any, grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler: Any = await continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.request_deserializer is None:
            return handler
        wrapped = self._wrapped.get(handler)
        if wrapped is None:
            wrapped = self._wrapped[handler] = self._wrap(handler, handler_call_details.method)
        return wrapped

    @staticmethod
    def _wrap(handler: Any, method: str) -> grpc.RpcMethodHandler:
        behavior = handler.unary_unary or handler.unary_stream

        async def reject(request: object, context: grpc.aio.ServicerContext) -> None:
            if isinstance(request, Undecodable):
                message = f"{method}: the request is not a valid protobuf message: {request.error}"
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, bounded(message))

        async def unary(request: object, context: grpc.aio.ServicerContext) -> Any:
            await reject(request, context)
            return await behavior(request, context)

        async def stream(request: object, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await reject(request, context)
            async for item in behavior(request, context):
                yield item

        tolerant = _tolerant(handler.request_deserializer)
        if handler.unary_unary is not None:
            return handler._replace(request_deserializer=tolerant, unary_unary=unary)
        # A coroutine writing with context.write (health Watch), or an async generator.
        streaming = stream if inspect.isasyncgenfunction(behavior) else unary
        return handler._replace(request_deserializer=tolerant, unary_stream=streaming)


def metric_spec(trigger: TriggerSpec) -> pb.GetMetricSpecResponse:
    return pb.GetMetricSpecResponse(
        metricSpecs=[
            pb.MetricSpec(metricName=trigger.metric_name, targetSize=1, targetSizeFloat=1.0)
        ]
    )


class ExternalScalerService(pb_grpc.ExternalScalerServicer):
    def __init__(self, engine: Engine, triggers: TriggerCache, shutdown: asyncio.Event) -> None:
        self._engine = engine
        self._triggers = triggers
        self._shutdown = shutdown

    def _trigger(self, ref: pb.ScaledObjectRef) -> TriggerSpec:
        if not ref.name or not ref.namespace:
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "scaledObjectRef: name and namespace are required (KEDA always sends both)",
            )
        if len(ref.name) > NAME_MAX or len(ref.namespace) > NAMESPACE_MAX:
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"scaledObjectRef {shown(ref.namespace)}/{shown(ref.name)}: a Kubernetes name is "
                f"at most {NAME_MAX} characters and a namespace at most {NAMESPACE_MAX}; got "
                f"{len(ref.name)} and {len(ref.namespace)}",
            )
        try:
            return self._triggers.parse(ref.namespace, ref.name, ref.scalerMetadata)
        except TriggerError as exc:
            # TriggerCache gives each problem cut already (`problems_of`): joined as they are.
            problems = "; ".join(f"{p.path}: {p.message}" for p in exc.problems)
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"ScaledObject {ref.namespace}/{ref.name}: trigger metadata: {problems}",
            ) from None

    async def _decision(self, trigger: TriggerSpec) -> tuple[int, bool]:
        try:
            decision = await self._engine.decision(trigger)
        except NoDecisionError as exc:
            raise RpcError(_FAULT_CODES[exc.fault], exc.message) from None
        return decision.replicas, decision.active

    async def _counted(
        self, method: str, context: grpc.aio.ServicerContext, answer: Callable[[], Awaitable[T]]
    ) -> T:
        """`answer()`, with its outcome counted in RPCS; an RpcError aborts the call with its
        status."""
        try:
            result = await answer()
        except RpcError as exc:
            telemetry.rpc_counter(method, exc.code.name).inc()
            await context.abort(exc.code, exc.message)
        telemetry.rpc_counter(method, "OK").inc()
        return result

    async def GetMetricSpec(  # noqa: N802 - gRPC method name
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        async def answer() -> pb.GetMetricSpecResponse:
            trigger = self._trigger(request)
            self._engine.touch(trigger)  # first sight starts the workload's loop
            return metric_spec(trigger)

        return await self._counted("GetMetricSpec", context, answer)

    async def GetMetrics(  # noqa: N802
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        async def answer() -> pb.GetMetricsResponse:
            trigger = self._trigger(request.scaledObjectRef)
            if not trigger.accepts_metric(request.metricName):
                raise RpcError(
                    grpc.StatusCode.NOT_FOUND,
                    f"metric {shown(request.metricName)!r} is not served for ScaledObject "
                    f"{trigger.workload}; its metric is {trigger.metric_name!r}",
                )
            replicas, _ = await self._decision(trigger)
            return pb.GetMetricsResponse(
                metricValues=[
                    pb.MetricValue(
                        metricName=trigger.metric_name,
                        metricValue=replicas,
                        metricValueFloat=float(replicas),
                    )
                ]
            )

        return await self._counted("GetMetrics", context, answer)

    async def IsActive(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        async def answer() -> pb.IsActiveResponse:
            _, active = await self._decision(self._trigger(request))
            return pb.IsActiveResponse(result=active)

        return await self._counted("IsActive", context, answer)

    async def _stream_trigger(
        self, method: str, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> TriggerSpec:
        """A stream's trigger; the stream counts as answered once it is accepted."""

        async def answer() -> TriggerSpec:
            return self._trigger(request)

        return await self._counted(method, context, answer)

    async def StreamIsActive(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        """Push `true` the moment a workload turns active. KEDA >= 2.18 ignores a pushed `false`
        (scale to zero follows IsActive polling and cooldownPeriod), and KEDA < 2.18 would let
        it override other active triggers (kedacore/keda#6986), so `false` is never pushed."""
        trigger = await self._stream_trigger("StreamIsActive", request, context)
        telemetry.OPEN_STREAMS.labels(method="StreamIsActive").inc()
        try:
            was_active = False
            async for decision in self._engine.watch(trigger):
                active = decision is not None and decision.active
                if active and not was_active:
                    yield pb.IsActiveResponse(result=True)
                was_active = active
        finally:
            telemetry.OPEN_STREAMS.labels(method="StreamIsActive").dec()

    async def StreamMetricSpec(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        """Send the spec on open. The spec is a pure function of the trigger metadata (target 1,
        name from metadata), so within one stream it never changes; when a user edits the
        metadata KEDA rebuilds the scaler and opens a new stream, which gets the new spec."""
        trigger = await self._stream_trigger("StreamMetricSpec", request, context)
        telemetry.OPEN_STREAMS.labels(method="StreamMetricSpec").inc()
        try:
            self._engine.touch(trigger)
            yield metric_spec(trigger)
            await self._shutdown.wait()
        finally:
            telemetry.OPEN_STREAMS.labels(method="StreamMetricSpec").dec()
