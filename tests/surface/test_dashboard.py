"""deploy/monitoring/dashboard.json: a Grafana dashboard whose queries read metrics that exist.

Every PromQL expression is checked as far as is cheap without a PromQL parser: brackets balance,
every function is a PromQL function, and every metric name is one the scaler or the companion
really exports (their registries scraped and parsed by prometheus_client, tests/metric_scrapes.py)
or one of the few external metrics listed below. Renaming a metric in the code breaks this test.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_bench
from tests.metric_scrapes import companion_families, names, scaler_families
from tests.tools import require

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "monitoring" / "dashboard.json"

# Metrics from outside this project, read by the GPU-node panels: Karpenter's NodePool usage and
# limits per resource_type (`nodes`, `nvidia.com/gpu`), sigs.k8s.io/karpenter
# pkg/controllers/metrics/nodepool (metrics.Namespace "karpenter", subsystem "nodepools").
EXTERNAL = {"karpenter_nodepools_usage", "karpenter_nodepools_limit"}

PROMQL_FUNCTIONS = {
    # aggregations
    "sum", "min", "max", "avg", "count", "group", "stddev", "stdvar", "topk", "bottomk",
    "quantile", "count_values",
    # functions
    "abs", "absent", "ceil", "floor", "round", "clamp", "clamp_min", "clamp_max", "rate",
    "irate", "increase", "delta", "idelta", "deriv", "changes", "resets", "vector", "scalar",
    "time", "timestamp", "label_replace", "label_join", "histogram_quantile", "sort",
    "sort_desc", "avg_over_time", "min_over_time", "max_over_time", "sum_over_time",
    "count_over_time", "last_over_time", "quantile_over_time", "present_over_time",
}  # fmt: skip
KEYWORDS = {"and", "or", "unless", "bool", "by", "without", "on", "ignoring", "group_left",
            "group_right", "offset", "inf", "nan"}  # fmt: skip
PAIRS = {")": "(", "]": "[", "}": "{"}
IDENT = re.compile(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?")


def load() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return dashboard


def panels(dashboard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]


def _without_strings(expr: str) -> str:
    return re.sub(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`', '""', expr)


def _balanced(expr: str) -> bool:
    stack: list[str] = []
    for char in _without_strings(expr):
        if char in "([{":
            stack.append(char)
        elif char in PAIRS and (not stack or stack.pop() != PAIRS[char]):
            return False
    return not stack


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects; raises on a function PromQL does not have."""
    text = re.sub(r"\$__\w+", "5m", expr)  # Grafana's interval variables are durations
    text = _without_strings(re.sub(r"\$\{?(\w+)\}?", r"\1", text))
    text = re.sub(r"\{[^{}]*\}", " ", text)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges and subqueries
    text = re.sub(r"\boffset\s+\S+", " ", text)
    found = set()
    for name, call in IDENT.findall(text):
        if call:
            if name not in PROMQL_FUNCTIONS:
                raise ValueError(f"{name}(): not a PromQL function, in {expr!r}")
        elif name.lower() not in KEYWORDS:
            found.add(name)
    return found


def known() -> set[str]:
    return names(scaler_families()) | names(companion_families())


# --- the checker itself ---------------------------------------------------------------------------


def test_the_checker_finds_names_functions_and_unbalanced_brackets() -> None:
    expr = (
        'sum by (nodepool) (rate(a_total{x="}(", y=~"$v"}[$__rate_interval] offset 5m)) '
        "/ on (pod) group_left b and c == 1"
    )
    assert _balanced(expr)
    assert metric_names(expr) == {"a_total", "b", "c"}
    assert not _balanced('max(a{x="1"}')
    assert not _balanced("max(a[5m)]")
    with pytest.raises(ValueError, match="rat"):
        metric_names("rat(a_total[5m])")


# --- the dashboard --------------------------------------------------------------------------------


def test_dashboard_loads_with_a_recent_schema_and_unique_panel_ids() -> None:
    dashboard = load()
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in panels(dashboard)]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize("expr", exprs(load()))
def test_every_expression_parses_and_reads_metrics_that_exist(expr: str) -> None:
    assert expr.strip()
    assert _balanced(expr), expr
    found = metric_names(expr)
    assert found, expr
    unknown = found - known() - EXTERNAL
    assert not unknown, f"{expr}: no such metric {unknown}"


