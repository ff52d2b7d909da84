"""The tuning ConfigMap: loading, every problem by path, `scaler check-config`, and resolve()."""

from __future__ import annotations

import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_queue_scaler.settings.config import (
    MAX_CONFIG_BYTES,
    MAX_NODES,
    MAX_PATH_CHARS,
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS,
    MAX_UNKNOWN_KEYS,
    SECTIONS,
    Config,
    ConfigError,
    ServerSettings,
    load_config_file,
    load_config_text,
)
from gpu_queue_scaler.settings.fields import BY_KEY, FIELDS, SERVER_KEYS, TUNING_KEYS, Field, Range
from gpu_queue_scaler.settings.spec import ResolveError, WorkloadSpec, resolve
from gpu_queue_scaler.settings.trigger import parse_trigger

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGMAP = REPO_ROOT / "deploy" / "base" / "configmap.yaml"


def problems(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config_text(text, "cm.yaml")
    assert info.value.source == "cm.yaml"
    return info.value


def paths(error: ConfigError | ResolveError) -> list[str]:
    return [p.path for p in error.problems]


# --- loading ------------------------------------------------------------------------------


def test_deployed_configmap_example_loads() -> None:
    manifest = yaml.safe_load(CONFIGMAP.read_text())
    config = load_config_text(manifest["data"]["config.yaml"], "configmap")
    assert set(config.profiles) == {"llama-3-8b", "resnet50", "sglang", "trtllm"}
    assert "sglang:num_queue_reqs" in config.profiles["sglang"]["waitingQuery"]
    assert config.profiles["llama-3-8b"]["targetConcurrency"] == 16.0
    assert config.defaults["targetConcurrency"] == 8.0
    assert config.defaults["minReplicas"] == 0
    assert config.server.stale_target_s == 600.0
    assert config.server.evaluation_interval_s == 1.0


def test_full_config_loads_into_typed_values() -> None:
    text = """
defaults:
  targetConcurrency: 4
  minReplicas: 1
  maxReplicas: 40
  serverAddress: http://prometheus.monitoring:9090/
profiles:
  llama-3-8b:
    targetConcurrency: 16.5
    coldStartSeconds: "240"
  small: {}
server:
  evaluationIntervalSeconds: 2.5
  staleTargetSeconds: 120
"""
    config = load_config_text(text, "cm.yaml")
    assert dict(config.defaults) == {
        "targetConcurrency": 4.0,
        "minReplicas": 1,
        "maxReplicas": 40,
        "serverAddress": "http://prometheus.monitoring:9090",
    }
    assert type(config.defaults["minReplicas"]) is int
    assert type(config.defaults["targetConcurrency"]) is float
    assert {k: dict(v) for k, v in config.profiles.items()} == {
        "llama-3-8b": {"targetConcurrency": 16.5, "coldStartSeconds": 240.0},
        "small": {},
    }
    assert config.server == ServerSettings(
        evaluation_interval_s=2.5,
        workload_idle_timeout_s=900.0,
        stale_target_s=120.0,
        first_decision_timeout_s=2.0,
    )
    assert config.source == "cm.yaml"
    assert len(config.digest) == 64
    assert load_config_text(text + "\n", "cm.yaml").digest != config.digest


@pytest.mark.parametrize("text", ["", "\n", "# only a comment\n", "---\n", "defaults:\n"])
def test_empty_config_is_all_built_in_defaults(text: str) -> None:
    config = load_config_text(text)
    assert dict(config.defaults) == {}
    assert dict(config.profiles) == {}
    assert config.server == ServerSettings()
    assert config.server == ServerSettings(
        evaluation_interval_s=5.0,
        workload_idle_timeout_s=900.0,
        stale_target_s=600.0,
        first_decision_timeout_s=2.0,
    )


def test_load_config_file_reads_and_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("defaults:\n  targetConcurrency: 3\n")
    config = load_config_file(path)
    assert config.defaults["targetConcurrency"] == 3.0
    assert config.source == str(path)


def test_load_config_file_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_config_file(path)
    assert info.value.source == str(path)
    assert paths(info.value) == ["<file>"]
    assert "cannot read" in info.value.problems[0].message
    assert str(info.value).startswith(f"{path}: <file>: cannot read")


# --- every problem, with its path -------------------------------------------------------------

PROBLEMS = [
    pytest.param(
        "extras:\n  a: 1\n",
        "extras",
        ["unknown section; accepted: defaults, profiles, server"],
        id="unknown-section",
    ),
    pytest.param(
        "defaults:\n  colour: blue\n",
        "defaults.colour",
        ["unknown key; accepted keys: see `scaler reference`"],
        id="defaults-unknown-key",
    ),
    pytest.param(
        "defaults:\n  targetconcurrency: 8\n",
        "defaults.targetconcurrency",
        ["did you mean 'targetConcurrency'?"],
        id="defaults-did-you-mean",
    ),
    pytest.param(
        "defaults:\n  evaluationIntervalSeconds: 5\n",
        "defaults.evaluationIntervalSeconds",
        ["unknown key; evaluationIntervalSeconds belongs in the `server:` section"],
        id="server-key-in-defaults",
    ),
    pytest.param(
        "defaults:\n  backend: vllm\n",
        "defaults.backend",
        ["unknown key; backend belongs in the ScaledObject's trigger metadata"],
        id="trigger-only-key-in-defaults",
    ),
    pytest.param(
        "profiles:\n  p:\n    colour: blue\n",
        "profiles.p.colour",
        ["unknown key; accepted keys: see `scaler reference`"],
        id="profile-unknown-key",
    ),
    pytest.param(
        "server:\n  targetConcurrency: 8\n",
        "server.targetConcurrency",
        ["unknown key; targetConcurrency belongs in `defaults:` or a profile"],
        id="tuning-key-in-server",
    ),
    pytest.param(
        "server:\n  colour: blue\n",
        "server.colour",
        [
            "unknown key; accepted keys: evaluationIntervalSeconds, workloadIdleTimeoutSeconds, "
            "staleTargetSeconds, firstDecisionTimeoutSeconds"
        ],
        id="server-unknown-key",
    ),
    pytest.param(
        "defaults:\n  targetConcurrency: abc\n",
        "defaults.targetConcurrency",
        ["got 'abc'; accepted: a number > 0 and <= 100000"],
        id="string-for-number",
    ),
    pytest.param(
        "defaults:\n  targetConcurrency: true\n",
        "defaults.targetConcurrency",
        ["got True; accepted: a number > 0 and <= 100000"],
        id="bool-for-number",
    ),
    pytest.param(
        "defaults:\n  minReplicas: [1]\n",
        "defaults.minReplicas",
        ["got [1]; accepted: an integer from 0 to 10000"],
        id="list-for-number",
    ),
    pytest.param(
        "defaults:\n  maxReplicas: 2.5\n",
        "defaults.maxReplicas",
        ["got 2.5; accepted: an integer from 1 to 10000"],
        id="fraction-for-integer",
    ),
    pytest.param(
        "defaults:\n  coldStartSeconds: .nan\n",
        "defaults.coldStartSeconds",
        ["got nan; accepted: a number of seconds from 0 to 3600"],
        id="nan",
    ),
    pytest.param(
        "profiles:\n  p:\n    serverAddress: ftp://prom\n",
        "profiles.p.serverAddress",
        ["got 'ftp://prom'; accepted: an http(s):// base URL"],
        id="profile-bad-url",
    ),
    pytest.param(
        "profiles:\n  p: 3\n", "profiles.p", ["must be a mapping of tuning keys"], id="profile-int"
    ),
    pytest.param(
        "profiles:\n  p: [a]\n",
        "profiles.p",
        ["must be a mapping of tuning keys"],
        id="profile-list",
    ),
    pytest.param(
        "profiles:\n  Llama:\n    targetConcurrency: 4\n",
        "profiles.Llama",
        ["profile names are lowercase letters, digits, '.', '_', '-'"],
        id="profile-name-uppercase",
    ),
    pytest.param(
        "profiles:\n  " + "a" * 64 + ": {}\n",
        "profiles." + "a" * 64,
        ["profile names are lowercase"],
        id="profile-name-too-long",
    ),
    pytest.param(
        "defaults:\n  minReplicas: 5\nprofiles:\n  p:\n    maxReplicas: 3\n",
        "profiles.p.minReplicas",
        ["minReplicas (5) must not exceed maxReplicas (3)"],
        id="profile-min-above-max-after-merge",
    ),
    pytest.param(
        "defaults:\n  minReplicas: 5\n  maxReplicas: 3\n",
        "defaults.minReplicas",
        ["minReplicas (5) must not exceed maxReplicas (3)"],
        id="defaults-min-above-max",
    ),
    pytest.param("defaults: 3\n", "defaults", ["must be a mapping, got int"], id="defaults-int"),
    pytest.param(
        "profiles: [a]\n", "profiles", ["must be a mapping, got list"], id="profiles-list"
    ),
    pytest.param("server: on\n", "server", ["must be a mapping, got bool"], id="server-bool"),
    pytest.param("- a\n- b\n", "<root>", ["must be a mapping, got list"], id="root-list"),
    pytest.param("just text\n", "<root>", ["must be a mapping, got str"], id="root-str"),
    pytest.param(
        "defaults:\n  targetConcurrency: [1, 2\n",
        "line 3, column 1",
        ["not valid YAML: expected ',' or ']'"],
        id="invalid-yaml-flow",
    ),
    pytest.param(
        "defaults:\n  a: 1\n b: 2\n",
        "line 3, column 2",
        ["not valid YAML"],
        id="invalid-yaml-indent",
    ),
    pytest.param(
        "defaults:\n\ttargetConcurrency: 1\n",
        "line 2, column 1",
        ["not valid YAML", "'\\t'"],
        id="invalid-yaml-tab",
    ),
    pytest.param(
        "defaults:\n  targetConcurrency: 8\n  maxReplicas: 9\n  targetConcurrency: 9\n",
        "line 4, column 3",
        ["duplicate key 'targetConcurrency' (line 4)"],
        id="duplicate-key",
    ),
    pytest.param(
        "defaults: {}\nserver: {}\ndefaults: {}\n",
        "line 3, column 1",
        ["duplicate key 'defaults' (line 3)"],
        id="duplicate-section",
    ),
]


@pytest.mark.parametrize(("text", "path", "fragments"), PROBLEMS)
def test_each_problem_is_reported_with_its_path(text: str, path: str, fragments: list[str]) -> None:
    error = problems(text)
    assert paths(error) == [path], str(error)
    for fragment in fragments:
        assert fragment in error.problems[0].message, str(error)
    assert str(error).startswith(f"cm.yaml: {path}: ")


def test_several_problems_in_one_file_are_all_reported() -> None:
    text = """
extras: 1
defaults:
  targetConcurrency: abc
  colour: red
profiles:
  Bad: {}
  ok:
    maxReplicas: 0
  notmap: 7
server:
  evaluationIntervalSeconds: 0
  foo: 1
"""
    error = problems(text)
    assert sorted(paths(error)) == sorted(
        [
            "extras",
            "defaults.targetConcurrency",
            "defaults.colour",
            "profiles.Bad",
            "profiles.ok.maxReplicas",
            "profiles.notmap",
            "server.evaluationIntervalSeconds",
            "server.foo",
        ]
    )
    for path in paths(error):
        assert f"{path}: " in str(error)


# --- numeric keys, discovered from the registry -----------------------------------------------


def numeric_bounds(field: Field) -> tuple[float, float, bool] | None:
    if not isinstance(field.parse, Range):
        return None
    r = field.parse
    return r.lo, r.hi, r.lo_open


NUMERIC = {f.key: b for f in FIELDS if (b := numeric_bounds(f)) is not None}
SECTION_NUMERIC = [
    pytest.param(section, key, id=f"{section}.{key}")
    for section, keys in (("defaults", TUNING_KEYS), ("server", SERVER_KEYS))
    for key in keys
    if key in NUMERIC
]


def test_numeric_discovery_covers_tuning_and_server_keys() -> None:
    assert len(SECTION_NUMERIC) >= 12
    assert set(SERVER_KEYS) <= set(NUMERIC)


@pytest.mark.parametrize(("section", "key"), SECTION_NUMERIC)
def test_numeric_keys_out_of_range_are_reported_per_section(section: str, key: str) -> None:
    lo, hi, lo_open = NUMERIC[key]
    below = lo if lo_open else lo - 1
    above = hi * 2 + 1
    text = f"{section}:\n  {key}: {below!r}\n"
    error = problems(text)
    assert paths(error) == [f"{section}.{key}"]
    assert f"accepted: {BY_KEY[key].accepted}" in error.problems[0].message
    error = problems(f"{section}:\n  {key}: {above!r}\n")
    assert paths(error) == [f"{section}.{key}"]
    if section == "defaults":
        error = problems(f"profiles:\n  p:\n    {key}: {below!r}\n")
        assert paths(error) == [f"profiles.p.{key}"]


def test_huge_integer_is_a_config_error() -> None:
    # float(10**400) raises OverflowError, which Field.value does not turn into a FieldError.
    error = problems("defaults:\n  targetConcurrency: 1" + "0" * 400 + "\n")
    assert paths(error) == ["defaults.targetConcurrency"]


def test_unhashable_mapping_key_is_a_config_error() -> None:
    # The duplicate-key check puts every key in a set; a YAML sequence key is unhashable.
    error = problems("defaults:\n  ? [a, b]\n  : 1\n")
    assert len(error.problems) == 1


def test_invalid_timestamp_scalar_is_a_config_error() -> None:
    # PyYAML resolves 2024-13-01 as a timestamp and raises a plain ValueError constructing it.
    error = problems("defaults:\n  coldStartSeconds: 2024-13-01\n")
    assert len(error.problems) == 1


def test_deeply_nested_yaml_is_a_config_error() -> None:
    error = problems("[" * 3000)
    assert len(error.problems) == 1


# --- hostile files: every answer bounded -----------------------------------------------------


def laughs(levels: int, width: int = 9) -> str:
    """A billion-laughs file: each level a list of `width` aliases to the level below, the last
    one a tuning value: width**levels strings once its aliases are expanded, in a few hundred
    bytes."""
    lines = ['l0: &l0 ["lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{', '.join([f'*l{level - 1}'] * width)}]")
    return "\n".join([*lines, f"defaults:\n  targetConcurrency: *l{levels}\n"])


def peak_bytes(run: Callable[[], object]) -> int:
    """The most memory Python held while `run` ran (its result dropped)."""
    tracemalloc.start()
    try:
        run()
    except ConfigError:
        pass
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("levels", [5, 9])
def test_alias_expansion_is_stopped_while_composing(levels: int) -> None:
    """9**5 = 59,049 strings (the smaller bomb, cheap enough to build, prints 413 KB when it is
    echoed whole); 9**9 = 387 million (it ran out of memory): both stop at MAX_NODES with a
    short error, in little memory."""
    text = laughs(levels)
    error = problems(text)
    assert len(text) < 600 and paths(error)[0].startswith("line ")
    assert error.problems[0].message == (
        f"not accepted: more than {MAX_NODES} nodes with its aliases expanded; "
        "a tuning ConfigMap needs a few hundred"
    )
    assert peak_bytes(lambda: load_config_text(text)) < 2_000_000


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    error = problems("defaults:\n  targetConcurrency: &me [1, *me]\n")
    assert error.problems[0].message == "not accepted: alias *me inside its own anchor"


def test_merge_keys_are_yaml_and_accepted() -> None:
    config = load_config_text(
        """
defaults: &shared
  targetConcurrency: 4
  maxReplicas: 20
profiles:
  one:
    <<: *shared
    targetConcurrency: 8
  cold: &cold {coldStartSeconds: 30}
  two:
    <<: [*cold, *shared]
""",
        "cm.yaml",
    )
    assert config.profiles["one"] == {"targetConcurrency": 8.0, "maxReplicas": 20}
    assert config.profiles["two"] == {
        "coldStartSeconds": 30.0,
        "targetConcurrency": 4.0,
        "maxReplicas": 20,
    }


def test_two_merge_keys_in_one_mapping_are_a_duplicate() -> None:
    error = problems("defaults: &d {maxReplicas: 3}\nprofiles:\n  p:\n    <<: *d\n    <<: *d\n")
    assert "duplicate key '<<' (line 5)" in str(error)


def test_a_file_over_a_configmaps_1_mib_is_refused_unread(tmp_path: Path) -> None:
    """Kubernetes keeps a ConfigMap within 1 MiB; a longer file (here a sparse 1 GiB one) is
    refused after reading at most 1 MiB of it."""
    error = problems("#" * MAX_CONFIG_BYTES + "\n")
    assert paths(error) == ["<file>"] and "at most 1048576 bytes (1 MiB)" in str(error)
    load_config_text("#" * (MAX_CONFIG_BYTES - 1) + "\n")  # the limit itself is fine
    huge = tmp_path / "huge.yaml"
    with huge.open("wb") as file:
        file.truncate(1 << 30)
    with pytest.raises(ConfigError) as info:
        load_config_file(huge)
    assert info.value.problems[0].message.startswith("1073741824 bytes; a ConfigMap holds")
    assert peak_bytes(lambda: load_config_file(huge)) < 4 * MAX_CONFIG_BYTES


def test_unknown_keys_are_reported_up_to_a_bound_and_counted() -> None:
    text = "defaults:\n" + "".join(f"  colour{i}: {i}\n" for i in range(300))
    error = problems(text)
    assert paths(error) == [f"defaults.colour{i}" for i in range(MAX_UNKNOWN_KEYS)] + ["defaults"]
    assert error.problems[-1].message == f"... and {300 - MAX_UNKNOWN_KEYS} more unknown keys"


def test_problems_are_reported_up_to_a_bound_and_counted() -> None:
    text = "profiles:\n" + "".join(f"  p{i}: {{minReplicas: x}}\n" for i in range(200))
    error = problems(text)
    assert len(error.problems) == MAX_PROBLEMS + 1
    assert str(error.problems[-1]) == f"<root>: ... and {200 - MAX_PROBLEMS} more problems"


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("defaults:\n  " + "k" * 1000 + ": 1\n", id="long-key"),
        pytest.param("profiles:\n  " + "P" * 1000 + ": {}\n", id="long-profile-name"),
        pytest.param("x" * 1000 + ": 1\n", id="long-section"),
        pytest.param(
            "defaults:\n  targetConcurrency: [" + ", ".join(["1"] * 5000) + "]\n", id="long-list"
        ),
        pytest.param(
            "defaults:\n  ? [" + ", ".join(["long"] * 5000) + "]\n  : 1\n", id="list-as-key"
        ),
        pytest.param(
            "defaults:\n  " + '"' + "k" * 100_000 + '": 1\n  "' + "k" * 100_000 + '": 2\n',
            id="long-duplicate-key",
        ),
    ],
)
def test_what_an_error_echoes_of_the_file_is_cut(text: str) -> None:
    error = problems(text)
    for problem in error.problems:
        assert len(problem.path) <= MAX_PATH_CHARS and len(problem.message) <= MAX_PROBLEM_CHARS
    assert len(str(error)) < 2 * MAX_PROBLEM_CHARS


