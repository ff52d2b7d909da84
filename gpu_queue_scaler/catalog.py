"""Which metrics make each signal, per backend: one catalog that both sources evaluate.

An expression says *what* a signal is (a gauge summed across pods, a counter's rate, a histogram
quantile, ...). The Prometheus source renders it as PromQL; the direct-scrape source evaluates it on
parsed /metrics samples. So the two paths cannot disagree on which metric means what.

Metric names have alternates, first match wins: vLLM renamed `vllm:gpu_cache_usage_perc` to
`vllm:kv_cache_usage_perc` in 0.9.2 (removed in 0.12), and Prometheus 2.x scraping an exporter
built on prometheus_client >= 0.23 may store `vllm:num_requests_waiting` as
`vllm_num_requests_waiting`; every vLLM name is matched in both spellings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

Matcher = tuple[str, str, str]  # (label, op, value), op one of = != =~ !~


@dataclass(frozen=True)
class Gauge:
    """Sum (or max, or mean) across pods of the first present name."""

    names: tuple[str, ...]
    agg: str = "sum"  # "sum" | "max" | "avg"
    scale: float = 1.0
    extra: tuple[Matcher, ...] = ()


@dataclass(frozen=True)
class Count:
    """How many pods report the gauge: the ready serving pods."""

    of: Gauge


@dataclass(frozen=True)
class Rate:
    """Per-second increase of a counter, summed across pods and series; resets handled."""

    names: tuple[str, ...]
    scale: float = 1.0
    extra: tuple[Matcher, ...] = ()


@dataclass(frozen=True)
class Deriv:
    """Per-second change of a gauge's sum across pods over the rate window."""

    of: Gauge


@dataclass(frozen=True)
class Quantile:
    """Quantile of a histogram's observations within the rate window, across pods."""

    q: float
    names: tuple[str, ...]  # histogram base names (samples are NAME_bucket with `le`)
    scale: float = 1.0


@dataclass(frozen=True)
class Plus:
    """The first term is required; the others count as 0 when absent (e.g. failure counters)."""

    terms: tuple[Expr, ...]


@dataclass(frozen=True)
class Ratio:
    num: Expr
    den: Expr


@dataclass(frozen=True)
class AtLeastZero:
    of: Expr


@dataclass(frozen=True)
class PromQL:
    """A user's own query (custom backend or an override); Prometheus source only."""

    query: str


Expr = Gauge | Count | Rate | Deriv | Quantile | Plus | Ratio | AtLeastZero | PromQL

SIGNAL_FIELDS = (
    "waiting",
    "running",
    "arrival_rate",
    "queue_time_mean_s",
    "queue_time_p99_s",
    "ttft_p99_s",
    "kv_cache_usage",
    "ready_pods",
    "service_time_s",
    "prompt_tokens_rate",
    "generation_tokens_rate",
)
# Trigger/profile keys that replace one signal's expression with the user's PromQL.
QUERY_KEYS = {
    "waiting": "waitingQuery",
    "running": "runningQuery",
    "arrival_rate": "arrivalRateQuery",
    "queue_time_mean_s": "queueTimeQuery",
    "queue_time_p99_s": "queueTimeP99Query",
    "ttft_p99_s": "ttftP99Query",
    "kv_cache_usage": "kvCacheQuery",
    "ready_pods": "readyPodsQuery",
    "service_time_s": "serviceTimeQuery",
    "prompt_tokens_rate": "promptTokensRateQuery",
    "generation_tokens_rate": "generationTokensRateQuery",
}


@dataclass(frozen=True)
class Catalog:
    backend: str
    model_label: str | None  # the label that carries the model name
    default_metrics_port: int | None
    signals: Mapping[str, Expr]
    # Fields the decision cannot do without, read from every sample (gauges, not rates that need
    # two samples): one missing while the others are reported is a fault, and the policy holds
    # the last good target instead of sizing from what is left (a queue read as 0).
    required: frozenset[str] = frozenset()


def _vllm(*names: str) -> tuple[str, ...]:
    """Both spellings of each vLLM name: `vllm:x` and Prometheus 2.x's `vllm_x`."""
    return tuple(n for name in names for n in (name, name.replace("vllm:", "vllm_", 1)))


def _triton(name: str) -> tuple[str, ...]:
    """Triton exposes counters without `_total`; Prometheus stores them so, while
    prometheus_client's parser (direct scrape) appends `_total` to counter samples."""
    return (name, f"{name}_total")


_TRITON_WAITING = Gauge(("nv_inference_pending_request_count",))
_VLLM_WAITING = Gauge(_vllm("vllm:num_requests_waiting"))
_VLLM_RUNNING = Gauge(_vllm("vllm:num_requests_running"))

