"""100 concurrent malformed RPCs against the real in-process server: each ends with the status the
service documents (gpu_queue_scaler/serve/service.py) and a message naming the problem; none is
INTERNAL or UNKNOWN; afterwards the server still answers a good call and its health is still
SERVING.

Found by this test and fixed in gpu_queue_scaler/serve/service.py (wired in
gpu_queue_scaler/serve/server.py): bytes that are not the method's protobuf message were UNKNOWN
("Unexpected DecodeError"), now INVALID_ARGUMENT; a status message echoing a 1 MB name, key or
metric name overflowed the client's trailer limit (RESOURCE_EXHAUSTED "Stream removed", no message),
now each echoed piece is short, a name or namespace longer than Kubernetes allows is
INVALID_ARGUMENT, and the message is bounded; in gpu_queue_scaler/settings/fields.py a rejection's
detail (a bad host, a bad regex) no longer quotes the input whole.
"""

from __future__ import annotations

import asyncio
import ctypes
import gc
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler.serve.service import STATUS_MESSAGE_MAX, bounded
from tests.conftest import ref, synthetic

MB = "x" * (1 << 20)
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
PRECONDITION = grpc.StatusCode.FAILED_PRECONDITION
SERVICE = "/externalscaler.ExternalScaler/"
DEADLINE_S = 20.0


@dataclass(frozen=True)
class Case:
    what: str
    call: Callable[[], Awaitable[Any]]
    code: grpc.StatusCode
    names: tuple[str, ...]  # each must appear in the status message


def garbage(seed: int, message: Any) -> bytes:
    """Random bytes, grown with 0xff (an unfinished varint) until `message` cannot parse them:
    random bytes alone are often a valid message of unknown fields."""
    rng = random.Random(seed)
    body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
    while True:
        try:
            message.FromString(body)
        except DecodeError:
            return body
        body += b"\xff"


