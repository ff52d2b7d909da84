"""A workload's demand over the last hours, and the period found in it (`seasonPeriodSeconds:
auto`).

Why here and not in the forecaster: the forecaster's seasonal models are built for one period
and share a bank with every workload of the same shape, so a period found later means a new
forecast seat. This keeps what that seat needs: the demand in bins of the forecast's step for
the last `HISTORY_S` (a ring allocated once: 17 KB at the default 10 s step, and as much again
for the arrival rate beside it), so the new seat learns it at once (`replay_into`)
instead of waiting two periods more. The same ring is what `forecast: wake` reads (`outlook`):
the demand one period ago once the series has run one period, and two periods ago too once it
has run two, with no forecaster seat at all. Deterministic, no I/O, no clock.

The period is searched in the arrival rate (a second ring of the same bins), not in the demand:
the demand of a burst the fleet met late is the backlog's drain, a cold start after the burst
(the token rates count what is served), so two bursts a period apart, one met on time and one
late, read as a period longer by a cold start. What clients send has the period as it is. A
workload with no arrival rate is searched on its demand.

The search (`gpu_queue_scaler.forecast.period`) runs when a minute of bins closes,
over periods from `MIN_PERIOD_S` to what the history can judge (the series and its shift
overlapping by `MIN_OVERLAP_S`). A period found stays until another recurs clearly more
(`SWITCH_MARGIN` of autocorrelation): each switch restarts the forecast seat on the history, so
it must not flap between near-equal lags. A lag near the period found is a refinement of it and
needs less (`REFINE_MARGIN`). A pattern that pauses (a weekend) keeps its period.
"""

from __future__ import annotations

import math

import numpy as np

from gpu_queue_scaler.decision.outlook import (
    MAX_GAP_BINS,
    SEASON_MODEL,
    NeedForecast,
    Outlook,
    horizon_bins,
)
from gpu_queue_scaler.forecast.period import autocorrelation, peak_lag

HISTORY_S = 6 * 3600.0  # as the engine's forecast warm-up (engine.schedule.FORECAST_WARMUP_MAX_S)
MIN_PERIOD_S = 600.0  # a shorter cycle is inside a few cold starts: the reactive need follows it
MIN_OVERLAP_S = 1200.0  # a lag is judged on at least this much of the series and its shift
SEARCH_EVERY_S = 60.0
SWITCH_MARGIN = 0.1
# A lag within REFINE_SHARE of the period found is the same period read more precisely: it is
# taken once it recurs REFINE_MARGIN more. A period found from its first two occurrences can be
# off by a minute (the first one seen may be cut, or longer), and a burst's own minutes then
# make the wrong lag a close second that SWITCH_MARGIN would never let go.
REFINE_SHARE = 0.1
REFINE_MARGIN = 0.02


def held(series: np.ndarray, limit: int) -> np.ndarray:
    """The series with each gap of at most `limit` bins holding the value before it: a demand
    decided every 30 s holds until the next tick, so 10 s bins without a tick are not unknown
    (left unknown, they would make every lag that aligns the ticks look like a period)."""
    known = np.isfinite(series)
    if known.all() or not known.any():
        return series
    index = np.arange(series.size)
    last = np.maximum.accumulate(np.where(known, index, -1))
    fill = (~known) & (last >= 0) & (index - last <= limit)
    out = series.copy()
    out[fill] = series[last[fill]]
    return out


def minute_means(series: np.ndarray, every: int) -> np.ndarray:
    """Means of consecutive groups of `every` points, the newest group last and whole (a
    partial oldest group is left out); NaN where a group has no known point."""
    if every <= 1:
        return series
    groups = series[series.size % every :].reshape(-1, every)
    known = np.isfinite(groups)
    counts = known.sum(axis=1)
    sums = np.where(known, groups, 0.0).sum(axis=1)
    means: np.ndarray = np.divide(
        sums, counts, out=np.full(counts.size, math.nan), where=counts > 0
    )
    return means