def test_a_misspelt_key_names_the_nearest_key_only() -> None:
    error = problems("defaults:\n  targetConcurency: 4\n  scaleDownMaxPercnt: 5\n")
    assert [p.message for p in error.problems] == [
        "unknown key; did you mean 'targetConcurrency'?",
        "unknown key; did you mean 'scaleDownMaxPercent'?",
    ]


# --- scaler check-config ----------------------------------------------------------------------


def check_config(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_queue_scaler", "check-config", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )


GOOD = "defaults:\n  targetConcurrency: 4\nprofiles:\n  a: {}\n  b: {maxReplicas: 3}\n"
BAD = "defaults:\n  colour: red\n  targetConcurrency: 0\nprofiles:\n  p:\n    minReplicas: x\n"
BAD_PATHS = ["defaults.colour", "defaults.targetConcurrency", "profiles.p.minReplicas"]


@pytest.mark.slow
def test_check_config_good_file(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    result = check_config(good)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"{good}: ok (2 profiles)"]


@pytest.mark.slow
def test_check_config_bad_file_prints_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD)
    result = check_config(bad)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == len(BAD_PATHS)
    for line, path in zip(lines, BAD_PATHS, strict=True):
        assert line.startswith(f"{bad}: {path}: "), line
    assert "did you mean" not in lines[0]
    assert "accepted: a number > 0 and <= 100000" in lines[1]