CATALOGS: Mapping[str, Catalog] = {
    "triton": Catalog(
        backend="triton",
        model_label="model",
        default_metrics_port=8002,
        required=frozenset({"waiting"}),
        signals={
            # The queue: requests enqueued but not yet executing (per model).
            "waiting": _TRITON_WAITING,
            # Little's law: compute time accumulated per second = requests in compute.
            "running": Rate(_triton("nv_inference_compute_infer_duration_us"), scale=1e-6),
            "arrival_rate": Plus(
                (
                    Rate(_triton("nv_inference_request_success")),
                    Rate(_triton("nv_inference_request_failure")),
                )
            ),
            "queue_time_mean_s": Ratio(
                Rate(_triton("nv_inference_queue_duration_us"), scale=1e-6),
                Rate(_triton("nv_inference_request_success")),
            ),
            # Only with --metrics-config summary_latencies=true; summaries cannot be merged
            # across pods, so the worst pod's p99 stands for the fleet.
            "queue_time_p99_s": Gauge(
                ("nv_inference_queue_summary_us",),
                agg="max",
                scale=1e-6,
                extra=(("quantile", "=", "0.99"),),
            ),
            # Only for decoupled models with histogram_latencies=true.
            "ttft_p99_s": Quantile(0.99, ("nv_inference_first_response_histogram_ms",), 1e-3),
            "ready_pods": Count(_TRITON_WAITING),
            # Time a request holds the model: input + infer + output, per completed request.
            "service_time_s": Ratio(
                Plus(
                    tuple(
                        Rate(_triton(f"nv_inference_compute_{phase}_duration_us"), scale=1e-6)
                        for phase in ("input", "infer", "output")
                    )
                ),
                Rate(_triton("nv_inference_request_success")),
            ),
        },
    ),
    "vllm": Catalog(
        backend="vllm",
        model_label="model_name",
        default_metrics_port=8000,
        required=frozenset({"waiting", "running"}),
        signals={
            "waiting": _VLLM_WAITING,
            "running": _VLLM_RUNNING,
            # Arrivals = completions + growth of what is in flight.
            "arrival_rate": AtLeastZero(
                Plus(
                    (
                        Rate(_vllm("vllm:request_success_total")),
                        Deriv(_VLLM_WAITING),
                        Deriv(_VLLM_RUNNING),
                    )
                )
            ),
            "queue_time_mean_s": Ratio(
                Rate(_vllm("vllm:request_queue_time_seconds_sum")),
                Rate(_vllm("vllm:request_queue_time_seconds_count")),
            ),
            "queue_time_p99_s": Quantile(0.99, _vllm("vllm:request_queue_time_seconds")),
            "ttft_p99_s": Quantile(0.99, _vllm("vllm:time_to_first_token_seconds")),
            # The fleet's mean KV-cache usage: ready pods x the mean is the KV the fleet holds, in
            # pods' worth (capacity's kv_cache term). The hottest pod's would make one long
            # context on one pod read as the whole fleet's: ready x max grows with every replica
            # added and never lets the term fall.
            "kv_cache_usage": Gauge(
                _vllm("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), agg="avg"
            ),
            "ready_pods": Count(_VLLM_WAITING),
            # Time a request holds a batch slot (RUNNING: prefill + decode), per request.
            "service_time_s": Ratio(
                Rate(_vllm("vllm:request_inference_time_seconds_sum")),
                Rate(_vllm("vllm:request_inference_time_seconds_count")),
            ),
            # The GPU's work: prompt tokens prefilled and tokens generated per second.
            "prompt_tokens_rate": Rate(_vllm("vllm:prompt_tokens_total")),
            "generation_tokens_rate": Rate(_vllm("vllm:generation_tokens_total")),
        },
    ),
    "custom": Catalog(backend="custom", model_label=None, default_metrics_port=None, signals={}),
}


# The queue fields the capacity model sizes from: with one of them known and another missing,
# the need is what the known one alone says, too low by the missing one.
QUEUE_FIELDS = ("waiting", "running")


def required_fields(backend: str, queries: Mapping[str, str]) -> frozenset[str]:
    """The queue fields a workload's source is expected to report on every read: the backend's
    gauges and every queue field the user gave a query for (a custom backend's own choice)."""
    catalog = CATALOGS.get(backend)
    base = catalog.required if catalog is not None else frozenset()
    return base | frozenset(f for f in QUEUE_FIELDS if queries.get(f))


def signal_exprs(backend: str, overrides: Mapping[str, str | None]) -> dict[str, Expr]:
    """The backend's expressions with the user's PromQL overrides (by signal field) applied."""
    exprs: dict[str, Expr] = dict(CATALOGS[backend].signals)
    for field, query in overrides.items():
        if query:
            exprs[field] = PromQL(query)
    return exprs


# Sample-name suffixes of counters, histograms and summaries: the family is the name without one.
FAMILY_SUFFIXES = ("_total", "_bucket", "_sum", "_count", "_created")


def family_of(name: str) -> str:
    """A sample name's family: the name without a counter/histogram/summary suffix."""
    for suffix in FAMILY_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _sample_names(expr: Expr) -> set[str]:
    match expr:
        case Gauge() | Rate():
            return set(expr.names)
        case Count(of=gauge) | Deriv(of=gauge):
            return set(gauge.names)
        case Quantile():
            return {f"{n}_bucket" for n in expr.names}
        case Plus(terms=terms):
            return set().union(*(_sample_names(t) for t in terms))
        case Ratio(num=num, den=den):
            return _sample_names(num) | _sample_names(den)
        case AtLeastZero(of=inner):
            return _sample_names(inner)
    return set()  # PromQL: read by Prometheus, never from a pod's text


def families(exprs: Mapping[str, Expr]) -> frozenset[str]:
    """Every metric family the expressions read (both spellings of each name): what a direct
    scrape has to parse of a pod's text."""
    names = set().union(*(_sample_names(e) for e in exprs.values()))
    return frozenset(names | {family_of(n) for n in names})
