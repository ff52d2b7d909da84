"""PromQL in and out, pure: a workload's catalog expressions rendered as PromQL text, a read's
queries combined into few expressions (and their answers split back), and an instant answer read as
one number. No I/O here: the Prometheus source (`gpu_queue_scaler.sources.prometheus`) sends these
queries, and the direct-scrape source scopes its pods with the same label matchers (`matchers_for`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote_plus

from gpu_queue_scaler.catalog import (
    CATALOGS,
    AtLeastZero,
    Count,
    Deriv,
    Expr,
    Gauge,
    Matcher,
    Plus,
    PromQL,
    Quantile,
    Rate,
    Ratio,
    signal_exprs,
)

if TYPE_CHECKING:
    from gpu_queue_scaler.settings.spec import WorkloadSpec

FIELD_LABEL = "scaler_signal"  # tags each signal's series in a combined query
# A combined query travels URL-encoded in the request line, and proxies in front of Prometheus
# cap it at ~8 KiB (nginx's default buffer): a read's queries are combined in groups within this.
MAX_QUERY_URL_CHARS = 6000


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def matchers_for(spec: WorkloadSpec, model_label: str | None) -> tuple[Matcher, ...]:
    """The labels that scope a query to one deployment: the model, the namespace, the selector."""
    found: list[Matcher] = []
    if model_label and spec.trigger.model:
        found.append((model_label, "=", spec.trigger.model))
    if spec.namespace_label:
        found.append((spec.namespace_label, "=", spec.trigger.namespace))
    found += spec.trigger.label_selector
    return tuple(found)


def render_selector(matchers: tuple[Matcher, ...]) -> str:
    return ",".join(f"{label}{op}{_quote(value)}" for label, op, value in matchers)


def render(expr: Expr, spec: WorkloadSpec, matchers: tuple[Matcher, ...]) -> str:
    """PromQL for one catalog expression."""
    sel = render_selector(matchers)
    window = f"[{max(1, round(spec.rate_window_s))}s]"

    def series(name: str, extra: tuple[Matcher, ...] = ()) -> str:
        return f"{name}{{{render_selector(matchers + extra)}}}"

    def alternatives(parts: list[str], scale: float = 1.0) -> str:
        body = parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"
        return body if scale == 1.0 else f"({body} * {scale!r})"

    match expr:
        case Gauge():
            return alternatives(
                [f"{expr.agg}({series(n, expr.extra)})" for n in expr.names], expr.scale
            )
        case Count(of=gauge):
            return alternatives([f"count({series(n, gauge.extra)})" for n in gauge.names])
        case Rate():
            return alternatives(
                [f"sum(rate({series(n, expr.extra)}{window}))" for n in expr.names], expr.scale
            )
        case Deriv(of=gauge):
            return alternatives([f"sum(deriv({series(n)}{window}))" for n in gauge.names])
        case Quantile():
            buckets = [f"sum by (le) (rate({series(n + '_bucket')}{window}))" for n in expr.names]
            parts = [f"histogram_quantile({expr.q!r}, {b})" for b in buckets]
            return alternatives(parts, expr.scale)
        case Plus(terms=(first, *rest)):
            return " + ".join(
                [f"({render(first, spec, matchers)})"]
                + [f"(({render(t, spec, matchers)}) or vector(0))" for t in rest]
            )
        case Ratio(num=num, den=den):
            return f"({render(num, spec, matchers)}) / ({render(den, spec, matchers)})"
        case AtLeastZero(of=inner):
            return f"clamp_min({render(inner, spec, matchers)}, 0)"
        case PromQL(query=query):
            return query.replace("$selector", sel).replace("$model", spec.trigger.model or "")
    raise ValueError(f"cannot render {expr!r}")


def age_query(
    spec: WorkloadSpec, exprs: Mapping[str, Expr], matchers: tuple[Matcher, ...]
) -> str | None:
    """The newest ready-pods sample's timestamp, to refuse stale data; None without that count."""
    ready = exprs.get("ready_pods")
    if isinstance(ready, Count):
        return " or ".join(
            f"max(timestamp({n}{{{render_selector(matchers)}}}))" for n in ready.of.names
        )
    return None


