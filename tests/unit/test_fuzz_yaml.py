"""Hostile ConfigMaps through the path the server runs: a file on disk, `ConfigStore.poll()` (read
and parse in a worker thread, then applied), as the watch loop calls it. Generated alias chains
(billion laughs of every shape), merge keys, and heaps of big and unknown keys; each case bounded
in memory (traced peak) and in work by counts (files parsed, problems reported), never by the
wall clock.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from gpu_queue_scaler.logs import MAX_MESSAGE_CHARS
from gpu_queue_scaler.settings.config import (
    MAX_CONFIG_BYTES,
    MAX_NODES,
    MAX_PATH_CHARS,
    MAX_PROBLEM_CHARS,
    MAX_PROBLEMS,
    MAX_UNKNOWN_KEYS,
    ConfigError,
    load_config_file,
)
from gpu_queue_scaler.settings.reload import ConfigStore
from tests.conftest import PROPERTIES

GOOD = "defaults:\n  targetConcurrency: 8\nprofiles:\n  base: {maxReplicas: 20}\n"
PEAK_BYTES = 24 * 1024 * 1024  # a 1 MiB file of MAX_NODES nodes composes in under half of it


def config_valid() -> float | None:
    return REGISTRY.get_sample_value("queue_scaler_config_valid")


@dataclass
class Outcome:
    store: ConfigStore
    peak: int
    logged: list[str]


class Watched:
    """One good config in force and its file; `feed` writes a new text and polls it three
    times, as the watch loop does while the file stays."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "config.yaml"
        self.path.write_text(GOOD)
        self.handler = _Lines()
        logging.getLogger("gpu_queue_scaler.settings.reload").addHandler(self.handler)

    def feed(self, text: str) -> Outcome:
        self.path.write_text(GOOD)
        store = ConfigStore(load_config_file(self.path), str(self.path))
        self.path.write_text(text)
        self.handler.lines.clear()
        tracemalloc.start()
        try:
            for _ in range(3):
                asyncio.run(store.poll())
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        return Outcome(store, peak, list(self.handler.lines))

    def close(self) -> None:
        logging.getLogger("gpu_queue_scaler.settings.reload").removeHandler(self.handler)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory):
    """One file for every case of a test (each `feed` starts from the good config)."""
    logging.getLogger("gpu_queue_scaler.settings.reload").setLevel(logging.ERROR)
    result = Watched(tmp_path_factory.mktemp("watched"))
    yield result
    result.close()


def check_bounded(outcome: Outcome, text: str) -> ConfigError | None:
    """Whatever the file: parsed at most once over three polls, in bounded memory; a rejection
    leaves the good config in force, is logged once in one bounded line, and echoes a bounded
    amount of the file."""
    store = outcome.store
    assert outcome.peak < PEAK_BYTES, outcome.peak
    assert store.parses <= 1
    error = store.last_error
    if error is None:
        assert config_valid() == 1.0 and not outcome.logged
        return None
    assert config_valid() == 0.0 and store.current.profiles["base"]["maxReplicas"] == 20
    assert len(outcome.logged) == 1 and len(outcome.logged[0]) <= MAX_MESSAGE_CHARS
    assert "keeping the last good config" in outcome.logged[0]
    assert len(error.problems) <= MAX_PROBLEMS + 1
    for problem in error.problems:
        assert len(problem.path) <= MAX_PATH_CHARS and len(problem.message) <= MAX_PROBLEM_CHARS
    if len(text.encode()) > MAX_CONFIG_BYTES:
        assert error.problems[0].path == "<file>"
    return error


# --- alias chains -------------------------------------------------------------------------------

# Anchor i is a list or a mapping of aliases to anchors below it (or a scalar, for i = 0).
Anchor = tuple[str, list[int]]


@st.composite
def alias_chains(draw: st.DrawFn) -> list[Anchor]:
    count = draw(st.integers(1, 10))
    anchors: list[Anchor] = [("scalar", [])]
    for i in range(1, count + 1):
        kind = draw(st.sampled_from(["list", "map"]))
        refs = draw(st.lists(st.integers(0, i - 1), max_size=12))
        anchors.append((kind, refs))
    return anchors


