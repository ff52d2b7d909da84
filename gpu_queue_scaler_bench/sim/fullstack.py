"""`scaler bench replay --full-stack`: the scaler policy through the real server, in real time.

Why: the offline bench calls `gpu_queue_scaler.decision.policy.decide` directly, which proves the
policy but not the path a cluster runs: vLLM's /metrics text -> the direct-scrape source
(`scrapeTargets`) -> the engine's wall-clock loop -> gRPC -> KEDA -> the HPA -> the Deployment. Here
every piece of that path is the production code except the cluster:
`gpu_queue_scaler.serve.server.ScalerServer` listens on a free 127.0.0.1 port in this process, each
ready replica of the simulated fleet serves vLLM's metrics (`vllm:num_requests_waiting`, `_running`,
`request_success_total`, the queue-time, TTFT and inference-time histograms, `kv_cache_usage_perc`)
on a loopback HTTP port of its own, and a KEDA/HPA emulator calls GetMetricSpec, GetMetrics and
IsActive over gRPC (`gpu_queue_scaler_bench.emulators.keda`) and applies KEDA's activation and the
HPA's arithmetic (`gpu_queue_scaler_bench.sim.autoscalers`) in trace time.

Time. The server ticks on the wall clock, so the fleet runs in real time, compressed by
`speedup` X: one trace second is 1/X wall seconds. The scaler sees a world X times faster, in
consistent units: its time settings (cold start, polling interval, SLO, rate window, windows of
the rule) are divided by X, the durations the pods report (queue time, TTFT, inference time, and
the histograms' bucket bounds) likewise, and counters grow X times faster per wall second, so
every replica count it computes (arrivals x service time, backlog / horizon) is the one it would
compute in trace time. What does not scale: the rule's fixed 60 s panic hold and scale-down
period (`gpu_queue_scaler.decision.policy`), which span 60 X trace seconds here, and the scheduling
jitter of one process on a shared machine (reported as lag behind real time).

Replica metrics slots: the trigger lists one loopback port per possible replica (maxReplicas of
them, fixed, as a Service's endpoints would be); a port answers with its replica's metrics while
that replica is ready and serving, and HTTP 503 otherwise (a pod out of the endpoints), so
`ready_pods` is the count of replicas reporting the queue gauge as in production. The gateway's
FIFO queue (see `gpu_queue_scaler_bench.sim.fleet`) is reported as each ready replica's share of
`vllm:num_requests_waiting`; queue time is observed when a request is admitted, as the offline
fleet's signal does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sys
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc
import numpy as np
from numpy.typing import NDArray
from prometheus_client import CollectorRegistry

from gpu_queue_scaler.serve.server import ScalerServer
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.fields import AUTO, BY_KEY, DAILY_S
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler.settings.spec import resolve
from gpu_queue_scaler.settings.trigger import parse_trigger
from gpu_queue_scaler_bench.emulators.keda import Evaluation, KedaLikeClient, scaled_object
from gpu_queue_scaler_bench.sim.autoscalers import (
    SCALER_BEHAVIOR,
    Hpa,
    Keda,
    average_value_replicas,
)
from gpu_queue_scaler_bench.sim.fleet import QUEUE_TIME_BUCKETS, TTFT_BUCKETS, ServingFleet
from gpu_queue_scaler_bench.sim.policies import scaler_metadata
from gpu_queue_scaler_bench.sim.report import FULL_STACK
from gpu_queue_scaler_bench.sim.run import BenchResult, SimConfig, Simulation, run_bench
from gpu_queue_scaler_bench.sim.workload import Requests

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

FULL_STACK_NAME = FULL_STACK
MAX_SPEEDUP = 10.0  # forecastStepSeconds (10 s) / X must stay >= its minimum of 1 s
MAX_SLOTS = 1000  # scrapeTargets holds at most 1000 targets
MAX_WALL_S = 1800.0  # a full-stack replay is a check of the path, not the bench
NAMESPACE = "bench"
NAME = "llama-3-8b"

# Trigger keys that are trace time (divided by the speedup); the rest (timeouts) are wall time.
DILATED_KEYS = (
    "rateWindowSeconds",
    "maxSampleAgeSeconds",
    "serviceTimeSeconds",
    "queueTimeSloSeconds",
    "coldStartSeconds",
    "pollingIntervalSeconds",
    "horizonSeconds",
    "forecastStepSeconds",
    "seasonPeriodSeconds",
    "scaleDownStabilizationSeconds",
    "scaleToZeroIdleSeconds",
)
# ...and those whose defaults must be written out to be divided.
_DEFAULTED = (
    "rateWindowSeconds",
    "maxSampleAgeSeconds",
    "forecastStepSeconds",
    "seasonPeriodSeconds",
    "scaleDownStabilizationSeconds",
    "scaleToZeroIdleSeconds",
)


def dilate_metadata(metadata: Mapping[str, str], speedup: float) -> dict[str, str]:
    """The trigger for a world `speedup` times faster: every trace-time key divided by it.
    A ValueError names a key the result would put out of range."""
    out = dict(metadata)
    for key in _DEFAULTED:
        if key not in out and BY_KEY[key].default is not None:
            out[key] = f"{BY_KEY[key].default}"
    if out.get("seasonPeriodSeconds", "").strip() == AUTO:
        # The period search's own spans (gpu_queue_scaler.decision.season) are wall time, not
        # dilated: the sped-up run takes the period `auto` starts from, the daily one.
        out["seasonPeriodSeconds"] = f"{DAILY_S:g}"
    for key in DILATED_KEYS:
        if key in out:
            out[key] = f"{float(out[key]) / speedup:.6g}"
    try:
        resolve(parse_trigger(NAMESPACE, NAME, out), Config())
    except ValueError as exc:
        raise ValueError(f"--speedup {speedup:g} puts a setting out of range: {exc}") from None
    return out


def server_settings(speedup: float) -> ServerSettings:
    base = ServerSettings()
    return dataclasses.replace(
        base,
        evaluation_interval_s=base.evaluation_interval_s / speedup,
        stale_target_s=base.stale_target_s / speedup,
    )


# --- the replicas' /metrics ----------------------------------------------------------------------


class _Growing:
    """Per-pod-id accumulators (pod ids are small integers handed out by the cluster)."""

    def __init__(self, columns: int) -> None:
        self.values: FloatArray = np.zeros((64, columns))

    def _grow(self, pods: IntArray) -> None:
        need = int(pods.max()) + 1
        if need > self.values.shape[0]:
            grown = np.zeros((max(need, 2 * self.values.shape[0]), self.values.shape[1]))
            grown[: self.values.shape[0]] = self.values
            self.values = grown

    def add(self, pods: IntArray, column: int, weights: FloatArray | None = None) -> None:
        if pods.size == 0:
            return
        self._grow(pods)
        np.add.at(self.values[:, column], pods, 1.0 if weights is None else weights)

    def add_buckets(self, pods: IntArray, observed: FloatArray, bounds: FloatArray) -> None:
        """Histogram observations into columns 0..len(bounds) (the last is +Inf only)."""
        if pods.size == 0:
            return
        self._grow(pods)
        index = np.searchsorted(bounds, observed, side="left")
        np.add.at(self.values, (pods, index), 1.0)

    def row(self, pod: int) -> FloatArray:
        if pod >= self.values.shape[0]:
            return np.zeros(self.values.shape[1])
        row: FloatArray = self.values[pod]
        return row


class VllmExporter:
    """What each replica's vLLM would expose, accumulated step by step from the fleet."""

    # columns of `counters`
    SUCCESS, QT_SUM, QT_COUNT, TTFT_SUM, TTFT_COUNT, INF_SUM, INF_COUNT = range(7)

    def __init__(self, fleet: ServingFleet, model: str, speedup: float) -> None:
        self.fleet = fleet
        self.model = model
        self.speedup = speedup
        self.counters = _Growing(7)
        self.qt_buckets = _Growing(QUEUE_TIME_BUCKETS.size + 1)
        self.ttft_buckets = _Growing(TTFT_BUCKETS.size + 1)
        self._ttft_seen = np.zeros(fleet.req.count, dtype=bool)
        self._before = np.zeros(0, dtype=np.int64)
        self._head = 0
        self.gauges: dict[int, tuple[float, float, float]] = {}  # pod -> waiting, running, kv

    def before_step(self) -> None:
        self._before = self.fleet.r_id.copy()
        self._head = self.fleet.head

    def after_step(self, serving: IntArray) -> None:
        fleet = self.fleet
        arrivals = fleet.req.arrivals_s
        admitted = np.arange(self._head, fleet.head, dtype=np.int64)
        admitted = admitted[np.isfinite(fleet.admit_t[admitted])]
        pods = fleet.pod_of[admitted]
        waited = fleet.admit_t[admitted] - arrivals[admitted]
        self.counters.add(pods, self.QT_SUM, waited)
        self.counters.add(pods, self.QT_COUNT)
        self.qt_buckets.add_buckets(pods, waited, QUEUE_TIME_BUCKETS)
        candidates = np.concatenate([self._before, admitted])
        first = candidates[np.isfinite(fleet.first_token_t[candidates])]
        first = first[~self._ttft_seen[first]]
        self._ttft_seen[first] = True
        ttft = fleet.first_token_t[first] - arrivals[first]
        self.counters.add(fleet.pod_of[first], self.TTFT_SUM, ttft)
        self.counters.add(fleet.pod_of[first], self.TTFT_COUNT)
        self.ttft_buckets.add_buckets(fleet.pod_of[first], ttft, TTFT_BUCKETS)
        done = candidates[np.isfinite(fleet.finish_t[candidates])]
        ran = fleet.finish_t[done] - fleet.admit_t[done]
        self.counters.add(fleet.pod_of[done], self.SUCCESS)
        self.counters.add(fleet.pod_of[done], self.INF_SUM, ran)
        self.counters.add(fleet.pod_of[done], self.INF_COUNT)
        # Gauges: the gateway's queue shared across the ready replicas (sums to the queue).
        serving = np.asarray(serving, dtype=np.int64)
        n = int(serving.size)
        running = fleet.running_per_pod(serving)
        kv = fleet.kv_usage(serving)
        queued = fleet.waiting
        self.gauges = {
            int(pod): (
                float(queued // n + (1 if i < queued % n else 0)),
                float(running[i]),
                float(kv[i]),
            )
            for i, pod in enumerate(serving.tolist())
        }

    def _histogram(
        self, name: str, labels: str, counts: FloatArray, bounds: FloatArray, total: float
    ) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        cumulative = np.cumsum(counts)
        for bound, count in zip(bounds / self.speedup, cumulative[:-1], strict=True):
            lines.append(f'{name}_bucket{{{labels},le="{float(bound):.9g}"}} {count:.1f}')
        lines.append(f'{name}_bucket{{{labels},le="+Inf"}} {cumulative[-1]:.1f}')
        lines.append(f"{name}_count{{{labels}}} {cumulative[-1]:.1f}")
        lines.append(f"{name}_sum{{{labels}}} {total / self.speedup:.9g}")
        return lines

    def render(self, pod: int) -> str:
        """vLLM's exposition text for one replica, in wall-clock units (durations / speedup)."""
        waiting, running, kv = self.gauges.get(pod, (0.0, 0.0, 0.0))
        labels = f'engine="0",model_name="{self.model}"'
        c = self.counters.row(pod)
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{labels}}} {running:.1f}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{labels}}} {waiting:.1f}",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{labels}}} {kv:.6g}",
            "# TYPE vllm:request_success_total counter",
            f'vllm:request_success_total{{{labels},finished_reason="stop"}} {c[self.SUCCESS]:.1f}',
        ]
        lines += self._histogram(
            "vllm:time_to_first_token_seconds",
            labels,
            self.ttft_buckets.row(pod),
            TTFT_BUCKETS,
            float(c[self.TTFT_SUM]),
        )
        lines += self._histogram(
            "vllm:request_queue_time_seconds",
            labels,
            self.qt_buckets.row(pod),
            QUEUE_TIME_BUCKETS,
            float(c[self.QT_SUM]),
        )
        # Only its sum and count are read (service time): one bucket keeps the scrape small.
        lines += self._histogram(
            "vllm:request_inference_time_seconds",
            labels,
            np.array([c[self.INF_COUNT]]),
            np.zeros(0),
            float(c[self.INF_SUM]),
        )
        return "\n".join(lines) + "\n"


