"""ScaledObject trigger metadata -> a validated, immutable `TriggerSpec`.

KEDA sends the whole trigger `metadata` map (every value a string) with every call, up to three
calls per evaluation; parsing is cached per (namespace, name, metadata) so the hot path is a dict
lookup. The spec depends only on the metadata, never on the ConfigMap or a metrics backend, so
GetMetricSpec can always answer (if it fails, KEDA's `fallback` never engages: kedacore/keda#8056).
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from scaler.fields import (
    TRIGGER_KEYS,
    TUNING_KEYS,
    FieldError,
    check_bounds,
    parse_section,
)

SYNTHETIC_KEYS = tuple(k for k in TRIGGER_KEYS if k.startswith("synthetic"))
METRIC_NAME_MAX = 100


class TriggerError(ValueError):
    """Every problem found in one trigger's metadata, each naming its key."""

    def __init__(self, problems: list[FieldError]) -> None:
        self.problems = problems
        super().__init__("; ".join(str(p) for p in problems))


@dataclass(frozen=True)
class TriggerSpec:
    namespace: str
    name: str
    backend: str
    metric_name: str
    model: str | None
    profile: str | None
    label_selector: tuple[tuple[str, str, str], ...]
    scrape_targets: tuple[tuple[str, int], ...]
    # Keys this trigger set explicitly (typed); tuning keys override the profile and defaults.
    values: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def workload(self) -> str:
        return f"{self.namespace}/{self.name}"

    def tuning(self) -> dict[str, Any]:
        return {k: v for k, v in self.values.items() if k in TUNING_KEYS}

    def accepts_metric(self, metric_name: str) -> bool:
        """KEDA strips its `sN-` prefix before GetMetrics; accept it anyway from other clients."""
        if metric_name == self.metric_name:
            return True
        prefix, _, rest = metric_name.partition("-")
        return rest == self.metric_name and re.fullmatch(r"s\d+", prefix) is not None


def sanitize_metric_name(raw: str) -> str:
    """Lowercase [a-z0-9-], no leading/trailing '-', at most 100 characters.

    HPA external metric names must be valid path segments; KEDA adds `sN-` in front. A name that
    had to be cut keeps a short hash of the original so two long names never collide.
    """
    name = re.sub(r"-+", "-", re.sub(r"[^a-z0-9]", "-", raw.lower())).strip("-") or "workload"
    if len(name) > METRIC_NAME_MAX:
        digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
        name = name[: METRIC_NAME_MAX - 9].rstrip("-") + "-" + digest
    return name


def _build(namespace: str, name: str, metadata: Mapping[str, str]) -> TriggerSpec:
    values, problems = parse_section(metadata, TRIGGER_KEYS, "")
    problems += check_bounds(values, "")
    backend = values.get("backend")
    if "backend" not in metadata:
        problems.append(
            FieldError("backend", "required; accepted: vllm | triton | custom | synthetic")
        )
    if backend is not None and backend != "synthetic":
        problems += [
            FieldError(key, f"applies only to backend synthetic, not {backend}")
            for key in SYNTHETIC_KEYS
            if key in values
        ]
    if problems:
        raise TriggerError(problems)
    model = values.get("model")
    metric = sanitize_metric_name(values.get("metricName") or f"{backend}-{model or name}")
    return TriggerSpec(
        namespace=namespace,
        name=name,
        backend=str(backend),
        metric_name=metric,
        model=model,
        profile=values.get("profile"),
        label_selector=values.get("labelSelector", ()),
        scrape_targets=values.get("scrapeTargets", ()),
        values=MappingProxyType(values),
    )


class TriggerCache:
    """Bounded LRU of parsed triggers, successes and failures alike (bad metadata is re-sent
    by KEDA on every poll and must not be re-parsed each time)."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._capacity = capacity
        self._items: OrderedDict[
            tuple[str, str, frozenset[tuple[str, str]]], TriggerSpec | TriggerError
        ]
        self._items = OrderedDict()

    def parse(self, namespace: str, name: str, metadata: Mapping[str, str]) -> TriggerSpec:
        key = (namespace, name, frozenset(metadata.items()))
        found = self._items.get(key)
        if found is None:
            try:
                found = _build(namespace, name, metadata)
            except TriggerError as exc:
                found = exc
            self._items[key] = found
            if len(self._items) > self._capacity:
                self._items.popitem(last=False)
        else:
            self._items.move_to_end(key)
        if isinstance(found, TriggerError):
            raise found
        return found

    def __len__(self) -> int:
        return len(self._items)


def parse_trigger(namespace: str, name: str, metadata: Mapping[str, str]) -> TriggerSpec:
    """Parse one trigger's metadata without caching (tools, tests, `check-config`)."""
    return _build(namespace, name, metadata)
