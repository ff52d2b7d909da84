"""Release artifacts: the LICENSE, the version, the CHANGELOG and the single install manifest.

The manifest is what `deploy/release.sh` writes: every kustomization built by `kubectl kustomize`
into one file. Its objects are validated with the schemas the manifest tests use (k8s_schema.py),
and the KEDA and monitoring namespaces are checked to be settings, not constants.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import k8s_schema
from tests.tools import kustomize, require

ROOT = k8s_schema.REPO_ROOT
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = PYPROJECT["project"]["version"]


def test_license_is_the_apache_license_pyproject_names() -> None:
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert text == Path("/usr/share/common-licenses/Apache-2.0").read_text(encoding="utf-8")


def test_scaler_version_prints_the_package_metadata_version() -> None:
    assert metadata.version("gpu-queue-scaler") == VERSION  # the venv's install is this tree
    done = subprocess.run(
        [sys.executable, "-m", "gpu_queue_scaler", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"scaler {VERSION}"


def test_version_falls_back_when_the_package_is_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu_queue_scaler import version as version_module

    monkeypatch.setattr(version_module, "DISTRIBUTION", "gpu-queue-scaler-not-installed")
    assert version_module.version() == "0+unknown"


def test_changelog_keeps_a_changelog_with_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert text.startswith("# Changelog\n")
    assert "keepachangelog.com" in text
    sections = re.findall(r"^## \[([^\]]+)\]", text, flags=re.MULTILINE)
    assert sections and sections[0] == "Unreleased"
    allowed = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    kinds = re.findall(r"^### (.+)$", text, flags=re.MULTILINE)
    assert kinds and set(kinds) <= allowed, kinds
    for released in sections[1:]:  # "x.y.z - YYYY-MM-DD"
        assert re.fullmatch(r"\d+\.\d+\.\d+ - \d{4}-\d{2}-\d{2}", released), released


# --- the install manifest -------------------------------------------------------------------------

RELEASE_SH = ROOT / "deploy" / "release.sh"
NAMESPACES = {"keda": "keda", "monitoring": "monitoring"}
# What deploy/release puts together: every object of these kustomizations, once.
PARTS = ("cert-manager", "companion", "monitoring")


def _release(
    tmp_path: Path, *, keda: str | None = None, monitoring: str | None = None
) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / f"release-{keda}-{monitoring}.yaml"
    env = {**os.environ, "OUT": str(out), "KUBECTL": require("kubectl")}
    for name, value in (("KEDA_NAMESPACE", keda), ("MONITORING_NAMESPACE", monitoring)):
        if value is not None:
            env[name] = value
        else:
            env.pop(name, None)
    done = subprocess.run(
        ["bash", str(RELEASE_SH)], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    return done, out


def _objects(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")) if doc]


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str | None]:
    meta = obj["metadata"]
    return (obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    done, out = _release(tmp_path_factory.mktemp("release"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out)
    text = out.read_text(encoding="utf-8")
    assert text.startswith(f"# gpu-queue-scaler {VERSION}: kubectl apply -f ")
    return _objects(out)


def test_release_holds_every_object_of_the_kustomizations_once(
    release: list[dict[str, Any]],
) -> None:
    keys = [_key(obj) for obj in release]
    assert len(keys) == len(set(keys)), "an object twice in the release"
    parts = {_key(obj) for part in PARTS for obj in kustomize(ROOT / "deploy" / part)}
    assert set(keys) == parts
    # The settings ConfigMap is local-config: read by the replacements, never applied.
    assert not [k for k in keys if k[2] == "gpu-queue-scaler-namespaces"]
    assert ("v1", "Namespace", "gpu-queue-scaler", None) in set(keys)


def test_every_release_object_validates_against_its_schema(release: list[dict[str, Any]]) -> None:
    from tests.surface import test_manifests  # the module (its cert-manager checker), not its tests

    checked = {"crd": 0, "core": 0, "cert-manager": 0}
    for obj in release:
        if test_manifests._is_cert_manager(obj):
            assert test_manifests.cert_manager_problems(obj) == [], _key(obj)
            checked["cert-manager"] += 1
        elif k8s_schema.has_crd(*_group_kind(obj)):
            k8s_schema.validate_custom_resource(obj)
            checked["crd"] += 1
        else:
            for version in test_manifests.K8S_VERSIONS:
                k8s_schema.validate_core(obj, version)
            checked["core"] += 1
    assert all(checked.values()), checked


def _group_kind(obj: dict[str, Any]) -> tuple[str, str]:
    return k8s_schema.split_api_version(obj["apiVersion"])[0], obj["kind"]


def test_release_images_run_the_released_version(release: list[dict[str, Any]]) -> None:
    images = {
        container["image"]
        for obj in release
        if obj["kind"] == "Deployment"
        for container in obj["spec"]["template"]["spec"]["containers"]
    }
    assert images == {f"ghcr.io/gpu-queue-scaler/gpu-queue-scaler:{VERSION}"}


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> dict[tuple[Any, ...], Any]:
    if isinstance(node, dict):
        return {k: v for key, sub in node.items() for k, v in _leaves(sub, (*path, key)).items()}
    if isinstance(node, list):
        return {k: v for i, sub in enumerate(node) for k, v in _leaves(sub, (*path, i)).items()}
    return {path: node}


def _namespace_places(objects: list[dict[str, Any]], value: str) -> set[tuple[Any, ...]]:
    """Where `value` names a namespace: a metadata.namespace or a namespace selector's
    kubernetes.io/metadata.name."""
    return {
        (_key(obj)[:3], path)
        for obj in objects
        for path, leaf in _leaves(obj).items()
        if leaf == value
        and (path == ("metadata", "namespace") or path[-1] == "kubernetes.io/metadata.name")
    }


def test_changed_keda_and_monitoring_namespaces_reach_every_place(
    release: list[dict[str, Any]], tmp_path: Path
) -> None:
    done, out = _release(tmp_path, keda="keda-system", monitoring="observability")
    assert done.returncode == 0, done.stderr
    changed = _objects(out)
    by_name = {_key(obj)[:3]: obj for obj in changed}
    # Every place naming `keda` or `monitoring` as a namespace now names the new one ...
    for old, new in (("keda", "keda-system"), ("monitoring", "observability")):
        places = _namespace_places(release, old)
        assert places, f"no place names {old!r} in the default release"
        assert _namespace_places(changed, old) == set()
        assert _namespace_places(changed, new) == places
    # ... the places are the NetworkPolicy's two peers and KEDA's client Certificate ...
    moved = _namespace_places(release, "keda") | _namespace_places(release, "monitoring")
    assert {key[1] for key, _ in moved} == {"NetworkPolicy", "Certificate"}
    # ... and nothing else differs (the key of a moved object aside).
    assert len(changed) == len(release)
    for obj in release:
        other = by_name[_key(obj)[:3]]
        differ = {
            path
            for path in _leaves(obj).keys() | _leaves(other).keys()
            if _leaves(obj).get(path) != _leaves(other).get(path)
        }
        for path in differ:
            assert (_key(obj)[:3], path) in moved, (_key(obj), path)


def test_release_refuses_a_namespace_that_is_not_a_dns_label(tmp_path: Path) -> None:
    done, out = _release(tmp_path, keda="KEDA_system")
    assert done.returncode == 2
    assert "KEDA_NAMESPACE" in done.stderr and "DNS label" in done.stderr
    assert not out.exists()


def test_the_default_namespaces_are_the_ones_deploy_names() -> None:
    settings = dict(
        line.split("=", 1)
        for line in (ROOT / "deploy" / "release" / "namespaces.env").read_text().splitlines()
        if line.strip()
    )
    assert settings == NAMESPACES
