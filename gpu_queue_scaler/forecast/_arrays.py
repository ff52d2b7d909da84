"""Array types and input checks shared by the forecasters.

Kept in one place so every model treats bad input the same way: a non-finite value (NaN, +-inf)
is a missing observation, never a number to learn from.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
IntArray = NDArray[np.int64]
State = dict[str, NDArray[Any]]


def observe(y: ArrayLike, n_series: int) -> tuple[FloatArray, BoolArray]:
    """One observation per series -> (values with missing set to 0.0, mask of present ones).

    Zeroing the missing values keeps later arithmetic free of NaN/inf warnings; the mask decides
    which results are kept.
    """
    values = np.asarray(y, dtype=np.float64)
    if values.shape != (n_series,):
        raise ValueError(f"expected shape ({n_series},), got {values.shape}")
    ok = np.isfinite(values)
    return np.where(ok, values, 0.0), ok


def as_history(history: ArrayLike, n_series: int) -> FloatArray:
    """A warm-start history, shape (n_series, T)."""
    values = np.asarray(history, dtype=np.float64)
    if values.ndim != 2 or values.shape[0] != n_series:
        raise ValueError(f"expected shape ({n_series}, T), got {values.shape}")
    return values


def check_steps(h: int) -> int:
    """A forecast length: a positive number of bins."""
    if isinstance(h, bool) or not isinstance(h, int | np.integer) or h < 1:
        raise ValueError(f"h must be a positive integer, got {h!r}")
    return int(h)


def check_count(n: int, what: str) -> int:
    """A positive integer constructor argument (series count, window, period...)."""
    if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 1:
        raise ValueError(f"{what} must be a positive integer, got {n!r}")
    return int(n)


def check_unit(x: float, what: str, *, closed_low: bool = False) -> float:
    """A smoothing weight in (0, 1] (or [0, 1] with closed_low)."""
    value = float(x)
    low_ok = value >= 0.0 if closed_low else value > 0.0
    if not (low_ok and value <= 1.0):
        raise ValueError(f"{what} must be in {'[' if closed_low else '('}0, 1], got {x!r}")
    return value
