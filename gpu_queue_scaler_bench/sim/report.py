"""Measures per policy, the sanity checks, the table, the JSON object and the plots.

Why measures and not just cost: a policy is only cheaper if it serves as well, so every row pairs
SLO attainment (share of all requests, dropped ones counting as misses, whose queue wait and TTFT
are within the SLO) with what it paid (GPU-hours = live nodes x GPUs per node, cold starts
included; dollars at the node type's on-demand price). Percentiles are over completed requests.

Cold starts, where pre-warm (the companion's row) acts:

- `node_hours`: live node-seconds / 3600 over the trace (what Karpenter bills; GPU-h / GPUs per
  node);
- `replica_start_p50_s` / `replica_start_p99_s`: a pod's creation -> ready, over pods created
  during the trace, i.e. what a scale-up waits (model load on a free GPU, plus the node launch
  when it needs a new node); NaN/null when no pod was created;
- `scale_from_zero_s`: mean over scale-from-zero episodes (nothing serving and a request arrives)
  of first such arrival -> a replica serving, on the step clock; NaN/null with no episode;
  `scale_from_zero_episodes` counts them (an episode still open at the end is not counted).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpu_queue_scaler_bench.sim.policies import (
    KEDA_INFLIGHT,
    KEDA_INFLIGHT_BEST,
    KEDA_INFLIGHT_SHARE,
    KEDA_INFLIGHT_SWEEP,
    REACTIVE_BEST,
    REACTIVE_SWEEP,
)
from gpu_queue_scaler_bench.sim.prewarm import COMPANION, FORECAST, PREWARM
from gpu_queue_scaler_bench.sim.run import BenchResult, PolicyRun
from gpu_queue_scaler_bench.sim.verdict import Outcome, Verdict, judge

# gpu_queue_scaler_bench.sim.fullstack's row (named here: no import cycle)
FULL_STACK = "scaler-fullstack"


@dataclass(frozen=True)
class Measures:
    name: str
    slo_attainment: float  # queue wait within the SLO
    ttft_attainment: float  # TTFT within the SLO
    p50_queue_wait_s: float
    p99_queue_wait_s: float
    p50_ttft_s: float
    p99_ttft_s: float
    gpu_hours: float
    cost_usd: float
    hours_at_zero_nodes: float
    requests: int
    completed: int
    dropped: int
    scale_events: int
    peak_replicas: int
    peak_nodes: int
    node_hours: float
    replica_start_p50_s: float
    replica_start_p99_s: float
    scale_from_zero_s: float
    scale_from_zero_episodes: int
    evictions: int  # pods consolidation evicted (WhenEmptyOrUnderutilized), each restarted
    preemptions: int = 0  # requests preempted for KV and recomputed (--kv-preemption)


def _pct(values: np.ndarray[Any, np.dtype[np.float64]], q: float) -> float:
    finite = values[np.isfinite(values)]
    return float(np.percentile(finite, q)) if finite.size else math.nan


def measure(run: PolicyRun, slo_s: float) -> Measures:
    wait, ttft = run.queue_wait_s, run.ttft_s
    n = int(run.arrivals_s.size)
    within_wait = np.isfinite(wait) & (wait <= slo_s + 1e-9)
    within_ttft = np.isfinite(ttft) & (ttft <= slo_s + 1e-9)
    gpu_hours = run.gpu_seconds / 3600.0
    return Measures(
        name=run.name,
        slo_attainment=float(within_wait.sum()) / n if n else 1.0,
        ttft_attainment=float(within_ttft.sum()) / n if n else 1.0,
        p50_queue_wait_s=_pct(wait, 50),
        p99_queue_wait_s=_pct(wait, 99),
        p50_ttft_s=_pct(ttft, 50),
        p99_ttft_s=_pct(ttft, 99),
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours / run.gpus_per_node * run.usd_per_node_hour,
        hours_at_zero_nodes=run.zero_node_seconds / 3600.0,
        requests=n,
        completed=int(np.isfinite(run.finish_t).sum()),
        dropped=int(run.dropped.sum()),
        scale_events=run.scale_events,
        peak_replicas=int(run.replicas.max()) if run.replicas.size else 0,
        peak_nodes=int(run.nodes.max()) if run.nodes.size else 0,
        node_hours=gpu_hours / run.gpus_per_node,
        replica_start_p50_s=_pct(run.replica_starts_s, 50),
        replica_start_p99_s=_pct(run.replica_starts_s, 99),
        scale_from_zero_s=float(run.zero_waits_s.mean()) if run.zero_waits_s.size else math.nan,
        scale_from_zero_episodes=int(run.zero_waits_s.size),
        evictions=run.evictions,
        preemptions=run.preemptions,
    )


def checks(measures: list[Measures]) -> list[str]:
    """The oracle must not be beaten: a policy that meets the SLO at least as well with fewer
    GPU-hours means the oracle's schedule is not minimal on this run (a finding to report)."""
    found: list[str] = []
    oracle = next((m for m in measures if m.name == "oracle"), None)
    for m in measures:
        if m.completed + m.dropped != m.requests:
            found.append(f"{m.name}: completed + dropped != requests")
        if (
            oracle is not None
            and m is not oracle
            and m.slo_attainment >= oracle.slo_attainment
            and m.gpu_hours < oracle.gpu_hours - 1e-9
        ):
            found.append(
                f"{m.name} meets the SLO as well as the oracle ({m.slo_attainment:.4f}) with "
                f"fewer GPU-hours ({m.gpu_hours:.2f} < {oracle.gpu_hours:.2f}): the oracle's "
                "schedule is not minimal here"
            )
    return found


