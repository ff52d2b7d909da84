"""The README's promises: the quickstart commands exist, its minimal ScaledObject is one KEDA and
the scaler accept, and it links every page of the documentation site."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gpu_queue_scaler.settings.trigger import parse_trigger
from tests import k8s_schema

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    quickstart = README[README.index("## Quickstart") :]
    commands = re.findall(r"^\./dev \w+", quickstart.split("```sh", 1)[1].split("```", 1)[0], re.M)
    assert commands == ["./dev demo", "./dev test"]
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()


def test_the_minimal_scaledobject_is_valid_for_keda_and_the_scaler():
    section = README[README.index("## A minimal ScaledObject") :]
    [obj] = yaml.safe_load_all(section.split("```yaml", 1)[1].split("```", 1)[0])
    assert obj["kind"] == "ScaledObject"
    k8s_schema.validate_custom_resource(obj)  # KEDA's CRD, unknown fields refused
    [trigger] = obj["spec"]["triggers"]
    assert trigger["type"] == "external"
    assert trigger["metadata"]["maxReplicas"] == str(obj["spec"]["maxReplicaCount"])
    parse_trigger(obj["metadata"]["namespace"], obj["metadata"]["name"], trigger["metadata"])


def test_the_readme_links_every_docs_page_and_each_link_exists():
    targets = re.findall(r"\]\(((?:docs|bench|deploy)/[^)#\s]*)[^)]*\)", README)
    for target in targets:
        assert (ROOT / target).exists(), target
    pages = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages - {"docs/index.md"} <= set(targets), pages - set(targets)
