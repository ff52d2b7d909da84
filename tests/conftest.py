"""Shared fixtures: a real scaler server on a loopback port and a KEDA-like client for it."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from gpu_queue_scaler.decision.policy import Decision
from gpu_queue_scaler.engine import Engine, Workload
from gpu_queue_scaler.serve.server import ScalerServer
from gpu_queue_scaler.settings.config import Config, ServerSettings
from gpu_queue_scaler.settings.reload import ConfigStore
from gpu_queue_scaler_bench.emulators.keda import KedaLikeClient, scaled_object
from tests.servers.base import await_install

FAST = ServerSettings(
    evaluation_interval_s=0.05,
    workload_idle_timeout_s=60.0,
    stale_target_s=600.0,
    first_decision_timeout_s=5.0,
)


BENCH = Path(__file__).resolve().parents[1] / "bench"


# What the policy's and the windows' property tests share: reproducible examples, no per-example
# deadline (a shared CI machine is noisy), and slow data generation allowed. Each test sets its
# own max_examples on top: @settings(PROPERTIES, max_examples=N).
PROPERTIES = settings(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


def run_bench(script: str, *args: str, timeout_s: float = 120) -> list[str]:
    """Run bench/<script> with this interpreter, bounded in time; its stdout lines (it must
    exit 0: its stderr is the failure message)."""
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def synthetic(**overrides: str) -> dict[str, str]:
    """Trigger metadata for a synthetic workload (every value a string, as KEDA sends them)."""
    base = {
        "scalerAddress": "127.0.0.1:6000",
        "backend": "synthetic",
        "syntheticPattern": "constant",
        "syntheticPeakRps": "6",
        "syntheticServiceSeconds": "2",
        "targetConcurrency": "8",
    }
    base.update(overrides)
    return base


# Real servers (Prometheus, Triton, vLLM) started by the tests; see tests/servers/.
pytest_plugins = ["tests.servers.prometheus", "tests.servers.triton", "tests.servers.vllm"]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """A `real_servers` test first waits for `./dev test`'s background installs of the servers
    (no-op when none runs), outside its timeout: a test's time limit is for the test, not for
    vLLM's downloads. Whether an install failed, the server's fixture reports."""
    if item.get_closest_marker("real_servers") is not None:
        for server in ("prometheus", "triton", "vllm"):
            await_install(server)
    return (yield)


class ManualClock:
    """Wall-clock and monotonic time that move only when the test moves them (`advance`), and the
    sleep that waits for them: an Engine built with `engine()` ticks, times out idle workloads
    and ages held targets on this clock, so a test counts in ticks what it used to time in
    seconds, whatever the machine's speed. gRPC and the event loop still run in real time."""

    TOLERANCE_S = 1e-6  # float sums of intervals land a hair off the tick grid

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._start = start
        self._elapsed = 0.0  # summed apart from `start`: sums of 0.1 s near 1.8e9 drift by ulps
        self.now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        if seconds <= self.TOLERANCE_S:
            await asyncio.sleep(0)
            return
        woken = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self.now + seconds, next(self._order), woken))
        await woken

    def advance(self, seconds: float) -> None:
        """Move time on and wake every sleeper whose time has come."""
        self._elapsed += seconds
        self.now = self._start + self._elapsed
        while self._sleepers and self._sleepers[0][0] <= self.now + self.TOLERANCE_S:
            _, _, woken = heapq.heappop(self._sleepers)
            if not woken.done():  # a cancelled sleeper (a stopped loop) is skipped
                woken.set_result(None)

    def engine(self, store: ConfigStore, **kwargs: Any) -> Engine:
        return Engine(store, clock=self.time, monotonic=self.monotonic, sleep=self.sleep, **kwargs)


ServerFactory = Callable[..., Any]


@pytest.fixture
async def start_server() -> AsyncIterator[ServerFactory]:
    """Start real servers on 127.0.0.1:0; all are stopped at the end of the test."""
    servers: list[ScalerServer] = []
    clients: list[KedaLikeClient] = []

    async def start(
        config: Config | None = None, **kwargs: Any
    ) -> tuple[ScalerServer, KedaLikeClient]:
        store = kwargs.pop("store", None) or ConfigStore(config or Config(server=FAST))
        server = ScalerServer(store, "127.0.0.1:0", **kwargs)
        await server.start()
        servers.append(server)
        client = KedaLikeClient(f"127.0.0.1:{server.port}")
        clients.append(client)
        return server, client

    yield start
    for client in clients:
        await asyncio.wait_for(client.close(), 30)
    for server in servers:
        server.grace_s = min(server.grace_s, 2.0)  # nothing in flight is waited on at teardown
        await server.stop()  # bounded inside: grace, then at most STOP_LOOPS_S for the loops
        assert server.loops_stopped, "a workload loop did not stop (see the stop_timeout log)"


