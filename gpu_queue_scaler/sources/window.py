"""Recent scrapes of one workload's pods, and the catalog's expressions evaluated on them.

Pure: no I/O, no clock; the scrape source feeds it. Counters become rates across the scrapes in the
rate window with resets handled as Prometheus does (a drop means the process restarted and counted
from zero), and histograms give quantiles with Prometheus's `histogram_quantile` interpolation.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

from gpu_queue_scaler.catalog import (
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
)
from gpu_queue_scaler.sources.exposition import LabelSet, Scrape, matches

Result = tuple[float | None, str | None]  # (value, why it is missing)


def histogram_quantile(q: float, buckets: Iterable[tuple[float, float]]) -> float | None:
    """Prometheus's algorithm: linear interpolation inside the bucket holding rank q x total;
    the +Inf bucket answers with the highest finite bound. None without observations."""
    ordered = sorted(buckets)
    if not ordered or ordered[-1][0] != math.inf or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if bound == math.inf:
                return lower_bound if len(ordered) > 1 else None
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return None


class Window:
    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.targets: dict[str, deque[tuple[float, Scrape]]] = {}

    def add(self, target: str, at: float, scrape: Scrape) -> None:
        history = self.targets.setdefault(target, deque())
        history.append((at, scrape))
        while len(history) > 2 and history[1][0] <= at - self.window_s:
            history.popleft()  # keep one scrape at or before the window start

    def keep_only(self, targets: Iterable[str]) -> None:
        """Forget pods that are gone (scaled down, replaced)."""
        alive = set(targets)
        for target in list(self.targets):
            if target not in alive:
                del self.targets[target]

    # --- evaluation ---------------------------------------------------------------------------

    def evaluate(
        self, expr: Expr, matchers: tuple[Matcher, ...], now: float, max_age_s: float
    ) -> Result:
        fresh = {
            target: history
            for target, history in self.targets.items()
            if history and now - history[-1][0] <= max_age_s
        }
        value, why = _Eval(fresh, matchers).run(expr)
        if value is not None and not math.isfinite(value):  # e.g. two pods at 1e308, summed
            return None, f"not a finite number ({value}): the samples overflow"
        return value, why


class _Eval:
    def __init__(
        self, targets: dict[str, deque[tuple[float, Scrape]]], matchers: tuple[Matcher, ...]
    ):
        self.targets = targets
        self.matchers = matchers

    def _name(self, names: tuple[str, ...]) -> str | None:
        """The first alternate any pod reports."""
        for name in names:
            if any(history[-1][1].has(name) for history in self.targets.values()):
                return name
        return None

    def _values(self, scrape: Scrape, name: str, extra: tuple[Matcher, ...] = ()) -> list[float]:
        return [
            value
            for labels, value in scrape.series(name)
            if matches(labels, self.matchers, only_present=True) and matches(labels, extra)
        ]

    def run(self, expr: Expr) -> Result:
        if not self.targets:
            return None, "no pod answered recently"
        match expr:
            case Gauge():
                return self._gauge(expr)
            case Count(of=gauge):
                name = self._name(gauge.names)
                if name is None:
                    return None, f"no pod reports {' or '.join(gauge.names)}"
                return float(
                    sum(
                        bool(self._values(h[-1][1], name, gauge.extra))
                        for h in self.targets.values()
                    )
                ), None
            case Rate():
                return self._rate(expr)
            case Deriv(of=gauge):
                return self._deriv(gauge)
            case Quantile():
                return self._quantile(expr)
            case Plus(terms=(first, *rest)):
                value, why = self.run(first)
                if value is None:
                    return None, why
                return value + sum(self.run(term)[0] or 0.0 for term in rest), None
            case Ratio(num=num, den=den):
                top, why_top = self.run(num)
                bottom, why_bottom = self.run(den)
                if top is None or bottom is None:
                    return None, why_top or why_bottom
                if bottom == 0:
                    return None, "no completed requests in the rate window"
                return top / bottom, None
            case AtLeastZero(of=inner):
                value, why = self.run(inner)
                return (None, why) if value is None else (max(0.0, value), None)
            case PromQL():
                return None, "a PromQL query needs the Prometheus source (serverAddress)"
        return None, f"unsupported expression {expr!r}"

    def _gauge(self, gauge: Gauge) -> Result:
        name = self._name(gauge.names)
        if name is None:
            return None, f"no pod reports {' or '.join(gauge.names)}"
        per_pod = [self._values(h[-1][1], name, gauge.extra) for h in self.targets.values()]
        found = [v for values in per_pod for v in values]
        if not found:
            return None, f"no {name} series matches the model and labelSelector"
        if gauge.agg == "max":
            total = max(found)
        elif gauge.agg == "avg":
            total = sum(found) / len(found)
        else:
            total = sum(found)
        return total * gauge.scale, None

    def _increase(
        self, name: str, extra: tuple[Matcher, ...] = ()
    ) -> tuple[dict[tuple[str, LabelSet], float], float]:
        """Per-series increase over each pod's window (resets handled), and the longest span.
        A series is its pod and its label set; whether a label set matches is decided once."""
        increases: dict[tuple[str, LabelSet], float] = {}
        selected: dict[LabelSet, bool] = {}
        span = 0.0
        for target, history in self.targets.items():
            if len(history) < 2:
                continue
            span = max(span, history[-1][0] - history[0][0])
            previous: dict[LabelSet, float] = {}
            for _, scrape in history:
                for labels, value in scrape.series(name):
                    keep = selected.get(labels)
                    if keep is None:
                        keep = matches(labels, self.matchers, only_present=True) and matches(
                            labels, extra
                        )
                        selected[labels] = keep
                    if not keep:
                        continue
                    key = (target, labels)
                    before = previous.get(labels)
                    if before is not None:
                        increases[key] = increases.get(key, 0.0) + (
                            value - before if value >= before else value
                        )
                    else:
                        increases.setdefault(key, 0.0)
                    previous[labels] = value
        return increases, span

    def _rate(self, rate: Rate) -> Result:
        name = self._name(rate.names)
        if name is None:
            return None, f"no pod reports {' or '.join(rate.names)}"
        increases, span = self._increase(name, rate.extra)
        if span <= 0:
            return None, f"{name}: a rate needs two scrapes within the window"
        if not increases:
            return None, f"no {name} series matches the model and labelSelector"
        return sum(increases.values()) / span * rate.scale, None

    def _deriv(self, gauge: Gauge) -> Result:
        name = self._name(gauge.names)
        if name is None:
            return None, f"no pod reports {' or '.join(gauge.names)}"
        change, span = 0.0, 0.0
        for history in self.targets.values():
            if len(history) < 2:
                continue
            span = max(span, history[-1][0] - history[0][0])
            change += sum(self._values(history[-1][1], name)) - sum(
                self._values(history[0][1], name)
            )
        if span <= 0:
            return None, f"{name}: a change needs two scrapes within the window"
        return change / span, None

    def _quantile(self, quantile: Quantile) -> Result:
        base = self._name(tuple(f"{n}_bucket" for n in quantile.names))
        if base is None:
            return None, f"no pod reports the histogram {' or '.join(quantile.names)}"
        increases, span = self._increase(base)
        if span <= 0:
            return None, f"{base}: a quantile needs two scrapes within the window"
        buckets: dict[float, float] = {}
        for (_, labels), increase in increases.items():
            le = dict(labels).get("le")
            if le is None:
                continue
            try:
                bound = math.inf if le in ("+Inf", "Inf") else float(le)
            except ValueError:
                continue  # a bucket bound that is not a number cannot be placed: skip it
            if not math.isnan(bound):
                buckets[bound] = buckets.get(bound, 0.0) + increase
        value = histogram_quantile(quantile.q, buckets.items())
        if value is None:
            return None, f"{base}: no observations in the rate window"
        return value * quantile.scale, None
