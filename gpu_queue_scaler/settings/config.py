"""The tuning ConfigMap: YAML text -> a validated, immutable `Config`.

Layout (every key is in `gpu_queue_scaler.settings.fields`; `scaler check-config FILE` prints each
problem by path):

    defaults:   {tuning keys}            # for every workload
    profiles:   {name: {tuning keys}}    # named by a trigger's `profile`
    server:     {server keys}            # process-wide

Precedence for a workload: trigger metadata > its profile > `defaults` > built-in defaults.
Validation collects every problem rather than stopping at the first, so one `check-config` run shows
a user everything to fix; but a hostile file gets a bounded answer: the text is at most 1 MiB (the
limit of a Kubernetes ConfigMap), its YAML graph at most MAX_NODES nodes with every alias expanded
(a billion-laughs file is stopped while it is composed, before any Python object is built), and
what an error echoes of the file is cut (`MAX_PROBLEMS` problems, `MAX_UNKNOWN_KEYS` unknown keys,
each problem within `MAX_PROBLEM_CHARS`).
"""

from __future__ import annotations

import hashlib
import os
import reprlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpu_queue_scaler.logs import (
    cut,  # the one way a message is shortened, so every cut reads alike
)
from gpu_queue_scaler.settings.fields import (
    BY_KEY,
    NAME_RE,
    REFERENCE_POINTER,
    SERVER_KEYS,
    TUNING_KEYS,
    FieldError,
    check_bounds,
    key_hint,
    parse_section,
    pattern,
)

SECTIONS = ("defaults", "profiles", "server")
_profile_name = pattern(NAME_RE, 63)

# "The data stored in a ConfigMap cannot exceed 1 MiB"
# (https://kubernetes.io/docs/concepts/configuration/configmap/): a longer file is no ConfigMap.
MAX_CONFIG_BYTES = 1024 * 1024
# YAML nodes with every alias expanded. The shipped ConfigMap has under a hundred; a hundred
# profiles of ten keys have about two thousand.
MAX_NODES = 10_000
MAX_PROBLEMS = 50  # reported per file; the rest are counted
MAX_UNKNOWN_KEYS = 10  # reported per section; the rest are counted
MAX_PROBLEM_CHARS = 1500  # a problem's path and message, as echoed back and logged
MAX_PATH_CHARS = 120
_shown = reprlib.Repr()  # a key as an error shows it: a few items and characters of each
_shown.maxlevel, _shown.maxdict, _shown.maxlist, _shown.maxstring = 2, 4, 4, 60


def _bounded(problems: list[FieldError]) -> list[FieldError]:
    """The first MAX_PROBLEMS problems, each cut to a bound, and a count of the rest."""
    kept = [
        p
        if len(p.path) <= MAX_PATH_CHARS and len(p.message) <= MAX_PROBLEM_CHARS
        else FieldError(cut(p.path, MAX_PATH_CHARS), cut(p.message, MAX_PROBLEM_CHARS))
        for p in problems[:MAX_PROBLEMS]
    ]
    if len(problems) > MAX_PROBLEMS:
        kept.append(FieldError("<root>", f"... and {len(problems) - MAX_PROBLEMS} more problems"))
    return kept


class ConfigError(ValueError):
    def __init__(self, source: str, problems: list[FieldError]) -> None:
        self.source = cut(source, MAX_PATH_CHARS)
        self.problems = _bounded(problems)
        super().__init__(f"{self.source}: " + "; ".join(str(p) for p in self.problems))


@dataclass(frozen=True)
class ServerSettings:
    evaluation_interval_s: float = BY_KEY["evaluationIntervalSeconds"].default
    workload_idle_timeout_s: float = BY_KEY["workloadIdleTimeoutSeconds"].default
    stale_target_s: float = BY_KEY["staleTargetSeconds"].default
    first_decision_timeout_s: float = BY_KEY["firstDecisionTimeoutSeconds"].default

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> ServerSettings:
        base = cls()
        return cls(
            evaluation_interval_s=values.get(
                "evaluationIntervalSeconds", base.evaluation_interval_s
            ),
            workload_idle_timeout_s=values.get(
                "workloadIdleTimeoutSeconds", base.workload_idle_timeout_s
            ),
            stale_target_s=values.get("staleTargetSeconds", base.stale_target_s),
            first_decision_timeout_s=values.get(
                "firstDecisionTimeoutSeconds", base.first_decision_timeout_s
            ),
        )


def _frozen(values: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(values))


