"""One JSON object per log line, with the `extra=` fields of each call as top-level keys, so a
log pipeline can filter on `workload`, `decision_id` or `event` without parsing prose.

Every line is cut to a bound (`MAX_LINE_CHARS`), whoever logs it: a library's message can carry
input of any size (urllib3's retry warning, the whole URL-encoded PromQL query; an echoed value
of a rejected file), and one such line can fill a node's log volume. `cut` is the one way to
shorten a text for a message here, so every cut reads alike.
"""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
MAX_MESSAGE_CHARS = 2000  # a record's message
MAX_FIELD_CHARS = 500  # each `extra=` field's value, as text
MAX_TRACEBACK_CHARS = 8000  # its traceback: the first and the last half of that are kept
MAX_LINE_CHARS = 16_000  # a whole line, whatever it holds (JSON stays valid)


def cut(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """`text` if it is within `limit` characters, else its start and its length, within `limit`
    in all (for a limit of 40 characters or more)."""
    if len(text) <= limit:
        return text
    suffix = f"... [cut: {len(text)} characters]"
    return text[: max(0, limit - len(suffix))] + suffix


def _cut_middle(text: str, limit: int) -> str:
    """`text` within about `limit` characters, its start and its end kept (a traceback's last
    frames and the error say the most)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - 2 * half} characters cut] ...\n{text[-half:]}"


def _value(value: object) -> object:
    """An `extra=` value as JSON takes it, cut: numbers and flags as they are, text cut."""
    if value is None or isinstance(value, bool | int | float):
        return value
    return cut(value if isinstance(value, str) else str(value), MAX_FIELD_CHARS)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": cut(record.getMessage()),
        }
        entry.update({k: _value(v) for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exc"] = _cut_middle(self.formatException(record.exc_info), MAX_TRACEBACK_CHARS)
        line = json.dumps(entry, default=str)
        if len(line) <= MAX_LINE_CHARS:
            return line
        # Many fields, each within its bound: the line keeps what says what happened.
        kept = {k: entry[k] for k in ("ts", "level", "logger", "msg", "event") if k in entry}
        return json.dumps({**kept, "cut": f"{len(line)} characters, fields left out"})


class TextFormatter(logging.Formatter):
    """`logging.Formatter`, its message cut to MAX_MESSAGE_CHARS and each line within
    MAX_LINE_CHARS (a traceback's middle cut first)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        record.message = cut(record.message)  # as the JSON line's msg is cut
        return super().formatMessage(record)

    def formatException(self, ei: logging._SysExcInfoType) -> str:  # noqa: N802 (logging's name)
        return _cut_middle(super().formatException(ei), MAX_TRACEBACK_CHARS)

    def format(self, record: logging.LogRecord) -> str:
        return cut(super().format(record), MAX_LINE_CHARS)


def setup(level: str = "info", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
