"""A loaded trace -> the request arrays the simulator replays (arrival, input and output tokens).

Why here and not in `gpu_queue_scaler_bench.traces`: the loader keeps what the file says; replay
needs more. Rate files carry no requests, so each window is expanded into arrivals with Gamma
inter-arrival times of the window's coefficient of variation (shape 1/CV^2; CV 1 is Poisson),
optionally time-compressed. Data gaps (NaN windows) are filled by linear interpolation: they are
missing data, not idle time. Traces without token columns draw tokens from a lognormal fitted to the
Azure conversation trace.

`--scale F` superimposes F copies of the trace, copy k shifted by a seeded offset drawn uniformly
in [0, jitter) and wrapped around the trace's span, so the load's shape (ramps, daily cycles) is
kept while the copies' bursts do not line up; a fractional part keeps each request of one more copy
with probability frac(F). F < 1 thins the trace the same way. Deterministic for a seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler_bench.traces import Trace

FloatArray = NDArray[np.float64]
IntArray = NDArray[np.int64]

DEFAULT_JITTER_S = 60.0
# Lognormal token draws for traces without token columns, matched to the Azure 2023 conversation
# trace's medians (1020 prompt tokens, 129 generated) with a ~x3 spread.
_INPUT_MEDIAN, _OUTPUT_MEDIAN, _SIGMA = 1020.0, 129.0, 1.0
MAX_REQUESTS = 20_000_000  # bound on what one replay may hold in memory


@dataclass(frozen=True)
class Requests:
    """Requests sorted by arrival (seconds from 0), with their prompt and output token counts."""

    arrivals_s: FloatArray
    input_tokens: IntArray
    output_tokens: IntArray
    duration_s: float
    name: str

    @property
    def count(self) -> int:
        return int(self.arrivals_s.size)


def _tokens(rng: np.random.Generator, n: int, median: float) -> IntArray:
    draws = rng.lognormal(math.log(median), _SIGMA, n)
    return np.clip(np.rint(draws), 1, 32_000).astype(np.int64)


def _fill_gaps(rates: FloatArray) -> FloatArray:
    """Linear interpolation over NaN windows (held flat at the ends); all-NaN becomes zeros."""
    known = np.isfinite(rates)
    if not known.any():
        return np.zeros_like(rates)
    index = np.arange(rates.size, dtype=np.float64)
    return np.interp(index, index[known], rates[known])


def expand_rates(
    trace: Trace, rng: np.random.Generator, compress: float = 1.0
) -> tuple[FloatArray, float]:
    """Arrivals for a rate trace: per window, Gamma inter-arrivals at the window's rate and CV.

    `compress` > 1 shortens each window by that factor at the same rate (fewer requests, same
    shape). Returns the arrival times and the replayed span.
    """
    assert trace.rates is not None
    assert trace.window_s is not None
    assert trace.cv is not None
    if compress <= 0:
        raise ValueError("compress must be > 0")
    rates = _fill_gaps(trace.rates)
    cvs = np.where(np.isfinite(trace.cv) & (trace.cv > 0), trace.cv, 1.0)
    window = trace.window_s / compress
    expected = float(np.sum(rates) * window)
    if expected > MAX_REQUESTS:
        raise ValueError(
            f"{trace.name}: {expected:.0f} requests to replay; cap it with --duration, a "
            "compression or --scale below 1"
        )
    chunks: list[FloatArray] = []
    for i, (rate, cv) in enumerate(zip(rates, cvs, strict=True)):
        if rate <= 0:
            continue
        shape = 1.0 / (cv * cv)
        scale = 1.0 / (rate * shape)
        mean_n = rate * window
        # Enough draws to cover the window with overwhelming probability; topped up if not.
        n = int(mean_n + 6.0 * math.sqrt(mean_n) * max(cv, 1.0) + 16)
        gaps = rng.gamma(shape, scale, n)
        # A stationary start: the first arrival is a uniform fraction of a gap into the window.
        gaps[0] *= rng.random()
        times = np.cumsum(gaps)
        for _ in range(8):  # bounded top-ups
            if times[-1] >= window:
                break
            more = np.cumsum(rng.gamma(shape, scale, n)) + times[-1]
            times = np.concatenate([times, more])
        chunks.append(times[times < window] + i * window)
    arrivals = np.concatenate(chunks) if chunks else np.zeros(0)
    return arrivals, float(rates.size * window)


def build_requests(
    trace: Trace,
    *,
    scale: float = 1.0,
    seed: int = 0,
    duration_s: float | None = None,
    compress: float = 1.0,
    jitter_s: float = DEFAULT_JITTER_S,
) -> Requests:
    """The requests to replay: the trace (expanded if it holds rates), scaled and capped."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive number, got {scale!r}")
    rng = np.random.default_rng(seed)
    if trace.kind == "rates":
        arrivals, span = expand_rates(trace, rng, compress)
        inputs = _tokens(rng, arrivals.size, _INPUT_MEDIAN)
        outputs = _tokens(rng, arrivals.size, _OUTPUT_MEDIAN)
    else:
        assert trace.arrivals_s is not None
        arrivals = trace.arrivals_s / compress
        # just past the last arrival: np.mod below must not wrap it to 0
        last = float(np.nextafter(arrivals[-1], np.inf)) if arrivals.size else 0.0
        span = max(trace.duration_s / compress, last)
        if trace.resolution_s > 0:  # quantised stamps: spread each over its clock tick
            arrivals = arrivals + rng.random(arrivals.size) * trace.resolution_s / compress
        inputs = (
            trace.input_tokens
            if trace.input_tokens is not None
            else _tokens(rng, arrivals.size, _INPUT_MEDIAN)
        )
        outputs = (
            trace.output_tokens
            if trace.output_tokens is not None
            else _tokens(rng, arrivals.size, _OUTPUT_MEDIAN)
        )
    if duration_s is not None:
        span = min(span, duration_s)
        keep = arrivals < span
        arrivals, inputs, outputs = arrivals[keep], inputs[keep], outputs[keep]
    span = max(span, 1.0)
    copies = math.ceil(scale)
    if copies * arrivals.size > MAX_REQUESTS:
        raise ValueError(f"--scale {scale:g} makes over {MAX_REQUESTS} requests; cap --duration")
    parts_t: list[FloatArray] = []
    parts_in: list[IntArray] = []
    parts_out: list[IntArray] = []
    for k in range(copies):
        offset = 0.0 if k == 0 else rng.random() * min(jitter_s, span)
        keep_p = min(1.0, scale - k)
        mask = (
            np.ones(arrivals.size, dtype=bool)
            if keep_p >= 1.0
            else rng.random(arrivals.size) < keep_p
        )
        parts_t.append(np.mod(arrivals[mask] + offset, span))
        parts_in.append(np.asarray(inputs[mask], dtype=np.int64))
        parts_out.append(np.asarray(outputs[mask], dtype=np.int64))
    times = np.concatenate(parts_t)
    order = np.argsort(times, kind="stable")
    return Requests(
        arrivals_s=times[order],
        input_tokens=np.maximum(np.concatenate(parts_in)[order], 1),
        output_tokens=np.maximum(np.concatenate(parts_out)[order], 1),
        duration_s=span,
        name=trace.name,
    )
