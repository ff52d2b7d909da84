"""The README's promises: the settings reference is current, and the quickstart commands exist."""

from __future__ import annotations

import re
from pathlib import Path

from scaler.reference import BEGIN, END, markdown

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_settings_reference_is_generated_from_the_parser():
    block = README[README.index(BEGIN) : README.index(END) + len(END)]
    assert block == markdown(), "README reference is stale: paste the output of `scaler reference`"


def test_quickstart_is_two_commands_and_ci_runs_the_test_one():
    quickstart = README[README.index("## Quickstart") :]
    commands = re.findall(r"^\./dev \w+", quickstart.split("```sh", 1)[1].split("```", 1)[0], re.M)
    assert commands == ["./dev demo", "./dev test"]
    assert "./dev test" in (ROOT / ".ci" / "run").read_text()
