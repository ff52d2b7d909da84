"""One contract, every forecaster: the properties the scaler relies on, checked the same way."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from gpu_queue_scaler.forecast import (
    ForecastResult,
    HoltDamped,
    Model,
    MovingAverage,
    Naive,
    ScalerForecaster,
    SeasonalHolt,
    SeasonalNaive,
    SimpleExponential,
)

H = 6
PERIOD = 5


@dataclass(frozen=True)
class Spec:
    cls: Any
    params: dict[str, Any] = field(default_factory=dict)

    def make(self, n: int) -> Any:
        return self.cls(n, **self.params)

    @property
    def id(self) -> str:
        return str(self.cls.name)


SPECS = [
    Spec(Naive),
    Spec(MovingAverage, {"window": 4}),
    Spec(SeasonalNaive, {"period": PERIOD}),
    Spec(SimpleExponential),
    Spec(HoltDamped),
    Spec(SeasonalHolt, {"period": PERIOD}),
    Spec(ScalerForecaster, {"horizon": H, "period": PERIOD, "min_errors": 3}),
]


def outputs(result: Any) -> dict[str, np.ndarray]:
    """Every array a forecaster returns: the point forecast, and bounds where it has them."""
    if isinstance(result, ForecastResult):
        return {"point": result.point, "upper": result.upper, "lower": result.lower}
    return {"point": result}


def same(a: Any, b: Any) -> bool:
    left, right = outputs(a), outputs(b)
    names_equal = not isinstance(a, ForecastResult) or a.model == b.model
    return names_equal and all(np.array_equal(left[key], right[key]) for key in left)


def history(n: int, t: int, seed: int) -> np.ndarray:
    """Non-negative bursty demand with a cycle, so every model's machinery is exercised."""
    rng = np.random.default_rng(seed)
    cycle = 20 + 15 * np.sin(2 * np.pi * np.arange(t) / PERIOD)
    return rng.poisson(cycle[None, :] * rng.uniform(0.5, 2.0, (n, 1))).astype(float)


def stepped(make: Callable[[], Any], ys: np.ndarray) -> Any:
    model = make()
    for column in ys.T:
        model.update(column)
    return model


@pytest.mark.parametrize("spec", SPECS, ids=lambda spec: spec.id)
def test_contract(spec: Spec) -> None:
    n, t = 4, 8 * PERIOD
    ys = history(n, t, seed=7)

    # Shapes, and finite non-negative output for non-negative input, from an empty state on.
    fresh = spec.make(n)
    if spec.cls is not ScalerForecaster:
        assert isinstance(fresh, Model)
    for h in (1, 3, H):
        for key, array in outputs(fresh.predict(h)).items():
            assert array.shape == (n, h), key
            assert np.all(array == 0.0), key
    fitted = spec.make(n).fit(ys)
    for h in (1, H):
        result = fitted.predict(h)
        for key, array in outputs(result).items():
            assert array.shape == (n, h), key
            assert np.all(np.isfinite(array)) and np.all(array >= 0.0), key
        if isinstance(result, ForecastResult):
            assert len(result.model) == n
            assert np.all(result.upper >= result.point) and np.all(result.point >= result.lower)
    with pytest.raises(ValueError, match="h must be a positive integer"):
        fitted.predict(0)
    with pytest.raises(ValueError, match="shape"):
        fitted.update(np.zeros(n + 1))

    # Deterministic; fit == step-by-step updates from a fresh state == forecast(); refit resets.
    assert same(spec.make(n).fit(ys).predict(H), fitted.predict(H))
    assert same(stepped(lambda: spec.make(n), ys).predict(H), fitted.predict(H))
    assert same(spec.cls.forecast(ys, H, **spec.params), fitted.predict(H))
    assert same(spec.make(n).fit(ys[:, ::-1]).fit(ys).predict(H), fitted.predict(H))

    # A missing value (NaN, or inf) for series 0: no NaN out, and series 0's state untouched.
    for missing in (np.nan, np.inf):
        model = spec.make(n).fit(ys)
        before = model.state()
        y = ys[:, -1].copy()
        y[0] = missing
        model.update(y)
        after = model.state()
        assert before.keys() == after.keys()
        for key in before:
            assert np.array_equal(before[key][0], after[key][0], equal_nan=True), key
        for key, array in outputs(model.predict(H)).items():
            assert np.all(np.isfinite(array)) and np.all(array >= 0.0), key
    all_missing = spec.make(n)
    all_missing.fit(np.full((n, t), np.nan))
    for key, array in outputs(all_missing.predict(H)).items():
        assert np.all(array == 0.0), key

    # All-zero demand forecasts exactly 0, bounds included.
    zeros = spec.make(n).fit(np.zeros((n, t)))
    for key, array in outputs(zeros.predict(H)).items():
        assert np.all(array == 0.0), key

    # Series are independent: changing series 1 (values, missing bins) never moves series 0.
    other = ys.copy()
    other[1] = other[1][::-1] * 3.0 + 50.0
    other[1, ::4] = np.nan
    result, changed = fitted.predict(H), spec.make(n).fit(other).predict(H)
    a, b = outputs(result), outputs(changed)
    for key in a:
        assert np.array_equal(a[key][0], b[key][0]), key
    assert not np.array_equal(a["point"][1], b["point"][1])  # the change did reach series 1
    if isinstance(result, ForecastResult):
        assert result.model[0] == changed.model[0]
