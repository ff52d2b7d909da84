"""`scaler bench load`: N ScaledObjects polled like KEDA against the real server, next to a floor.

Why: KEDA calls the scaler for every ScaledObject on every pollingInterval and again for every
HPA query, so a cluster with a thousand inference deployments is a steady stream of small RPCs.
This bench drives that stream over loopback against the real `scaler serve` process and against
a minimal grpc.aio server answering the same proto with constants (the floor: what Python gRPC
costs on this machine), one after the other with the same schedule, and prints latency
percentiles, throughput, errors and each server's CPU, and the ratios scaler / floor.

The load, per ScaledObject (distinct names, `backend: synthetic` triggers, so no metrics source
is needed): GetMetricSpec once (KEDA building the HPA), then KEDA's scale loop every
`--polling-interval` and the HPA's query every `--hpa-interval`, each being KEDA's
GetMetricsAndActivity for an external scaler: GetMetrics, then IsActive. Each object's loops
start at a random phase and every period carries +-`--jitter` (a fraction) of randomness; a loop
waits for its calls before sleeping until its next tick, as KEDA's goroutines do. All objects
share `--channels` HTTP/2 connections (KEDA pools one per scaler address) and at most
`--concurrency` calls are in flight; a call's latency runs from the moment it was due, so any
wait in the client counts. The client is one asyncio process; its CPU and event-loop lag are
printed so a saturated client is visible (on a 2-core machine it competes with the server).

Three views of the latencies, because a short run mixes two regimes. *Whole run*: every call.
*Steady state*: calls due after every object has appeared and run both loops once, which is
the regime a cluster lives in (ScaledObjects are created rarely, and polled for days).
*First per object*: each object's first GetMetrics, which waits for its warm start (its
history replayed through the policy, so that a new or restarted replica answers as one that
ran all along) and first evaluation; the floor has nothing to wait for. In a 120 s run of
1,000 new objects, those first calls are ~5% of all calls, so they set the whole run's p99.

Servers run as separate processes on 127.0.0.1 with a free port, so their CPU is read from
/proc/<pid>/stat (utime + stime over the measured window) and their memory from
/proc/<pid>/status and /proc/<pid>/fd. `--soak` runs the scaler alone for `--duration` (default
600 s) and reports RSS after the warm-up, at the end, the growth, and open descriptors. Only the
processes started here are stopped, by PID (SIGTERM, then SIGKILL after a bound).

`--rounds N` runs each server N times, alternating the order (scaler, floor, floor, scaler, ...),
and pools the calls: on a shared machine a server's p99 moves by tens of percent from one
two-minute run to the next, so a single pair of runs can land on either side of a 1.5x goal;
each round's own ratio is printed too.

`--profile FILE` runs the scaler server under cProfile (written when it stops) to see where a
high p99 comes from.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import grpc

from gpu_queue_scaler._proto import externalscaler_pb2 as pb
from gpu_queue_scaler._proto import externalscaler_pb2_grpc as pb_grpc
from gpu_queue_scaler_bench.load import quantile

ServerKind = Literal["scaler", "floor"]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
LAG_TICK_S = 0.05  # the client's event-loop lag probe
FLOOR_METRIC = "floor"


@dataclass(frozen=True)
class LoadOptions:
    objects: int = 1000
    duration_s: float = 60.0
    polling_interval_s: float = 30.0
    hpa_interval_s: float = 15.0
    jitter: float = 0.1
    concurrency: int = 1000
    channels: int = 1
    deadline_s: float = 10.0
    soak: bool = False
    sample_interval_s: float = 10.0
    warmup_s: float = 60.0
    config: str | None = None
    profile: str | None = None
    seed: int = 0
    servers: tuple[ServerKind, ...] = ("scaler", "floor")
    rounds: int = 1  # runs of each server, alternated (see run_load)


# --- the servers, as processes -----------------------------------------------------------------


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


class ServerProcess:
    """A server started here as a child process; its port is read from the `serving` log line."""

    def __init__(self, kind: ServerKind, argv: Sequence[str], log_dir: Path) -> None:
        self.kind = kind
        self.log_path = log_dir / f"{kind}.log"
        self._log = self.log_path.open("w+")
        self.proc = subprocess.Popen(  # noqa: S603 - our own interpreter and module
            list(argv), stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        self.pid = self.proc.pid
        self.port = 0

    async def wait_serving(self, timeout_s: float = START_TIMEOUT_S) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log_path.read_text().splitlines():
                with contextlib.suppress(ValueError):
                    entry = json.loads(line)
                    if isinstance(entry, dict) and entry.get("event") == "serving":
                        self.port = int(entry["port"])
                        return self.port
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} server exited early:\n{self._tail()}")
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{self.kind} server did not start in {timeout_s:g}s:\n{self._tail()}")

    def _tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])

    def cpu_s(self) -> float:
        """utime + stime of the process so far (all its threads)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "; state is fields[0]
        return (int(fields[11]) + int(fields[12])) / _clock_ticks()

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def open_fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def stop(self) -> int:
        """Stop this process (by its PID): SIGTERM, then SIGKILL if it has not exited in time."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
        return self.proc.returncode


def server_argv(kind: ServerKind, options: LoadOptions) -> list[str]:
    if kind == "floor":
        return [sys.executable, "-m", "gpu_queue_scaler_bench.load.polls", "--floor-server"]
    prefix = [sys.executable]
    if options.profile:
        prefix += ["-m", "cProfile", "-o", options.profile]
    argv = [
        *prefix,
        "-m",
        "gpu_queue_scaler",
        "serve",
        "--address",
        "127.0.0.1:0",
        "--metrics-address",
        "127.0.0.1:0",
        "--drain-seconds",
        "0",
        "--insecure-plaintext",  # loopback, as the floor; TLS would be a cost of its own
        "--log-format",
        "json",
    ]
    return argv + (["--config", options.config] if options.config else [])


# --- the floor: the same proto, constant answers -----------------------------------------------


class FloorService(pb_grpc.ExternalScalerServicer):
    """Answers every unary call with a constant: what any Python grpc.aio scaler pays at least."""

    SPEC = pb.GetMetricSpecResponse(
        metricSpecs=[pb.MetricSpec(metricName=FLOOR_METRIC, targetSize=1, targetSizeFloat=1.0)]
    )
    METRICS = pb.GetMetricsResponse(
        metricValues=[pb.MetricValue(metricName=FLOOR_METRIC, metricValue=1, metricValueFloat=1.0)]
    )
    ACTIVE = pb.IsActiveResponse(result=True)

    async def GetMetricSpec(  # noqa: N802 - gRPC method name
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricSpecResponse:
        return self.SPEC

    async def GetMetrics(  # noqa: N802
        self, request: pb.GetMetricsRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetMetricsResponse:
        return self.METRICS

    async def IsActive(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> pb.IsActiveResponse:
        return self.ACTIVE

    async def StreamIsActive(  # noqa: N802 - not used by the bench; the proto has it
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.IsActiveResponse]:
        yield self.ACTIVE

    async def StreamMetricSpec(  # noqa: N802
        self, request: pb.ScaledObjectRef, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GetMetricSpecResponse]:
        yield self.SPEC


async def serve_floor(address: str = "127.0.0.1:0") -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalScalerServicer_to_server(FloorService(), server)
    port = server.add_insecure_port(address)
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(json.dumps({"event": "serving", "port": port}), flush=True)
    await stop.wait()
    await server.stop(1.0)


# --- the KEDA-like client ----------------------------------------------------------------------


def trigger_metadata(index: int) -> dict[str, str]:
    """A synthetic trigger; periods differ so the objects' decisions do not move in lockstep."""
    return {
        "scalerAddress": "127.0.0.1:6000",
        "backend": "synthetic",
        "syntheticPattern": "sine",
        "syntheticPeakRps": str(4 + index % 13),
        "syntheticServiceSeconds": "2",
        "syntheticPeriodSeconds": str(600 + 7 * (index % 97)),
        "targetConcurrency": "8",
    }