def plan(spec: WorkloadSpec) -> tuple[tuple[Matcher, ...], dict[str, Expr]]:
    """The label matchers and the signal expressions (with overrides) of one workload."""
    matchers = matchers_for(spec, CATALOGS[spec.trigger.backend].model_label)
    return matchers, signal_exprs(spec.trigger.backend, spec.queries)


def _scalar(result: object) -> float:
    """The single value of an aggregated instant-query result; raises ValueError otherwise."""
    if not isinstance(result, list):
        raise ValueError(f"unexpected answer {str(result)[:80]!r}")
    if not result:
        raise LookupError("no series matched")
    if len(result) > 1:
        raise ValueError(f"{len(result)} series where one was expected: aggregate the query")
    value = float(result[0]["value"][1])
    if not math.isfinite(value):
        raise ValueError(f"non-finite value {value}")
    return value


def instant_value(result: object) -> float:
    """`_scalar`, with a malformed sample reported as ValueError."""
    try:
        return _scalar(result)
    except (KeyError, TypeError, IndexError, OverflowError) as exc:  # e.g. a 400-digit integer
        raise ValueError(f"malformed result: {exc!r}"[:300]) from None


def instant_outcome(result: object) -> float | BaseException:
    """A query's value, or why it has none (the exception its request raised, or its result's)."""
    if isinstance(result, BaseException):
        return result
    try:
        return instant_value(result)
    except (ValueError, LookupError) as exc:
        return exc


def combined_query(queries: Mapping[str, str]) -> str:
    """All of a read's queries as one PromQL expression: each one's series tagged with its signal
    in FIELD_LABEL (label_replace), joined with `or` (distinct tags, so nothing is dropped) in a
    balanced tree: `or` binds to the left, and a flat chain of a batch's hundreds of parts costs
    Prometheus more CPU (`bench/prometheus_reads.py`; the figures: docs/signals.md)."""
    parts = [
        f'label_replace(({query}), "{FIELD_LABEL}", "{field}", "", "")'
        for field, query in queries.items()
    ]
    while len(parts) > 2:
        paired = [f"({a} or {b})" for a, b in zip(parts[::2], parts[1::2], strict=False)]
        parts = paired + parts[len(paired) * 2 :]
    return " or ".join(parts)


def combined_groups(queries: Mapping[str, str]) -> list[list[str]]:
    """The signals in groups whose combined query stays within MAX_QUERY_URL_CHARS once
    URL-encoded (in order; a query too long to share a request has one of its own)."""
    groups: list[list[str]] = []
    size = 0
    for field, query in queries.items():
        length = len(quote_plus(combined_query({field: query}))) + len(" or ()")
        if not groups or size + length > MAX_QUERY_URL_CHARS:
            groups.append([])
            size = 0
        groups[-1].append(field)
        size += length
    return groups


def split_answer(result: object, fields: Iterable[str]) -> dict[str, list[object]]:
    """A combined query's answer as each query's own would have been; ValueError when it is not
    one (a series without a known tag)."""
    parts: dict[str, list[object]] = {field: [] for field in fields}
    if not isinstance(result, list):
        raise ValueError(f"unexpected answer {str(result)[:80]!r}")
    for series in result:
        metric = series.get("metric") if isinstance(series, dict) else None
        field = metric.get(FIELD_LABEL) if isinstance(metric, dict) else None
        if not isinstance(field, str) or field not in parts:
            raise ValueError(f"a series without a known {FIELD_LABEL}: {str(series)[:80]!r}")
        parts[field].append(series)
    return parts


def tagged(reads: Sequence[Mapping[str, str]]) -> dict[str, str]:
    """Several reads' queries under distinct tags (`<read>/<signal>`), for one combined query."""
    return {f"{i}/{name}": q for i, queries in enumerate(reads) for name, q in queries.items()}
