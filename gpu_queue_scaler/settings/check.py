"""`scaler check FILE...`: lint ScaledObjects and the scaler's ConfigMap before applying them.

Each YAML document is recognised by its apiVersion and kind:

- a `keda.sh/v1alpha1` ScaledObject: its fields against KEDA's own CRD schema (the copy in
  `gpu_queue_scaler/schemas`, made strict so a misspelt field is named instead of pruned), and every
  `external` or `external-push` trigger (only those dialing `--scaler-address`, when given) with
  the server's own parser, against the ConfigMap's profiles and defaults when one is in the run
  or given with `--config`; then what only this scaler knows: the replica count it returns with
  target 1 needs `metricType: AverageValue`, a `fallback` of 0 replicas scales to zero, the HPA's
  10% tolerance drops +-1 steps, the KEDA bounds against the trigger's;
- a `v1` ConfigMap with a `config.yaml` key (the key deploy/base mounts as `--config`);
- a mapping without a kind: a plain config file, checked as `scaler check-config` checks it.

Other kinds are skipped, and said so. Problems fail the check (exit 1), warnings do not; a file
that cannot be read or is not YAML exits 2. What is printed is bounded: each line, the lines of one
document, and the lines in all.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import jsonschema
import yaml
from kubernetes.utils.quantity import parse_quantity

from gpu_queue_scaler.logs import cut
from gpu_queue_scaler.settings.config import (
    MAX_CONFIG_BYTES,
    Config,
    ConfigError,
    load_config_file,
    load_config_text,
    load_yaml_documents,
    parse_document,
    read_config_bytes,
)
from gpu_queue_scaler.settings.fields import BY_KEY, FieldError, nearest_key

# The data key of the ConfigMap that deploy/base mounts and passes as `serve --config`.
CONFIG_DATA_KEY = "config.yaml"
SCALED_OBJECT = ("keda.sh/v1alpha1", "ScaledObject")
OUR_TRIGGER_TYPES = ("external", "external-push")
SCHEMA_FILE = "keda.sh_scaledobjects.yaml"  # a copy of deploy/crds' (tests check they agree)

LINE_CHARS = 500  # a printed line, cut
LINES_PER_DOCUMENT = 50  # findings printed for one document; the rest are counted
MAX_LINES = 200  # lines printed in all; the rest are counted

# KEDA's and the HPA's own defaults for what the checks compare.
KEDA_MAX_REPLICAS = 100  # maxReplicaCount
KEDA_POLLING_INTERVAL_S = 30  # pollingInterval
HPA_TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance


@dataclass
class Finding:
    path: str
    message: str
    warning: bool = False


@dataclass
class Checked:
    """One document: what it is, what was found, and a note for its `ok` line."""

    file: str
    label: str  # e.g. "ScaledObject team-a/llama"; "" for a plain config file
    findings: list[Finding] = field(default_factory=list)
    note: str = ""
    skipped: bool = False

    def problem(self, path: str, message: str) -> None:
        self.findings.append(Finding(path, message))

    def warn(self, path: str, message: str) -> None:
        self.findings.append(Finding(path, message, warning=True))

    @property
    def failed(self) -> bool:
        return any(not f.warning for f in self.findings)

    def lines(self) -> Iterator[str]:
        head = f"{self.file}: {self.label}: " if self.label else f"{self.file}: "
        if self.skipped or not self.findings:
            yield head + (self.note or "ok")
            return
        for found in self.findings[:LINES_PER_DOCUMENT]:
            kind = "warning: " if found.warning else ""
            yield f"{head}{found.path}: {kind}{found.message}"
        more = len(self.findings) - LINES_PER_DOCUMENT
        if more > 0:
            yield f"{head}... and {more} more findings not shown"
        if not self.failed:
            yield head + (self.note or "ok") + " (warnings only)"


# --- the ScaledObject's schema --------------------------------------------------------------------


_SUBSCHEMA_MAPS = ("properties", "patternProperties")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_GO_LATE_FLAGS = re.compile(r"^\^\(\?([imsU]+)\)")


def strict_schema(schema: Mapping[str, Any], *, drop_required: bool = False) -> dict[str, Any]:
    """A copy of a CRD's structural schema that rejects what the API server would prune or reject.

    - Every object schema with `properties` and neither `additionalProperties` nor
      `x-kubernetes-preserve-unknown-fields: true` gets `additionalProperties: false`.
    - `x-kubernetes-embedded-resource: true` objects also accept apiVersion, kind and metadata.
    - `x-kubernetes-int-or-string: true` without a type becomes anyOf integer/string (schemas that
      already carry that anyOf are kept as they are).
    - `nullable: true` admits null.
    - A `pattern` opening with an inline flag group after its anchor (`^(?i)...`, which Go's RE2
      reads, and the API server with it, but Python's re rejects) gets the flags first:
      `(?i)^...`, the same language.
    - `drop_required=True` removes `required` lists, to check partial bodies (merge patches).
    """
    out: dict[str, Any] = dict(schema)
    for key in _SUBSCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {
                name: strict_schema(sub, drop_required=drop_required)
                for name, sub in out[key].items()
            }
    for key in _SUBSCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [strict_schema(sub, drop_required=drop_required) for sub in out[key]]
    items = out.get("items")
    if isinstance(items, Mapping):
        out["items"] = strict_schema(items, drop_required=drop_required)
    elif isinstance(items, list):
        out["items"] = [strict_schema(sub, drop_required=drop_required) for sub in items]
    for key in ("additionalProperties", "not"):
        if isinstance(out.get(key), Mapping):
            out[key] = strict_schema(out[key], drop_required=drop_required)
    if out.get("x-kubernetes-embedded-resource") is True and "properties" in out:
        props = dict(out["properties"])
        props.setdefault("apiVersion", {"type": "string"})
        props.setdefault("kind", {"type": "string"})
        props.setdefault("metadata", {"type": "object"})
        out["properties"] = props
    if (
        "properties" in out
        and "additionalProperties" not in out
        and out.get("x-kubernetes-preserve-unknown-fields") is not True
    ):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string") is True and "type" not in out and "anyOf" not in out:
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if isinstance(out.get("pattern"), str):
        out["pattern"] = _GO_LATE_FLAGS.sub(r"(?\1)^", out["pattern"])
    if out.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if drop_required:
        out.pop("required", None)
    return out


def crd_text() -> str:
    return (resources.files("gpu_queue_scaler") / "schemas" / SCHEMA_FILE).read_text(
        encoding="utf-8"
    )


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    crd = yaml.safe_load(crd_text())
    [version] = [v for v in crd["spec"]["versions"] if v["name"] == SCALED_OBJECT[0].split("/")[1]]
    # `status` stays: `kubectl get scaledobject -o yaml | scaler check -` carries KEDA's own.
    return jsonschema.Draft202012Validator(strict_schema(version["schema"]["openAPIV3Schema"]))


def field_path(parts: Sequence[object]) -> str:
    """`spec.triggers[0].metadata.model` from jsonschema's path parts."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "<root>"


_METADATA_VALUE = re.compile(r"spec\.triggers\[\d+\]\.metadata\..+", re.DOTALL)


def _schema_findings(obj: Mapping[str, Any], checked: Checked) -> None:
    for error in _validator().iter_errors(dict(obj)):
        path = field_path(list(error.absolute_path))
        schema = error.schema if isinstance(error.schema, Mapping) else {}
        if error.validator == "additionalProperties" and isinstance(error.instance, Mapping):
            known = tuple(schema.get("properties", {}))
            for key in error.instance:
                if key not in known:
                    near = nearest_key(str(key), known)
                    hint = f"; did you mean {near}?" if near else f"; accepted: {', '.join(known)}"
                    name = field_path([*error.absolute_path, cut(str(key), 120)])
                    checked.problem(name, f"unknown field{hint}")
            continue
        message = cut(error.message, 300)
        if error.validator == "type" and _METADATA_VALUE.fullmatch(path):
            message += "; KEDA takes every trigger metadata value as a string: quote it"
        checked.problem(path, message)


# --- what only this scaler knows ------------------------------------------------------------------


def _mapping(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """obj[key] if it is a mapping, else an empty one (the schema has said what is wrong)."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    return value if isinstance(value, list) else []


def _number(value: object) -> float | None:
    """A Kubernetes quantity (`"0"`, `"100m"`, 0.05) as a number, or None if it is none."""
    try:
        return float(parse_quantity(value))  # type: ignore[no-untyped-call]
    except (ValueError, TypeError):
        return None


def _hpa_behavior(spec: Mapping[str, Any], max_count: int, checked: Checked) -> None:
    advanced = _mapping(spec, "advanced")
    behavior = _mapping(_mapping(advanced, "horizontalPodAutoscalerConfig"), "behavior")
    base = "spec.advanced.horizontalPodAutoscalerConfig.behavior"
    for direction in ("scaleUp", "scaleDown"):
        raw = _mapping(behavior, direction).get("tolerance")
        tolerance = HPA_TOLERANCE if raw is None else _number(raw)
        if tolerance is not None and tolerance > 0 and max_count > 1 / tolerance:
            said = "the HPA's default 10%" if raw is None else f"{raw!r}"
            checked.warn(
                f"{base}.{direction}.tolerance",
                f"{said}: the HPA drops +-1 steps of the scaler's target above "
                f'{1 / tolerance:.0f} replicas (maxReplicaCount {max_count}); set tolerance: "0"',
            )
    window = _mapping(behavior, "scaleDown").get("stabilizationWindowSeconds")
    if not isinstance(window, int) or window > 0:
        shown = "unset (the HPA's 300 s)" if window is None else f"{window}"
        checked.warn(
            f"{base}.scaleDown.stabilizationWindowSeconds",
            f"{shown}: the scaler stabilizes its own scale-down (scaleDownStabilizationSeconds); "
            "a second window in the HPA delays it further; set 0",
        )
    if isinstance(advanced.get("scalingModifiers"), Mapping):
        checked.warn(
            "spec.advanced.scalingModifiers",
            "a formula over the scaler's value changes the replica count it returns",
        )


def _fallback(spec: Mapping[str, Any], checked: Checked) -> None:
    fallback = spec.get("fallback")
    if not isinstance(fallback, Mapping):
        return
    if fallback.get("replicas") == 0:
        checked.problem(
            "spec.fallback.replicas",
            "0: KEDA's scale loop then does not skip the failing trigger and, with "
            "minReplicaCount 0, scales the workload to zero after cooldownPeriod; set the "
            "replicas that carry typical load",
        )
    behavior = fallback.get("behavior", "static")
    if behavior not in ("currentReplicasIfHigher", "currentReplicas"):
        checked.warn(
            "spec.fallback.behavior",
            f"{behavior}: during an outage KEDA may scale the workload below what runs; "
            "currentReplicasIfHigher keeps max(running, fallback.replicas)",
        )


def _bounds(
    spec: Mapping[str, Any], path: str, lo: int, hi: int, polling: float, checked: Checked
) -> None:
    """The ScaledObject's replica bounds and polling interval against the trigger's."""
    min_count = spec.get("minReplicaCount", 0)
    max_count = spec.get("maxReplicaCount", KEDA_MAX_REPLICAS)
    if not isinstance(min_count, int) or not isinstance(max_count, int):
        return  # the schema said so
    if min_count > hi:
        checked.problem(
            "spec.minReplicaCount",
            f"{min_count} is above the trigger's maxReplicas ({hi}): the HPA's floor is above the "
            "scaler's highest target",
        )
    if lo > max_count:
        checked.problem(
            f"{path}.minReplicas",
            f"{lo} is above spec.maxReplicaCount ({max_count}): the HPA never reaches the "
            "scaler's lowest target",
        )
    if hi != max_count:
        checked.warn(
            f"{path}.maxReplicas",
            f"{hi} differs from spec.maxReplicaCount ({max_count}): the HPA stops at the lower; "
            "keep them equal so the scaler's forecasts and the companion size for what can run",
        )
    interval = spec.get("pollingInterval", KEDA_POLLING_INTERVAL_S)
    if isinstance(interval, int) and interval != polling:
        checked.warn(
            f"{path}.pollingIntervalSeconds",
            f"{polling:g} differs from spec.pollingInterval ({interval}): it is part of the "
            "forecast horizon; keep them equal",
        )


@dataclass(frozen=True)
class Tuning:
    """The config ScaledObjects are resolved against, and how it is named in the output."""

    config: Config | None  # None: none given, or the one given is invalid
    named: str  # e.g. "deploy/base/configmap.yaml: ConfigMap gpu-queue-scaler/..."


def _trigger(
    spec: Mapping[str, Any],
    index: int,
    trigger: Mapping[str, Any],
    where: tuple[str, str],
    tuning: Tuning,
    checked: Checked,
) -> str:
    """Check one of our triggers; return a note on what its tuning was checked against."""
    from gpu_queue_scaler.settings.spec import ResolveError, resolve
    from gpu_queue_scaler.settings.trigger import TriggerError, parse_trigger

    path = f"spec.triggers[{index}]"
    metric_type = trigger.get("metricType")
    if metric_type is not None and metric_type != "AverageValue":
        checked.problem(
            f"{path}.metricType",
            f"{cut(repr(metric_type), 80)}: the scaler returns the replica count with target "
            "1, which only AverageValue turns into that many replicas (KEDA's fallback too); set "
            "AverageValue or leave it out",
        )
    raw = trigger.get("metadata")
    # A number the schema flagged as unquoted is read as KEDA would read it once quoted.
    metadata = {
        str(k): v if isinstance(v, str) else str(v)
        for k, v in (raw.items() if isinstance(raw, Mapping) else ())
        if isinstance(v, (str, int, float)) and not isinstance(v, bool)
    }
    try:
        parsed = parse_trigger(where[0], where[1], metadata)
    except TriggerError as exc:
        for p in exc.problems:
            checked.problem(f"{path}.metadata.{p.path}", p.message)
        return ""
    values = parsed.values
    if tuning.config is not None:
        try:
            workload = resolve(parsed, tuning.config)
        except ResolveError as exc:
            for p in exc.problems:
                checked.problem(f"{path}.metadata.{p.path}", p.message)
            return f"tuning against {tuning.named}"
        lo, hi, polling = workload.min_replicas, workload.max_replicas, workload.polling_interval_s
        note = f"tuning against {tuning.named}"
    elif parsed.profile is None:
        default = {k: BY_KEY[k].default for k in ("minReplicas", "maxReplicas")}
        lo = values.get("minReplicas", default["minReplicas"])
        hi = values.get("maxReplicas", default["maxReplicas"])
        polling = values.get("pollingIntervalSeconds", BY_KEY["pollingIntervalSeconds"].default)
        note = "bounds against the built-in defaults: no ConfigMap given"
    else:
        return (
            f"profile {parsed.profile!r} not checked: give the ConfigMap (--config FILE, or a "
            "file in the same run)"
        )
    _bounds(spec, f"{path}.metadata", lo, hi, polling, checked)
    return note


def check_scaled_object(
    obj: Mapping[str, Any], checked: Checked, tuning: Tuning, only: str
) -> None:
    _schema_findings(obj, checked)
    spec = _mapping(obj, "spec")
    meta = _mapping(obj, "metadata")
    where = (str(meta.get("namespace") or "default"), str(meta.get("name") or ""))
    min_count = spec.get("minReplicaCount", 0)
    max_count = spec.get("maxReplicaCount", KEDA_MAX_REPLICAS)
    if isinstance(min_count, int) and isinstance(max_count, int) and min_count > max_count:
        checked.problem(
            "spec.minReplicaCount",
            f"{min_count} is above maxReplicaCount ({max_count}); KEDA's CRD refuses it",
        )
    triggers = _list(spec, "triggers")
    ours = 0
    notes: list[str] = []
    for index, trigger in enumerate(triggers):
        if not isinstance(trigger, Mapping) or trigger.get("type") not in OUR_TRIGGER_TYPES:
            continue
        metadata = _mapping(trigger, "metadata")
        if only and str(metadata.get("scalerAddress", "")) != only:
            continue
        ours += 1
        notes.append(_trigger(spec, index, trigger, where, tuning, checked))
    if not ours:
        what = f"dialing {only}" if only else "(external or external-push)"
        checked.note = f"skipped: no trigger {what}, nothing of this scaler's to check"
        checked.skipped = not checked.findings
        return
    if isinstance(max_count, int):
        _hpa_behavior(spec, max_count, checked)
    _fallback(spec, checked)
    shown = "; ".join(dict.fromkeys(n for n in notes if n))
    checked.note = f"ok ({ours} trigger{'s' * (ours > 1)}{'; ' + shown if shown else ''})"


# --- documents ------------------------------------------------------------------------------------


def _read(name: str) -> bytes:
    if name != "-":
        return read_config_bytes(name)
    data = sys.stdin.buffer.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            "<stdin>", [FieldError("<file>", f"more than {MAX_CONFIG_BYTES} bytes (1 MiB)")]
        )
    return data


def _items(documents: list[object]) -> list[object]:
    """The documents, with a `kind: List` (what `kubectl get -o yaml` prints for several
    objects) replaced by its items."""
    found: list[object] = []
    for doc in documents:
        items = doc.get("items") if isinstance(doc, Mapping) and doc.get("kind") == "List" else None
        found.extend(items if isinstance(items, list) else [doc])
    return found


def _label(kind: str, meta: object, index: int, count: int) -> str:
    meta = meta if isinstance(meta, Mapping) else {}
    name, namespace = meta.get("name"), meta.get("namespace")
    if isinstance(name, str) and name:
        shown = f"{namespace}/{name}" if isinstance(namespace, str) and namespace else name
        return cut(f"{kind} {shown}", 200)
    return f"{kind} (document {index + 1})" if count > 1 else kind


def _tuning(checked: Checked, named: str, load: Callable[[], Config], prefix: str = "") -> Tuning:
    """A config document's tuning: `load()`'s config (and an `ok` note), or its problems."""
    try:
        config = load()
    except ConfigError as exc:
        for p in exc.problems:
            checked.problem(f"{prefix}{p.path}", p.message)
        return Tuning(None, named)
    checked.note = f"ok ({len(config.profiles)} profiles)"
    return Tuning(config, named)


def _document(
    doc: object,
    shown: str,
    index: int,
    count: int,
    scaled: list[tuple[Checked, Mapping[str, Any]]],
) -> tuple[Checked, Tuning | None]:
    """One document of a file: what was found, and the tuning it carries (a config file or the
    scaler's ConfigMap); a ScaledObject goes to `scaled`, checked once every config is read."""
    kind = doc.get("kind") if isinstance(doc, Mapping) else None
    if not isinstance(doc, Mapping) or kind is None:  # a plain config file
        checked = Checked(shown, _label("config", None, index, count) if count > 1 else "")
        return checked, _tuning(checked, shown, functools.partial(parse_document, doc, shown))
    key = (str(doc.get("apiVersion")), str(kind))
    checked = Checked(shown, _label(key[1], doc.get("metadata"), index, count))
    if key == SCALED_OBJECT:
        scaled.append((checked, doc))
        return checked, None
    data = doc.get("data")
    if key == ("v1", "ConfigMap") and isinstance(data, Mapping) and CONFIG_DATA_KEY in data:
        named, text = f"{shown}: {checked.label}", data[CONFIG_DATA_KEY]
        if not isinstance(text, str):
            checked.problem(f"data.{CONFIG_DATA_KEY}", "must be a string (the config file)")
            return checked, Tuning(None, named)
        load = functools.partial(load_config_text, text, named)
        return checked, _tuning(checked, named, load, f"data.{CONFIG_DATA_KEY}: ")
    checked.skipped = True
    checked.note = (
        f"skipped: not a {' '.join(SCALED_OBJECT)}, the scaler's ConfigMap "
        f"(data.{CONFIG_DATA_KEY}) or a config file"
    )
    return checked, None


@dataclass
class Run:
    """The documents in input order (a ScaledObject is checked once every config is read), and
    the lines of what could not be read."""

    entries: list[Checked | list[str]] = field(default_factory=list)
    unreadable: bool = False

    def add(self, checked: Checked) -> None:
        self.entries.append(checked)

    def say(self, lines: list[str]) -> None:
        self.entries.append(lines)

    def lines(self) -> Iterator[str]:
        for entry in self.entries:
            yield from entry.lines() if isinstance(entry, Checked) else entry

    @property
    def failed(self) -> bool:
        return any(isinstance(e, list) or e.failed for e in self.entries)


def run(files: Sequence[str], config_file: str | None = None, scaler_address: str = "") -> int:
    """Check every document of `files`; print one line per finding (or an `ok` line per
    document); 0: no problem, 1: problems, 2: a file could not be read or is not YAML."""
    state = Run()
    scaled: list[tuple[Checked, Mapping[str, Any]]] = []
    first: Tuning | None = None
    for name in files:
        shown = "<stdin>" if name == "-" else name
        try:
            documents = _items(load_yaml_documents(_read(name), shown))
        except ConfigError as exc:
            state.unreadable = True
            state.say([f"{shown}: {p}" for p in exc.problems])
            continue
        for index, doc in enumerate(documents):
            if doc is not None:
                checked, found = _document(doc, shown, index, len(documents), scaled)
                state.add(checked)
                first = first or found
    tuning = first or Tuning(None, "")
    if config_file is not None:
        try:
            tuning = Tuning(load_config_file(config_file), config_file)
        except ConfigError as exc:
            state.say([f"{config_file}: {p}" for p in exc.problems])
            tuning = Tuning(None, config_file)
    for checked, doc in scaled:
        check_scaled_object(doc, checked, tuning, scaler_address)
        if tuning.named and tuning.config is None:
            checked.note += f" (tuning not checked: {tuning.named} is invalid)"
    shown_lines = 0
    for line in state.lines():
        shown_lines += 1
        if shown_lines <= MAX_LINES:
            print(cut(line, LINE_CHARS))
    if shown_lines > MAX_LINES:
        print(f"... and {shown_lines - MAX_LINES} more lines not shown")
    return 2 if state.unreadable else 1 if state.failed else 0