def cases(client: Any, channel: grpc.aio.Channel) -> list[Case]:
    stub = client.stub
    found: list[Case] = []

    def metrics(so: pb.ScaledObjectRef, metric: str) -> Callable[[], Awaitable[Any]]:
        request = pb.GetMetricsRequest(scaledObjectRef=so, metricName=metric)
        return lambda: stub.GetMetrics(request, timeout=DEADLINE_S)

    def on_every_method(what: str, so: pb.ScaledObjectRef, code: grpc.StatusCode, *names: str):
        for method in ("GetMetricSpec", "IsActive"):
            found.append(
                Case(
                    f"{what} ({method})",
                    lambda m=method: getattr(stub, m)(so, timeout=DEADLINE_S),
                    code,
                    names,
                )
            )
        found.append(Case(f"{what} (GetMetrics)", metrics(so, "anything"), code, names))
        for method in ("StreamIsActive", "StreamMetricSpec"):
            found.append(
                Case(
                    f"{what} ({method})",
                    lambda m=method: getattr(stub, m)(so, timeout=DEADLINE_S).read(),
                    code,
                    names,
                )
            )

    # Missing identity (5 methods each): 15 calls.
    required = ("name and namespace are required",)
    on_every_method("no name", ref("", synthetic()), INVALID, *required)
    on_every_method("no namespace", ref("llama", synthetic(), namespace=""), INVALID, *required)
    on_every_method("empty ref", pb.ScaledObjectRef(), INVALID, *required)
    # Unknown backend, no backend (5 each): 10 calls.
    on_every_method("unknown backend", ref("a", synthetic(backend="sglang")), INVALID, "backend")
    no_backend = synthetic()
    del no_backend["backend"]
    on_every_method("no backend", ref("b", no_backend), INVALID, "backend", "required")
    # Bad values, each naming its key: 16 calls.
    bad_values = {
        "targetConcurrency": "-1",
        "maxReplicas": "1e400",
        "coldStartSeconds": "NaN",
        "pollingIntervalSeconds": "inf",
        "minReplicas": "٣",  # an Arabic-Indic digit: float() would take it
        "labelSelector": 'pod=~"("',
        "scrapeTargets": "pod:99999",
        "serverAddress": "prometheus:9090",
        "metricsPort": "0x1F90",
        "syntheticPeakRps": "",
        "profile": "Not_A_Name!",
        "forecast": "yes",
        "model": "ünïcödé model",
        "targetconcurrency": "8",  # misspelt: an unknown key, with a hint
    }
    for index, (key, value) in enumerate(bad_values.items()):
        so = ref(f"bad-{index}", synthetic(**{key: value}))
        found.append(Case(f"bad {key}", lambda so=so: stub.GetMetricSpec(so), INVALID, (key,)))
    min_over_max = ref("bounds", synthetic(minReplicas="5", maxReplicas="2"))
    found.append(Case("min > max", metrics(min_over_max, "x"), INVALID, ("minReplicas",)))
    huge_selector = ref("huge-re", synthetic(labelSelector="pod=~" + "(" * 100_000))
    found.append(
        Case("huge bad regex", lambda: stub.IsActive(huge_selector), INVALID, ("labelSelector",))
    )
    # Valid alone, not with the ConfigMap or without a source: FAILED_PRECONDITION on GetMetrics.
    no_profile = ref("np", synthetic(profile="nope"))
    found.append(
        Case("unknown profile", metrics(no_profile, "synthetic-np"), PRECONDITION, ("'nope'",))
    )
    no_source = ref("ns", {"backend": "vllm", "model": "m"})
    found.append(
        Case("vllm, no source", metrics(no_source, "vllm-m"), PRECONDITION, ("serverAddress",))
    )
    # GetMetrics for a metric this trigger never specified, and absurd metric names: 12 calls.
    good = ref("good", synthetic())
    for metric in (
        "",
        "synthetic-other",
        "s0-",
        "s99999999999999999999-synthetic-good-x",
        "../../etc/passwd",
        "\x00\x01\x02",
        "🦙" * 1000,
        "metric with spaces",
        "SYNTHETIC-GOOD",
        "%s%n%x",
        "x" * 10_000,
        MB,
    ):
        found.append(Case(f"metric {metric[:20]!r}", metrics(good, metric), NOT_FOUND, ("metric",)))
    # Huge strings (1 MB): name, namespace, a key, a value, a metric name with no workload.
    found += [
        Case("1 MB name", lambda: stub.GetMetricSpec(ref(MB, synthetic())), INVALID, ("name",)),
        Case(
            "1 MB namespace",
            lambda: stub.IsActive(ref("a", synthetic(), namespace=MB)),
            INVALID,
            ("namespace",),
        ),
        Case(
            "1 MB key",
            lambda: stub.GetMetricSpec(ref("a", {**synthetic(), MB: "1"})),
            INVALID,
            ("unknown key",),
        ),
        Case(
            "1 MB value",
            lambda: stub.GetMetricSpec(ref("a", synthetic(targetConcurrency=MB))),
            INVALID,
            ("targetConcurrency",),
        ),
        Case(
            "1 MB selector",
            lambda: stub.GetMetricSpec(ref("a", synthetic(scrapeTargets=MB + ":80"))),
            INVALID,
            ("scrapeTargets",),
        ),
        Case(
            "many bad keys",
            lambda: stub.GetMetricSpec(ref("a", {f"k{i}": "v" for i in range(200)})),
            INVALID,
            ("unknown key",),
        ),
    ]
    # Raw bytes that are not the method's message, on every unary method path (and health).
    methods = [
        ("GetMetricSpec", pb.ScaledObjectRef, False),
        ("GetMetrics", pb.GetMetricsRequest, False),
        ("IsActive", pb.ScaledObjectRef, False),
        ("StreamIsActive", pb.ScaledObjectRef, True),
        ("StreamMetricSpec", pb.ScaledObjectRef, True),
        ("/grpc.health.v1.Health/Check", health_pb2.HealthCheckRequest, False),
    ]
    for seed in range(100 - len(found)):
        method, message, streaming = methods[seed % len(methods)]
        path = method if method.startswith("/") else SERVICE + method
        found.append(
            Case(
                f"garbage #{seed} on {path}",
                raw_call(channel, path, garbage(seed, message), streaming),
                INVALID,
                ("not a valid protobuf message", path),
            )
        )
    return found


def raw_call(
    channel: grpc.aio.Channel, path: str, body: bytes, streaming: bool
) -> Callable[[], Awaitable[Any]]:
    """Send `body` as is: a generic call with a bytes serializer, no protobuf on our side."""
    if streaming:
        stream = channel.unary_stream(path, request_serializer=bytes, response_deserializer=bytes)
        return lambda: stream(body, timeout=DEADLINE_S).read()
    unary = channel.unary_unary(path, request_serializer=bytes, response_deserializer=bytes)
    return lambda: unary(body, timeout=DEADLINE_S)


