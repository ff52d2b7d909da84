"""Release artifacts: the LICENSE, the version, the CHANGELOG and the single install manifest.

The manifest is what `deploy/release.sh` writes: every kustomization built by `kubectl kustomize`
into one file. Its objects are validated with the schemas the manifest tests use (k8s_schema.py),
and the KEDA and monitoring namespaces are checked to be settings, not constants.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

import k8s_schema  # noqa: E402

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
        [sys.executable, "-m", "scaler", "--version"],
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
    from scaler import version as version_module

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