def to_json(result: BenchResult) -> dict[str, Any]:
    """The `--json` object: the keys it names, plus a few more per policy."""
    cfg = result.config
    measures = [measure(run, cfg.slo_s) for run in result.runs]
    policies = []
    for m in measures:
        row = asdict(m)
        policies.append({k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                         for k, v in row.items()})  # fmt: skip
    return {
        "trace": result.trace,
        "scale": result.scale,
        "cold_start_s": cfg.cold_start_s,
        "slo_s": cfg.slo_s,
        "profile": cfg.profile.name,
        "node": cfg.profile.node.name,
        "gpus_per_node": cfg.profile.node.gpus,
        "consolidation": cfg.consolidation,
        "kv_preemption": cfg.preemption,
        "termination_grace_s": cfg.termination_grace_s,
        "seed": cfg.seed,
        "requests": result.requests.count,
        "duration_s": result.requests.duration_s,
        "replica_slots": result.slots,
        "target_concurrency": result.target_concurrency,
        "always_on_replicas": result.always_on_replicas,
        "initial_replicas": result.initial_replicas,
        "policies": policies,
        "checks": checks(measures),
        "notes": result.notes,
        **({"full_stack": result.full_stack} if result.full_stack is not None else {}),
    }


def table(result: BenchResult) -> str:
    cfg = result.config
    measures = [measure(run, cfg.slo_s) for run in result.runs]
    head = (
        f"trace {result.trace}, scale {result.scale:g}: {result.requests.count} requests over "
        f"{result.requests.duration_s / 60:.0f} min; profile {cfg.profile.name} "
        f"({cfg.profile.node.name}, {cfg.profile.node.gpus} GPUs/node, "
        f"${cfg.usd_per_node_hour:g}/h{'' if cfg.node_usd_per_hour is None else ' given'}); "
        f"cold start {cfg.cold_start_s:g} s "
        f"(node {cfg.node_launch_s:g} s + model {cfg.model_load_s:g} s); SLO {cfg.slo_s:g} s; "
        f"seed {cfg.seed}; consolidation {cfg.consolidation}, termination grace "
        f"{cfg.termination_grace_s:g} s\n"
        f"replica slots {result.slots}, scaler targetConcurrency {result.target_concurrency:g}, "
        f"warm start {result.initial_replicas} replicas, always-on {result.always_on_replicas}\n"
    )
    if result.full_stack is not None:
        fs = result.full_stack
        head += (
            f"FULL-STACK run: {FULL_STACK} went through the real gRPC server (scraping the "
            f"fleet's vLLM /metrics, KEDA/HPA emulator over gRPC) at speedup {fs['speedup']}; "
            "scaler and oracle are the offline policies on the same requests\n"
        )
    width = max(16, *(len(m.name) + 1 for m in measures))
    columns = (
        f"{'policy':<{width}}{'SLO wait':>9}{'SLO ttft':>9}{'p50 wait':>9}{'p99 wait':>9}"
        f"{'p99 ttft':>9}{'GPU-h':>8}{'node-h':>7}{'USD':>8}{'zero-h':>7}{'dropped':>8}"
        f"{'events':>7}{'evicted':>8}{'peak':>6}{'start50':>8}{'start99':>8}{'from0':>7}"
    )
    lines = [head, columns, "-" * len(columns)]
    for m in measures:
        lines.append(
            f"{m.name:<{width}}{m.slo_attainment:>9.4f}{m.ttft_attainment:>9.4f}"
            f"{m.p50_queue_wait_s:>9.2f}{m.p99_queue_wait_s:>9.2f}{m.p99_ttft_s:>9.2f}"
            f"{m.gpu_hours:>8.2f}{m.node_hours:>7.2f}{m.cost_usd:>8.1f}"
            f"{m.hours_at_zero_nodes:>7.2f}{m.dropped:>8d}{m.scale_events:>7d}{m.evictions:>8d}"
            f"{m.peak_replicas:>6d}{m.replica_start_p50_s:>8.0f}{m.replica_start_p99_s:>8.0f}"
            f"{_zero(m):>7}"
        )
    found = verdict(result.trace, measures)
    if found is not None:
        lines += found.lines(cfg.slo_s)
    lines.append(
        "start50/99: pod created -> ready, s (p50/p99 over pods created in the trace); from0: "
        "mean s from a request arriving at zero serving replicas to one serving (episodes)"
    )
    if cfg.preemption:
        lines.append(
            "KV preemption on: requests preempted and recomputed per policy: "
            + ", ".join(f"{m.name} {m.preemptions}" for m in measures)
        )
    names = {m.name for m in measures}
    if "keda-prometheus" in names:
        lines.append(
            "the pitfall row: keda-prometheus counts waiting requests only, min 0, so it "
            "scales to zero while requests still run"
        )
    if names & {KEDA_INFLIGHT, KEDA_INFLIGHT_BEST}:
        lines.append(
            "keda-inflight-*: KEDA's Prometheus scaler on running + waiting, AverageValue, min 1, "
            f"HPA defaults; {KEDA_INFLIGHT} at {KEDA_INFLIGHT_SHARE:.0%} of a replica's slots "
            f"per replica, {KEDA_INFLIGHT_BEST} the best of {100 * min(KEDA_INFLIGHT_SWEEP):.0f}-"
            f"{max(KEDA_INFLIGHT_SWEEP):.0%} picked after the runs (see its check line)"
        )
    if REACTIVE_BEST in names:
        lines.append(
            f"{REACTIVE_BEST}: a bound, not a policy one can run: the oracle's exact need now (no "
            "lag, no noise) x a headroom, held for the scaler's scale-down window, the best of "
            f"x{min(REACTIVE_SWEEP):g}-x{max(REACTIVE_SWEEP):g} picked after the runs (see its "
            "check line); what a reactive rule could reach by reading the present perfectly"
        )
    if any(m.name == PREWARM for m in measures):
        lines.append(
            f"{COMPANION} is the scaler as configured (forecast wake by default) plus the "
            f"Karpenter companion; {FORECAST} and {PREWARM} run the scaler with forecast=on, "
            f"{PREWARM} adds the companion. The companion (gpu_queue_scaler.companion every 15 s): "
            "placeholder pods hold GPUs for the target or forecast q90, so nodes launch ahead "
            "and real pods preempt them; pod-deletion-cost = pods on the node, so scale-downs "
            "empty the least-used nodes and consolidation removes them"
        )
    for note in checks(measures) + result.notes:
        lines.append(f"check: {note}")
    return "\n".join(lines)