async def outcome(case: Case) -> tuple[Case, grpc.StatusCode, str]:
    try:
        answer = await asyncio.wait_for(case.call(), DEADLINE_S + 5)
    except grpc.aio.AioRpcError as exc:
        return case, exc.code(), exc.details() or ""
    return case, grpc.StatusCode.OK, repr(answer)[:200]


async def test_100_concurrent_malformed_rpcs(start_server):
    server, client = await start_server()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        batch = cases(client, channel)
        assert len(batch) == 100
        results = await asyncio.wait_for(asyncio.gather(*(outcome(c) for c in batch)), 90)
        wrong = [
            f"{case.what}: {code.name} {details[:300]!r}"
            for case, code, details in results
            if code != case.code or not all(name in details for name in case.names)
        ]
        assert not wrong, "\n".join(wrong)
        codes = {code for _, code, _ in results}
        assert not codes & {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
        assert all(len(details.encode()) <= STATUS_MESSAGE_MAX + 20 for _, _, details in results)

        # The server is unharmed: a good call answers, health is SERVING.
        good = await asyncio.wait_for(client.evaluate(ref("after", synthetic())), 30)
        assert good.value == 2.0  # 1.25 x 6 req/s x 2 s / 8 per replica -> 2
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "externalscaler.ExternalScaler"):
            answer = await health.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=DEADLINE_S
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await asyncio.wait_for(channel.close(), 30)


def os_status() -> tuple[float, int]:
    """This process's RSS (MB) and OS threads, from /proc (the server runs in this process).
    The heap's free memory is given back to the OS first (glibc's malloc_trim), so RSS counts
    what is still held, not what the allocator keeps for reuse."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


async def test_malformed_rpcs_again_and_again_keep_rss_and_threads_flat(start_server):
    """The 100 malformed calls five times over, and each round 40 rejected triggers with values
    and keys of 200 KB never sent before: RSS and threads stay where the first round left them.
    The trigger cache kept every rejected map whole (its key) with its exception (2,000 distinct
    100 KB values kept 803 MB), and one exception raised at every poll grew by its frames."""
    server, client = await start_server()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    stub = client.stub

    async def distinct_huge(round_: int) -> None:
        async def one(index: int) -> None:
            big = f"{round_}-{index}-" + "9" * 200_000
            so = ref(f"huge-{index}", synthetic(targetConcurrency=big, **{"k" + big: "1"}))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stub.GetMetricSpec(so, timeout=DEADLINE_S)
            assert raised.value.code() == INVALID

        for start in range(0, 40, 10):
            await asyncio.gather(*(one(i) for i in range(start, start + 10)))

    async def round_(number: int) -> None:
        batch = cases(client, channel)
        await asyncio.wait_for(asyncio.gather(*(outcome(c) for c in batch)), 90)
        await asyncio.wait_for(distinct_huge(number), 90)

    try:
        await round_(0)  # the first round builds what every later one reuses
        rss_before, threads_before = os_status()
        for number in range(1, 6):
            await round_(number)
        rss_after, threads_after = os_status()
    finally:
        await asyncio.wait_for(channel.close(), 30)
    # Before: ~0.6 MB kept per distinct rejected map, 120 MB over these rounds.
    assert rss_after - rss_before < 40, (rss_before, rss_after)
    assert threads_after <= threads_before + 2, (threads_before, threads_after)
    assert len(server.engine) <= 10  # malformed calls start no loops


def test_bounded_status_messages_count_percent_encoding() -> None:
    assert bounded("short") == "short"
    ascii_cut = bounded("a" * 10_000)
    assert ascii_cut.endswith(" ... (cut)") and len(ascii_cut) <= STATUS_MESSAGE_MAX + 10
    wide = bounded("🦙" * 10_000)  # 4 UTF-8 bytes, each sent as %XX: 12 per character
    assert wide.endswith(" ... (cut)") and len(wide) <= STATUS_MESSAGE_MAX // 12 + 10
    assert bounded("%" * 10_000).count("%") == STATUS_MESSAGE_MAX // 3
