"""CPU per row of the scaler's forecaster at 1,000 rows, and through the engine's forecast bank.

Usage: python bench/forecast_cpu.py [--rows 1000] [--horizon 12] [--period P] [--old DIR]

Times update + predict of one `ScalerForecaster` with `--rows` rows (a noisy series per row, 5%
missing), and a `ForecastBank(10.0, horizon, period)` with as many rows, each observing once per
bin (the first observation of a bin closes the last for every row). With `--old DIR`, DIR holds a
copy of `gpu_queue_scaler/forecast` as the package `oldforecast` (its `gpu_queue_scaler.forecast`
imports renamed), and both are timed in the same run, interleaved, the best of `--repeat` runs each,
with their ratio.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Callable
from typing import Any

import gpu_queue_scaler.decision.bank as bank_module
import numpy as np
from gpu_queue_scaler.forecast import ScalerForecaster

WARM = 200
TIMED = 200


def _series(rows: int, bins: int) -> np.ndarray:
    rng = np.random.default_rng(0)
    noise = 1 + 0.3 * rng.standard_normal((rows, bins))
    y = np.maximum(rng.gamma(2.0, 3.0, (rows, 1)) * noise, 0)
    y[rng.random(y.shape) < 0.05] = np.nan
    return y


def forecaster_cpu(cls: Any, y: np.ndarray, horizon: int, period: int | None) -> float:
    """CPU seconds per row of one update + predict."""
    forecaster = cls(y.shape[0], horizon, period)
    for k in range(WARM):
        forecaster.update(y[:, k])
        forecaster.predict(horizon)
    start = time.process_time()
    for k in range(WARM, WARM + TIMED):
        forecaster.update(y[:, k])
        forecaster.predict(horizon)
    return (time.process_time() - start) / TIMED / y.shape[0]


def bank_cpu(cls: Any, y: np.ndarray, horizon: int, period: int | None) -> float:
    """CPU seconds per row and bin through a ForecastBank (the forecaster class patched in; NaN
    for a forecaster older than the bank's reads, `peaks`)."""
    if not hasattr(cls, "peaks"):
        return float("nan")
    saved = bank_module.ScalerForecaster
    bank_module.ScalerForecaster = cls
    try:
        bank = bank_module.ForecastBank(10.0, horizon, period)
        rows = [bank.add(horizon * 10.0) for _ in range(y.shape[0])]
        values = y.T.tolist()

        def run(bins: range) -> None:
            for k in bins:
                at = (k + 0.5) * 10.0
                for row, value in zip(rows, values[k], strict=True):
                    bank.observe(row, at, value)

        run(range(WARM))
        start = time.process_time()
        run(range(WARM, WARM + TIMED))
        return (time.process_time() - start) / TIMED / y.shape[0]
    finally:
        bank_module.ScalerForecaster = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--horizon", type=int, default=12)
    parser.add_argument("--period", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old", help="a directory holding the package oldforecast")
    args = parser.parse_args()
    y = _series(args.rows, WARM + TIMED + 1)
    classes: dict[str, Any] = {"new": ScalerForecaster}
    if args.old:
        sys.path.insert(0, args.old)
        classes = {"old": importlib.import_module("oldforecast").ScalerForecaster, **classes}
    measures: dict[str, Callable[[Any, np.ndarray, int, int | None], float]] = {
        "forecaster": forecaster_cpu,
        "bank": bank_cpu,
    }
    print(f"rows {args.rows}, horizon {args.horizon}, period {args.period}: us CPU per row")
    for what, measure in measures.items():
        best = {name: np.inf for name in classes}
        for _ in range(args.repeat):
            for name, cls in classes.items():
                value = measure(cls, y, args.horizon, args.period)
                best[name] = value if np.isnan(value) else min(best[name], value)
        cells = [f"{name} {best[name] * 1e6:.2f}" for name in classes]
        if "old" in best:
            cells.append(f"old/new {best['old'] / best['new']:.2f}x")
        print(f"  {what}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