def verdict(trace: str, measures: list[Measures]) -> Verdict | None:
    """The scaler row against the goals (`gpu_queue_scaler_bench.sim.verdict`), when the run
    has it, the oracle and always-on."""
    return judge(trace, {m.name: Outcome(m.slo_attainment, m.gpu_hours) for m in measures})


def _zero(m: Measures) -> str:
    if not m.scale_from_zero_episodes:
        return "-"
    return f"{m.scale_from_zero_s:.0f}({m.scale_from_zero_episodes})"


def plot(result: BenchResult, directory: str | Path) -> list[Path]:
    """PNG plots: demand, replicas and nodes per policy over time; queue-wait distribution.
    matplotlib is imported here only (`pip install -e '.[sim]'`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    dt = result.dt
    bin_s = 60.0
    arrivals = result.requests.arrivals_s
    bins = np.arange(0.0, result.requests.duration_s + bin_s, bin_s)
    rate = np.histogram(arrivals, bins)[0] / bin_s
    fig, axes = plt.subplots(3, 1, figsize=(11, 10), sharex=True)
    axes[0].step(bins[:-1] / 60, rate, where="post", color="black")
    axes[0].set_ylabel("arrivals (req/s, 1 min)")
    axes[0].set_title(
        f"{result.trace} x{result.scale:g}, cold start {result.config.cold_start_s:g} s"
    )
    for run in result.runs:
        minutes = np.arange(run.ready.size) * dt / 60
        axes[1].plot(minutes, run.ready, label=run.name, lw=1.2)
        axes[2].plot(minutes, run.nodes, label=run.name, lw=1.2)
    axes[1].set_ylabel("ready replicas")
    axes[2].set_ylabel("nodes")
    axes[2].set_xlabel("minutes")
    axes[1].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fleet_png = out / "fleet.png"
    fig.savefig(fleet_png, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(8, 5))
    for run in result.runs:
        wait = run.queue_wait_s
        wait = np.sort(np.where(np.isfinite(wait), wait, np.inf))
        share = np.arange(1, wait.size + 1) / max(wait.size, 1)
        pick = np.unique(np.linspace(0, max(wait.size - 1, 0), 2000).astype(np.int64))
        ax.plot(np.clip(wait[pick], 1e-3, None), share[pick], label=run.name)
    ax.axvline(result.config.slo_s, color="grey", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xlabel("queue wait (s; dropped never arrive at 1)")
    ax.set_ylabel("share of requests")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    wait_png = out / "queue_wait.png"
    fig.savefig(wait_png, dpi=110)
    plt.close(fig)
    return [fleet_png, wait_png]
