"""The command line as a user meets it: exit codes that mean what they say, output into a pipe
that closes early, and no verdict printed without the data behind it."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_queue_scaler import cli
from gpu_queue_scaler_bench.load.polls import (
    VERDICT_MIN_CALLS,
    Calls,
    LoadOptions,
    ServerRun,
    assemble,
    soak_summary,
    table,
)

SCALER = [sys.executable, "-m", "gpu_queue_scaler"]


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# --- scaler signals -------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True])
def test_signals_exits_1_naming_the_cause_when_no_pod_answered(as_json: bool) -> None:
    port = _closed_port()
    done = subprocess.run(
        [
            *SCALER,
            "signals",
            *(["--json"] if as_json else []),
            "--interval",
            "0.1",
            "--metadata",
            "backend=vllm",
            "--metadata",
            f"scrapeTargets=127.0.0.1:{port}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "scaler signals: no pod answered" in done.stderr
    assert f"127.0.0.1:{port}" in done.stderr
    if as_json:  # still one JSON object on stdout, for scripts
        assert json.loads(done.stdout)["reasons"]


def test_signals_of_a_synthetic_workload_exit_0() -> None:
    done = subprocess.run(
        [*SCALER, "signals", "--json", "--metadata", "backend=synthetic"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["source"] == "synthetic"


# --- commands other packages add -----------------------------------------------------------------

PLUGIN = """
import argparse


def _hello(args: argparse.Namespace) -> int:
    print(f"hello {args.name}")
    return 7


def register(sub) -> None:
    hello = sub.add_parser("hello", help="a plugin's command")
    hello.add_argument("--name", required=True)
    hello.set_defaults(run=_hello)
"""


@pytest.fixture
def plugins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[importlib.metadata.EntryPoint]]:
    """The entry points the command line finds: a real module on the path, nothing else."""
    (tmp_path / "cli_test_plugin.py").write_text(PLUGIN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    found: list[importlib.metadata.EntryPoint] = []
    real = importlib.metadata.entry_points

    def entry_points(**selection: str) -> object:
        if selection.get("group") == cli.PLUGIN_GROUP:
            return found
        return real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    yield found
    sys.modules.pop("cli_test_plugin", None)


def _entry(name: str, value: str) -> importlib.metadata.EntryPoint:
    return importlib.metadata.EntryPoint(name=name, value=value, group=cli.PLUGIN_GROUP)


def test_a_plugins_command_is_listed_and_runs(
    plugins: list[importlib.metadata.EntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    plugins.append(_entry("hello", "cli_test_plugin:register"))
    assert "a plugin's command" in cli.parser().format_help()
    assert cli.main(["hello", "--name", "world"]) == 7
    assert capsys.readouterr().out == "hello world\n"


def test_a_plugin_whose_code_is_missing_is_named_when_asked_for(
    plugins: list[importlib.metadata.EntryPoint], capsys: pytest.CaptureFixture[str]
) -> None:
    """As in the runtime image, whose metadata may name a measuring command it does not ship: the
    other commands still work, and asking for that one says where it comes from."""
    plugins += [_entry("measure", "cli_test_absent_plugin:register")]
    plugins += [_entry("hello", "cli_test_plugin:register")]
    assert cli.parser().parse_args(["explain", "a/b"]).workload == "a/b"
    assert cli.main(["measure", "--trace", "x.csv"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "scaler: 'measure' comes with the measuring package, which is not installed here\n"
    )
    assert cli.main(["hello", "--name", "again"]) == 7  # the plugin after it still loaded
    with pytest.raises(SystemExit) as unknown:  # a name nobody declared: argparse's own error
        cli.main(["nope"])
    assert unknown.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err


# The product's commands ship in the runtime image, which leaves the measuring package out: none
# may import it, even lazily inside a handler. `demo` and `bench` live in gpu_queue_scaler_bench.cli
# and come in through the entry points (the import-linter contracts check the whole product).
MEASURING = ("gpu_queue_scaler_bench", "matplotlib", "tqdm")


def _measuring_imports(source: str) -> list[str]:
    """The measuring package and the simulator's plotting libraries, wherever `source` imports
    them."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return sorted({n for n in names for b in MEASURING if n == b or n.startswith(b + ".")})


def test_the_import_check_sees_lazy_and_from_imports() -> None:
    source = "def run():\n    from gpu_queue_scaler_bench.sim import run\n    import tqdm\n"
    assert _measuring_imports(source) == [
        "gpu_queue_scaler_bench.sim",
        "gpu_queue_scaler_bench.sim.run",
        "tqdm",
    ]
    assert _measuring_imports("from gpu_queue_scaler.cli import serve\n") == []