@dataclass(frozen=True)
class Config:
    defaults: Mapping[str, Any] = field(default_factory=lambda: _frozen({}))
    profiles: Mapping[str, Mapping[str, Any]] = field(default_factory=lambda: _frozen({}))
    server: ServerSettings = field(default_factory=ServerSettings)
    source: str = "<built-in defaults>"
    digest: str = ""


_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Unaccepted(yaml.composer.ComposerError):
    """Valid YAML this loader does not take: too many nodes, or an alias in its own anchor."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (in a ConfigMap the second one silently wins) and
    a graph of more than MAX_NODES nodes once its aliases are expanded, counted while it is
    composed: an alias adds the size of what it names, so nine aliases to a node of nine
    aliases... are stopped at the bound, not after a billion copies were built or printed."""

    def __init__(self, stream: bytes) -> None:
        super().__init__(stream)
        self._nodes = 0  # nodes composed so far, aliases expanded
        self._sizes: dict[int, int] = {}  # id(node) -> its size expanded, once it is complete

    def compose_document(self) -> yaml.Node | None:
        # Anchors are per document, so is the bound: each document of a manifest file gets its own.
        self._nodes, self._sizes = 0, {}
        return super().compose_document()

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            target = self.anchors.get(event.anchor)
            if target is not None:  # (an undefined alias is PyYAML's own error)
                size = self._sizes.get(id(target))
                if size is None:
                    raise _Unaccepted(
                        None, None, f"alias *{event.anchor} inside its own anchor", event.start_mark
                    )
                self._count(size, event.start_mark)
            return super().compose_node(parent, index)
        node = super().compose_node(parent, index)
        if node is None:
            return None
        if isinstance(node, yaml.MappingNode):
            children = [c for pair in node.value for c in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            children = []
        self._sizes[id(node)] = 1 + sum(self._sizes[id(c)] for c in children)
        self._count(1, node.start_mark)
        return node

    def _count(self, nodes: int, mark: yaml.Mark) -> None:
        self._nodes += nodes
        if self._nodes > MAX_NODES:
            raise _Unaccepted(
                None,
                None,
                f"more than {MAX_NODES} nodes with its aliases expanded; "
                "a tuning ConfigMap needs a few hundred",
                mark,
            )


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        # A merge key `<<: *base` is YAML's own (SafeLoader merges it); two of them are a
        # duplicate like any key (`<<: [*a, *b]` merges both).
        key = "<<" if key_node.tag == _MERGE_TAG else loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # a list or mapping used as a key: no setting is named like that
            raise yaml.constructor.ConstructorError(
                None, None, f"unsupported key {_shown.repr(key)}", key_node.start_mark
            ) from None
        if duplicate:
            line = key_node.start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {_shown.repr(key)} (line {line})", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_StrictLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _mapping_no_duplicates,
)


def _section(doc: Mapping[str, Any], name: str, problems: list[FieldError]) -> Mapping[str, Any]:
    value = doc.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        problems.append(FieldError(name, f"must be a mapping, got {type(value).__name__}"))
        return {}
    return value


# A section of at most this many keys lists them for an unknown key; a longer one points to
# `scaler reference` (the tuning keys are about fifty).
MAX_LISTED_KEYS = 8


def _parse_keys(
    raw: Mapping[Any, Any], allowed: tuple[str, ...], prefix: str, problems: list[FieldError]
) -> dict[str, Any]:
    """Parse a section's known keys; report its unknown keys, at most MAX_UNKNOWN_KEYS of them,
    each with `fields.key_hint`'s hint, else the accepted keys of a short section (listed once,
    the other keys refer to that path), else where to read them."""
    unknown = [key for key in raw if key not in allowed]
    listed = ""  # the first path that lists the accepted keys
    for key in unknown[:MAX_UNKNOWN_KEYS]:
        path, hint = f"{prefix}{cut(str(key), MAX_PATH_CHARS)}", key_hint(str(key), allowed)
        if not hint and len(allowed) > MAX_LISTED_KEYS:
            hint = f"; {REFERENCE_POINTER}"
        elif not hint and listed:
            hint = f"; accepted keys: as for {listed}"
        elif not hint:
            hint, listed = f"; accepted keys: {', '.join(allowed)}", path
        problems.append(FieldError(path, "unknown key" + hint))
    if len(unknown) > MAX_UNKNOWN_KEYS:
        more = len(unknown) - MAX_UNKNOWN_KEYS
        problems.append(FieldError(prefix.rstrip("."), f"... and {more} more unknown keys"))
    known = {key: value for key, value in raw.items() if key in allowed}
    values, found = parse_section(known, allowed, prefix)
    problems += found
    return values