@pytest.mark.slow
def test_check_config_answers_a_hostile_file_in_a_few_lines(tmp_path: Path) -> None:
    """A 537-byte billion-laughs file and 5.9 MB of unknown keys: each one short line and exit 2,
    files not read whole or not loaded as YAML (the bomb took 45 s, printed 226 MB and died with
    MemoryError)."""
    bomb, heap = tmp_path / "bomb.yaml", tmp_path / "heap.yaml"
    bomb.write_text(laughs(9))
    heap.write_text("defaults:\n" + "".join(f"  colour{i:07d}: {i}\n" for i in range(250_000)))
    result = check_config(bomb, heap)
    assert result.returncode == 2, result.stderr
    assert result.stdout.splitlines() == [
        f"{bomb}: line 5, column 35: not accepted: more than {MAX_NODES} nodes with its aliases "
        "expanded; a tuning ConfigMap needs a few hundred",
        f"{heap}: <file>: 5888900 bytes; a ConfigMap holds at most 1048576 bytes (1 MiB)",
    ]


@pytest.mark.slow
def test_check_config_exits_2_on_a_file_that_is_not_yaml_and_1_on_a_bad_value(
    tmp_path: Path,
) -> None:
    """The exit codes `scaler check` uses: a CI job can tell a broken file from a bad setting."""
    broken, bad = tmp_path / "broken.yaml", tmp_path / "bad.yaml"
    broken.write_text("defaults: [targetConcurrency: 4\n")
    bad.write_text(BAD)
    result = check_config(broken)
    assert result.returncode == 2, result.stdout
    assert result.stdout.startswith(f"{broken}: line ")
    assert "not valid YAML" in result.stdout
    assert check_config(bad).returncode == 1


