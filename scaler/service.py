"""The KEDA external-scaler gRPC surface: a thin servicer over the engine's decision cache.

The replica target is returned as a metric with AverageValue semantics: `targetSize = 1` and
`metricValue = desired replicas`, so the HPA computes ceil(desired / 1) = desired. GetMetricSpec
depends only on the trigger metadata, never on the ConfigMap or a metrics backend, so it keeps
answering through outages and KEDA's `fallback` can engage (kedacore/keda#8056).

Status codes: INVALID_ARGUMENT for bad trigger metadata (the message names each key and what is
accepted), NOT_FOUND for a metric name this trigger does not serve, FAILED_PRECONDITION for a
trigger that does not fit the ConfigMap (e.g. an unknown profile), UNAVAILABLE while there is no
decision to give (no data yet, or data missing for longer than `staleTargetSeconds`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import grpc

from scaler import telemetry
from scaler._proto import externalscaler_pb2 as pb
from scaler._proto import externalscaler_pb2_grpc as pb_grpc
from scaler.engine import Engine, Fault, NoDecisionError
from scaler.trigger import TriggerCache, TriggerError, TriggerSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

_FAULT_CODES = {
    Fault.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Fault.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}


class RpcError(Exception):
    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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
        try:
            return self._triggers.parse(ref.namespace, ref.name, ref.scalerMetadata)
        except TriggerError as exc:
            raise RpcError(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"ScaledObject {ref.namespace}/{ref.name}: trigger metadata: {exc}",
            ) from None

    async def _decision(self, trigger: TriggerSpec) -> tuple[int, bool]:
        try:
            decision = await self._engine.decision(trigger)
        except NoDecisionError as exc:
            raise RpcError(_FAULT_CODES[exc.fault], exc.message) from None
        return decision.replicas, decision.active

    async def _unary(
        self, method: str, context: grpc.aio.ServicerContext, answer: Callable[[], Awaitable[T]]
    ) -> T:
        try:
            result = await answer()
        except RpcError as exc:
            telemetry.RPCS.labels(method=method, code=exc.code.name).inc()
            await context.abort(exc.code, exc.message)
        telemetry.RPCS.labels(method=method, code="OK").inc()
        return result

    async def GetMetricSpec(  # noqa: N802 - gRPC method name
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        async def answer() -> pb.GetMetricSpecResponse:
            trigger = self._trigger(request)
            self._engine.touch(trigger)  # first sight starts the workload's loop
            return metric_spec(trigger)

        return await self._unary("GetMetricSpec", context, answer)

    async def GetMetrics(  # noqa: N802
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        async def answer() -> pb.GetMetricsResponse:
            trigger = self._trigger(request.scaledObjectRef)
            if not trigger.accepts_metric(request.metricName):
                raise RpcError(
                    grpc.StatusCode.NOT_FOUND,
                    f"metric {request.metricName!r} is not served for ScaledObject "
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

        return await self._unary("GetMetrics", context, answer)

    async def IsActive(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        async def answer() -> pb.IsActiveResponse:
            _, active = await self._decision(self._trigger(request))
            return pb.IsActiveResponse(result=active)

        return await self._unary("IsActive", context, answer)

    async def _stream_trigger(
        self, method: str, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> TriggerSpec:
        try:
            trigger = self._trigger(request)
        except RpcError as exc:
            telemetry.RPCS.labels(method=method, code=exc.code.name).inc()
            await context.abort(exc.code, exc.message)
        telemetry.RPCS.labels(method=method, code="OK").inc()
        return trigger

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
