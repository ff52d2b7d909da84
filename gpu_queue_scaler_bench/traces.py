"""Load request-arrival traces (any of the shipped formats) into arrays of arrivals or rates.

Three formats are accepted; the format is detected from the file's first line, not its extension:

* **Per-request CSV**: a header with a ``TIMESTAMP`` (or ``timestamp``) column holding either a
  date-time (Azure LLM inference 2023: ``2023-11-16 18:15:46.6805900``, fractional seconds to 100 ns
  are kept) or plain seconds. Token columns are optional: ``ContextTokens`` / ``input_tokens`` /
  ``input_length`` and ``GeneratedTokens`` / ``output_tokens`` / ``output_length``.
* **Per-request JSONL**: one JSON object per line with a ``timestamp`` in **milliseconds**
  (Mooncake FAST'25), optional ``input_length`` and ``output_length``.
* **Rate CSV**: a header with ``ts`` (seconds) and ``total_rate`` (or ``rate``, req/s averaged
  over the window), optionally ``rate_weighted_cv`` (or ``cv``, the inter-arrival coefficient of
  variation in the window); rows on a regular grid of windows (ServeGen: 600 s). A rate of 0 and an
  empty cell are **data gaps** in these files, not idle time: they load as NaN, and so do windows
  missing from the grid.

Arrival times are seconds from the trace's first request, sorted (ties keep file order).

**Quantised timestamps.** Some traces stamp arrivals on a coarse clock: Mooncake's conversation
trace has 12,031 requests on 1,180 distinct stamps ~3 s apart. :func:`load_trace` detects such a
clock and records its step in :attr:`Trace.resolution_s` (0 when arrivals are not quantised).
:func:`binned` then treats each stamp as covering ``[t, t + resolution_s)`` and spreads its requests
uniformly over that interval before counting, so bins of any width >= the resolution see the mean
rate rather than an alias of the clock (10 s bins over a 3 s clock would otherwise alternate 3 and 4
stamps per bin, a fake +-15% oscillation). Bins narrower than the resolution are refused: the data
cannot tell what happened inside one tick.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import numpy as np
from numpy.typing import NDArray

__all__ = [
    "DEFAULT_REQUEST_BIN_S",
    "Trace",
    "TraceError",
    "binned",
    "default_bin_s",
    "load_trace",
]

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

DEFAULT_REQUEST_BIN_S = 10.0
"""Default bin width for per-request traces (rate traces use their window)."""

ACCEPTED = (
    "accepted formats: a per-request CSV with a TIMESTAMP column (date-time or seconds); "
    "JSONL objects with a millisecond 'timestamp'; a rate CSV with columns 'ts' (seconds) and "
    "'total_rate' or 'rate' (req/s per window)"
)

_TIMESTAMP_COLUMNS = ("timestamp",)
_INPUT_COLUMNS = ("contexttokens", "input_tokens", "input_length")
_OUTPUT_COLUMNS = ("generatedtokens", "output_tokens", "output_length")
_RATE_COLUMNS = ("total_rate", "rate")
_CV_COLUMNS = ("rate_weighted_cv", "cv")


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file and what is accepted."""


@dataclass(frozen=True)
class Trace:
    """One loaded trace.

    ``kind == "requests"``: :attr:`arrivals_s` (float64 seconds from the first request, sorted) and
    optional per-request :attr:`input_tokens` / :attr:`output_tokens` (int64, same order).
    ``kind == "rates"``: :attr:`window_s`, :attr:`rates` (req/s per window, NaN for data gaps) and
    :attr:`cv` (inter-arrival CV per window, NaN where unknown), window ``i`` starting at
    ``i * window_s`` from the first row.
    """

    name: str
    kind: Literal["requests", "rates"]
    path: str = ""
    arrivals_s: FloatArray | None = None
    input_tokens: IntArray | None = None
    output_tokens: IntArray | None = None
    resolution_s: float = 0.0
    window_s: float | None = None
    rates: FloatArray | None = None
    cv: FloatArray | None = None

    @property
    def duration_s(self) -> float:
        """Span covered: the last arrival plus one clock tick, or all windows."""
        if self.kind == "rates":
            assert self.rates is not None
            assert self.window_s is not None
            return float(self.rates.size * self.window_s)
        assert self.arrivals_s is not None
        if self.arrivals_s.size == 0:
            return 0.0
        return float(self.arrivals_s[-1]) + self.resolution_s

    @property
    def requests(self) -> float:
        """Number of requests: counted, or for rates the sum of rate x window over known windows."""
        if self.kind == "rates":
            assert self.rates is not None
            assert self.window_s is not None
            return float(np.nansum(self.rates) * self.window_s)
        assert self.arrivals_s is not None
        return float(self.arrivals_s.size)