@pytest.mark.slow
def test_check_config_mixed_files_fail_and_report_both(tmp_path: Path) -> None:
    good, bad, missing = tmp_path / "good.yaml", tmp_path / "bad.yaml", tmp_path / "missing.yaml"
    good.write_text(GOOD)
    bad.write_text(BAD)
    result = check_config(bad, good, missing)
    assert result.returncode == 2  # a file it cannot read outranks one with problems, as in check
    lines = result.stdout.splitlines()
    assert f"{good}: ok (2 profiles)" in lines
    assert [line for line in lines if line.startswith(f"{bad}: ")] == lines[: len(BAD_PATHS)]
    assert len(lines) == len(BAD_PATHS) + 2
    assert lines[-1].startswith(f"{missing}: <file>: cannot read")


# --- resolve ------------------------------------------------------------------------------------


def spec_for(config: Config, **metadata: str) -> WorkloadSpec:
    trigger = parse_trigger("team-a", "llama", {"backend": "synthetic", **metadata})
    return resolve(trigger, config)


LAYERED = load_config_text(
    """
defaults:
  targetConcurrency: 4
  maxReplicas: 50
profiles:
  p:
    targetConcurrency: 2
    maxReplicas: 20
  empty: {}
"""
)


@pytest.mark.parametrize(
    ("config", "metadata", "target", "max_replicas"),
    [
        pytest.param(Config(), {}, 8.0, 100, id="built-in"),
        pytest.param(LAYERED, {}, 4.0, 50, id="defaults-over-built-in"),
        pytest.param(LAYERED, {"profile": "empty"}, 4.0, 50, id="empty-profile-keeps-defaults"),
        pytest.param(LAYERED, {"profile": "p"}, 2.0, 20, id="profile-over-defaults"),
        pytest.param(
            LAYERED,
            {"profile": "p", "targetConcurrency": "1", "maxReplicas": "10"},
            1.0,
            10,
            id="trigger-over-profile",
        ),
        pytest.param(
            LAYERED,
            {"targetConcurrency": "3", "maxReplicas": "60"},
            3.0,
            60,
            id="trigger-over-defaults",
        ),
    ],
)
def test_resolve_precedence(
    config: Config, metadata: dict[str, str], target: float, max_replicas: int
) -> None:
    spec = spec_for(config, **metadata)
    assert spec.target_concurrency == target
    assert spec.max_replicas == max_replicas
    assert spec.min_replicas == 0
    assert spec.config_digest == config.digest


