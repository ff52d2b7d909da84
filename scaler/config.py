"""The tuning ConfigMap: YAML text -> a validated, immutable `Config`.

Layout (every key is in `scaler.fields`; `scaler check-config FILE` prints each problem by path):

    defaults:   {tuning keys}            # for every workload
    profiles:   {name: {tuning keys}}    # named by a trigger's `profile`
    server:     {server keys}            # process-wide

Precedence for a workload: trigger metadata > its profile > `defaults` > built-in defaults.
Validation collects every problem rather than stopping at the first, so one `check-config` run shows
a user everything to fix.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from scaler.fields import (
    BY_KEY,
    NAME_RE,
    SERVER_KEYS,
    TUNING_KEYS,
    FieldError,
    check_bounds,
    parse_section,
    pattern,
)

SECTIONS = ("defaults", "profiles", "server")
_profile_name = pattern(NAME_RE, 63)


class ConfigError(ValueError):
    def __init__(self, source: str, problems: list[FieldError]) -> None:
        self.source = source
        self.problems = problems
        super().__init__(f"{source}: " + "; ".join(str(p) for p in problems))


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


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys: in a ConfigMap the second one silently wins."""


def _mapping_no_duplicates(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:  # a list or mapping used as a key: no setting is named like that
            raise yaml.constructor.ConstructorError(
                None, None, f"unsupported key {key!r}", key_node.start_mark
            ) from None
        if duplicate:
            line = key_node.start_mark.line + 1
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (line {line})", key_node.start_mark
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


def parse_document(doc: object, source: str, digest: str = "") -> Config:
    """Validate an already-loaded YAML document."""
    if doc is None:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(
            source, [FieldError("<root>", f"must be a mapping, got {type(doc).__name__}")]
        )
    problems: list[FieldError] = []
    for key in doc:
        if key not in SECTIONS:
            problems.append(
                FieldError(str(key), f"unknown section; accepted: {', '.join(SECTIONS)}")
            )
    defaults, found = parse_section(_section(doc, "defaults", problems), TUNING_KEYS, "defaults.")
    problems += found + check_bounds(defaults, "defaults.")
    profiles: dict[str, Mapping[str, Any]] = {}
    for name, body in _section(doc, "profiles", problems).items():
        path = f"profiles.{name}"
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
        values, found = parse_section(body, TUNING_KEYS, f"{path}.")
        problems += found + check_bounds({**defaults, **values}, f"{path}.")
        profiles[str(name)] = _frozen(values)
    server, found = parse_section(_section(doc, "server", problems), SERVER_KEYS, "server.")
    problems += found
    if problems:
        raise ConfigError(source, problems)
    return Config(
        defaults=_frozen(defaults),
        profiles=_frozen(profiles),
        server=ServerSettings.from_values(server),
        source=source,
        digest=digest,
    )


def load_config_text(text: str | bytes, source: str = "<text>") -> Config:
    raw = text.encode() if isinstance(text, str) else text
    digest = hashlib.sha256(raw).hexdigest()
    try:
        doc = yaml.load(raw, Loader=_StrictLoader)  # noqa: S506 - _StrictLoader is a SafeLoader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "<root>"
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(source, [FieldError(where, f"not valid YAML: {problem}")]) from None
    except (ValueError, TypeError, OverflowError) as exc:  # e.g. a timestamp like 2026-13-45
        raise ConfigError(source, [FieldError("<root>", f"not valid YAML: {exc}")]) from None
    except RecursionError:
        raise ConfigError(
            source, [FieldError("<root>", "not valid YAML: nested too deeply")]
        ) from None
    return parse_document(doc, source, digest)


def load_config_file(path: str | Path) -> Config:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(
            str(path), [FieldError("<file>", f"cannot read: {exc.strerror}")]
        ) from None
    return load_config_text(data, str(path))
