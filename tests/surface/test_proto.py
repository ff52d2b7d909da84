"""The proto is KEDA's on the wire, and the committed stubs are exactly what protos/ generates."""

from __future__ import annotations

from pathlib import Path

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler.serve import protogen

ROOT = Path(__file__).resolve().parents[2]

# kedacore/keda pkg/scalers/externalscaler/externalscaler.proto: (message, field) -> (number, type)
UPSTREAM_FIELDS = {
    ("ScaledObjectRef", "name"): (1, "string"),
    ("ScaledObjectRef", "namespace"): (2, "string"),
    ("ScaledObjectRef", "scalerMetadata"): (3, "message"),  # map<string, string>
    ("IsActiveResponse", "result"): (1, "bool"),
    ("GetMetricSpecResponse", "metricSpecs"): (1, "message"),
    ("MetricSpec", "metricName"): (1, "string"),
    ("MetricSpec", "targetSize"): (2, "int64"),
    ("MetricSpec", "targetSizeFloat"): (3, "double"),
    ("GetMetricsRequest", "scaledObjectRef"): (1, "message"),
    ("GetMetricsRequest", "metricName"): (2, "string"),
    ("GetMetricsResponse", "metricValues"): (1, "message"),
    ("MetricValue", "metricName"): (1, "string"),
    ("MetricValue", "metricValue"): (2, "int64"),
    ("MetricValue", "metricValueFloat"): (3, "double"),
}
UPSTREAM_METHODS = {
    "IsActive": ("ScaledObjectRef", "IsActiveResponse", False),
    "StreamIsActive": ("ScaledObjectRef", "IsActiveResponse", True),
    "GetMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", False),
    "GetMetrics": ("GetMetricsRequest", "GetMetricsResponse", False),
    "StreamMetricSpec": ("ScaledObjectRef", "GetMetricSpecResponse", True),
}
TYPE_NAMES = {9: "string", 8: "bool", 3: "int64", 1: "double", 11: "message"}


def test_wire_format_matches_keda():
    assert pb.DESCRIPTOR.package == "externalscaler"
    found = {
        (message.name, field.name): (field.number, TYPE_NAMES[field.type])
        for message in pb.DESCRIPTOR.message_types_by_name.values()
        for field in message.fields
    }
    assert found == UPSTREAM_FIELDS
    service = pb.DESCRIPTOR.services_by_name["ExternalScaler"]
    assert service.full_name == "externalscaler.ExternalScaler"
    methods = {
        m.name: (m.input_type.name, m.output_type.name, m.server_streaming) for m in service.methods
    }
    assert methods == UPSTREAM_METHODS
    assert all(not m.client_streaming for m in service.methods)


def test_committed_stubs_are_reproducible_from_protos(tmp_path):
    generated = protogen.generate(tmp_path)
    assert {p.name for p in generated} == {
        "externalscaler_pb2.py",
        "externalscaler_pb2.pyi",
        "externalscaler_pb2_grpc.py",
        "externalscaler_pb2_grpc.pyi",
    }
    for path in generated:
        committed = ROOT / "gpu_queue_scaler" / "_proto" / path.name
        assert committed.read_text() == path.read_text(), (
            f"{committed} is stale: run `python -m gpu_queue_scaler.serve.protogen`"
        )
