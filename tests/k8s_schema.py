"""Offline, strict schema validation of Kubernetes objects, for tests.

Built-in kinds are checked with `kubernetes_validate` in strict mode (unknown fields rejected) at
`K8S_VERSION`. Custom resources are checked with jsonschema against the openAPIV3Schema of the
upstream CRDs copied into deploy/crds, after `strict()` closes every object schema: the API server
silently prunes unknown fields of a custom resource unless the client asks for strict field
validation, so without this a misspelt key would pass here and vanish in the cluster.

An object with no known schema is an error (`SchemaNotFoundError`), never a silent pass.

Reused by the manifest tests and by tests of the request bodies the scaler sends to the API
(e.g. Karpenter NodePool patches: `validate_custom_resource(body, partial=True)`).
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml
from kubernetes_validate.utils import VersionNotSupportedError
from referencing import Registry, Resource

from gpu_queue_scaler.settings.check import strict_schema

REPO_ROOT = Path(__file__).resolve().parent.parent
CRD_DIR = REPO_ROOT / "deploy" / "crds"

# Oldest Kubernetes the manifests target: HPA `behavior.*.tolerance` needs 1.33.
K8S_VERSION = "1.33"

_OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
_K8S_DEFINITIONS_ID = "https://kubernetes.io/api/_definitions.json"


class SchemaNotFoundError(LookupError):
    """No schema is known for this apiVersion/kind: fail loudly instead of passing."""


class ManifestInvalidError(ValueError):
    """The object does not match its schema; the message lists every problem with its path."""


def split_api_version(api_version: str) -> tuple[str, str]:
    """`apps/v1` -> ("apps", "v1"); `v1` -> ("", "v1")."""
    group, _, version = api_version.rpartition("/")
    return group, version


def _where(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    name = meta.get("name", "?") if isinstance(meta, Mapping) else "?"
    return f"{obj.get('apiVersion')} {obj.get('kind')} {name!r}"


def _path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(part) for part in error.absolute_path) or "<root>"


# --- custom resources -----------------------------------------------------------------------------


@functools.cache
def _crd_index() -> dict[tuple[str, str], dict[str, Any]]:
    """(group, kind) -> CRD, for every CustomResourceDefinition under deploy/crds."""
    index: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if not doc or doc.get("kind") != "CustomResourceDefinition":
                continue
            key = (doc["spec"]["group"], doc["spec"]["names"]["kind"])
            if key in index:
                raise ValueError(f"two CRDs for {key} under {CRD_DIR}")
            index[key] = doc
    return index


def has_crd(group: str, kind: str) -> bool:
    return (group, kind) in _crd_index()


def load_crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    """A fresh copy of `openAPIV3Schema` of the served `version` of the CRD for group/kind."""
    crd = _crd_index().get((group, kind))
    if crd is None:
        known = ", ".join(f"{k} ({g})" for g, k in sorted(_crd_index()))
        raise SchemaNotFoundError(
            f"no CRD for kind {kind!r} in group {group!r} in {CRD_DIR}; known: {known}"
        )
    for entry in crd["spec"]["versions"]:
        if entry["name"] == version:
            if not entry.get("served", False):
                raise SchemaNotFoundError(f"{group}/{version} {kind} is not served by its CRD")
            return copy.deepcopy(entry["schema"]["openAPIV3Schema"])
    names = [entry["name"] for entry in crd["spec"]["versions"]]
    raise SchemaNotFoundError(f"CRD for {group} {kind} has no version {version!r} (has {names})")


# One strictness for the scaler's own check and these tests: the API server's pruning and rejection.
strict = strict_schema


@functools.cache
def _crd_validator(
    group: str, kind: str, version: str, partial: bool
) -> jsonschema.protocols.Validator:
    schema = strict(load_crd_schema(group, kind, version), drop_required=partial)
    cls = jsonschema.Draft202012Validator
    cls.check_schema(schema)
    return cls(schema)


def validate_custom_resource(obj: Mapping[str, Any], *, partial: bool = False) -> None:
    """Validate a custom resource against its CRD in deploy/crds, strictly.

    `metadata` is checked as the API server checks it: against the core ObjectMeta schema.
    With `partial=True` required fields may be missing (for merge-patch bodies); apiVersion and
    kind must still be present to find the schema, and null (delete) values are not supported.
    Raises SchemaNotFoundError or ManifestInvalidError.
    """
    api_version, kind = obj.get("apiVersion"), obj.get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise SchemaNotFoundError(f"object without apiVersion/kind: {dict(obj)!r:.200}")
    group, version = split_api_version(api_version)
    if not group:
        raise SchemaNotFoundError(f"{api_version} {kind} is a core kind, not a custom resource")
    validator = _crd_validator(group, kind, version, partial)
    problems = [f"{_path(e)}: {e.message}" for e in validator.iter_errors(dict(obj))]
    if "metadata" in obj:
        problems += [f"metadata.{p}" for p in _object_meta_problems(obj["metadata"], K8S_VERSION)]
    if problems:
        raise ManifestInvalidError(f"{_where(obj)} is invalid:\n  " + "\n  ".join(sorted(problems)))


# --- built-in kinds -------------------------------------------------------------------------------


@functools.cache
def _object_meta_validator(k8s_version: str) -> jsonschema.protocols.Validator:
    """Strict ObjectMeta schema from kubernetes_validate's bundled definitions."""
    root = resources.files("kubernetes_validate") / "kubernetes-json-schema"
    candidates = [
        entry.name
        for entry in root.iterdir()
        if entry.name.startswith(f"v{k8s_version}.") and entry.name.endswith("-local-strict")
    ]
    if not candidates:
        raise SchemaNotFoundError(f"kubernetes_validate has no strict schemas for {k8s_version}")
    definitions = json.loads(
        (root / max(candidates) / "_definitions.json").read_text(encoding="utf-8")
    )
    registry: Registry = Resource.from_contents(definitions) @ Registry()
    schema = {"$ref": f"{_K8S_DEFINITIONS_ID}#/$defs/{_OBJECT_META}"}
    return jsonschema.Draft202012Validator(schema, registry=registry)


