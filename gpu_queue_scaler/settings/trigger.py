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

from gpu_queue_scaler.settings.fields import (
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


# What a cached rejection keeps and echoes: KEDA re-sends the same bad metadata on every poll, and
# a client can send a megabyte-long key or value; a problem is a short (key, message) pair.
PROBLEMS_KEPT = 20  # per trigger; the rest are counted in one last problem
PATH_SHOWN = 80
MESSAGE_SHOWN = 1200
ENTRY_OVERHEAD = 600  # bytes: an entry's dict slot, key tuple, problem tuple
SPEC_OVERHEAD = 2000  # a spec object and its values' dict, beyond the strings
ITEM_BYTES = 150  # one scrape target or label matcher: a tuple of a string and a number or two
CACHE_BYTES = 32 * 1024 * 1024
UNCACHED_BYTES = 1024 * 1024  # metadata larger than this is parsed on every call, never kept

Problem = tuple[str, str]  # (key, message), as cut for echoing
CacheKey = tuple[str, str, frozenset[tuple[str, str]] | bytes]
KEY_INLINE_BYTES = 4096  # a map up to this size is its own key (cheaper than a digest to build)


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def problems_of(error: TriggerError) -> tuple[Problem, ...]:
    """The error's problems as short values: no traceback, no input kept whole."""
    kept = tuple(
        (cut(p.path, PATH_SHOWN), cut(p.message, MESSAGE_SHOWN))
        for p in error.problems[:PROBLEMS_KEPT]
    )
    more = len(error.problems) - PROBLEMS_KEPT
    if more > 0:
        kept += (("metadata", f"and {more} more problems not shown"),)
    return kept


def metadata_digest(metadata: Mapping[str, str]) -> bytes:
    """A digest of the whole map: the cache key of a large map, so that the key does not keep
    the client's long strings."""
    digest = hashlib.blake2b(digest_size=16)
    for key, value in sorted(metadata.items()):
        for text in (key, value):
            data = text.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.digest()


class TriggerCache:
    """Bounded LRU of parsed triggers, successes and failures alike (bad metadata is re-sent
    by KEDA on every poll and must not be re-parsed each time).

    A failure is kept as its problems (short key, message pairs), never as the exception: an
    exception raised again keeps every frame of every earlier raise in its traceback. Each call
    gets a fresh `TriggerError`. The cache is bounded by entries and by bytes (an estimate of
    what an entry keeps: the parsed values, or the cut problems)."""

    def __init__(self, capacity: int = 10_000, max_bytes: int = CACHE_BYTES) -> None:
        self._capacity = capacity
        self._max_bytes = max_bytes
        self._bytes = 0
        self._items: OrderedDict[CacheKey, tuple[TriggerSpec | tuple[Problem, ...], int]]
        self._items = OrderedDict()

    def parse(self, namespace: str, name: str, metadata: Mapping[str, str]) -> TriggerSpec:
        size = sum(map(len, metadata.keys())) + sum(map(len, metadata.values()))
        if size > UNCACHED_BYTES:
            found = self._build(namespace, name, metadata)
        else:
            key: CacheKey = (
                namespace,
                name,
                frozenset(metadata.items())
                if size <= KEY_INLINE_BYTES
                else metadata_digest(metadata),
            )
            entry = self._items.get(key)
            if entry is None:
                found = self._build(namespace, name, metadata)
                self._keep(key, found, size)
            else:
                self._items.move_to_end(key)
                found = entry[0]
        if isinstance(found, TriggerSpec):
            return found
        raise TriggerError([FieldError(path, message) for path, message in found])

    @staticmethod
    def _build(
        namespace: str, name: str, metadata: Mapping[str, str]
    ) -> TriggerSpec | tuple[Problem, ...]:
        try:
            return _build(namespace, name, metadata)
        except TriggerError as exc:
            return problems_of(exc)

    def _keep(self, key: CacheKey, found: TriggerSpec | tuple[Problem, ...], size: int) -> None:
        kept = size if isinstance(key[2], frozenset) else 0  # the map itself, as the key
        if isinstance(found, TriggerSpec):  # the parsed values: strings, and a tuple per item
            items = len(found.scrape_targets) + len(found.label_selector)
            kept += SPEC_OVERHEAD + 2 * size + ITEM_BYTES * items
        else:  # the cut problems, not the input
            kept += sum(len(path) + len(message) for path, message in found)
        cost = ENTRY_OVERHEAD + len(key[0]) + len(key[1]) + kept
        self._items[key] = (found, cost)
        self._bytes += cost
        while self._items and (len(self._items) > self._capacity or self._bytes > self._max_bytes):
            _, (_, dropped) = self._items.popitem(last=False)
            self._bytes -= dropped

    def __len__(self) -> int:
        return len(self._items)

    @property
    def bytes(self) -> int:
        """The estimated bytes the entries keep (bounded by `max_bytes`)."""
        return self._bytes


def parse_trigger(namespace: str, name: str, metadata: Mapping[str, str]) -> TriggerSpec:
    """Parse one trigger's metadata without caching (tools, tests, `check-config`)."""
    return _build(namespace, name, metadata)