class MetricsSlots:
    """One loopback HTTP port per possible replica; a port serves the /metrics of the ready
    replica that holds it, else 503. Ports stay bound for the whole run (no reuse by others)."""

    READ_TIMEOUT_S = 5.0

    def __init__(self, count: int) -> None:
        if not 1 <= count <= MAX_SLOTS:
            raise ValueError(f"{count} metrics slots: expected 1 to {MAX_SLOTS}")
        self.count = count
        self.ports: list[int] = []
        self.holder: list[int | None] = [None] * count  # pod id per slot
        self.slot_of: dict[int, int] = {}
        self.render: Any = None  # pod id -> text
        self.scrapes = 0  # answered with metrics
        self.refused = 0  # answered 503 (no ready replica on the slot)
        self._servers: list[asyncio.Server] = []

    async def start(self) -> None:
        for slot in range(self.count):
            server = await asyncio.start_server(partial(self._handle, slot), "127.0.0.1", 0)
            self._servers.append(server)
            self.ports.append(int(server.sockets[0].getsockname()[1]))

    @property
    def targets(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def assign(self, serving: IntArray) -> None:
        """Ready replicas keep their slot; replicas gone free theirs; new ones take the
        lowest free slot (a replica beyond the slots is not scraped)."""
        alive = set(serving.tolist())
        for pod in [p for p in self.slot_of if p not in alive]:
            self.holder[self.slot_of.pop(pod)] = None
        free = [i for i, pod in enumerate(self.holder) if pod is None]
        for pod in serving.tolist():
            if pod not in self.slot_of and free:
                slot = free.pop(0)
                self.slot_of[pod], self.holder[slot] = slot, pod

    async def _handle(
        self, slot: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            async with asyncio.timeout(self.READ_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
            parts = head.split(b" ", 2)
            pod = self.holder[slot]
            if len(parts) < 2 or parts[0] != b"GET" or parts[1].split(b"?")[0] != b"/metrics":
                status, body = "404 Not Found", b"not found\n"
            elif pod is None or self.render is None:
                status, body = "503 Service Unavailable", b"no ready replica\n"
                self.refused += 1
            else:
                status, body = "200 OK", str(self.render(pod)).encode()
                self.scrapes += 1
            writer.write(
                f"HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8"
                f"\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def close(self) -> None:
        for server in self._servers:
            server.close()
        for server in self._servers:
            with contextlib.suppress(OSError):
                await server.wait_closed()


# --- KEDA and the HPA, over gRPC ----------------------------------------------------------------


@dataclass
class Poll:
    """One evaluation KEDA or the HPA made over gRPC, in trace time."""

    at: float
    caller: str  # "keda" | "hpa" | "keda+hpa"
    replicas_before: int
    value: float | None  # GetMetrics' metricValueFloat (the scaler's replica target)
    active: bool | None  # IsActive
    replicas_after: int | None
    error: str | None = None


class GrpcKeda:
    """KEDA polling IsActive every pollingInterval (30 s, cooldownPeriod 300 s) and the HPA
    reading GetMetrics every 15 s with the examples' behavior (tolerance 0, no windows): the
    same emulation as the offline scaler policy, but every number comes over gRPC."""

    def __init__(
        self, client: KedaLikeClient, metadata: Mapping[str, str], max_replicas: int
    ) -> None:
        self.client = client
        self.ref = scaled_object(NAMESPACE, NAME, metadata)
        self.keda = Keda(0)
        self.hpa = Hpa(1, max_replicas, SCALER_BEHAVIOR)
        self.polls: list[Poll] = []
        self.rpcs: Counter[str] = Counter()  # "Method code" -> calls

    async def evaluate(self) -> Evaluation:
        try:
            evaluation = await self.client.evaluate(self.ref, deadline_s=5.0)
        except grpc.aio.AioRpcError as exc:
            self.rpcs[f"evaluate {exc.code().name}"] += 1
            raise
        for method in ("GetMetricSpec", "GetMetrics", "IsActive"):
            self.rpcs[f"{method} OK"] += 1
        return evaluation

    async def act(self, at: float, current: int) -> int | None:
        keda_due = self.keda.due(at)
        callers = []
        evaluation: Evaluation | None = None
        wanted = current
        try:
            if keda_due:
                callers.append("keda")
                evaluation = await self.evaluate()
                wanted = self.keda.poll(at, current, evaluation.active)
            if wanted > 0 and current > 0 and self.hpa.due(at):
                callers.append("hpa")
                evaluation = evaluation or await self.evaluate()
                proposal = average_value_replicas(current, evaluation.value, evaluation.target, 0.0)
                wanted = self.hpa.normalize(at, current, proposal)
        except grpc.aio.AioRpcError as exc:  # KEDA and the HPA change nothing this time
            self.polls.append(
                Poll(at, "+".join(callers), current, None, None, None, exc.code().name)
            )
            return None
        if callers:
            assert evaluation is not None
            self.polls.append(
                Poll(at, "+".join(callers), current, evaluation.value, evaluation.active, wanted)
            )
        return wanted


# --- the run --------------------------------------------------------------------------------


@dataclass
class FullStackRun:
    bench: BenchResult
    polls: list[Poll]
    rpcs: dict[str, int]
    scrapes: int
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the server's, at the end


def wall_estimate_s(requests: Requests, cfg: SimConfig, speedup: float) -> float:
    """Wall seconds of a full-stack replay without its drain: pre-roll plus trace."""
    pre = min(cfg.warm_window_s, requests.duration_s)
    return (pre + requests.duration_s) / speedup


def check_options(requests: Requests, cfg: SimConfig, speedup: float) -> None:
    """A ValueError for a speedup, a length or trigger keys the full-stack replay does not
    take (checked before the offline part runs)."""
    if not 1.0 <= speedup <= MAX_SPEEDUP:
        raise ValueError(f"--speedup must be from 1 to {MAX_SPEEDUP:g}, got {speedup:g}")
    if wall_estimate_s(requests, cfg, speedup) > MAX_WALL_S:
        raise ValueError(
            f"a full-stack replay of {requests.duration_s:g} s at speedup {speedup:g} takes "
            f"over {MAX_WALL_S:g} s: shorten --duration"
        )
    probe = scaler_metadata(1.0, cfg.slo_s, cfg.cold_start_s, 1, dict(cfg.scaler_metadata))
    dilate_metadata({**probe, "scrapeTargets": "127.0.0.1:1"}, speedup)


async def run_full_stack(
    requests: Requests, cfg: SimConfig, scale: float = 1.0, speedup: float = 5.0
) -> FullStackRun:
    """The scaler row through the real server and gRPC, next to the in-process scaler and the
    oracle on the same requests (run first, offline: they also size the warm start)."""
    check_options(requests, cfg, speedup)
    reference = run_bench(requests, dataclasses.replace(cfg, policies=("scaler", "oracle")), scale)
    slots = MetricsSlots(min(MAX_SLOTS, max(reference.max_replicas, reference.initial_replicas)))
    await slots.start()
    metadata = dilate_metadata(
        {**reference.scaler_metadata, "scrapeTargets": slots.targets}, speedup
    )
    store = ConfigStore(Config(server=server_settings(speedup)))
    server = ScalerServer(store, "127.0.0.1:0", registry=CollectorRegistry(), grace_s=1.0)
    client: KedaLikeClient | None = None
    sim = Simulation(requests, cfg, reference.initial_replicas)
    exporter = VllmExporter(sim.fleet, metadata["model"], speedup)
    slots.render = exporter.render
    lag_max = 0.0
    started = time.monotonic()
    try:
        await server.start()
        client = KedaLikeClient(f"127.0.0.1:{server.port}")
        emulator = GrpcKeda(client, metadata, reference.max_replicas)
        serving = sim.cluster.serving()
        slots.assign(serving)
        exporter.after_step(serving)  # the warm fleet, idle, before the first step
        # KEDA was polling before the replay began: the server's loop is already running.
        for _ in range(20):
            try:
                await emulator.evaluate()
                break
            except grpc.aio.AioRpcError:
                await asyncio.sleep(store.current.server.evaluation_interval_s)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        step_wall = sim.dt / speedup
        for _ in range(sim.max_steps):
            exporter.before_step()
            at, stats = sim.advance()
            serving = sim.cluster.serving()
            exporter.after_step(serving)
            slots.assign(serving)
            wanted = await emulator.act(at, sim.cluster.replicas)
            sim.apply(at, wanted, stats)
            if sim.done:
                break
            delay = t0 + sim.k * step_wall - loop.time()
            lag_max = max(lag_max, -delay)
            await asyncio.sleep(max(0.0, delay))  # yields to the server even when late
        decisions = [
            {
                "replicas": d.replicas,
                "active": d.active,
                "reason": d.reason.value,
                "signal_source": d.signal.source if d.signal is not None else None,
                "ready_pods": d.signal.ready_pods if d.signal is not None else None,
            }
            for d in server.engine.decisions()
        ]
    finally:
        if client is not None:
            await client.close()
        await server.stop()
        await slots.close()
    wall = time.monotonic() - started
    run = sim.result(FULL_STACK_NAME)
    ok = sum(n for key, n in emulator.rpcs.items() if key.endswith(" OK"))
    failed = {key: n for key, n in emulator.rpcs.items() if not key.endswith(" OK")}
    info: dict[str, Any] = {
        "speedup": speedup,
        "wall_s": round(wall, 1),
        "max_lag_s": round(lag_max, 3),
        "grpc_calls_ok": ok,
        "grpc_failures": failed,
        "keda_hpa_polls": len(emulator.polls),
        "scrapes": slots.scrapes,
        "metrics_slots": slots.count,
        "trigger": metadata,
    }
    notes = [
        *reference.notes,
        f"{FULL_STACK_NAME}: the real ScalerServer on 127.0.0.1:{server.port}, signals scraped "
        f"from {slots.count} loopback /metrics ports ({slots.scrapes} scrapes), "
        f"{len(emulator.polls)} KEDA/HPA polls over gRPC ({ok} calls OK"
        + (f", failures {failed}" if failed else "")
        + f"); speedup {speedup:g} ({wall:.0f} s wall, at most {lag_max:.2f} s behind)",
        f"{FULL_STACK_NAME}: trigger times divided by {speedup:g}; the rule's fixed 60 s panic "
        f"hold and scale-down period span {60 * speedup:g} s of trace here",
    ]
    bench = dataclasses.replace(
        reference,
        runs=[run, *reference.runs],
        notes=notes,
        full_stack=info,
    )
    return FullStackRun(bench, emulator.polls, dict(emulator.rpcs), slots.scrapes, decisions)


def announce(requests: Requests, cfg: SimConfig, speedup: float) -> None:
    """One line on stderr before a run that takes real time."""
    estimate = wall_estimate_s(requests, cfg, speedup)
    print(
        f"full-stack replay: {requests.duration_s:g} s of trace at speedup {speedup:g}, about "
        f"{math.ceil(estimate)} s of wall time plus the drain",
        file=sys.stderr,
        flush=True,
    )
