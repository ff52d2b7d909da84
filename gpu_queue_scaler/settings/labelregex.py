"""The regexes of label matchers (`labelSelector`'s `=~` and `!~`), compiled by RE2.

RE2 matches in time linear in the value whatever the pattern, where Python's `re` backtracks
(`(a|aa)*c` takes time exponential in the label value's length, on the event loop of every
direct-scrape read). It is also the syntax Prometheus itself
matches with (Go's regexp is RE2's), so a selector means the same by direct scrape and through
Prometheus; a pattern RE2 refuses (a lookaround, a backreference) is refused when the trigger
is parsed, naming `labelSelector`.
"""

from __future__ import annotations

import functools
import re
from typing import Protocol, cast

import re2

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a refused pattern is the caller's error to report, not stderr's


MAX_REPEAT = 1000  # RE2's and Go's largest repetition count
MAX_NESTING = 1000  # Go's deepest nesting; RE2 takes deeper, Prometheus would refuse it
# A count RE2 cannot read as a number (past 10^8) makes it read the braces as literal text, where
# Go's regexp (Prometheus's) refuses the pattern: refused here too, as every count past MAX_REPEAT.
_REPEAT = re.compile(r"(?<!\\)\{(\d+)(?:,(\d*))?\}")


class LabelRegex(Protocol):
    def fullmatch(self, text: str) -> object | None: ...


class LabelRegexError(ValueError):
    """A pattern RE2 does not compile; the message says why."""


@functools.lru_cache(maxsize=1024)
def label_regex(pattern: str) -> LabelRegex:
    """`pattern` compiled (cached: a selector's few patterns are matched on every series)."""
    for found in _REPEAT.finditer(pattern):
        if any(len(n) > 4 or int(n) > MAX_REPEAT for n in found.groups() if n):
            raise LabelRegexError(f"repetition count over {MAX_REPEAT} in {found[0][:40]}")
    depth = deepest = 0
    escaped = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in "()":
            depth += 1 if char == "(" else -1
            deepest = max(deepest, depth)
    if deepest > MAX_NESTING:
        raise LabelRegexError(f"groups nested {deepest} deep, over {MAX_NESTING}")
    try:
        return cast(LabelRegex, re2.compile(pattern, _OPTIONS))
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        text = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise LabelRegexError(text[:200]) from None