def chain_text(anchors: list[Anchor], recursive: bool) -> str:
    lines = ['a0: &a0 "lol"']
    for i, (kind, refs) in enumerate(anchors[1:], start=1):
        items = [f"*a{r}" for r in refs] + (
            [f"*a{i}"] if recursive and i == len(anchors) - 1 else []
        )
        if kind == "list":
            lines.append(f"a{i}: &a{i} [{', '.join(items)}]")
        else:
            lines.append(f"a{i}: &a{i} {{{', '.join(f'k{j}: {x}' for j, x in enumerate(items))}}}")
    lines.append(f"defaults:\n  targetConcurrency: *a{len(anchors) - 1}")
    return "\n".join(lines) + "\n"


def expanded_nodes(anchors: list[Anchor]) -> int:
    """The document's node count with every alias expanded, worked out from the plan: the root,
    each top-level key and value, and a node per key and value inside each anchor."""
    sizes: list[int] = []
    for kind, refs in anchors:
        per_item = 2 if kind == "map" else 1  # a mapping's item is a key node and a value
        sizes.append(1 + sum(sizes[r] + per_item - 1 for r in refs))
    defaults = 1 + 1 + sizes[-1]  # the `defaults` mapping, its key, the alias
    return 1 + sum(1 + size for size in sizes) + 1 + defaults


@settings(PROPERTIES, max_examples=300)
@given(alias_chains(), st.booleans())
def test_alias_chains_are_refused_past_the_node_bound_in_bounded_memory(
    watched: Watched, anchors: list[Anchor], recursive: bool
) -> None:
    text = chain_text(anchors, recursive and len(anchors) > 1)
    outcome = watched.feed(text)
    error = check_bounded(outcome, text)
    assert error is not None  # `a0:`... are no sections; the nodes bound, if hit, comes first
    messages = [p.message for p in error.problems]
    if recursive and len(anchors) > 1:
        assert any("inside its own anchor" in m for m in messages) or "more than" in messages[0]
    elif expanded_nodes(anchors) > MAX_NODES:
        assert messages == [
            f"not accepted: more than {MAX_NODES} nodes with its aliases expanded; "
            "a tuning ConfigMap needs a few hundred"
        ]
    else:
        assert not any(m.startswith("not accepted") for m in messages), messages
        assert error.problems[0].path == "a0"  # what is wrong is the file's own keys


# --- merge keys --------------------------------------------------------------------------------

VALUES = {
    "targetConcurrency": (1, 4, 8.5),
    "maxReplicas": (5, 20),
    "coldStartSeconds": (10, 30),
    "scaleDownStabilizationSeconds": (0, 60),
    "panicThreshold": (2, 3),
    "horizonSeconds": (60, 120),
}


@st.composite
def merged_profiles(draw: st.DrawFn) -> tuple[list[dict[str, float]], list[int], dict[str, float]]:
    """Base profiles with disjoint keys, the bases one profile merges, and its own keys."""
    keys = draw(st.permutations(sorted(VALUES)))
    cuts = sorted(draw(st.lists(st.integers(0, len(keys)), min_size=1, max_size=4)))
    bounds = [0, *cuts, len(keys)]
    bases = [
        {k: draw(st.sampled_from(VALUES[k])) for k in keys[lo:hi]}
        for lo, hi in itertools.pairwise(bounds)
    ]
    merged = draw(st.lists(st.integers(0, len(bases) - 1), min_size=1, max_size=4, unique=True))
    own_keys = draw(st.lists(st.sampled_from(sorted(VALUES)), max_size=3, unique=True))
    own = {k: draw(st.sampled_from(VALUES[k])) for k in own_keys}
    return bases, merged, own


