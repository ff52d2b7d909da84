"""One forecaster for many workloads: a row each, one update per bin for all of them.

Why: the forecaster is vectorised across series (`gpu_queue_scaler.forecast`): an update costs a
fixed number of numpy calls whatever the number of series, so 1,000 series cost a few microseconds
each, where one series on its own pays the whole per-call overhead (most of a millisecond). A
forecaster per workload (`gpu_queue_scaler.decision.outlook.NeedForecast`) would make every workload
pay that. So the engine gives every workload a row of a `ForecastBank` shared by all workloads with
the same bins (forecast step, horizon in bins, season in bins), and each bin is closed for all rows
by one update + predict.

The numbers are those of a `NeedForecast` fed the same needs (tested with ==): rows are
independent, the forecaster's bin clock is the wall-clock bin index (so a row's ring positions and
seasonal phases do not depend on when it joined), and a row is reset to a new forecaster's state
at its first observation.

When a bin closes. Workloads' loops tick independently on one wall-clock grid, so the bank closes
its open bin lazily: the first observation (from any row) at a time in a later bin closes every
bin before that one, for every row, with the mean of the needs each row observed in it (NaN, i.e.
missing, for a row that observed none, or has been released), then forecasts every row once.
A row's outlook changes when that row first observes in a new bin (as a `NeedForecast`'s would),
not when another row closes the bin. A need observed at a time in a bin that is already closed
(a loop whose tick was delayed past another loop's first tick of the next bin) can no longer be
learnt: it is dropped and counted in `dropped`; the row then carries on in the open bin. With one
row (a workload without an engine) nothing is ever late.

Gaps: a row that observes nothing for more than `MAX_GAP_BINS` bins restarts, as a `NeedForecast`
does; a bank no row observed for that long restarts its clock at the next observation (every row
would restart anyway) instead of closing every empty bin in between.

Warm start: a workload replays its history into a `NeedForecast` of its own (history is older than
the bank's open bin), then `adopt` moves that state into its row, both brought to the same bin
first, so the row holds exactly what it would hold had the workload been live all along.

Rows are reused after `release` (the lowest free one first); capacity doubles when none is free.
Deterministic, no I/O, no clock: time comes in as an argument.

Cost. An observation is a few list reads and writes (no numpy, no object built); the work per bin
is done once for all rows when the bin closes: the means, the forecaster's update, the peaks of
its forecast, every row's next `Outlook` (what a row gets at its first observation in the bin),
and the reset of every row that started over since the last update (a row's reset is due before
the update after its first observation; nothing reads its state in between).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import repeat

import numpy as np

from gpu_queue_scaler.decision.outlook import (
    MAX_GAP_BINS,
    NeedForecast,
    Outlook,
    horizon_bins,
    period_bins,
)
from gpu_queue_scaler.forecast import ScalerForecaster

BankKey = tuple[float, int, int | None]  # forecast step (s), horizon (bins), season (bins)

_floor = math.floor
_isfinite = math.isfinite
_make_outlook = Outlook._make


def _outlooks(
    point_max: Sequence[float],
    upper_max: Sequence[float],
    model: Sequence[str],
    horizon_s: Sequence[float],
    made_at: float,
) -> list[Outlook]:
    """`Outlook(point_max[i], upper_max[i], model[i], horizon_s[i], made_at)` for every row i,
    built in one C loop (`map` over `Outlook._make`): this was most of the bank's cost per row
    and bin."""
    if not (len(point_max) == len(upper_max) == len(model) == len(horizon_s)):
        raise ValueError("one value per row in every field")
    return list(map(_make_outlook, zip(point_max, upper_max, model, horizon_s, repeat(made_at))))


class ForecastBank:
    """Rows of one `ScalerForecaster` for workloads with the same forecast step, horizon bins and
    season bins. See the module docstring for when bins close.

    Per observation the work is a few list reads and writes; everything per bin (the means, the
    update, the forecasts, every row's next `Outlook`, the resets of rows that started over) is
    done once for all rows when the bin closes."""

    def __init__(self, step_s: float, horizon: int, period: int | None) -> None:
        self.step_s = step_s
        self.horizon = horizon
        self.period = period
        self.bin: int | None = None  # the open bin: every bin before it is closed
        self.dropped = 0  # needs observed for a bin already closed
        self.updates = 0  # bins closed (one forecaster update each, for every row)
        self._forecaster: ScalerForecaster | None = None  # built at the first bin (its origin)
        self._free: list[int] = []  # a heap of free rows: the lowest is reused first
        self._in_use: list[bool] = []
        self._total: list[float] = []  # the open bin's sum and count of needs, per row
        self._count: list[float] = []  # (whole numbers, as floats: no conversion per bin)
        self._row_bin: list[int | None] = []  # the bin of the row's last observation
        self._outlook: list[Outlook | None] = []
        self._horizon_s: list[float] = []  # per row: Outlook.horizon_s (same bins, any seconds)
        # Per row, the outlook of the last forecast (made when the open bin opened): what a row
        # that observed in an earlier bin gets at its first observation in the open one.
        self._latest: list[Outlook] = []
        self._stale: set[int] = set()  # rows that started over: reset before the next update

    @property
    def capacity(self) -> int:
        return len(self._total)

    def __len__(self) -> int:
        """Rows in use."""
        return self.capacity - len(self._free)

    # --- rows ----------------------------------------------------------------------------------

    def add(self, horizon_s: float) -> int:
        """A row for a new workload (learns from its first observation on)."""
        if not self._free:
            self._grow(max(1, self.capacity))
        row = heapq.heappop(self._free)
        self._in_use[row] = True
        self._horizon_s[row] = horizon_s
        self._row_bin[row] = None
        self._outlook[row] = None
        return row

    def release(self, row: int) -> None:
        """The workload is gone: its row learns nothing (NaN) until reused, and is reset then."""
        self._check(row)
        self._in_use[row] = False
        self._clear(row)
        self._row_bin[row] = None
        self._outlook[row] = None
        heapq.heappush(self._free, row)

    def _grow(self, n: int) -> None:
        start = self.capacity
        if self._forecaster is not None:
            self._forecaster.add_rows(n)
        self._total += [0.0] * n
        self._count += [0.0] * n
        self._row_bin += [None] * n
        self._outlook += [None] * n
        self._horizon_s += [0.0] * n
        self._in_use += [False] * n
        for row in range(start, start + n):
            heapq.heappush(self._free, row)

    def _check(self, row: int) -> None:
        if not (0 <= row < len(self._in_use) and self._in_use[row]):
            raise ValueError(f"row {row} is not in use")

    def _clear(self, row: int) -> None:
        self._total[row] = 0.0
        self._count[row] = 0.0

    # --- the bin clock -------------------------------------------------------------------------

    def _restart(self, index: int) -> None:
        """Start the clock at bin `index` with a new forecaster; every row starts over."""
        self._forecaster = ScalerForecaster(self.capacity, self.horizon, self.period, origin=index)
        self.bin = index
        self._stale.clear()
        self._latest = []
        self._total = [0.0] * self.capacity
        self._count = [0.0] * self.capacity
        self._row_bin = [None] * self.capacity
        self._outlook = [None] * self.capacity

    def _advance(self, index: int) -> None:
        """Close the bins before `index` for every row (one update each), then forecast."""
        forecaster = self._forecaster
        assert forecaster is not None
        assert self.bin is not None
        if self._stale:  # rows reset since the last update: as a new forecaster's rows
            forecaster.reset_rows(sorted(self._stale))
            self._stale.clear()
        while self.bin < index:
            total = np.fromiter(self._total, np.float64, self.capacity)
            count = np.fromiter(self._count, np.float64, self.capacity)
            means = np.divide(total, count, out=np.full(total.size, np.nan), where=count > 0)
            forecaster.update(means)
            self.updates += 1
            self.bin += 1
            self._total = [0.0] * self.capacity
            self._count = [0.0] * self.capacity
        point_max, upper_max = forecaster.peaks(self.horizon)
        self._latest = _outlooks(
            point_max.tolist(),
            upper_max.tolist(),
            forecaster.choice(),
            self._horizon_s,
            self.bin * self.step_s,
        )

    def _move_to(self, index: int) -> None:
        if self.bin is None or index - self.bin > MAX_GAP_BINS:
            self._restart(index)
        elif index > self.bin:
            self._advance(index)

    def _start_row(self, row: int, index: int) -> None:
        """The row's first observation (or its first after a gap): it starts over, from bin
        `index` (its forecaster row is reset before the next update)."""
        self._stale.add(row)
        self._clear(row)
        self._row_bin[row] = index
        self._outlook[row] = None

    # --- what a workload calls -----------------------------------------------------------------

    def outlook(self, row: int) -> Outlook | None:
        """The row's outlook as of its last observation."""
        return self._outlook[row]

    def observe(self, row: int, at: float, need: float | None) -> Outlook | None:
        """Add the need the row's workload decided at `at` (None: no fresh signal); returns its
        outlook, as `NeedForecast.observe` does."""
        if not (0 <= row < len(self._in_use) and self._in_use[row]):
            self._check(row)
        # gpu_queue_scaler.decision.outlook.bin_index, without the call
        index = _floor(at / self.step_s)
        if index != self.bin:  # the first observation of a later bin, or a late one
            self._move_to(index)
            assert self.bin is not None
            if index < self.bin:  # that bin is closed: too late to learn from
                if need is not None and _isfinite(need):
                    self.dropped += 1
                index, need = self.bin, None
        last = self._row_bin[row]
        if last == index:
            outlook = self._outlook[row]
        elif last is None or index - last > MAX_GAP_BINS:  # its first observation, or a gap
            self._start_row(row, index)
            outlook = None
        else:  # its first observation in this bin: the forecast made when the bin opened
            self._row_bin[row] = index
            outlook = self._outlook[row] = self._latest[row]
        if need is not None and _isfinite(need):
            self._total[row] += need
            self._count[row] += 1.0
        return outlook

    def adopt(self, row: int, private: NeedForecast) -> None:
        """Load the row with a `NeedForecast`'s state (a workload's replayed history), both brought
        to the same bin first: the later of the two, as their next observation would."""
        self._check(row)
        if (private.step_s, private.horizon, private.period) != (
            self.step_s,
            self.horizon,
            self.period,
        ):
            raise ValueError("the forecast does not fit this bank's bins")
        self._clear(row)
        self._row_bin[row] = None
        self._outlook[row] = None
        if private.bin is None:
            return  # nothing learnt: the row starts at its first observation
        if self.bin is not None and self.bin - private.bin > MAX_GAP_BINS:
            return  # it would restart at its next observation anyway
        self._move_to(private.bin)
        assert self._forecaster is not None
        assert self.bin is not None
        private.advance(self.bin)
        self._forecaster.copy_rows([row], private.forecaster, [0])
        self._stale.discard(row)  # a reset now would undo the copy
        self._total[row] = private.total
        self._count[row] = float(private.count)
        self._row_bin[row] = private.bin
        self._outlook[row] = private.outlook


class BankedForecast:
    """A workload's row in a bank: what a `gpu_queue_scaler.decision.decider.Decider` holds in place
    of a `NeedForecast` (same `observe` and `outlook`)."""

    def __init__(
        self, banks: ForecastBanks, key: BankKey, row: int, horizon_s: float, period_s: float | None
    ) -> None:
        self._banks = banks
        self.key = key
        self.bank = banks.bank(key)
        self.row = row
        self.step_s = key[0]
        self.horizon_s = horizon_s
        self.period_s = period_s
        self.released = False
        # observe(at, need) -> Outlook | None: the bank's, for this row (no call in between).
        self.observe: Callable[[float, float | None], Outlook | None] = partial(
            self.bank.observe, row
        )

    @property
    def outlook(self) -> Outlook | None:
        return self.bank.outlook(self.row)

    def adopt(self, private: NeedForecast) -> None:
        self.bank.adopt(self.row, private)

    def release(self) -> None:
        if not self.released:
            self.released = True
            self._banks.release(self)


class ForecastBanks:
    """The banks of one engine, one per (forecast step, horizon bins, season bins); a bank goes
    when its last row is released."""

    def __init__(self) -> None:
        self._banks: dict[BankKey, ForecastBank] = {}

    def bank(self, key: BankKey) -> ForecastBank:
        bank = self._banks.get(key)
        if bank is None:
            bank = self._banks[key] = ForecastBank(*key)
        return bank

    def join(self, step_s: float, horizon_s: float, period_s: float | None) -> BankedForecast:
        """A row for a workload with these forecast settings."""
        key: BankKey = (step_s, horizon_bins(step_s, horizon_s), period_bins(step_s, period_s))
        row = self.bank(key).add(horizon_s)
        return BankedForecast(self, key, row, horizon_s, period_s)

    def release(self, seat: BankedForecast) -> None:
        seat.bank.release(seat.row)
        if not len(seat.bank) and self._banks.get(seat.key) is seat.bank:
            del self._banks[seat.key]

    def __iter__(self) -> Iterator[ForecastBank]:
        return iter(list(self._banks.values()))
