"""What the scaler's own help texts tell a reader is what the code does.

The /metrics HELP of each `signal_*` family is read back from the real registry's scrape
(tests/metric_scrapes.py) and checked against how the catalog makes that signal; the settings'
help (the `scaler reference` table in docs/trigger.md) against the policy's constants.
"""

from __future__ import annotations

import pytest

from gpu_queue_scaler import telemetry
from gpu_queue_scaler.catalog import CATALOGS, Count, Expr, Gauge, Quantile, Rate, Ratio
from gpu_queue_scaler.decision.policy import PANIC_HOLD_S, SCALE_DOWN_PERIOD_S
from gpu_queue_scaler.settings import fields
from tests.metric_scrapes import scaler_families

HELP = {family.name: family.documentation for family in scaler_families()}


def said(expr: Expr) -> str | None:
    """The words a help text needs to say how `expr` reads the pods (None: nothing to check)."""
    match expr:
        case Gauge(agg="sum"):
            return "summed over pods"
        case Gauge(agg="avg"):
            return "mean"
        case Gauge(agg="max"):
            return "worst pod"
        case Count():
            return "pods that report"
        case Rate():
            return "per second"
        case Quantile(q=q):
            return f"p{q * 100:g} "
        case Ratio():
            return "mean "
    return None


@pytest.mark.parametrize("field", sorted(telemetry.SIGNAL_METRICS))
def test_a_signal_family_help_says_how_the_catalog_makes_it(field: str) -> None:
    name, _ = telemetry.SIGNAL_METRICS[field]
    text = HELP[telemetry.PREFIX + name].lower()
    for catalog in CATALOGS.values():
        expr = catalog.signals.get(field)
        words = said(expr) if expr is not None else None
        if words is not None:
            assert words in text, f"{name} ({catalog.backend}: {expr}): {words!r} not in {text!r}"


def test_the_panic_help_says_what_the_policy_does() -> None:
    """panicThreshold's help (generated into docs/trigger.md): the target is the need as it is,
    held at the panic's peak for the policy's hold; no growth is applied to the need."""
    text = fields.BY_KEY["panicThreshold"].doc
    assert "the need at face value" in text
    assert f"until {PANIC_HOLD_S:g} s after demand last outran" in text
    assert "grow" not in text and "doubled" not in text


def test_the_scale_down_help_names_the_policy_period() -> None:
    assert f"per {SCALE_DOWN_PERIOD_S:g} s" in fields.BY_KEY["scaleDownMaxPercent"].doc


def test_the_kv_cache_target_help_names_the_mean_the_catalog_reads() -> None:
    kv = CATALOGS["vllm"].signals["kv_cache_usage"]
    assert isinstance(kv, Gauge) and kv.agg == "avg"
    assert "pods' mean KV-cache usage" in fields.BY_KEY["kvCacheTarget"].doc