def ref(name: str, metadata: Mapping[str, str], namespace: str = "team-a") -> Any:
    return scaled_object(namespace, name, metadata)


def latest(server: ScalerServer, name: str) -> Decision | None:
    """The server's current decision for the ScaledObject `name`, if any."""
    return next((d for d in server.engine.decisions() if d.workload.endswith("/" + name)), None)


async def poll(check: Callable[[], bool], timeout_s: float) -> bool:
    """Call `check` every 20 ms until it is true (bounded by `timeout_s`). The last call is
    after the deadline: a loop starved past it still sees what is there."""
    deadline = time.monotonic() + timeout_s
    while True:
        past = time.monotonic() >= deadline
        if check():
            return True
        if past:
            return False
        await asyncio.sleep(0.02)


async def wait_decision(
    server: ScalerServer, name: str, predicate: Callable[[Decision], bool], timeout_s: float
) -> Decision:
    """Poll the server's decisions for `name` until one matches (bounded by `timeout_s`)."""
    last: list[Decision | None] = [None]

    def matches() -> bool:
        decision = last[0] = latest(server, name)
        return decision is not None and predicate(decision)

    if await poll(matches, timeout_s):
        assert last[0] is not None
        return last[0]
    faults = last[0].faults if last[0] is not None else ()
    raise AssertionError(f"no decision matched within {timeout_s}s; last: {last[0]}; {faults}")


class DecisionLog:
    """Every decision the servers publish, in order: a spy on `Workload.publish`.

    Latency claims ("the next evaluation after the queue shows sees it") are asserted on this
    log, counted in ticks, rather than by timing the test's own polling: on a 2-core runner a
    real vLLM or Triton starves the test's event loop for seconds, which says nothing about the
    scaler, while the tick a decision came from does."""

    def __init__(self) -> None:
        self.decisions: list[Decision] = []
        self.publishers: list[int] = []  # id() of the Workload that published each decision

    def by_publisher(self, name: str) -> list[list[Decision]]:
        """`name`'s decisions split by the Workload that published them (one per server that
        evaluates it), in the order each first published."""
        groups: dict[int, list[Decision]] = {}
        for who, decision in zip(self.publishers, self.decisions, strict=True):
            if decision.workload.endswith("/" + name):
                groups.setdefault(who, []).append(decision)
        return list(groups.values())

    def after(self, name: str, wall: float, *, with_signal: bool = False) -> list[Decision]:
        """Decisions for `name` from ticks at or after `wall` (epoch seconds): their reads
        began after that moment. With `with_signal`, held ticks (a read that failed) are left
        out."""
        return [
            d
            for d in self.decisions
            if d.workload.endswith("/" + name)
            and d.at >= wall
            and (d.signal is not None or not with_signal)
        ]

    async def wait_within(
        self,
        name: str,
        wall: float,
        predicate: Callable[[Decision], bool],
        *,
        ticks: int,
        timeout_s: float,
        with_signal: bool = False,
    ) -> Decision:
        """The first decision after `wall` that matches, which must be among the first `ticks`
        after it (bounded by `timeout_s` of waiting for them)."""
        seen: list[Decision] = []

        def settled() -> bool:  # a match, or all `ticks` in without one
            seen[:] = self.after(name, wall, with_signal=with_signal)[:ticks]
            return any(predicate(d) for d in seen) or len(seen) == ticks

        await poll(settled, timeout_s)
        match = next((d for d in seen if predicate(d)), None)
        if match is not None:
            return match
        raise AssertionError(
            f"none of the first {ticks} decisions for {name} after {wall} matched "
            f"({len(seen)} came in {timeout_s}s): {seen}"
        )


@pytest.fixture
def decision_log(monkeypatch: pytest.MonkeyPatch) -> DecisionLog:
    """Record every published decision (the real publish still runs)."""
    log = DecisionLog()
    publish = Workload.publish

    def spy(self: Workload, decision: Decision | None, problem: Any) -> None:
        if decision is not None:
            log.decisions.append(decision)
            log.publishers.append(id(self))
        publish(self, decision, problem)

    monkeypatch.setattr(Workload, "publish", spy)
    return log
