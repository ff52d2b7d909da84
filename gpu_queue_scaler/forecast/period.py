"""The period of a demand series, found from its own autocorrelation.

Why: a seasonal forecaster needs its period, and the traffic that most needs one (a cron job, a
batch that comes back every 40 minutes, a shift pattern) has a period nobody wrote down. The
autocorrelation r(L) of a recurring pattern peaks again at its period after falling below zero
between the bursts; noise, a trend or a single ramp give no such second peak.

`find_period` reads r(L) over the lags it can judge (`min_lag` up to where the series and its
shift still overlap by `min_overlap` points) and returns the lag of the best peak that rose from
below zero and reaches `threshold`, ranked by r times the share of the series it is judged on;
of peaks within `HARMONIC_SHARE` of the best the shortest wins (a period's multiples peak almost
as high). Pure and deterministic; O(n log n)
by FFT. Missing points (NaN) are left out of the products.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from gpu_queue_scaler.forecast._arrays import FloatArray

THRESHOLD = 0.5  # a peak lower than this is too weak a recurrence to forecast from
HARMONIC_SHARE = 0.9  # a shorter peak this close to the best is the period, the best a multiple


def autocorrelation(series: ArrayLike) -> FloatArray:
    """r(L) for L = 0..n-1: the mean product of the centred series with its shift by L, over
    the pairs of points both known, divided by the variance (r(0) = 1; 0 where no pair is known,
    and all 0 for a constant series). Averaging over known pairs, not over all, keeps a series
    with regular gaps (a tick every third bin) from peaking at every lag that aligns them."""
    x = np.asarray(series, dtype=np.float64)
    n = x.size
    known = np.isfinite(x)
    if not known.any():
        return np.zeros(n)
    x = np.where(known, x - x[known].mean(), 0.0)
    variance = float(np.dot(x, x)) / int(known.sum())
    if variance <= 0.0:
        return np.zeros(n)
    size = 1 << (2 * n - 1).bit_length()

    def lagged(values: FloatArray) -> FloatArray:
        spectrum = np.fft.rfft(values, size)
        return np.asarray(np.fft.irfft(spectrum * np.conj(spectrum), size)[:n])

    pairs = np.rint(lagged(known.astype(np.float64)))
    sums = lagged(x)
    r = np.divide(sums, pairs * variance, out=np.zeros(n), where=pairs > 0)
    return np.asarray(r, dtype=np.float64)


def find_period(
    series: ArrayLike, min_lag: int, min_overlap: int, threshold: float = THRESHOLD
) -> tuple[int, float] | None:
    """(period in points, its autocorrelation), or None when the series shows no recurrence
    between `min_lag` and `len(series) - min_overlap` (see the module docstring)."""
    x = np.asarray(series, dtype=np.float64)
    if x.size - max(1, min_overlap) <= max(min_lag, 1):
        return None  # no lag to judge: no arithmetic
    return peak_lag(autocorrelation(x), min_lag, min_overlap, threshold)


def peak_lag(
    r: FloatArray, min_lag: int, min_overlap: int, threshold: float = THRESHOLD
) -> tuple[int, float] | None:
    """`find_period` on an `autocorrelation` already computed (a caller that also reads r at
    other lags computes it once)."""
    top = r.size - max(1, min_overlap)
    if top <= max(min_lag, 1):
        return None
    # A lag is a candidate once r has been below zero at some shorter lag (the pattern ended).
    crossed = np.maximum.accumulate(r < 0.0)
    lags = np.arange(max(min_lag, 1), top)
    left, here, right = r[lags - 1], r[lags], r[np.minimum(lags + 1, r.size - 1)]
    peaks = lags[crossed[lags] & (here >= left) & (here >= right) & (here >= threshold)]
    if peaks.size == 0:
        return None
    # Ranked on the evidence: r weighted by the share of the series the lag is judged on, so a
    # far lag that a short overlap happens to fit does not beat the period it is near a
    # multiple of, and a multiple (judged on less) ranks below the period itself.
    evidence = r[peaks] * (r.size - peaks) / r.size
    lag = int(peaks[evidence >= HARMONIC_SHARE * float(evidence.max())][0])
    return lag, float(r[lag])
