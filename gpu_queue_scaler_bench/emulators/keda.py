"""A small KEDA-like client for the full-stack replay (`gpu_queue_scaler_bench.sim.fullstack`) and
the tests.

It calls the scaler the way KEDA 2.20's scale loop does on every evaluation: GetMetricSpec, then
GetMetrics with the metric name KEDA would use (its `sN-` HPA prefix stripped), then IsActive; and
it applies the HPA's AverageValue arithmetic and KEDA's 0 <-> 1 activation to get the replica
count a cluster would run.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from gpu_queue_scaler_bench.emulators.hpa import desired_replicas_average_value

T = TypeVar("T")


@dataclass(frozen=True)
class Evaluation:
    metric_name: str  # as the HPA shows it: s{index}-{name}
    value: float
    target: float
    active: bool

    def replicas(self, current: int, tolerance: float = 0.0) -> int:
        """What KEDA + HPA would settle on from `current`: inactive -> 0 (after KEDA's
        cooldownPeriod, not modelled here); active -> KEDA lifts 0 to 1, then the HPA's
        AverageValue arithmetic (tolerance as set in the example ScaledObjects)."""
        if not self.active:
            return 0
        return max(
            1,
            desired_replicas_average_value(max(current, 1), self.value, self.target, tolerance),
        )


def scaled_object(namespace: str, name: str, metadata: Mapping[str, str]) -> pb.ScaledObjectRef:
    return pb.ScaledObjectRef(namespace=namespace, name=name, scalerMetadata=dict(metadata))


class KedaLikeClient:
    def __init__(self, target: str) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = pb_grpc.ExternalScalerStub(self.channel)

    async def evaluate(
        self, ref: pb.ScaledObjectRef, trigger_index: int = 0, deadline_s: float = 10.0
    ) -> Evaluation:
        spec = (await self.stub.GetMetricSpec(ref, timeout=deadline_s)).metricSpecs[0]
        hpa_name = f"s{trigger_index}-{spec.metricName}"
        request = pb.GetMetricsRequest(
            scaledObjectRef=ref, metricName=hpa_name.removeprefix(f"s{trigger_index}-")
        )
        value = (await self.stub.GetMetrics(request, timeout=deadline_s)).metricValues[0]
        active = (await self.stub.IsActive(ref, timeout=deadline_s)).result
        return Evaluation(
            metric_name=hpa_name,
            value=value.metricValueFloat
            if value.metricValueFloat > 0
            else float(value.metricValue),
            target=spec.targetSizeFloat if spec.targetSizeFloat > 0 else float(spec.targetSize),
            active=active,
        )

    async def statuses(
        self, ref: pb.ScaledObjectRef, deadline_s: float = 30.0
    ) -> list[grpc.StatusCode]:
        """One evaluation as KEDA asks it (GetMetricSpec, GetMetrics with the spec's metric,
        IsActive), each call made even when an earlier one failed: each call's status, for
        driving a server with metadata that is meant to be rejected."""
        spec_code, spec = await _status(self.stub.GetMetricSpec(ref, timeout=deadline_s))
        metric = "none" if spec is None else spec.metricSpecs[0].metricName
        request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metric)
        metrics_code, _ = await _status(self.stub.GetMetrics(request, timeout=deadline_s))
        active_code, _ = await _status(self.stub.IsActive(ref, timeout=deadline_s))
        return [spec_code, metrics_code, active_code]

    async def close(self) -> None:
        await self.channel.close()


async def _status(call: Awaitable[T]) -> tuple[grpc.StatusCode, T | None]:
    """A call's status, and its answer when it is OK."""
    try:
        return grpc.StatusCode.OK, await call
    except grpc.aio.AioRpcError as exc:
        return exc.code(), None
