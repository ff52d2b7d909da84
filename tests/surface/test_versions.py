"""The oldest Kubernetes, KEDA, Karpenter and kubectl that deploy/ needs, derived from what the
manifests use, and checked against the Compatibility page's table (docs/compatibility.md).

Only the newest CRDs are in deploy/crds (KEDA v2.20.2, Karpenter v1.14.1), so a strict schema
check cannot tell which older release first has a field. Instead, every field the example
ScaledObjects use and every kustomization key is classified here, with the release that
introduced the newer ones and its source; a field nobody classified fails the test, and the
stated minimum must be the newest release any used field needs (not older, not newer).
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from typing import Any

import yaml

from tests import k8s_schema, tools

REPO = k8s_schema.REPO_ROOT
DEPLOY = REPO / "deploy"
COMPATIBILITY = REPO / "docs" / "compatibility.md"

# What the Compatibility page's "Cluster" table states; every test below derives the same figures.
MINIMUM = {"Kubernetes": "1.33", "KEDA": "2.18", "Karpenter": "1.5", "kubectl": "1.32"}

# ScaledObject fields KEDA added in the releases this project's examples depend on, with the first
# release that has each. Paths: `[]` for a list item.
KEDA_SINCE = {
    # kedacore/keda#6464 (fallback `behavior`), in v2.17.0
    "spec.fallback.behavior": "2.17",
    # kedacore/keda-docs#1660: HPA behavior `tolerance` in the ScaledObject from KEDA v2.18
    "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance": "2.18",
    "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown.tolerance": "2.18",
}
# ScaledObject fields every KEDA 2 release from 2.16 on has (keda-docs content/docs/2.16,
# reference/scaledobject-spec.md).
KEDA_BEFORE = {
    "spec.scaleTargetRef.apiVersion",
    "spec.scaleTargetRef.kind",
    "spec.scaleTargetRef.name",
    "spec.pollingInterval",
    "spec.cooldownPeriod",
    "spec.idleReplicaCount",
    "spec.minReplicaCount",
    "spec.maxReplicaCount",
    "spec.fallback.failureThreshold",
    "spec.fallback.replicas",
    *(
        f"spec.advanced.horizontalPodAutoscalerConfig.behavior.{direction}.{key}"
        for direction in ("scaleUp", "scaleDown")
        for key in (
            "stabilizationWindowSeconds",
            "selectPolicy",
            "policies[].type",
            "policies[].value",
            "policies[].periodSeconds",
        )
    ),
    "spec.triggers[].type",
    "spec.triggers[].name",
    "spec.triggers[].metricType",
    "spec.triggers[].metadata",  # a map of strings, its keys the scaler's (test_keda_keys.py)
    "spec.triggers[].authenticationRef.name",
    "spec.triggers[].authenticationRef.kind",
    "spec.triggers[].useCachedMetrics",
}

# Kubernetes features deploy/ uses and the release where each works without a feature gate flip
# (kubernetes/kubernetes pkg/features/kube_features.go; the API reference for the kinds).
K8S_FEATURES = {
    # HPA behavior tolerance: alpha (gate HPAConfigurableTolerance, off) in 1.33, beta (on) in 1.35.
    # 1.33 is the oldest whose API has the field; the Compatibility page says the gate is needed
    # until 1.35.
    "HPA behavior tolerance": "1.33",
    "ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1)": "1.30",
    "gRPC container probes (GA)": "1.27",
}

# Karpenter: the v1 APIs are in every release from v1.0.0; Kubernetes 1.33 is supported from
# Karpenter 1.5 (karpenter.sh compatibility matrix: 1.5 supports 1.29 - 1.33).
KARPENTER_API_SINCE = {"karpenter.sh/v1": "1.0", "karpenter.k8s.aws/v1": "1.0"}
KARPENTER_FOR_KUBERNETES = {"1.33": "1.5"}

# Kustomization keys and the kustomize release that first has each: `labels` is kustomize
# v4.1.0's (release notes kustomize/v4.1.0); an inline (string) `transformers` entry came with
# kubernetes-sigs/kustomize#3225 (2020-11, before v4.0.0); `replacements` whose fieldPaths escape
# a dot (`kubernetes\.io`) need kubernetes-sigs/kustomize#3931 (2021-06, v4.2.0); `components`
# (kind Component) is kustomize v3.7.0's. The rest is older than kustomize v3.
KUSTOMIZE_SINCE = {
    "labels": "4.1.0",
    "transformers (inline)": "4.0.0",
    "replacements": "4.2.0",
    "components": "3.7.0",
}
KUSTOMIZE_BEFORE = {
    "apiVersion",
    "kind",
    "namespace",
    "resources",
    "configMapGenerator",
    "transformers",
    "patches",
}
# The kustomize each kubectl embeds (kubectl 1.21: v4.0.5; 1.22: v4.2.0, its changelog).
KUBECTL_KUSTOMIZE = {"1.21": "4.0.5", "1.22": "4.2.0"}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


def _newest(versions: list[str]) -> str:
    return max(versions, key=_version)


def _objects() -> list[dict[str, Any]]:
    paths = sorted(p for p in DEPLOY.rglob("*.yaml") if "crds" not in p.parts)
    return [
        obj
        for _, _, obj in k8s_schema.load_yaml_documents(paths)
        if obj.get("kind") != "Kustomization"
    ]


def _paths(value: Any, prefix: str) -> Iterator[str]:
    """Dotted paths of every leaf under `value` (list items as `[]`; trigger metadata whole)."""
    if prefix.endswith("triggers[].metadata"):
        yield prefix
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, f"{prefix}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{prefix}[]")
    else:
        yield prefix


def _scaled_object_paths() -> set[str]:
    found: set[str] = set()
    for obj in _objects():
        if obj.get("kind") == "ScaledObject":
            found.update(_paths(obj["spec"], "spec"))
    return found


def test_every_scaledobject_field_the_examples_use_is_classified() -> None:
    unknown = _scaled_object_paths() - KEDA_BEFORE - set(KEDA_SINCE)
    assert not unknown, f"classify these in KEDA_SINCE (with the release) or KEDA_BEFORE: {unknown}"


def test_the_classified_fields_are_real_crd_fields() -> None:
    """Both tables name fields of the real ScaledObject CRD (v2.20.2), not misspellings."""
    root = k8s_schema.load_crd_schema("keda.sh", "ScaledObject", "v1alpha1")
    for path in sorted(KEDA_BEFORE | set(KEDA_SINCE)):
        node = root
        for part in path.replace("[]", ".[]").split("."):
            if part == "[]":
                node = node["items"]
            else:
                assert part in node.get("properties", {}), (path, part)
                node = node["properties"][part]


def test_the_keda_minimum_is_the_newest_release_a_used_field_needs() -> None:
    used = _scaled_object_paths()
    needed = _newest(["2.17", *(KEDA_SINCE[p] for p in used if p in KEDA_SINCE)])  # 2.17: floats
    assert needed == MINIMUM["KEDA"]


def test_the_kubernetes_minimum_is_what_the_manifests_use_and_are_validated_at() -> None:
    objects = _objects()
    used = []
    if any(p.endswith(".tolerance") for p in _scaled_object_paths()):
        used.append(K8S_FEATURES["HPA behavior tolerance"])
    if any(o.get("kind") == "ValidatingAdmissionPolicy" for o in objects):
        used.append(K8S_FEATURES["ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1)"])
    if any('"grpc"' in json.dumps(o) and o.get("kind") == "Deployment" for o in objects):
        used.append(K8S_FEATURES["gRPC container probes (GA)"])
    assert _newest(used) == MINIMUM["Kubernetes"]
    assert MINIMUM["Kubernetes"] == k8s_schema.K8S_VERSION  # core objects are validated there


def test_the_karpenter_minimum_covers_its_apis_and_the_kubernetes_minimum() -> None:
    apis = {
        o["apiVersion"] for o in _objects() if str(o.get("apiVersion", "")).startswith("karpenter")
    }
    assert apis and apis <= set(KARPENTER_API_SINCE)
    needed = [KARPENTER_API_SINCE[a] for a in apis]
    needed.append(KARPENTER_FOR_KUBERNETES[MINIMUM["Kubernetes"]])
    assert _newest(needed) == MINIMUM["Karpenter"]


def _kustomization_keys() -> set[str]:
    keys: set[str] = set()
    for path in DEPLOY.rglob("kustomization.yaml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        keys.update(doc)
        if any(isinstance(t, str) and "\n" in t for t in doc.get("transformers", [])):
            keys.add("transformers (inline)")
    return keys


def test_the_kubectl_minimum_builds_every_kustomization_and_meets_the_skew_policy() -> None:
    keys = _kustomization_keys()
    unknown = keys - KUSTOMIZE_BEFORE - set(KUSTOMIZE_SINCE)
    assert not unknown, f"classify these kustomization keys in KUSTOMIZE_SINCE: {unknown}"
    kustomize = _newest([KUSTOMIZE_SINCE[k] for k in keys if k in KUSTOMIZE_SINCE])
    # The oldest kubectl whose embedded kustomize has every key used.
    for_kustomize = min(
        (v for v, k in KUBECTL_KUSTOMIZE.items() if _version(k) >= _version(kustomize)),
        key=_version,
    )
    assert for_kustomize == "1.22"
    # Kubernetes' version skew policy: kubectl within one minor version of the API server.
    major, minor = _version(MINIMUM["Kubernetes"])
    assert _newest([for_kustomize, f"{major}.{minor - 1}"]) == MINIMUM["kubectl"]


def test_the_kubectl_the_tests_run_is_at_least_the_minimum() -> None:
    """The kustomize builds in test_manifests.py run this kubectl (`./dev test` installs one when
    none is at least tools.KUBECTL_MIN, which is the minimum the docs state)."""
    assert ".".join(map(str, tools.KUBECTL_MIN)) == MINIMUM["kubectl"]
    kubectl = tools.require("kubectl")
    shown = json.loads(
        subprocess.run(
            [kubectl, "version", "--client", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    )
    assert _version(shown["clientVersion"]["gitVersion"])[:2] >= _version(MINIMUM["kubectl"])
    assert _version(shown["kustomizeVersion"]) >= _version(KUSTOMIZE_SINCE["labels"])


def _stated_table() -> dict[str, str]:
    text = COMPATIBILITY.read_text(encoding="utf-8")
    section = text.split("## Cluster", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|") for line in section.splitlines() if line.startswith("| ")]
    return {cells[1].strip(): cells[2].strip() for cells in rows[1:]}  # after the header row


def test_the_compatibility_page_states_these_minimums() -> None:
    assert _stated_table() == {name: f">= {version}" for name, version in MINIMUM.items()}


def test_the_examples_state_the_same_keda_minimum() -> None:
    for path in sorted((DEPLOY / "examples").glob("*.yaml")):
        for stated in re.findall(r"KEDA >= (\d+\.\d+)", path.read_text(encoding="utf-8")):
            assert stated == MINIMUM["KEDA"], path.name