def _object_meta_problems(metadata: object, k8s_version: str) -> list[str]:
    validator = _object_meta_validator(k8s_version)
    return [f"{_path(e)}: {e.message}" for e in validator.iter_errors(metadata)]


def validate_core(obj: Mapping[str, Any], k8s_version: str = K8S_VERSION) -> str:
    """Validate a built-in kind with kubernetes_validate in strict mode; returns the version used.

    Raises SchemaNotFoundError (unknown apiVersion/kind) or ManifestInvalidError.
    """
    if not isinstance(obj.get("apiVersion"), str) or not isinstance(obj.get("kind"), str):
        raise SchemaNotFoundError(f"object without apiVersion/kind: {dict(obj)!r:.200}")
    try:
        used: str = kubernetes_validate.validate(dict(obj), k8s_version, strict=True)
    except (kubernetes_validate.SchemaNotFoundError, VersionNotSupportedError) as exc:
        raise SchemaNotFoundError(exc.message) from None
    except kubernetes_validate.ValidationError as exc:
        raise ManifestInvalidError(
            f"{_where(obj)} is invalid for Kubernetes {exc.version} at {_path(exc)}: {exc.message}"
        ) from None
    return used


def validate_object(obj: Mapping[str, Any], k8s_version: str = K8S_VERSION) -> str:
    """Validate any object: a CRD from deploy/crds if one matches, else a built-in kind.

    Returns what validated it ("crd" or the Kubernetes version). An apiVersion/kind known to
    neither raises SchemaNotFoundError.
    """
    group, _ = split_api_version(str(obj.get("apiVersion", "")))
    if has_crd(group, str(obj.get("kind", ""))):
        validate_custom_resource(obj)
        return "crd"
    return validate_core(obj, k8s_version)


def load_yaml_documents(
    paths: Iterable[Path],
) -> list[tuple[Path, int, dict[str, Any]]]:
    """(path, index in file, object) for every non-empty YAML document in the files."""
    out: list[tuple[Path, int, dict[str, Any]]] = []
    for path in paths:
        for index, doc in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
            if doc is not None:
                out.append((path, index, doc))
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies application/merge-patch+json: what
    a patch body the code sends does to the stored object."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def without_nulls(body: Any) -> Any:
    """A merge patch minus its deletions (null leaves), which no schema describes."""
    if isinstance(body, dict):
        return {k: without_nulls(v) for k, v in body.items() if v is not None}
    return body