class Season:
    """Bins of demand at `step_s` for the last HISTORY_S (with `search` or `keep`), how long
    the series has run, and the period found in it (with `search`)."""

    def __init__(self, step_s: float, search: bool, keep: bool = False) -> None:
        self.step_s = step_s
        self.search = search
        self.keep = keep
        size = max(1, round(HISTORY_S / step_s)) if search or keep else 0
        # Row 0 the demand (what the outlook reads), row 1 the arrival rate (what is searched),
        # written together: a bin closes, is skipped or restarts for both at once.
        self._rings = np.full((2, size), math.nan)
        self._ring, self._rates = self._rings
        self._outlook: tuple[tuple[int, float, float], Outlook | None] | None = None
        self.bin: int | None = None  # the open bin
        self.first_bin = 0
        self._total = 0.0
        self._count = 0
        self._rate_total = 0.0
        self._rate_count = 0
        self._searched_at: int | None = None
        self.period_s: float | None = None  # found (with `search`)
        self.score = 0.0  # the autocorrelation at the period when it was last confirmed

    @property
    def seen_s(self) -> float:
        """How long the series has run (since its first bin, or its last restart)."""
        return 0.0 if self.bin is None else (self.bin - self.first_bin) * self.step_s

    def covers(self, period_s: float) -> bool:
        """The series has run two periods (a seasonal model's forecast is then its own)."""
        return self.seen_s >= 2 * period_s

    def observe(
        self, at: float, demand: float | None, rate: float | None = None, search: bool = True
    ) -> bool:
        """Add the demand decided at `at` and the arrival rate it was decided on; True when
        the period found changed. `search=False` leaves the search to `find` (a replay: one
        search at its end, not one per minute replayed)."""
        index = math.floor(at / self.step_s)  # outlook.bin_index, without the call
        closed = False
        if index != self.bin:
            if self.bin is None or index - self.bin > MAX_GAP_BINS:  # a restart (NeedForecast's)
                self._rings[:] = math.nan
                self.bin = self.first_bin = index
                self._total, self._count = 0.0, 0
                self._rate_total, self._rate_count = 0.0, 0
            elif index > self.bin:
                self._close(index)
                closed = True
        if demand is not None and math.isfinite(demand):
            self._total += demand
            self._count += 1
        if rate is not None and math.isfinite(rate):
            self._rate_total += rate
            self._rate_count += 1
        return closed and search and self.search and self._search()

    def missing(self) -> tuple[float, float] | None:
        """The span of the history this season could hold and does not, before its first bin
        (start, end in seconds), or None: what a warm start recalls (`recall`)."""
        if self.bin is None or not self._ring.size:
            return None
        start = (self.bin - self._ring.size) * self.step_s
        end = self.first_bin * self.step_s
        return (start, end) if end > start else None

    def recall(self, at: np.ndarray, demand: np.ndarray, rate: np.ndarray) -> bool:
        """Put older history (time order; NaN where a value is unknown) before the first bin
        held, as far as the ring reaches (`missing`), in a few array operations instead of an
        observation each; then search once. True when the period found changed. A warm
        start's: after its replay and first decision, so that first answer waits for none of it
        (`Decider.recall`)."""
        gap = self.missing()
        if gap is None or not at.size:
            return False
        assert self.bin is not None
        index = np.floor(at / self.step_s).astype(np.int64)
        first = max(int(index[0]), self.bin - self._ring.size)
        keep = (index >= first) & (index < self.first_bin)
        if not keep.any():
            return False
        index, demand, rate = index[keep] - first, demand[keep], rate[keep]
        bins = np.arange(first, self.first_bin) % self._ring.size
        _fill(self._ring, bins, index, demand)
        _fill(self._rates, bins, index, rate)
        self.first_bin = first
        self._searched_at = None  # the history changed: search now
        return self.find()

    def _close(self, index: int) -> None:
        """Close the open bin and any after it before `index` (nothing decided: NaN)."""
        assert self.bin is not None
        size = self._ring.size
        if size:
            self._rings[:, self.bin % size] = (
                self._total / self._count if self._count else math.nan,
                self._rate_total / self._rate_count if self._rate_count else math.nan,
            )
            if index > self.bin + 1:
                gap = np.arange(self.bin + 1, min(index, self.bin + 1 + size)) % size
                self._rings[:, gap] = math.nan
        self._total, self._count = 0.0, 0
        self._rate_total, self._rate_count = 0.0, 0
        self.bin = index

    def history(self, ring: np.ndarray | None = None) -> np.ndarray:
        """The closed bins held, oldest first (NaN: no demand decided in that bin); of the
        arrival rate with `ring=self._rates`."""
        ring = self._ring if ring is None else ring
        if self.bin is None or not ring.size:
            return np.zeros(0)
        n = min(ring.size, self.bin - self.first_bin)
        return np.take(ring, np.arange(self.bin - n, self.bin) % ring.size)

    def find(self) -> bool:
        """Search now (with `search`, once a minute at most); True when the period changed."""
        return self.search and self.bin is not None and self._search()

    def _search(self) -> bool:
        """Search the minute means of the history (the period to the minute is all a seasonal
        model needs, and the search costs a sixth of one on 10 s bins)."""
        assert self.bin is not None
        every = max(1, round(SEARCH_EVERY_S / self.step_s))
        if self._searched_at is not None and self.bin - self._searched_at < every:
            return False
        self._searched_at = self.bin
        unit = every * self.step_s  # seconds per point searched
        min_lag, min_overlap = math.ceil(MIN_PERIOD_S / unit), math.ceil(MIN_OVERLAP_S / unit)
        bins = min(self._ring.size, self.bin - self.first_bin)
        if bins // every <= min_lag + min_overlap:
            return False  # too short to judge any period: no arithmetic
        series = self.history(self._rates)
        if not np.isfinite(series).any():
            series = self.history()  # no arrival rate: the demand's own period
        r = autocorrelation(minute_means(held(series, every), every))
        found = peak_lag(r, min_lag=min_lag, min_overlap=min_overlap)
        if found is None:
            return False
        lag, score = found
        period_s = lag * unit
        if period_s != self.period_s and self.period_s is not None:
            current = round(self.period_s / unit)
            near = abs(period_s - self.period_s) <= REFINE_SHARE * self.period_s
            margin = REFINE_MARGIN if near else SWITCH_MARGIN
            if current < r.size and score < r[current] + margin:
                return False
        changed = period_s != self.period_s
        self.period_s, self.score = period_s, score
        return changed

    def outlook(self, period_s: float, horizon_s: float) -> Outlook | None:
        """The seasonal outlook `forecast: wake` reads: the demand over the coming horizon as it
        was one period ago (the point) and the higher of one and two periods ago (the bound),
        from one period ago alone while the history holds less than two (None before one, or
        when two do not fit HISTORY_S). One period is enough to wake for: a burst that recurred
        once is read a period after it, not two (waiting for two left the second burst of a
        pattern a cold start late, and the wake costs a horizon's replicas once if it does not
        come back).
        A recurring burst is forecast whole, a horizon ahead, from the demand itself; a burst
        that did not come back a period ago drops out of the point at once. O(horizon) per bin,
        no forecaster seat: `wake` runs for every workload by default."""
        if self.bin is None or not self._ring.size or self.seen_s < period_s:
            return None
        period = round(period_s / self.step_s)
        if period < 1 or 2 * period > self._ring.size:
            return None
        key = (self.bin, period_s, horizon_s)
        if self._outlook is not None and self._outlook[0] == key:
            return self._outlook[1]
        ahead = horizon_bins(self.step_s, horizon_s)
        peaks = []
        for back in (period, 2 * period) if self.covers(period_s) else (period,):
            start = self.bin - back
            window = self._ring[np.arange(start, min(start + ahead, self.bin)) % self._ring.size]
            known = window[np.isfinite(window)]
            peaks.append(float(known.max()) if known.size else 0.0)
        made = Outlook(
            point_max=peaks[0],
            upper_max=max(peaks),
            model=SEASON_MODEL,
            horizon_s=horizon_s,
            made_at=self.bin * self.step_s,
        )
        self._outlook = (key, made)
        return made

    def replay_into(self, forecast: NeedForecast) -> None:
        """Feed the bins held, then the open bin's demand so far, to a fresh forecast."""
        if self.bin is None:
            return
        series = self.history()
        first = self.bin - series.size
        for offset, mean in enumerate(series.tolist()):
            forecast.observe((first + offset) * self.step_s, mean if math.isfinite(mean) else None)
        forecast.resume(self.bin, self._total, self._count)


def _fill(ring: np.ndarray, bins: np.ndarray, index: np.ndarray, values: np.ndarray) -> None:
    """Write the mean of `values` per bin (`index`: 0 for `bins[0]`) into `ring` at `bins`; NaN
    for a bin without a known value."""
    known = np.isfinite(values)
    totals = np.bincount(index[known], values[known], minlength=bins.size)
    counts = np.bincount(index[known], minlength=bins.size)
    with np.errstate(invalid="ignore", divide="ignore"):
        ring[bins] = np.where(counts > 0, totals / counts, math.nan)