def test_the_products_commands_import_no_measuring_code() -> None:
    modules = {m.name: m for m in Path(cli.__file__).parent.glob("*.py")}
    assert {"serve.py", "__init__.py"} <= set(modules)
    assert not {"demo.py", "bench.py"} & set(modules)  # in the measuring package
    found = {name: _measuring_imports(m.read_text(encoding="utf-8")) for name, m in modules.items()}
    assert {name: names for name, names in found.items() if names} == {}


# --- output into a pipe whose reader went away ----------------------------------------------------


@pytest.mark.parametrize("command", [["reference"], ["--help"], ["bench", "load", "--help"]])
def test_a_closed_pipe_ends_the_command_quietly(command: list[str]) -> None:
    """As `scaler reference | head -1` once head has exited: the reader's end is closed before
    the command writes, so every write fails with EPIPE. Quiet: no traceback, exit 141 (a shell's
    code for SIGPIPE)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            [*SCALER, *command], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipeError" not in done.stderr, done.stderr
    assert done.stderr == ""
    # argparse's help output ignores a failed write itself (and exits 0).
    assert done.returncode == (0 if "--help" in command else 141)


def test_reference_into_head_prints_its_first_line_only() -> None:
    done = subprocess.run(
        f"{sys.executable} -m gpu_queue_scaler reference | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stdout.startswith("<!-- reference:begin")
    assert done.stdout.count("\n") == 1
    assert "Traceback" not in done.stderr


# --- scaler bench load: no verdict without data ---------------------------------------------------


def _run(kind: str, latency_s: float, due_s: list[float], steady_after_s: float) -> ServerRun:
    calls = Calls(
        latencies_s=[latency_s] * len(due_s),
        due_s=due_s,
        by_method={"GetMetrics": [latency_s] * len(due_s)},
        first_s=[latency_s],
        lag_s=[0.001],
    )
    return ServerRun(kind, 1, 5.0, calls, 0.1, 0.1, [(0.0, 100_000, 10)], steady_after_s)  # type: ignore[arg-type]


def test_a_run_shorter_than_steady_state_gets_no_steady_verdict() -> None:
    """`--duration 5` ends before steady state (poll + HPA interval): the steady-state figures
    are n/a, and so is their verdict (it said ABOVE 1.5x the floor)."""
    options = LoadOptions(objects=50, duration_s=5.0)
    due = [0.5, 1.0, 2.0, 4.5]  # every call before the steady state
    result = assemble(
        options,
        {"scaler": _run("scaler", 0.004, due, 46.5), "floor": _run("floor", 0.002, due, 46.5)},
        [],
    )
    lines = table(result).splitlines()
    [steady] = [line for line in lines if line.startswith("steady-state p99")]
    assert "no verdict" in steady and "46.5 s" in steady
    assert "ABOVE" not in steady and "within" not in steady
    [whole] = [line for line in lines if line.startswith("p99 ")]
    assert whole.startswith("p99 n/a: no verdict (4 calls on a server")  # a p99 of 4 calls


def test_a_whole_run_of_enough_calls_gets_a_verdict() -> None:
    options = LoadOptions(objects=50, duration_s=5.0)
    due = [i * 0.04 for i in range(VERDICT_MIN_CALLS)]  # every call before the steady state
    result = assemble(
        options,
        {"scaler": _run("scaler", 0.004, due, 46.5), "floor": _run("floor", 0.002, due, 46.5)},
        [],
    )
    [whole] = [line for line in table(result).splitlines() if line.startswith("p99 ")]
    assert whole == "p99 ABOVE 1.5x the floor (goal)"  # 2x, from calls that exist


def test_steady_state_calls_get_a_verdict() -> None:
    options = LoadOptions(objects=50, duration_s=60.0)
    due = [1.0] + [50.0 + i * 0.05 for i in range(VERDICT_MIN_CALLS)]
    result = assemble(
        options,
        {"scaler": _run("scaler", 0.0025, due, 46.5), "floor": _run("floor", 0.002, due, 46.5)},
        [],
    )
    assert "steady-state p99 within 1.5x the floor (goal)" in table(result).splitlines()


def test_a_soak_without_a_sample_after_the_warm_up_gets_no_verdict() -> None:
    run = _run("scaler", 0.002, [1.0], 46.5)
    run.samples = [(0.0, 100_000, 10), (10.0, 120_000, 10)]
    assert soak_summary(run, warmup_s=60.0)["rss_growth_pct"] is None
    run.samples.append((70.0, 121_200, 10))
    assert soak_summary(run, warmup_s=60.0)["rss_growth_pct"] == 0.0  # its first sample after