@settings(PROPERTIES, max_examples=150)
@given(merged_profiles(), st.booleans())
def test_merge_keys_are_applied_as_yaml_says(
    watched: Watched,
    plan: tuple[list[dict[str, float]], list[int], dict[str, float]],
    as_list: bool,
) -> None:
    bases, merged, own = plan
    lines = ["profiles:"]
    for i, base in enumerate(bases):
        lines.append(f"  b{i}: &b{i} {{{', '.join(f'{k}: {v}' for k, v in base.items())}}}")
    lines.append("  merged:")
    if len(merged) == 1 and not as_list:
        lines.append(f"    <<: *b{merged[0]}")
    else:
        lines.append(f"    <<: [{', '.join(f'*b{i}' for i in merged)}]")
    lines += [f"    {k}: {v}" for k, v in own.items()]
    text = "\n".join(lines) + "\n"
    outcome = watched.feed(text)
    assert check_bounded(outcome, text) is None, outcome.store.last_error
    expected = {k: v for i in merged for k, v in bases[i].items()} | own
    assert dict(outcome.store.current.profiles["merged"]) == expected
    assert outcome.store.parses == 1 and outcome.store.generation == 1


# --- big and unknown keys ------------------------------------------------------------------------

KEY_CHARS = st.characters(min_codepoint=ord("a"), max_codepoint=ord("z"))


@settings(PROPERTIES, max_examples=60)
@given(
    section=st.sampled_from(["defaults", "server", "profiles.p"]),
    # a few keys, or about as many as MAX_NODES allows (two nodes a key)
    unknown=st.integers(0, 40) | st.integers(MAX_NODES // 2 - 10, MAX_NODES // 2 + 10),
    key_length=st.integers(1, 1000),
    value_length=st.integers(0, 300),
    big_value=st.booleans(),  # and one value of 1 MiB: the file is then too large
    typo=st.booleans(),
)
def test_heaps_of_big_and_unknown_keys_get_a_bounded_answer(
    watched: Watched,
    section: str,
    unknown: int,
    key_length: int,
    value_length: int,
    big_value: bool,
    typo: bool,
) -> None:
    stem = "k" + "x" * max(0, key_length - 7)
    keys = [f"{stem}{i:06d}" for i in range(unknown)]  # unknown to every section
    indent = "    " if section == "profiles.p" else "  "
    known = {"defaults": "targetConcurrency: 4", "server": "staleTargetSeconds: 600"}
    lines = [indent + known.get(section, "maxReplicas: 5")]  # known keys among the unknown
    lines += [f"{indent}{key}: {'v' * value_length}" for key in keys]
    if typo:
        lines.append(
            f"{indent}{'staleTargetSecond' if section == 'server' else 'targetConcurency'}: 4"
        )
    if big_value:
        lines.append(f"{indent}waitingQuery: {'q' * MAX_CONFIG_BYTES}")
    head = "profiles:\n  p:" if section == "profiles.p" else f"{section}:"
    text = "\n".join([head, *lines]) + "\n"
    outcome = watched.feed(text)
    error = check_bounded(outcome, text)
    nodes = 3 + (2 if section == "profiles.p" else 0) + 2 * len(lines)  # maps, keys, values
    if len(text.encode()) > MAX_CONFIG_BYTES:
        assert [p.path for p in error.problems] == ["<file>"] if error else False
        return
    if nodes > MAX_NODES:
        assert error is not None and error.problems[0].message.startswith(
            f"not accepted: more than {MAX_NODES} nodes"
        )
        return
    if not keys and not typo:
        assert error is None
        return
    assert error is not None
    unknown_reported = [p for p in error.problems if p.message.startswith("unknown key")]
    total = len(keys) + typo
    assert len(unknown_reported) == min(total, MAX_UNKNOWN_KEYS)
    if total > MAX_UNKNOWN_KEYS:
        assert error.problems[-1].message == f"... and {total - MAX_UNKNOWN_KEYS} more unknown keys"
        assert error.problems[-1].path == section
    elif typo:
        wanted = "targetConcurrency" if section != "server" else "staleTargetSeconds"
        assert error.problems[-1].message == f"unknown key; did you mean {wanted!r}?"
