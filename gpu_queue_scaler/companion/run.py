"""The companion's loop: decisions -> cluster read -> plan -> the diffs written, every interval.

One pass, in order:

1. the Lease (skipped in dry-run, which never leads and never writes): only the leader writes;
   a follower still reads and plans, so its metrics and its planner memory are warm on takeover;
2. GET the scaler's /decisions (bounded timeout). A failure is fail static: no cluster read and
   no write this pass, because the companion must never act on demand it does not have;
3. read the cluster (`kube.reads`) for the decided workloads and the ones the planner still
   remembers (a workload missing from /decisions is held, not forgotten); an API error keeps the
   last state and writes nothing;
4. `plan.plan` over the NodePools the companion manages: those a workload is placed on, or that
   carry its placeholders or its annotations. Every other NodePool is someone else's;
5. the leader applies the diffs. Idempotent: a second pass with nothing changed sends nothing.
   An Event that cannot be created does not fail the pass; it counts in
   errors_total{stage="event"};
6. packing (unless --no-pack): the leader sets each workload pod's
   controller.kubernetes.io/pod-deletion-cost to the GPU pods on its node
   (`gpu_queue_scaler.companion.packing`), so a scale-down empties the least-used node first and
   consolidation can remove it. It does not depend on demand (the annotation only orders the
   deletions the HPA decided), so it runs whatever the plans hold; writes_total{kind=
   "pod_deletion_cost"} counts the PATCHes.

When the loop ends (stop event, or --once) the leader releases its Lease, so a standby takes
over at its next pass rather than after the lease duration.

Bounded: each request has a timeout and retries a few times; the loop waits at most `interval`
between passes and stops as soon as the stop event is set.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge

from gpu_queue_scaler.companion.inputs import DecisionsError, parse_decisions
from gpu_queue_scaler.companion.kube.client import KubeError
from gpu_queue_scaler.companion.kube.cluster import Kube
from gpu_queue_scaler.companion.kube.reads import ClusterView
from gpu_queue_scaler.companion.kube.writes import Write
from gpu_queue_scaler.companion.model import (
    PREVIOUS_BUDGETS_ANNOTATION,
    PREVIOUS_LIMIT_ANNOTATION,
    CompanionConfig,
    CompanionState,
    NodePoolPlan,
    NodePoolState,
    WorkloadDemand,
)
from gpu_queue_scaler.companion.packing import pack
from gpu_queue_scaler.companion.plan import plan
from gpu_queue_scaler.sources.httpclient import async_client

log = logging.getLogger(__name__)

PREFIX = "queue_scaler_companion_"


class CompanionMetrics:
    """The companion's own /metrics (its registry, so tests and two companions never clash)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.passes = Counter(
            PREFIX + "passes",
            "Passes by result (ok, follower, fail_static, read_error, write_error)",
            ["result"],
            registry=registry,
        )
        self.writes = Counter(
            PREFIX + "writes",
            "Writes sent (or printed, in dry-run) by kind",
            ["kind"],
            registry=registry,
        )
        self.errors = Counter(
            PREFIX + "errors",
            "Errors by stage (lease, decisions, read, write, event, pass)",
            ["stage"],
            registry=registry,
        )
        self.leader = Gauge(PREFIX + "leader", "1 while this companion leads", registry=registry)
        self.placeholders = Gauge(
            PREFIX + "planned_placeholders",
            "Placeholder pods planned per NodePool",
            ["nodepool"],
            registry=registry,
        )
        self.forecast = Gauge(
            PREFIX + "forecast_gpus",
            "GPUs the workloads on a NodePool are forecast to need at the horizon",
            ["nodepool"],
            registry=registry,
        )
        self.last_success = Gauge(
            PREFIX + "last_success_timestamp_seconds",
            "When a pass last read, planned and (if leading) applied without error",
            registry=registry,
        )


@dataclass(frozen=True)
class RunSettings:
    scaler_url: str  # e.g. http://gpu-queue-scaler.keda:9090
    interval_s: float = 15.0
    decisions_timeout_s: float = 5.0


@dataclass(frozen=True)
class PassResult:
    """What one pass did (for tests, and the log line)."""

    result: str  # ok | follower | fail_static | read_error | write_error
    leader: bool
    plans: tuple[NodePoolPlan, ...] = ()
    writes: tuple[Write, ...] = ()
    problems: tuple[str, ...] = ()
    error: str | None = None
    view: ClusterView | None = field(default=None, repr=False)


