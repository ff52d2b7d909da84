"""Every path and module of the two packages that the docs, the manifests and the bench scripts
name exists, and the architecture page's `decide` signature is the policy's: a move or a split
that leaves prose behind fails here, not in a newcomer's search."""

from __future__ import annotations

import importlib
import inspect
import re
import tomllib
from pathlib import Path

import pytest

from gpu_queue_scaler.decision.policy import decide

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"gpu_queue_scaler(?:_bench)?(?:[/.][A-Za-z_0-9]+)+/?")
# Entry-point groups are dotted like modules but name none.
GROUPS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"])


def _texts() -> list[Path]:
    bench = ROOT / "bench"
    return sorted(
        [
            ROOT / "README.md",
            ROOT / "mkdocs.yml",
            *(ROOT / "docs").glob("*.md"),
            *(p for p in (ROOT / "deploy").rglob("*") if p.is_file()),
            *bench.glob("*.py"),
            *bench.glob("*.sh"),
            *bench.glob("*.md"),
            *(bench / "traces").rglob("*.md"),
        ]
    )


def _names() -> list[tuple[str, str]]:
    found = []
    for path in _texts():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in NAMED.finditer(line):
                found.append((f"{path.relative_to(ROOT)}:{number}", match.group(0).rstrip(".")))
    return found


def test_the_docs_name_no_module_by_its_old_flat_path() -> None:
    """The package was `scaler/` with flat modules: `scaler/engine.py`, `scaler.policy`."""
    modules = {p.stem for p in (ROOT / "gpu_queue_scaler").rglob("*.py")} | {
        p.name for p in (ROOT / "gpu_queue_scaler").rglob("*") if p.is_dir()
    }
    old = re.compile(r"(?<![\w/.-])scaler(?:/[a-z_]|\.([a-z_]+)\b)")
    stale = []
    for path in _texts():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for match in old.finditer(line):
                if match.group(1) is None or match.group(1) in modules - {"__init__"}:
                    stale.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not stale, "\n".join(stale)


def _resolves(name: str) -> bool:
    if "/" in name:
        path = ROOT / name.rstrip("/")
        return path.exists() or path.with_suffix(".py").exists()
    if name in GROUPS:
        return True
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            if not hasattr(target, attribute):
                return False
            target = getattr(target, attribute)
        return True
    return False


def test_the_docs_name_the_packages_only_by_paths_and_modules_that_exist() -> None:
    names = _names()
    assert len(names) > 50  # the pattern still finds the docs' mentions
    missing = [f"{where}: {name}" for where, name in names if not _resolves(name)]
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(
    "name", ["gpu_queue_scaler/gone.py", "gpu_queue_scaler.companion.kube.API_ACCESS"]
)
def test_a_stale_name_does_not_resolve(name: str) -> None:
    assert not _resolves(name)


def test_the_architecture_page_shows_the_policy_signature() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    shown = re.search(r"`decide\(([^`]*)\) ->", text)
    assert shown is not None
    parameters = []
    for parameter in inspect.signature(decide).parameters.values():
        default = "" if parameter.default is inspect.Parameter.empty else f"={parameter.default!r}"
        parameters.append(parameter.name + default)
    assert shown.group(1) == ", ".join(parameters)