def load_trace(path: str | Path) -> Trace:
    """Read ``path`` in whichever accepted format its first line shows; see the module docstring."""
    file = Path(path)
    try:
        with file.open(encoding="utf-8-sig", newline="") as handle:
            first = ""
            for line in handle:
                if line.strip():
                    first = line.strip()
                    break
            if not first:
                raise TraceError(f"{file}: empty file; {ACCEPTED}")
            handle.seek(0)
            if first.startswith("{"):
                return _load_jsonl(file, handle)
            header = next(csv.reader([first]))
            columns = {name.strip().lower(): i for i, name in enumerate(header)}
            if _pick(columns, _TIMESTAMP_COLUMNS) is not None:
                return _load_request_csv(file, handle, columns)
            if "ts" in columns and _pick(columns, _RATE_COLUMNS) is not None:
                return _load_rate_csv(file, handle, columns)
            raise TraceError(f"{file}: unrecognised first line {first[:120]!r}; {ACCEPTED}")
    except OSError as exc:
        raise TraceError(f"{file}: cannot read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise TraceError(f"{file}: not UTF-8 text ({exc.reason}); {ACCEPTED}") from exc


def default_bin_s(trace: Trace) -> float:
    """10 s for request traces (at least the timestamp resolution); the window for rate traces."""
    if trace.kind == "rates":
        assert trace.window_s is not None
        return trace.window_s
    return max(DEFAULT_REQUEST_BIN_S, trace.resolution_s)


def binned(trace: Trace, bin_s: float | None = None) -> FloatArray:
    """Mean req/s per bin of ``bin_s`` seconds (default :func:`default_bin_s`).

    Requests: counts per bin divided by ``bin_s``; bin ``i`` covers ``[i*bin_s, (i+1)*bin_s)`` from
    the first request, the last bin may be partly past the end of the trace. Quantised stamps are
    spread over their tick (module docstring), so counts can be fractional but sum to the number of
    requests; ``bin_s`` below :attr:`Trace.resolution_s` raises :class:`ValueError`.
    Rates: ``bin_s`` must be a whole multiple of the window; windows are averaged, and a bin with
    any NaN window is NaN (a gap stays a gap).
    """
    width = default_bin_s(trace) if bin_s is None else float(bin_s)
    if not (math.isfinite(width) and width > 0):
        raise ValueError(f"bin_s must be a positive number of seconds, got {bin_s!r}")
    if trace.kind == "rates":
        assert trace.rates is not None
        assert trace.window_s is not None
        ratio = width / trace.window_s
        k = round(ratio)
        if k < 1 or abs(ratio - k) > 1e-9 * ratio:
            raise ValueError(
                f"{trace.name}: bin_s {width:g} must be a whole multiple of the "
                f"{trace.window_s:g} s rate window"
            )
        if k == 1:
            return trace.rates.copy()
        n = -(-trace.rates.size // k)  # ceil: a partial last bin averages the windows it has
        padded = np.full(n * k, np.nan)
        padded[: trace.rates.size] = trace.rates
        groups = padded.reshape(n, k)
        out = np.full(n, np.nan)
        full = np.isfinite(groups).all(axis=1)
        out[full] = groups[full].mean(axis=1)
        last = groups[-1][: trace.rates.size - (n - 1) * k]
        if last.size and np.isfinite(last).all():
            out[-1] = float(last.mean())
        return out
    assert trace.arrivals_s is not None
    arrivals = trace.arrivals_s
    tick = trace.resolution_s
    if tick > 0 and width < tick * (1 - 1e-9):
        raise ValueError(
            f"{trace.name}: bin_s {width:g} is below the trace's {tick:g} s timestamp resolution; "
            f"use bins of at least {tick:g} s"
        )
    if arrivals.size == 0:
        return np.zeros(0)
    n_bins = max(1, math.ceil(trace.duration_s / width - 1e-9))
    if tick <= 0:
        index = np.minimum((arrivals // width).astype(np.int64), n_bins - 1)
        counts = np.bincount(index, minlength=n_bins).astype(np.float64)
        return counts / width
    # spread each stamp's requests uniformly over [t, t + tick): exact overlap with every bin
    stamps, per_stamp = np.unique(arrivals, return_counts=True)
    counts = np.zeros(n_bins + 1)
    ends = stamps + tick
    first_bin = (stamps // width).astype(np.int64)
    for offset in range(math.ceil(tick / width) + 1):
        index = first_bin + offset
        low = np.maximum(stamps, index * width)
        high = np.minimum(ends, (index + 1) * width)
        share = np.clip(high - low, 0.0, None) / tick
        np.add.at(counts, np.minimum(index, n_bins), per_stamp * share)
    counts[n_bins - 1] += counts[n_bins]  # float round-off past the last edge
    return counts[:n_bins] / width


# ---- readers ---------------------------------------------------------------------------------


def _pick(columns: dict[str, int], names: Sequence[str]) -> int | None:
    for name in names:
        if name in columns:
            return columns[name]
    return None


def _rows(file: Path, handle: Iterator[str]) -> Iterator[tuple[int, list[str]]]:
    reader = csv.reader(handle)
    next(reader, None)  # header
    for row in reader:
        if not row or all(not cell.strip() for cell in row):
            continue
        yield reader.line_num, row


def _cell(file: Path, line: int, row: list[str], index: int, column: str) -> str:
    if index >= len(row):
        raise TraceError(f"{file}:{line}: missing column {column!r} ({len(row)} fields)")
    return row[index].strip()


def _int(file: Path, line: int, text: str, column: str) -> int:
    try:
        value = int(text) if text.lstrip("-").isdigit() else int(float(text))
    except ValueError:
        raise TraceError(f"{file}:{line}: {column} {text!r} is not a number") from None
    if value < 0:
        raise TraceError(f"{file}:{line}: {column} {value} is negative")
    return value


def _float(file: Path, line: int, text: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise TraceError(f"{file}:{line}: {column} {text!r} is not a number") from None
    if not math.isfinite(value):
        raise TraceError(f"{file}:{line}: {column} {text!r} is not finite")
    return value


class _Clock:
    """TIMESTAMP cells to seconds from the first one, keeping digits below the microsecond."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.origin: datetime | None = None
        self.numeric: bool | None = None

    def seconds(self, line: int, text: str) -> float:
        if self.numeric is None:
            self.numeric = _is_number(text)
        if self.numeric:
            return _float(self.file, line, text, "TIMESTAMP")
        base, dot, fraction = text.partition(".")
        try:
            when = datetime.fromisoformat(base)
            extra = float("0." + fraction) if dot else 0.0
        except ValueError:
            raise TraceError(
                f"{self.file}:{line}: TIMESTAMP {text!r} is neither a date-time "
                "(YYYY-MM-DD HH:MM:SS[.fraction]) nor seconds"
            ) from None
        if when.tzinfo is not None:
            when = when.astimezone(UTC).replace(tzinfo=None)
        if self.origin is None:
            self.origin = when
        return (when - self.origin).total_seconds() + extra


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _load_request_csv(file: Path, handle: Iterator[str], columns: dict[str, int]) -> Trace:
    ts_col = _pick(columns, _TIMESTAMP_COLUMNS)
    assert ts_col is not None
    in_col = _pick(columns, _INPUT_COLUMNS)
    out_col = _pick(columns, _OUTPUT_COLUMNS)
    clock = _Clock(file)
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    for line, row in _rows(file, handle):
        times.append(clock.seconds(line, _cell(file, line, row, ts_col, "TIMESTAMP")))
        if in_col is not None:
            inputs.append(_int(file, line, _cell(file, line, row, in_col, "input"), "input tokens"))
        if out_col is not None:
            text = _cell(file, line, row, out_col, "output")
            outputs.append(_int(file, line, text, "output tokens"))
    return _requests(
        file,
        times,
        inputs if in_col is not None else None,
        outputs if out_col is not None else None,
    )


def _load_jsonl(file: Path, handle: Iterator[str]) -> Trace:
    times: list[float] = []
    inputs: list[int] = []
    outputs: list[int] = []
    has_in = has_out = True
    for line_no, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{file}:{line_no}: not a JSON object ({exc.msg})") from None
        if not isinstance(record, dict):
            raise TraceError(f"{file}:{line_no}: expected a JSON object per line")
        stamp = record.get("timestamp")
        if isinstance(stamp, bool) or not isinstance(stamp, int | float):
            raise TraceError(
                f"{file}:{line_no}: needs a numeric 'timestamp' (milliseconds); {ACCEPTED}"
            )
        times.append(float(stamp) / 1000.0)
        for key, into, present in (
            ("input_length", inputs, has_in),
            ("output_length", outputs, has_out),
        ):
            if not present:
                continue
            value = record.get(key)
            if value is None:
                if key == "input_length":
                    has_in = False
                else:
                    has_out = False
                continue
            into.append(_int(file, line_no, str(value), key))
    return _requests(file, times, inputs if has_in else None, outputs if has_out else None)


def _requests(
    file: Path,
    times: list[float],
    inputs: list[int] | None,
    outputs: list[int] | None,
) -> Trace:
    if not times:
        raise TraceError(f"{file}: no requests after the header; {ACCEPTED}")
    stamps = np.asarray(times, dtype=np.float64)
    order = np.argsort(stamps, kind="stable")
    stamps = stamps[order]
    stamps = stamps - stamps[0]

    def tokens(values: list[int] | None) -> IntArray | None:
        if values is None or len(values) != len(times):
            return None
        return np.asarray(values, dtype=np.int64)[order]

    return Trace(
        name=file.stem,
        kind="requests",
        path=str(file),
        arrivals_s=stamps,
        input_tokens=tokens(inputs),
        output_tokens=tokens(outputs),
        resolution_s=_resolution(stamps),
    )


def _resolution(stamps: FloatArray) -> float:
    """The clock step when arrivals sit on a coarse regular clock, else 0.

    Quantised: fewer than a third as many distinct stamps as requests, and >= 95% of the gaps
    between distinct stamps within 1% of a whole multiple of their median (longer gaps are ticks
    without requests).
    """
    distinct = np.unique(stamps)
    if distinct.size < 3 or distinct.size * 3 > stamps.size:
        return 0.0
    gaps = np.diff(distinct)
    step = float(np.median(gaps))
    if step <= 0:
        return 0.0
    multiples = gaps / step
    near = np.abs(multiples - np.round(multiples)) <= 0.01
    if np.mean(near) < 0.95:
        return 0.0
    return step


def _load_rate_csv(file: Path, handle: Iterator[str], columns: dict[str, int]) -> Trace:
    rate_col = _pick(columns, _RATE_COLUMNS)
    assert rate_col is not None
    ts_col = columns["ts"]
    cv_col = _pick(columns, _CV_COLUMNS)
    stamps: list[float] = []
    rates: list[float] = []
    cvs: list[float] = []
    for line, row in _rows(file, handle):
        stamps.append(_float(file, line, _cell(file, line, row, ts_col, "ts"), "ts"))
        text = _cell(file, line, row, rate_col, "rate")
        rate = _float(file, line, text, "rate") if text else math.nan
        if rate < 0:
            raise TraceError(f"{file}:{line}: rate {rate:g} is negative")
        rates.append(rate if rate > 0 else math.nan)  # 0 = data gap in these files
        cv_text = _cell(file, line, row, cv_col, "cv") if cv_col is not None else ""
        cvs.append(_float(file, line, cv_text, "cv") if cv_text else math.nan)
    if len(stamps) < 2:
        raise TraceError(f"{file}: a rate trace needs at least two windows, found {len(stamps)}")
    ts = np.asarray(stamps)
    if np.any(np.diff(ts) <= 0):
        raise TraceError(f"{file}: 'ts' must be strictly increasing")
    window = float(np.min(np.diff(ts)))
    slots = (ts - ts[0]) / window
    index = np.round(slots).astype(np.int64)
    if np.any(np.abs(slots - index) > 1e-6):
        raise TraceError(
            f"{file}: 'ts' is not on a regular grid of {window:g} s windows (missing windows are "
            "allowed, uneven ones are not)"
        )
    n = int(index[-1]) + 1
    rate_grid = np.full(n, np.nan)
    cv_grid = np.full(n, np.nan)
    rate_grid[index] = rates
    cv_grid[index] = cvs
    cv_grid[np.isnan(rate_grid)] = np.nan
    return Trace(
        name=file.stem,
        kind="rates",
        path=str(file),
        window_s=window,
        rates=rate_grid,
        cv=cv_grid,
    )