def managed_pools(view: ClusterView) -> list[NodePoolState]:
    """The NodePools the companion plans for: where a workload is placed, or where it left
    placeholders or its annotations (so it cleans up after a workload that went away)."""
    names = {p.nodepool for p in view.placements.values()}
    for pool in view.pools.values():
        if (
            pool.placeholders is not None
            or PREVIOUS_BUDGETS_ANNOTATION in pool.annotations
            or PREVIOUS_LIMIT_ANNOTATION in pool.annotations
        ):
            names.add(pool.name)
    return [view.pools[name] for name in sorted(names) if name in view.pools]


class Companion:
    def __init__(
        self,
        kube: Kube,
        settings: RunSettings,
        config: CompanionConfig,
        *,
        registry: CollectorRegistry | None = None,
        http: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.config = config
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = CompanionMetrics(self.registry)
        self.state = CompanionState()
        self._http = http if http is not None else async_client()
        self._own_http = http is None
        self._clock = clock
        self._planned: set[str] = set()

    async def close(self) -> None:
        if self._own_http:
            await self._http.aclose()

    async def _decisions(self, now: float) -> tuple[list[WorkloadDemand], list[str]] | str:
        """(demands, per-entry errors), or why /decisions could not be read at all."""
        url = f"{self.settings.scaler_url.rstrip('/')}/decisions"
        try:
            response = await self._http.get(url, timeout=self.settings.decisions_timeout_s)
            if response.status_code != 200:
                return f"GET {url}: HTTP {response.status_code}"
            demands, errors = parse_decisions(response.content, now)
        except httpx.HTTPError as exc:
            return f"GET {url}: {type(exc).__name__}: {exc}"
        except DecisionsError as exc:
            return f"GET {url}: {exc}"
        return demands, errors

    async def run_pass(self) -> PassResult:
        now = self._clock()
        m = self.metrics
        dry_run = self.kube.settings.dry_run
        leader = dry_run  # a dry run plans and prints as if it led, and never takes the Lease
        if not dry_run:
            try:
                leader = await self.kube.elect(now)
            except KubeError as exc:
                m.errors.labels("lease").inc()
                log.warning("%s", exc, extra={"event": "lease_error"})
                leader = False
            m.leader.set(1.0 if leader else 0.0)

        got = await self._decisions(now)
        if isinstance(got, str):
            return self._end(
                PassResult("fail_static", leader, error=got), "decisions", "fail static"
            )
        demands, problems = got
        workloads = {d.workload for d in demands} | set(self.state.last_demand_at)
        try:
            view = await self.kube.read(workloads)
        except KubeError as exc:
            return self._end(
                PassResult("read_error", leader, error=str(exc), problems=tuple(problems)),
                "read",
                "cluster read failed; keeping the last state",
            )
        problems = [*problems, *view.problems]
        for problem in problems:
            log.warning("%s", problem, extra={"event": "companion_input"})

        plans, self.state = plan(
            demands,
            list(view.placements.values()),
            managed_pools(view),
            self.config,
            self.state,
            now,
        )
        self._gauges(plans)
        if not leader:
            return self._end(
                PassResult("follower", leader, tuple(plans), (), tuple(problems), view=view)
            )
        events_failed = self.kube.events_failed
        changes = pack(view.pack_pods, self.config.pack_max_writes) if self.config.pack else []
        writes: list[Write] = []
        try:
            writes += await self.kube.apply(view, plans, self.config, now)
            if changes:
                writes += await self.kube.pack(changes)
        except KubeError as exc:
            return self._end(
                PassResult(
                    "write_error", leader, tuple(plans), (), tuple(problems), str(exc), view
                ),
                "write",
                "write failed; the rest of this pass is skipped, retried next pass",
            )
        finally:
            if self.kube.events_failed > events_failed:
                m.errors.labels("event").inc(self.kube.events_failed - events_failed)
        for write in writes:
            m.writes.labels(write.kind).inc()
        m.last_success.set(now)
        return self._end(
            PassResult("ok", leader, tuple(plans), tuple(writes), tuple(problems), view=view)
        )

    def _gauges(self, plans: list[NodePoolPlan]) -> None:
        seen = set()
        for p in plans:
            seen.add(p.nodepool)
            self.metrics.placeholders.labels(p.nodepool).set(p.placeholders)
            self.metrics.forecast.labels(p.nodepool).set(p.forecast_gpus)
        for gone in self._planned - seen:  # a NodePool no longer managed leaves /metrics
            self.metrics.placeholders.remove(gone)
            self.metrics.forecast.remove(gone)
        self._planned = seen

    def _end(self, result: PassResult, stage: str | None = None, what: str = "") -> PassResult:
        self.metrics.passes.labels(result.result).inc()
        if stage is not None:
            self.metrics.errors.labels(stage).inc()
            log.warning("%s: %s", what, result.error, extra={"event": f"companion_{result.result}"})
        else:
            log.info(
                "pass %s: %d plan(s), %d write(s)",
                result.result,
                len(result.plans),
                len(result.writes),
                extra={"event": "companion_pass", "result": result.result},
            )
        return result

    async def run(self, stop: asyncio.Event, *, max_passes: int | None = None) -> int:
        """Passes every interval until `stop` (or `max_passes`); the passes run."""
        done = 0
        while not stop.is_set() and (max_passes is None or done < max_passes):
            started = time.monotonic()
            try:
                await self.run_pass()
            except Exception:  # a bug in one pass must not end the loop; it is logged
                self.metrics.errors.labels("pass").inc()
                log.exception("companion pass failed", extra={"event": "companion_pass_error"})
            done += 1
            wait = max(0.0, self.settings.interval_s - (time.monotonic() - started))
            if stop.is_set() or (max_passes is not None and done >= max_passes):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=wait)
        await self.release()
        return done

    async def release(self) -> bool:
        """Give the Lease up if this companion holds it (not in dry-run); never raises."""
        if self.kube.settings.dry_run:
            return False
        released = await self.kube.release(self._clock())
        self.metrics.leader.set(0.0)
        return released


