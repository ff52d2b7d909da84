"""Load against real servers: KEDA-like polls of a running scaler (`scaler bench load`) and a
trace's requests against an inference endpoint (`scaler bench loadgen`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def quantile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile (a value that was observed; NaN for none), the one both
    load reports print, so their p50 and p99 mean the same thing."""
    if not values:
        return math.nan
    return float(np.quantile(np.asarray(values, dtype=np.float64), q, method="inverted_cdf"))