@dataclass
class Calls:
    """What the client saw against one server."""

    latencies_s: list[float] = field(default_factory=list)
    due_s: list[float] = field(default_factory=list)  # when each call was due, into the run
    by_method: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    lag_s: list[float] = field(default_factory=list)  # the client's event-loop lag samples
    # Each object's first GetMetrics: it waits for the object's warm start (history replayed
    # through the policy) and first evaluation, once per object and scaler restart.
    first_s: list[float] = field(default_factory=list)
    late: int = 0  # ticks a loop reached after its next tick was already due (skipped)

    def extend(self, other: Calls) -> None:
        """Add another run's calls (their `due_s` stay relative to their own run's start)."""
        self.latencies_s += other.latencies_s
        self.due_s += other.due_s
        for method, values in other.by_method.items():
            self.by_method.setdefault(method, []).extend(values)
        self.errors.update(other.errors)
        self.lag_s += other.lag_s
        self.first_s += other.first_s
        self.late += other.late


class KedaLoad:
    def __init__(self, options: LoadOptions, port: int, rng: random.Random) -> None:
        self.options = options
        self.rng = rng
        self.channels = [
            grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
            )
            for _ in range(max(1, options.channels))
        ]
        self.stubs = [pb_grpc.ExternalScalerStub(c) for c in self.channels]
        self.slots = asyncio.Semaphore(max(1, options.concurrency))
        self.calls = Calls()
        self.start = time.perf_counter()
        self._asked: set[str] = set()  # objects whose GetMetrics was sent

    async def _call(
        self, method: str, request: Any, stub: pb_grpc.ExternalScalerStub, first: bool = False
    ) -> Any:
        due = time.perf_counter()
        try:
            async with self.slots:
                answer = await getattr(stub, method)(request, timeout=self.options.deadline_s)
        except grpc.aio.AioRpcError as exc:
            self.calls.errors[f"{method}:{exc.code().name}"] += 1
            return None
        took = time.perf_counter() - due
        self.calls.latencies_s.append(took)
        self.calls.due_s.append(due - self.start)
        self.calls.by_method.setdefault(method, []).append(took)
        if first:
            self.calls.first_s.append(took)
        return answer

    async def _metrics_and_activity(
        self, stub: pb_grpc.ExternalScalerStub, ref: pb.ScaledObjectRef, metric: str
    ) -> None:
        """KEDA's GetMetricsAndActivity for an external scaler: GetMetrics, then IsActive."""
        first = ref.name not in self._asked
        self._asked.add(ref.name)
        await self._call(
            "GetMetrics", pb.GetMetricsRequest(scaledObjectRef=ref, metricName=metric), stub, first
        )
        await self._call("IsActive", ref, stub)

    async def _every(
        self,
        period_s: float,
        first_s: float,
        stub: pb_grpc.ExternalScalerStub,
        ref: pb.ScaledObjectRef,
        metric: str,
    ) -> None:
        next_at = time.monotonic() + first_s
        while True:
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await self._metrics_and_activity(stub, ref, metric)
            jitter = 1.0 + self.rng.uniform(-self.options.jitter, self.options.jitter)
            next_at += period_s * jitter
            if next_at < time.monotonic():  # the calls took longer than a period
                self.calls.late += 1
                next_at = time.monotonic()

    async def scaled_object(self, index: int) -> None:
        o = self.options
        stub = self.stubs[index % len(self.stubs)]
        ref = pb.ScaledObjectRef(
            namespace=f"bench-{index % 10}",
            name=f"so-{index:05d}",
            scalerMetadata=trigger_metadata(index),
        )
        await asyncio.sleep(self.rng.uniform(0, o.polling_interval_s))  # ScaledObjects appear
        spec = await self._call("GetMetricSpec", ref, stub)
        for _retry in itertools.count():  # no HPA until it answers: KEDA tries again next poll
            if spec is not None:
                break
            await asyncio.sleep(o.polling_interval_s)
            spec = await self._call("GetMetricSpec", ref, stub)
        metric = spec.metricSpecs[0].metricName
        await asyncio.gather(
            self._every(o.polling_interval_s, 0.0, stub, ref, metric),  # KEDA's scale loop
            self._every(
                o.hpa_interval_s, self.rng.uniform(0, o.hpa_interval_s), stub, ref, metric
            ),  # the HPA controller's query through KEDA's metrics server
        )

    async def lag_probe(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            self.calls.lag_s.append(time.perf_counter() - start - LAG_TICK_S)

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


# --- one run against one server ----------------------------------------------------------------


@dataclass
class ServerRun:
    kind: ServerKind
    pid: int
    wall_s: float
    calls: Calls
    server_cpu_s: float
    client_cpu_s: float
    samples: list[tuple[float, int, int]]  # (seconds into the run, RSS KiB, open fds)
    steady_after_s: float  # every object has appeared and run both loops once by then
    exit_code: int | None = None

    def absorb(self, other: ServerRun) -> None:
        """Pool another round of the same server: calls, wall time and CPU add up; the exit
        code is the first non-zero one."""
        self.calls.extend(other.calls)
        self.wall_s += other.wall_s
        self.server_cpu_s += other.server_cpu_s
        self.client_cpu_s += other.client_cpu_s
        self.pid = other.pid
        if not self.exit_code:
            self.exit_code = other.exit_code

    def summary(self) -> dict[str, Any]:
        lat = self.calls.latencies_s
        steady = [t for t, d in zip(lat, self.calls.due_s, strict=True) if d >= self.steady_after_s]
        return {
            "p50_ms": round(quantile(lat, 0.50) * 1000, 3),
            "p99_ms": round(quantile(lat, 0.99) * 1000, 3),
            "calls_per_s": round(len(lat) / self.wall_s, 2),
            "errors": sum(self.calls.errors.values()),
            "server_cpu_s": round(self.server_cpu_s, 3),
            "calls": len(lat),
            "steady_after_s": self.steady_after_s,
            "steady_p50_ms": round(quantile(steady, 0.50) * 1000, 3),
            "steady_p99_ms": round(quantile(steady, 0.99) * 1000, 3),
            "steady_calls": len(steady),
            "first_p50_ms": round(quantile(self.calls.first_s, 0.50) * 1000, 3),
            "first_p99_ms": round(quantile(self.calls.first_s, 0.99) * 1000, 3),
            "first_calls": len(self.calls.first_s),
            "max_ms": round(max(lat, default=math.nan) * 1000, 3),
            "error_codes": dict(self.calls.errors),
            "by_method_p99_ms": {
                m: round(quantile(v, 0.99) * 1000, 3)
                for m, v in sorted(self.calls.by_method.items())
            },
            "client_cpu_s": round(self.client_cpu_s, 3),
            "client_lag_p99_ms": round(quantile(self.calls.lag_s, 0.99) * 1000, 3),
            "late_ticks": self.calls.late,
            "pid": self.pid,
            "exit_code": self.exit_code,
        }


def _client_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_one(
    kind: ServerKind, options: LoadOptions, log_dir: Path, stop: asyncio.Event | None = None
) -> ServerRun:
    server = ServerProcess(kind, server_argv(kind, options), log_dir)
    try:
        run = await _drive(server, options, stop)
    finally:
        code = await asyncio.to_thread(server.stop)
    run.exit_code = code
    return run


async def _drive(
    server: ServerProcess, options: LoadOptions, stop: asyncio.Event | None
) -> ServerRun:
    port = await server.wait_serving()
    load = KedaLoad(options, port, random.Random(options.seed))  # noqa: S311 - schedule jitter
    samples: list[tuple[float, int, int]] = []
    start = time.monotonic()

    async def sample() -> None:
        while True:
            samples.append((time.monotonic() - start, server.rss_kib(), server.open_fds()))
            await asyncio.sleep(options.sample_interval_s)

    cpu0, client0 = server.cpu_s(), _client_cpu_s()
    tasks = [asyncio.create_task(load.scaled_object(i)) for i in range(options.objects)]
    tasks += [asyncio.create_task(load.lag_probe()), asyncio.create_task(sample())]
    waiter = asyncio.create_task((stop or asyncio.Event()).wait())
    try:
        await asyncio.wait({waiter}, timeout=options.duration_s)
        wall = time.monotonic() - start
        cpu, client = server.cpu_s() - cpu0, _client_cpu_s() - client0
        samples.append((wall, server.rss_kib(), server.open_fds()))
    finally:
        waiter.cancel()
        for task in tasks:
            task.cancel()
        await asyncio.gather(waiter, *tasks, return_exceptions=True)
        await load.close()
    steady_after = options.polling_interval_s + options.hpa_interval_s * (1 + options.jitter)
    return ServerRun(server.kind, server.pid, wall, load.calls, cpu, client, samples, steady_after)


def soak_summary(run: ServerRun, warmup_s: float) -> dict[str, Any]:
    warmed = [s for s in run.samples if s[0] >= warmup_s]
    after = warmed or run.samples[-1:]
    rss_warm, rss_end = after[0][1], run.samples[-1][1]
    return {
        "warmup_s": warmup_s,
        "rss_start_kib": run.samples[0][1],
        "rss_after_warmup_kib": rss_warm,
        "rss_end_kib": rss_end,
        "rss_max_kib": max(s[1] for s in run.samples),
        # None, not 0, with no sample after the warm-up: there is no growth to judge.
        "rss_growth_pct": (
            round(100.0 * (rss_end - rss_warm) / rss_warm, 2) if warmed and rss_warm else None
        ),
        "fds_start": run.samples[0][2],
        "fds_after_warmup": after[0][2],
        "fds_end": run.samples[-1][2],
        "samples": len(run.samples),
    }


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b > 0 and math.isfinite(a) and math.isfinite(b) else None


RATIO_KEYS = {
    "p50": "p50_ms",
    "p99": "p99_ms",
    "steady_p50": "steady_p50_ms",
    "steady_p99": "steady_p99_ms",
    "first_p99": "first_p99_ms",
    "server_cpu": "server_cpu_s",
}


def _ratios(scaler: dict[str, Any], floor: dict[str, Any]) -> dict[str, float | None]:
    """The scaler's figure over the floor's, for each summary key of RATIO_KEYS."""
    return {name: _ratio(scaler[key], floor[key]) for name, key in RATIO_KEYS.items()}


async def run_load(options: LoadOptions, stop: asyncio.Event | None = None) -> dict[str, Any]:
    if options.objects < 1 or options.duration_s <= 0:
        raise ValueError("--objects and --duration must be above 0")
    if options.polling_interval_s <= 0 or options.hpa_interval_s <= 0:
        raise ValueError("--polling-interval and --hpa-interval must be above 0")
    if options.rounds < 1 or (options.soak and options.rounds > 1):
        raise ValueError("--rounds must be 1 or more, and 1 with --soak")
    runs: dict[str, ServerRun] = {}
    by_round: list[dict[str, float | None]] = []
    with tempfile.TemporaryDirectory(prefix="scaler-bench-load-") as tmp:
        kinds: tuple[ServerKind, ...] = ("scaler",) if options.soak else options.servers
        for number in range(options.rounds):
            # Rounds alternate the order (scaler, floor, floor, scaler, ...), so a machine that
            # gets busier or quieter over the bench weighs on both servers alike.
            order = kinds if number % 2 == 0 else kinds[::-1]
            this: dict[str, ServerRun] = {}
            for kind in order:
                this[kind] = await run_one(kind, options, Path(tmp), stop)
                if stop is not None and stop.is_set():
                    break
            if "scaler" in this and "floor" in this:
                ratios = _ratios(this["scaler"].summary(), this["floor"].summary())
                by_round.append({key: ratios[key] for key in ("p99", "steady_p99")})
            for name, run in this.items():
                if name in runs:
                    runs[name].absorb(run)
                else:
                    runs[name] = run
            if stop is not None and stop.is_set():
                break
    return assemble(options, runs, by_round)


def assemble(
    options: LoadOptions, runs: dict[str, ServerRun], by_round: list[dict[str, float | None]]
) -> dict[str, Any]:
    """The bench's result from each server's pooled run: summaries, ratios, soak figures."""
    result: dict[str, Any] = {
        "objects": options.objects,
        "duration_s": round(max(r.wall_s for r in runs.values()), 3),
        "rounds": options.rounds,
        "polling_interval_s": options.polling_interval_s,
        "hpa_interval_s": options.hpa_interval_s,
        "scaler": runs["scaler"].summary() if "scaler" in runs else None,
        "floor": runs["floor"].summary() if "floor" in runs else None,
    }
    if result["scaler"] and result["floor"]:
        result["ratio"] = {**_ratios(result["scaler"], result["floor"]), "by_round": by_round}
    if options.soak and "scaler" in runs:
        result["soak"] = soak_summary(runs["scaler"], options.warmup_s)
    return result


# --- output ------------------------------------------------------------------------------------


def table(result: dict[str, Any]) -> str:
    rounds = result.get("rounds", 1)
    lines = [
        f"{result['objects']} ScaledObjects, {result['duration_s']:.0f} s per server"
        + (f" over {rounds} alternated rounds (figures pooled)" if rounds > 1 else "")
        + ", "
        f"KEDA poll {result['polling_interval_s']:g} s + HPA {result['hpa_interval_s']:g} s "
        "(GetMetrics + IsActive each)",
        f"{'':>22} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'calls/s':>9} {'errors':>7} "
        f"{'srv CPU s':>10} {'cli CPU s':>10} {'cli lag p99':>12}",
    ]
    for kind in ("scaler", "floor"):
        r = result.get(kind)
        if r is None:
            continue
        lines.append(
            f"{kind:>22} {r['p50_ms']:>9.2f} {r['p99_ms']:>9.2f} {r['max_ms']:>9.2f} "
            f"{r['calls_per_s']:>9.1f} {r['errors']:>7d} {r['server_cpu_s']:>10.2f} "
            f"{r['client_cpu_s']:>10.2f} {r['client_lag_p99_ms']:>10.1f}ms"
        )
        lines.append(
            f"{'  after ' + format(r['steady_after_s'], 'g') + ' s':>22} "
            f"{r['steady_p50_ms']:>9.2f} {r['steady_p99_ms']:>9.2f}   (steady state: "
            f"{r['steady_calls']} calls)"
        )
        lines.append(
            f"{'  first per object':>22} {r['first_p50_ms']:>9.2f} {r['first_p99_ms']:>9.2f}"
            f"   (each object's first GetMetrics: {r['first_calls']} calls)"
        )
        if r["error_codes"]:
            lines.append(f"{'':>22} errors: {r['error_codes']}")
    ratio = result.get("ratio")
    if ratio:
        lines += [
            f"{'scaler / floor':>22} {_show(ratio['p50']):>9} {_show(ratio['p99']):>9} "
            f"{'':>9} {'':>9} {'':>7} {_show(ratio['server_cpu']):>10}",
            f"{'  steady state':>22} {_show(ratio['steady_p50']):>9} "
            f"{_show(ratio['steady_p99']):>9}",
        ]
        if len(ratio["by_round"]) > 1:
            lines.append(
                "  p99 ratio by round: "
                + ", ".join(
                    f"{_show(r['p99'])} (steady {_show(r['steady_p99'])})"
                    for r in ratio["by_round"]
                )
            )
        for key, what in (("p99", "p99"), ("steady_p99", "steady-state p99")):
            lines.append(f"{what} {_verdict(ratio[key], result, key)}")
    soak = result.get("soak")
    if soak:
        growth = soak["rss_growth_pct"]
        lines += [
            f"soak: RSS {soak['rss_start_kib'] / 1024:.1f} MiB at start, "
            f"{soak['rss_after_warmup_kib'] / 1024:.1f} MiB after {soak['warmup_s']:g} s warm-up, "
            f"{soak['rss_end_kib'] / 1024:.1f} MiB at the end (max "
            f"{soak['rss_max_kib'] / 1024:.1f}): growth {_show(growth)}% "
            + (
                "(no verdict: no RSS sample after the warm-up; run longer than --warmup)"
                if growth is None
                else f"({'within' if growth < 5 else 'ABOVE'} the 5% goal)"
            ),
            f"soak: open fds {soak['fds_start']} at start, {soak['fds_after_warmup']} after "
            f"warm-up, {soak['fds_end']} at the end ({soak['samples']} samples)",
        ]
    return "\n".join(lines)


# A p99 of fewer calls is their maximum, one slow call: no verdict below this many per server.
VERDICT_MIN_CALLS = 100


def _verdict(ratio: float | None, result: dict[str, Any], key: str) -> str:
    """Against the 1.5x goal; no verdict without a ratio (a figure with no calls behind it) or
    on too few calls for a p99."""
    counted = "steady_calls" if key == "steady_p99" else "calls"
    fewest = min(result[kind][counted] for kind in ("scaler", "floor"))
    if ratio is not None and fewest < VERDICT_MIN_CALLS:
        return (
            f"n/a: no verdict ({fewest} calls on a server; a p99 needs at least "
            f"{VERDICT_MIN_CALLS}: run longer or with more --objects)"
        )
    if ratio is not None:
        return f"{'within' if ratio <= 1.5 else 'ABOVE'} 1.5x the floor (goal)"
    if key == "steady_p99":
        after = max(result[kind]["steady_after_s"] for kind in ("scaler", "floor"))
        return (
            f"n/a: no verdict (no call after {after:g} s, when steady state starts: run longer "
            "than that, or shorten --polling-interval / --hpa-interval)"
        )
    return "n/a: no verdict (a server answered no call)"


def _show(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g}"


def options_from(args: argparse.Namespace) -> LoadOptions:
    duration = args.duration if args.duration is not None else (600.0 if args.soak else 60.0)
    return LoadOptions(
        objects=args.objects,
        duration_s=duration,
        polling_interval_s=args.polling_interval,
        hpa_interval_s=args.hpa_interval,
        jitter=args.jitter,
        concurrency=args.concurrency,
        channels=args.channels,
        soak=args.soak,
        sample_interval_s=args.sample_interval,
        warmup_s=args.warmup,
        config=args.config,
        profile=args.profile,
        seed=args.seed,
        rounds=args.rounds,
    )


def run_command(options: LoadOptions, *, as_json: bool = False) -> int:
    """0 when every server answered without errors, 1 otherwise, 2 on bad input."""

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: stop, report what ran
        try:
            return await run_load(options, stop)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGINT)

    try:
        result = asyncio.run(main())
    except ValueError as exc:
        print(f"scaler bench load: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, TimeoutError) as exc:
        print(f"scaler bench load: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result) if as_json else table(result))
    served = [result[k] for k in ("scaler", "floor") if result.get(k)]
    return 0 if served and all(r["errors"] == 0 and r["calls"] > 0 for r in served) else 1


# the floor server process: `python -m gpu_queue_scaler_bench.load.polls --floor-server`
if __name__ == "__main__":
    if sys.argv[1:] != ["--floor-server"]:
        sys.exit("usage: python -m gpu_queue_scaler_bench.load.polls --floor-server")
    asyncio.run(serve_floor())
