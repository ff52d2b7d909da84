"""Row operations on a vectorised forecaster: add series, reset some, copy one's state from another.

Every model (and `ScalerForecaster`) keeps one row per series in a few arrays, and every update
treats the rows independently (elementwise arithmetic and per-row reductions). So many workloads
can share one forecaster, a row each (`gpu_queue_scaler.decision.bank`), if rows can be added as
workloads start, cleared when one is reused, and loaded from another forecaster's row (a workload
warmed up on its own history joins the shared one). Those three operations live here, once: each
class lists its per-series arrays and the axis that indexes the series (`_ROWS`), and the fresh
state of a row is whatever `_reset` builds, so a reset row is the row of a new forecaster, bit for
bit.

Nothing here changes what an update computes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, ClassVar, Self

import numpy as np
from numpy.typing import NDArray

from gpu_queue_scaler.forecast._arrays import IntArray


def as_rows(rows: Sequence[int] | NDArray[Any], n_series: int) -> IntArray:
    """Row indices (or a boolean mask of length n_series) -> distinct indices in range."""
    index = np.asarray(rows)
    if index.size == 0:
        return np.zeros(0, dtype=np.int64)
    if index.dtype == np.bool_:
        if index.shape != (n_series,):
            raise ValueError(f"mask must have shape ({n_series},), got {index.shape}")
        return np.flatnonzero(index).astype(np.int64)
    index = index.astype(np.int64, casting="same_kind").reshape(-1)
    if index.size and (index.min() < 0 or index.max() >= n_series):
        raise ValueError(f"rows out of range 0..{n_series - 1}: {index.tolist()}")
    if np.unique(index).size != index.size:
        raise ValueError(f"rows repeat: {index.tolist()}")
    return index


def _at(axis: int, rows: IntArray) -> tuple[Any, ...]:
    return (slice(None),) * axis + (rows,)


class RowState:
    """Mixin: `add_rows`, `reset_rows`, `copy_rows` from `_ROWS` (attribute -> series axis)."""

    _ROWS: ClassVar[dict[str, int]] = {}
    n_series: int

    def _reset(self) -> None:
        raise NotImplementedError

    def _fresh(self, n: int) -> Self:
        """A forecaster like this one (same parameters) with n new rows."""
        fresh = copy.copy(self)
        fresh.n_series = n
        fresh._reset()
        return fresh

    def _settings(self) -> dict[str, object]:
        """The scalar attributes (parameters, bin clock): equal in forecasters whose rows can be
        exchanged."""
        return {
            key: value
            for key, value in vars(self).items()
            if key not in ("n_series", "origin") and isinstance(value, int | float | str | None)
        }

    def _compatible(self, other: object) -> bool:
        """Same class, parameters and bin clock, so a row means the same thing in both."""
        return type(other) is type(self) and self._settings() == other._settings()

    def _extend(self, other: Self) -> None:
        for name, axis in self._ROWS.items():
            setattr(self, name, np.concatenate([getattr(self, name), getattr(other, name)], axis))
        self.n_series += other.n_series

    def _assign(self, rows: IntArray, other: Self, other_rows: IntArray) -> None:
        for name, axis in self._ROWS.items():
            getattr(self, name)[_at(axis, rows)] = getattr(other, name)[_at(axis, other_rows)]

    def add_rows(self, n: int) -> None:
        """Append n rows, each as a new forecaster's (nothing seen yet)."""
        if n > 0:
            self._extend(self._fresh(n))

    def reset_rows(self, rows: Sequence[int] | NDArray[Any]) -> None:
        """Forget everything the given rows (indices or a mask) learnt: each becomes the row of a
        new forecaster started now. Other rows are untouched."""
        index = as_rows(rows, self.n_series)
        if index.size:
            self._assign(index, self._fresh(index.size), np.arange(index.size))

    def copy_rows(
        self,
        rows: Sequence[int] | NDArray[Any],
        source: Self,
        source_rows: Sequence[int] | NDArray[Any],
    ) -> None:
        """Load rows `rows` with `source`'s rows `source_rows` (same parameters and bin clock):
        afterwards each behaves exactly as the source row would have."""
        if not self._compatible(source):
            raise ValueError(f"cannot copy rows from a different forecaster: {source!r}")
        index = as_rows(rows, self.n_series)
        source_index = as_rows(source_rows, source.n_series)
        if index.size != source_index.size:
            raise ValueError(f"{index.size} rows to fill from {source_index.size}")
        if index.size:
            self._assign(index, source, source_index)
