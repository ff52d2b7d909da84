"""Prometheus exposition text -> validated samples, with a reason for everything dropped.

Parsing is prometheus_client's `text_string_to_metric_families` (never hand-rolled). What we add is
robustness: the parser raises `ValueError` mid-stream on bad input, so a broken line costs the
samples after it but never the scrape loop; NaN, +-Inf and negative values (a queue cannot be
negative) are dropped with a reason; a duplicated series keeps its first value. And speed: given
the families a scrape reads (`catalog.families`), only their lines reach the parser, chosen by
the metric name that starts each line (`# HELP`/`# TYPE` lines by the name after the keyword).
The parser is pure Python and costs about the same per line, on the event loop, for every pod on
every tick, and the catalog reads only a fraction of a vLLM pod's lines: the filter cuts the
parse by that fraction (`bench/scrape_parse.py`; figures in docs/signals.md).
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from gpu_queue_scaler.catalog import FAMILY_SUFFIXES, Matcher, family_of
from gpu_queue_scaler.settings.labelregex import label_regex

LabelSet = frozenset[tuple[str, str]]
SeriesKey = tuple[str, LabelSet]


@dataclass
class Scrape:
    """One target's samples at one time: series key -> value."""

    samples: dict[SeriesKey, float] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # name -> its series, built on first use: a window evaluates each expression over every
    # scrape it keeps, and a pod exposes hundreds of series of which an expression reads a few.
    _index: tuple[int, dict[str, list[tuple[LabelSet, float]]]] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def series(self, name: str) -> list[tuple[LabelSet, float]]:
        """The (labels, value) of every series named `name`."""
        return self._by_name().get(name, [])

    def _by_name(self) -> dict[str, list[tuple[LabelSet, float]]]:
        if self._index is None or self._index[0] != len(self.samples):
            index: dict[str, list[tuple[LabelSet, float]]] = {}
            for (name, labels), value in self.samples.items():
                index.setdefault(name, []).append((labels, value))
            self._index = (len(self.samples), index)
        return self._index[1]

    def names(self) -> set[str]:
        return set(self._by_name())

    def has(self, name: str) -> bool:
        return name in self._by_name()


def _collect(text: str, scrape: Scrape, dropped: Counter[str]) -> None:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if not math.isfinite(value):
                dropped[f"non-finite value in {sample.name}"] += 1
            elif value < 0:
                dropped[f"negative value in {sample.name}"] += 1
            else:
                series = (sample.name, frozenset(sample.labels.items()))
                if series in scrape.samples:
                    dropped[f"duplicate series {sample.name}"] += 1
                else:
                    scrape.samples[series] = value


def _parses(text: str) -> bool:
    try:
        for _ in text_string_to_metric_families(text):
            pass
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=16)
def _line_pattern(wanted: frozenset[str]) -> re.Pattern[str]:
    """Matches a line that starts with the metric name of a `wanted` family (a sample's name, up
    to `{` or a blank, or the name a `# HELP` or `# TYPE` comment is about), with or without a
    counter/histogram suffix: one C-level match per line."""
    stems = sorted({family_of(name) for name in wanted}, key=len, reverse=True)
    if not stems:
        return re.compile(r"(?!)")  # no family wanted: no line
    names = "|".join(re.escape(stem) for stem in stems)
    suffixes = "|".join(FAMILY_SUFFIXES)
    return re.compile(
        rf"[ \t]*(?:#[ \t]+(?:HELP|TYPE)[ \t]+)?(?:{names})(?:{suffixes})?(?=[\s{{]|$)"
    )


def lines_of(text: str, wanted: frozenset[str]) -> tuple[list[str], list[int]]:
    """The lines of `text` whose metric name is of a `wanted` family, and each one's line
    number in `text` (from 1)."""
    match = _line_pattern(wanted).match
    kept: list[str] = []
    numbers: list[int] = []
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        if match(line):
            kept.append(line)
            numbers.append(number)
    return kept, numbers


def parse(text: str, wanted: frozenset[str] | None = None) -> Scrape:
    """The samples of `text` (with `wanted`: of those families only; the rest is not parsed, so
    a broken line there costs nothing)."""
    scrape = Scrape()
    dropped: Counter[str] = Counter()
    if wanted is None:
        lines = text.splitlines(keepends=True)
        numbers = list(range(1, len(lines) + 1))
    else:
        lines, numbers = lines_of(text, wanted)
        text = "".join(lines)
    try:
        _collect(text, scrape, dropped)
    except ValueError as exc:
        # The parser yields a family only when the next begins, so the error costs the family in
        # progress too. Keep the longest prefix of whole lines that parses (bisection: only on
        # this error path) and name the first bad line.
        good, bad = 0, len(lines)
        while bad - good > 1:
            middle = (good + bad) // 2
            good, bad = (middle, bad) if _parses("".join(lines[:middle])) else (good, middle)
        scrape.samples.clear()
        dropped.clear()
        _collect("".join(lines[:good]), scrape, dropped)
        at = numbers[good] if good < len(numbers) else len(numbers) + 1
        kept = "lines" if wanted is None else "lines read"
        scrape.problems.append(
            f"unparsable metrics text at line {at}, kept the {good} {kept} before it: {exc}"[:300]
        )
    if not scrape.samples and not scrape.problems and not dropped:
        scrape.problems.append(
            "no samples in metrics text"
            if wanted is None
            else "none of the backend's metrics in the text (e.g. "
            + ", ".join(sorted(wanted)[:2])
            + ")"
        )
    scrape.problems += [f"{reason} (x{count})" for reason, count in sorted(dropped.items())]
    return scrape


def matches(labels: LabelSet, matchers: Iterable[Matcher], only_present: bool = False) -> bool:
    """PromQL matcher semantics (regexes anchored and RE2's,
    `gpu_queue_scaler.settings.labelregex`). With `only_present`, matchers on labels the series does
    not carry are skipped: Prometheus adds target labels (namespace, pod, service) that a pod's own
    /metrics never has."""
    values = dict(labels)
    for label, op, want in matchers:
        if only_present and label not in values:
            continue
        have = values.get(label, "")
        if op == "=":
            ok = have == want
        elif op == "!=":
            ok = have != want
        elif op == "=~":
            ok = label_regex(want).fullmatch(have) is not None
        else:
            ok = label_regex(want).fullmatch(have) is None
        if not ok:
            return False
    return True