def api_client(kubeconfig: str | None) -> Any:
    """A kubernetes ApiClient: --kubeconfig if given, else in-cluster, else ~/.kube/config (as
    gpu_queue_scaler.sources.discovery does). urllib3's own retries are off: tenacity is the one
    layer."""
    from kubernetes import client
    from kubernetes import config as kube_config

    config: Any = kube_config  # its loaders are untyped
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)
            except config.ConfigException:
                config.load_kube_config(client_configuration=configuration)
    except (config.ConfigException, OSError) as exc:
        raise KubeError(f"no Kubernetes API configuration: {exc}") from None
    configuration.retries = False
    return client.ApiClient(configuration)


def parse_hours(text: str | None) -> tuple[int, int] | None:
    """`START-END` UTC hours (e.g. 7-22) -> (7, 22); empty or None -> None."""
    if not text:
        return None
    start, sep, end = text.partition("-")
    if not sep or not start.strip().isdigit() or not end.strip().isdigit():
        raise ValueError(f"--active-hours {text!r}: expected START-END UTC hours, e.g. 7-22")
    hours = int(start), int(end)
    if not all(0 <= h <= 24 for h in hours):
        raise ValueError(f"--active-hours {text!r}: hours are 0-24")
    return hours


def command(args: argparse.Namespace) -> int:
    """`scaler companion`: run the loop until SIGTERM/SIGINT (or once, with --once)."""
    import os
    import signal
    import sys

    from prometheus_client import start_http_server

    from gpu_queue_scaler import logs
    from gpu_queue_scaler.companion.kube.client import KubeSettings

    logs.setup(args.log_level, args.log_format)
    try:
        config = CompanionConfig(
            placeholder_gpus=args.placeholder_gpus,
            max_placeholders=args.max_placeholders,
            peak_rise_fraction=args.peak_rise_fraction,
            peak_hold_s=args.peak_hold,
            active_hours_utc=parse_hours(args.active_hours),
            stale_after_s=args.stale_after,
            pack=not args.no_pack,
        )
        if args.interval <= 0 or args.lease_duration <= args.interval:
            raise ValueError("--lease-duration must be longer than --interval (> 0)")
        client = api_client(args.kubeconfig)
    except (ValueError, KubeError) as exc:
        print(f"scaler companion: {exc}", file=sys.stderr)
        return 2
    settings = KubeSettings(
        namespace=args.namespace,
        identity=args.identity or os.environ.get("HOSTNAME") or "companion",
        lease_name=args.lease_name,
        lease_duration_s=args.lease_duration,
        placeholder_image=args.placeholder_image,
        priority_class=args.priority_class,
        taint_key=args.placeholder_toleration_key,
        event_namespace=args.event_namespace,
        dry_run=args.dry_run,
    )
    registry = CollectorRegistry()
    if args.metrics_port:
        start_http_server(args.metrics_port, registry=registry)

    async def run() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            # Only the main thread can take signals (an in-process caller may run us in another).
            with contextlib.suppress(ValueError, RuntimeError, NotImplementedError):
                loop.add_signal_handler(sig, stop.set)
        companion = Companion(
            Kube(client, settings),
            RunSettings(
                scaler_url=args.scaler_url,
                interval_s=args.interval,
                decisions_timeout_s=args.decisions_timeout,
            ),
            config,
            registry=registry,
        )
        try:
            await companion.run(stop, max_passes=1 if args.once else None)
        finally:
            await companion.close()
            client.close()
        return 0

    return asyncio.run(run())