def parse_document(doc: object, source: str, digest: str = "") -> Config:
    """Validate an already-loaded YAML document."""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(
            source, [FieldError("<root>", f"must be a mapping, got {type(doc).__name__}")]
        )
    problems: list[FieldError] = []
    for key in [key for key in doc if key not in SECTIONS][:MAX_UNKNOWN_KEYS]:
        problems.append(
            FieldError(
                cut(str(key), MAX_PATH_CHARS), f"unknown section; accepted: {', '.join(SECTIONS)}"
            )
        )
    defaults = _parse_keys(_section(doc, "defaults", problems), TUNING_KEYS, "defaults.", problems)
    problems += check_bounds(defaults, "defaults.")
    profiles: dict[str, Mapping[str, Any]] = {}
    for name, body in _section(doc, "profiles", problems).items():
        path = f"profiles.{cut(str(name), MAX_PATH_CHARS)}"
        try:
            _profile_name(name)
        except (ValueError, TypeError):
            problems.append(
                FieldError(path, "profile names are lowercase letters, digits, '.', '_', '-'")
            )
            continue
        if not isinstance(body, Mapping):
            problems.append(FieldError(path, "must be a mapping of tuning keys"))
            continue
        values = _parse_keys(body, TUNING_KEYS, f"{path}.", problems)
        problems += check_bounds({**defaults, **values}, f"{path}.")
        profiles[str(name)] = _frozen(values)
    server = _parse_keys(_section(doc, "server", problems), SERVER_KEYS, "server.", problems)
    if problems:
        raise ConfigError(source, problems)
    return Config(
        defaults=_frozen(defaults),
        profiles=_frozen(profiles),
        server=ServerSettings.from_values(server),
        source=source,
        digest=digest,
    )


def _too_large(source: str, size: int) -> ConfigError:
    return ConfigError(
        source,
        [
            FieldError(
                "<file>",
                f"{size} bytes; a ConfigMap holds at most {MAX_CONFIG_BYTES} bytes (1 MiB)",
            )
        ],
    )


def load_yaml_documents(raw: bytes, source: str) -> list[object]:
    """Every YAML document of `raw`, loaded as the ConfigMap is (duplicate keys refused, each
    document at most MAX_NODES nodes with its aliases expanded); ConfigError if it is not YAML.
    Used for the config file (one document) and for `scaler check`'s manifests."""
    loader = None
    try:
        loader = _StrictLoader(raw)  # reads the encoding: a ReaderError on bytes that are no text
        documents = []
        while loader.check_data():  # type: ignore[no-untyped-call]
            documents.append(loader.get_data())
        return documents
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<root>"
        problem = getattr(exc, "problem", None) or str(exc)
        what = "not accepted" if isinstance(exc, _Unaccepted) else "not valid YAML"
        raise ConfigError(source, [FieldError(where, f"{what}: {problem}")]) from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp like 2026-13-45
        raise ConfigError(source, [FieldError("<root>", f"not valid YAML: {exc}")]) from None
    except RecursionError:
        raise ConfigError(
            source, [FieldError("<root>", "not valid YAML: nested too deeply")]
        ) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_config_text(text: str | bytes, source: str = "<text>") -> Config:
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) > MAX_CONFIG_BYTES:
        raise _too_large(source, len(raw))
    digest = hashlib.sha256(raw).hexdigest()
    return parse_documents(load_yaml_documents(raw, source), source, digest)


def parse_documents(documents: list[object], source: str, digest: str = "") -> Config:
    """The config of documents `load_yaml_documents` returned: exactly one mapping (or none)."""
    if len(documents) > 1:
        raise ConfigError(
            source,
            [FieldError("<root>", f"{len(documents)} YAML documents; the config is one mapping")],
        )
    return parse_document(documents[0] if documents else None, source, digest)


def read_config_bytes(path: str | Path) -> bytes:
    """The file's bytes, reading no more than one byte past MAX_CONFIG_BYTES."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_CONFIG_BYTES + 1)
            size = len(data) if len(data) <= MAX_CONFIG_BYTES else os.fstat(file.fileno()).st_size
    except OSError as exc:
        raise ConfigError(
            str(path), [FieldError("<file>", f"cannot read: {exc.strerror}")]
        ) from None
    if size > MAX_CONFIG_BYTES:
        raise _too_large(str(path), max(size, len(data)))
    return data


def load_config_file(path: str | Path) -> Config:
    return load_config_text(read_config_bytes(path), str(path))