def test_resolve_built_in_values() -> None:
    spec = spec_for(Config())
    assert (
        spec.cold_start_s,
        spec.polling_interval_s,
        spec.horizon_s,
        spec.scale_down_stabilization_s,
        spec.scale_to_zero_idle_s,
        spec.server_address,
    ) == (180.0, 30.0, 210.0, 300.0, 300.0, None)
    assert spec.workload == "team-a/llama"


def test_horizon_defaults_to_cold_start_plus_polling_interval() -> None:
    spec = spec_for(Config(), coldStartSeconds="100", pollingIntervalSeconds="20")
    assert spec.horizon_s == 120.0
    config = load_config_text("defaults:\n  coldStartSeconds: 50\n")
    assert spec_for(config, pollingIntervalSeconds="7").horizon_s == 57.0
    explicit = spec_for(Config(), coldStartSeconds="100", horizonSeconds="60")
    assert explicit.horizon_s == 60.0


def test_unknown_profile_names_profile_and_lists_known_ones() -> None:
    config = load_config_text("profiles:\n  beta: {}\n  alpha: {}\n", "cm.yaml")
    with pytest.raises(ResolveError) as info:
        spec_for(config, profile="gamma")
    assert paths(info.value) == ["profile"]
    assert info.value.problems[0].message == (
        "'gamma' is not a profile in cm.yaml; known: alpha, beta"
    )
    with pytest.raises(ResolveError) as none_defined:
        spec_for(Config(), profile="gamma")
    assert "known: none defined" in str(none_defined.value)