def test_the_workload_variable_comes_from_the_scaler_metrics() -> None:
    variables = {v["name"]: v for v in load()["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name, label in (("namespace", "namespace"), ("workload", "scaledobject")):
        query = variables[name]["definition"]
        assert variables[name]["query"]["query"] == query
        match = re.fullmatch(r"label_values\((\w+)(\{.*\})?, (\w+)\)", query)
        assert match, query
        assert match[1] in names(scaler_families())
        assert match[3] == label


def _grafana_to_promql(expr: str) -> str:
    """A dashboard expression as Prometheus would receive it from Grafana."""
    text = re.sub(r"\$__\w+", "5m", expr)
    return text.replace("$namespace", ".*").replace("$workload", "llama")


def test_promtool_parses_every_expression(tmp_path: Path) -> None:
    """Prometheus's own parser, offline: each expression as a recording rule."""
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr_{i}", "expr": _grafana_to_promql(expr)}
                    for i, expr in enumerate(exprs(load()))
                ],
            }
        ]
    }
    path = tmp_path / "rules.json"  # JSON is YAML
    path.write_text(json.dumps(rules), encoding="utf-8")
    checked = subprocess.run(
        [require("promtool"), "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def _rows(dashboard: dict[str, Any]) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each row with the panels below it (up to the next row)."""
    rows: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            rows.append((panel, list(panel.get("panels", []))))
        else:
            assert rows, "a panel above the first row"
            rows[-1][1].append(panel)
    return rows


def _row_metrics(row_panels: list[dict[str, Any]]) -> set[str]:
    return {n for p in row_panels for t in p["targets"] for n in metric_names(t["expr"])}


def test_one_row_per_workload_shows_queue_latency_arrivals_forecast_replicas_and_reason() -> None:
    [(row, row_panels)] = [r for r in _rows(load()) if r[0].get("repeat")]
    assert row["repeat"] == "workload" and "$workload" in row["title"]
    for panel in row_panels:
        for target in panel["targets"]:
            assert 'scaledobject="$workload"' in target["expr"], target["expr"]
            assert 'namespace=~"$namespace"' in target["expr"], target["expr"]
    prefix = "queue_scaler_"
    assert _row_metrics(row_panels) >= {
        prefix + name
        for name in (
            "signal_waiting_requests",
            "signal_running_requests",
            "signal_queue_time_p99_seconds",
            "signal_ttft_p99_seconds",
            "signal_arrival_rate_requests_per_second",
            "offered_replicas",
            "forecast_needed_replicas",
            "desired_replicas",
            "signal_ready_pods",
            "decision_reason",
            "headroom",
            "late_share_ratio",
        )
    }
    forecast = [t for p in row_panels for t in p["targets"] if "forecast_needed" in t["expr"]]
    assert {re.search(r'bound="(\w+)"', t["expr"])[1] for t in forecast} == {"point", "q90"}  # type: ignore[index]
    [reason] = [p for p in row_panels if p["title"] == "Decision reason"]
    assert reason["type"] == "state-timeline"


def test_a_gpu_nodes_row_per_nodepool_reads_the_companion_and_karpenter() -> None:
    [(_, row_panels)] = [r for r in _rows(load()) if "GPU nodes" in r[0]["title"]]
    assert _row_metrics(row_panels) >= {
        "queue_scaler_companion_forecast_gpus",
        "queue_scaler_companion_planned_placeholders",
        "karpenter_nodepools_usage",
    }
    legends = {t["legendFormat"] for p in row_panels for t in p["targets"]}
    assert all("{{nodepool}}" in legend for legend in legends)


def test_metrics_exposition_bench_prints_its_figures() -> None:
    """bench/metrics_exposition.py (figures in the docs) renders a scrape for real workloads:
    ~20 series each (the figures are for the docs, not asserted)."""
    lines = run_bench("metrics_exposition.py", "--workloads", "20", "--repeat", "1")
    assert lines[0].startswith("20 workloads: ")
    series = int(lines[0].split()[2])
    assert 15 * 20 <= series <= 30 * 20
    assert lines[1].startswith("CPU per scrape: ")