@pytest.mark.parametrize("backend", ["vllm", "triton"])
def test_non_synthetic_backend_needs_server_address(backend: str) -> None:
    trigger = parse_trigger("team-a", "llama", {"backend": backend})
    with pytest.raises(ResolveError) as info:
        resolve(trigger, Config())
    assert paths(info.value) == ["serverAddress"]
    assert f"backend {backend} needs serverAddress" in str(info.value)
    assert "scrapeTargets" in str(info.value)


def test_custom_backend_needs_prometheus_and_a_query() -> None:
    trigger = parse_trigger("team-a", "sglang", {"backend": "custom"})
    with pytest.raises(ResolveError) as info:
        resolve(trigger, Config())
    assert paths(info.value) == ["waitingQuery", "serverAddress"]
    assert "backend custom needs serverAddress" in str(info.value)
    assert "scrapeTargets" not in str(info.value)  # custom PromQL cannot be scraped directly
    scraped = parse_trigger(
        "team-a",
        "sglang",
        {"backend": "custom", "signalSource": "scrape", "waitingQuery": "sum(q{$selector})"},
    )
    with pytest.raises(ResolveError) as info:
        resolve(scraped, Config())
    assert "signalSource" in paths(info.value)


def test_server_address_from_profile_defaults_or_scrape_targets_satisfies_it() -> None:
    config = load_config_text(
        "profiles:\n  p:\n    serverAddress: http://prom.monitoring:9090\n  q: {}\n"
    )
    by_profile = resolve(parse_trigger("ns", "n", {"backend": "vllm", "profile": "p"}), config)
    assert by_profile.server_address == "http://prom.monitoring:9090"
    with pytest.raises(ResolveError):
        resolve(parse_trigger("ns", "n", {"backend": "vllm", "profile": "q"}), config)
    defaults = load_config_text("defaults:\n  serverAddress: https://prom:443\n")
    assert resolve(parse_trigger("ns", "n", {"backend": "vllm"}), defaults).server_address == (
        "https://prom:443"
    )
    scraped = resolve(
        parse_trigger("ns", "n", {"backend": "vllm", "scrapeTargets": "10.0.0.1:8000"}), Config()
    )
    assert scraped.server_address is None


def test_min_above_max_only_after_merging_is_a_resolve_error() -> None:
    config = load_config_text("defaults:\n  maxReplicas: 3\n")
    with pytest.raises(ResolveError) as info:
        spec_for(config, minReplicas="5")
    assert paths(info.value) == ["minReplicas"]
    assert "minReplicas (5) must not exceed maxReplicas (3)" in str(info.value)
    big_min = load_config_text("profiles:\n  p:\n    minReplicas: 200\n")
    with pytest.raises(ResolveError) as built_in:
        spec_for(big_min, profile="p")
    assert "minReplicas (200) must not exceed maxReplicas (100)" in str(built_in.value)
    assert spec_for(big_min, profile="p", maxReplicas="200").min_replicas == 200


# --- fuzz -------------------------------------------------------------------------------------

KEYS = st.one_of(
    st.sampled_from((*SECTIONS, *TUNING_KEYS, *SERVER_KEYS, "p", "Bad", "", 1, True)),
    st.text(max_size=8),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=8),
    st.sampled_from(("http://prom:9090", "8", "-1", "1.5", "nan", "2024-01-01")),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(KEYS, inner, max_size=4)),
    max_leaves=8,
)
TUNED = st.dictionaries(st.sampled_from(TUNING_KEYS), SCALARS, max_size=3)
DOCUMENTS = st.one_of(
    st.dictionaries(st.sampled_from(SECTIONS), VALUES, max_size=3),
    st.fixed_dictionaries(
        {
            "defaults": TUNED,
            "profiles": st.dictionaries(KEYS, TUNED, max_size=3),
            "server": st.dictionaries(st.sampled_from(SERVER_KEYS), SCALARS, max_size=3),
        }
    ),
    VALUES,
)
YAMLISH = st.text(alphabet="{}[]:,-?&*!|>'\"%@`# \n\tab01.~", max_size=80)


def only_config_errors(text: str | bytes) -> None:
    error: ConfigError | None = None
    try:
        config: Any = load_config_text(text)
    except ConfigError as exc:
        error = exc
    if error is None:
        assert isinstance(config, Config)
    else:
        assert error.problems
        assert all(isinstance(p.path, str) and p.message for p in error.problems)


@settings(
    max_examples=1500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(DOCUMENTS)
def test_fuzz_yaml_documents_raise_only_config_errors(doc: object) -> None:
    only_config_errors(yaml.safe_dump(doc))


@settings(max_examples=1500, deadline=None, derandomize=True)
@given(st.one_of(YAMLISH, st.text(max_size=80), st.binary(max_size=40)))
def test_fuzz_raw_text_raises_only_config_errors(text: str | bytes) -> None:
    only_config_errors(text)
