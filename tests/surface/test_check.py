"""`scaler check`: ScaledObjects, the scaler's ConfigMap and config files linted before they are
applied, each finding naming the file, the object and the field path; and the nearest-key hint in
the gRPC error KEDA shows for bad trigger metadata."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from gpu_queue_scaler.cli import main
from gpu_queue_scaler.settings import check
from gpu_queue_scaler.settings.fields import TRIGGER_KEYS
from tests.conftest import ref, synthetic

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "deploy" / "examples").glob("*.yaml"))
CONFIGMAP = REPO / "deploy" / "base" / "configmap.yaml"

SCALED_OBJECT: dict[str, Any] = {
    "apiVersion": "keda.sh/v1alpha1",
    "kind": "ScaledObject",
    "metadata": {"name": "llama", "namespace": "team-a"},
    "spec": {
        "scaleTargetRef": {"name": "llama"},
        "pollingInterval": 30,
        "minReplicaCount": 0,
        "maxReplicaCount": 20,
        "fallback": {"failureThreshold": 3, "replicas": 2, "behavior": "currentReplicasIfHigher"},
        "advanced": {
            "horizontalPodAutoscalerConfig": {
                "behavior": {
                    "scaleUp": {"stabilizationWindowSeconds": 0, "tolerance": "0"},
                    "scaleDown": {"stabilizationWindowSeconds": 0, "tolerance": "0"},
                }
            }
        },
        "triggers": [
            {
                "type": "external",
                "metricType": "AverageValue",
                "metadata": {
                    "scalerAddress": "gpu-queue-scaler.gpu-queue-scaler.svc:6000",
                    "backend": "synthetic",
                    "targetConcurrency": "8",
                    "maxReplicas": "20",
                },
            }
        ],
    },
}
HEAD = "so.yaml: ScaledObject team-a/llama: "
CONFIG = "defaults:\n  targetConcurrency: 4\nprofiles:\n  llama: {maxReplicas: 20}\n"


def scaled_object(**changes: Any) -> dict[str, Any]:
    """The good ScaledObject with `changes` applied: dotted paths into it, None deletes."""
    obj = copy.deepcopy(SCALED_OBJECT)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node: Any = obj
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return obj


def lint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *docs: object, args: tuple[str, ...] = ()
) -> tuple[int, list[str]]:
    """`scaler check` on one file of `docs` (in-process), from `tmp_path`: (exit code, lines)."""
    (tmp_path / "so.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return run_main(tmp_path, capsys, "check", *args, "so.yaml")


def rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *docs: object, args: tuple[str, ...] = ()
) -> list[str]:
    """`lint` of `docs` that must fail (exit code 1): its lines."""
    code, lines = lint(tmp_path, capsys, *docs, args=args)
    assert code == 1, lines
    return lines


def run_main(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, list[str]]:
    capsys.readouterr()
    cwd = Path.cwd()
    try:
        os.chdir(tmp_path)
        code = main(list(argv))
    finally:
        os.chdir(cwd)
    return code, capsys.readouterr().out.splitlines()


# --- the shipped manifests ------------------------------------------------------------------------


def test_every_shipped_example_and_the_configmap_pass(capsys: pytest.CaptureFixture[str]) -> None:
    """Checked together, so each trigger's profile resolves against the shipped ConfigMap; no
    warning either: the examples are what users copy."""
    code = main(["check", *map(str, EXAMPLES), str(CONFIGMAP)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    scaled = [line for line in lines if ": ScaledObject " in line]
    assert len(scaled) == 4
    for line in scaled:
        assert line.endswith(
            "ok (1 trigger; tuning against "
            f"{CONFIGMAP}: ConfigMap gpu-queue-scaler/gpu-queue-scaler-config)"
        ), line
    assert f"{CONFIGMAP}: ConfigMap gpu-queue-scaler/gpu-queue-scaler-config: ok (4 profiles)" in (
        lines
    )
    assert not [line for line in lines if "warning" in line]


def test_the_examples_alone_name_what_they_did_not_check(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["check", *map(str, EXAMPLES)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    vllm = next(line for line in lines if "llama-3-8b" in line)
    assert "profile 'llama-3-8b' not checked: give the ConfigMap" in vllm


def test_the_configmap_key_is_the_one_the_deployment_mounts() -> None:
    deployment = yaml.safe_load((REPO / "deploy" / "base" / "deployment.yaml").read_text())
    [container] = [
        c for c in deployment["spec"]["template"]["spec"]["containers"] if "--config" in c["args"]
    ]
    config_path = container["args"][container["args"].index("--config") + 1]
    assert Path(config_path).name == check.CONFIG_DATA_KEY
    assert check.CONFIG_DATA_KEY in yaml.safe_load(CONFIGMAP.read_text())["data"]


def test_the_packaged_crd_is_the_one_in_deploy_crds() -> None:
    """The runtime copy (the image carries no deploy/) is KEDA's file, unmodified."""
    assert check.crd_text() == (REPO / "deploy" / "crds" / check.SCHEMA_FILE).read_text()


# --- the ScaledObject's own fields ---------------------------------------------------------------


def test_a_good_scaled_object_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, lines = lint(tmp_path, capsys, scaled_object())
    assert (code, lines) == (
        0,
        [HEAD + "ok (1 trigger; bounds against the built-in defaults: no ConfigMap given)"],
    )


def test_a_misspelt_spec_field_names_the_nearest_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__minReplicaCont=1))
    assert lines == [HEAD + "spec.minReplicaCont: unknown field; did you mean minReplicaCount?"]


def test_a_schema_violation_names_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__fallback__behavior="sometimes"))
    assert lines[0].startswith(HEAD + "spec.fallback.behavior: 'sometimes' is not one of ")


def test_an_unquoted_metadata_number_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__triggers__0__metadata__maxReplicas=20))
    assert lines == [
        HEAD + "spec.triggers[0].metadata.maxReplicas: 20 is not of type 'string'; KEDA takes "
        "every trigger metadata value as a string: quote it"
    ]


def test_min_above_max_replica_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__minReplicaCount=30))
    assert (
        HEAD + ("spec.minReplicaCount: 30 is above maxReplicaCount (20); KEDA's CRD refuses it")
        in lines
    )


# --- the trigger ----------------------------------------------------------------------------------


def test_a_misspelt_trigger_key_names_the_nearest_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(
        tmp_path, capsys, scaled_object(spec__triggers__0__metadata__targetConcurency="8")
    )
    assert lines == [
        HEAD + "spec.triggers[0].metadata.targetConcurency: unknown key; did you mean "
        "'targetConcurrency'? (accepted keys: see `scaler reference`)"
    ]


def test_a_bad_trigger_value_is_the_servers_rejection(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__triggers__0__metadata__backend="tgi"))
    assert lines == [
        HEAD + "spec.triggers[0].metadata.backend: got 'tgi'; accepted: vllm | triton | custom | "
        "synthetic"
    ]


@pytest.mark.parametrize("metric_type", ["Value", "Utilization"])
def test_a_metric_type_other_than_average_value_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], metric_type: str
) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__triggers__0__metricType=metric_type))
    assert lines == [
        HEAD + f"spec.triggers[0].metricType: {metric_type!r}: the scaler returns the replica "
        "count with target 1, which only AverageValue turns into that many replicas (KEDA's "
        "fallback too); set AverageValue or leave it out"
    ]


def test_no_metric_type_is_average_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _ = lint(tmp_path, capsys, scaled_object(spec__triggers__0__metricType=None))
    assert code == 0


def test_other_triggers_are_left_alone_and_a_filter_picks_ours(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = scaled_object()
    obj["spec"]["triggers"].insert(0, {"type": "cpu", "metadata": {"value": "50"}})
    other = {"type": "external", "metadata": {"scalerAddress": "other:9000", "anything": "x"}}
    obj["spec"]["triggers"].append(other)
    address = ("--scaler-address", "gpu-queue-scaler.gpu-queue-scaler.svc:6000")
    assert lint(tmp_path, capsys, obj, args=address)[0] == 0
    code, lines = lint(tmp_path, capsys, obj)  # every external trigger: the other one fails
    assert code == 1
    assert lines[0].startswith(HEAD + "spec.triggers[2].metadata.anything: unknown key")


def test_a_scaled_object_with_no_trigger_of_ours_is_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = lint(
        tmp_path, capsys, scaled_object(spec__triggers=[{"type": "cpu", "metadata": {}}])
    )
    assert code == 0
    assert lines == [
        HEAD + "skipped: no trigger (external or external-push), nothing of this scaler's to check"
    ]


# --- KEDA settings that break the replica target --------------------------------------------------


def test_a_fallback_of_zero_replicas_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(tmp_path, capsys, scaled_object(spec__fallback__replicas=0))
    assert lines[0].startswith(HEAD + "spec.fallback.replicas: 0: KEDA's scale loop then does not")


def test_a_fallback_that_may_scale_down_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = lint(tmp_path, capsys, scaled_object(spec__fallback__behavior=None))
    assert code == 0
    assert lines[0].startswith(HEAD + "spec.fallback.behavior: warning: static: during an outage")
    assert lines[-1] == HEAD + (
        "ok (1 trigger; bounds against the built-in defaults: no ConfigMap given) (warnings only)"
    )


def test_the_hpa_tolerance_is_a_warning_above_its_band(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    behavior = "spec__advanced__horizontalPodAutoscalerConfig__behavior"
    code, lines = lint(tmp_path, capsys, scaled_object(**{f"{behavior}__scaleUp__tolerance": None}))
    assert code == 0
    assert lines[0] == HEAD + (
        "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleUp.tolerance: warning: the "
        "HPA's default 10%: the HPA drops +-1 steps of the scaler's target above 10 replicas "
        '(maxReplicaCount 20); set tolerance: "0"'
    )
    code, lines = lint(
        tmp_path, capsys, scaled_object(**{f"{behavior}__scaleDown__tolerance": "50m"})
    )
    assert "above 20 replicas (maxReplicaCount 20)" not in lines[0]  # 5%: 20 steps of 1 fit
    assert len(lines) == 1 and code == 0
    code, lines = lint(
        tmp_path, capsys, scaled_object(**{f"{behavior}__scaleDown__tolerance": "100m"})
    )
    assert "behavior.scaleDown.tolerance: warning: '100m': the HPA drops" in lines[0]


def test_a_second_scale_down_window_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = lint(tmp_path, capsys, scaled_object(spec__advanced=None))
    assert code == 0
    assert any(
        "behavior.scaleDown.stabilizationWindowSeconds: warning: unset (the HPA's 300 s)" in line
        for line in lines
    )


def test_a_behavior_that_is_no_mapping_is_the_schemas_finding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A scaleDown written as a string is named by the schema; the HPA checks read past it."""
    behavior = "spec__advanced__horizontalPodAutoscalerConfig__behavior"
    lines = rejected(tmp_path, capsys, scaled_object(**{f"{behavior}__scaleDown": "fast"}))
    assert lines[0].startswith(
        HEAD + "spec.advanced.horizontalPodAutoscalerConfig.behavior.scaleDown: 'fast' is not of "
    ), lines
    assert any("scaleDown.stabilizationWindowSeconds: warning: unset" in line for line in lines)


def test_keda_bounds_against_the_triggers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, lines = lint(
        tmp_path, capsys, scaled_object(spec__triggers__0__metadata__maxReplicas="5")
    )
    assert code == 0
    assert lines[0] == HEAD + (
        "spec.triggers[0].metadata.maxReplicas: warning: 5 differs from spec.maxReplicaCount (20): "
        "the HPA stops at the lower; keep them equal so the scaler's forecasts and the companion "
        "size for what can run"
    )
    obj = scaled_object(spec__minReplicaCount=8, spec__triggers__0__metadata__maxReplicas="5")
    code, lines = lint(tmp_path, capsys, obj)
    assert code == 1
    assert (
        HEAD
        + (
            "spec.minReplicaCount: 8 is above the trigger's maxReplicas (5): the HPA's floor is "
            "above the scaler's highest target"
        )
        in lines
    )
    obj = scaled_object(spec__triggers__0__metadata__minReplicas="21")
    obj["spec"]["triggers"][0]["metadata"]["maxReplicas"] = "30"
    code, lines = lint(tmp_path, capsys, obj)
    assert code == 1
    assert any("metadata.minReplicas: 21 is above spec.maxReplicaCount (20)" in x for x in lines)
    code, lines = lint(tmp_path, capsys, scaled_object(spec__pollingInterval=15))
    assert lines[0] == HEAD + (
        "spec.triggers[0].metadata.pollingIntervalSeconds: warning: 30 differs from "
        "spec.pollingInterval (15): it is part of the forecast horizon; keep them equal"
    )


# --- ConfigMaps, config files, several documents -------------------------------------------------


def configmap(text: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-queue-scaler-config", "namespace": "gpu-queue-scaler"},
        "data": {"config.yaml": text},
    }


def test_a_multi_document_file_resolves_triggers_against_its_configmap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The ConfigMap after the ScaledObject still counts; an unknown profile is a problem, a
    known one brings its maxReplicas; a Deployment is skipped, not failed."""
    good = scaled_object(spec__triggers__0__metadata__profile="llama")
    del good["spec"]["triggers"][0]["metadata"]["maxReplicas"]  # 20, from the profile
    bad = scaled_object(spec__triggers__0__metadata__profile="nope", metadata__name="other")
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}}
    code, lines = lint(tmp_path, capsys, good, bad, deployment, configmap(CONFIG))
    named = "so.yaml: ConfigMap gpu-queue-scaler/gpu-queue-scaler-config"
    assert code == 1
    assert lines == [
        HEAD + f"ok (1 trigger; tuning against {named})",
        "so.yaml: ScaledObject team-a/other: spec.triggers[0].metadata.profile: 'nope' is not a "
        f"profile in {named}; known: llama",
        "so.yaml: Deployment d: skipped: not a keda.sh/v1alpha1 ScaledObject, the scaler's "
        "ConfigMap (data.config.yaml) or a config file",
        f"{named}: ok (1 profiles)",
    ]


def test_a_configmaps_problems_name_the_data_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = rejected(tmp_path, capsys, configmap("defaults:\n  targetConcurency: 4\n"))
    assert lines == [
        "so.yaml: ConfigMap gpu-queue-scaler/gpu-queue-scaler-config: data.config.yaml: "
        "defaults.targetConcurency: unknown key; did you mean 'targetConcurrency'?"
    ]


def test_a_plain_config_file_reads_as_check_config_reads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    assert run_main(tmp_path, capsys, "check", "config.yaml") == (
        0,
        ["config.yaml: ok (1 profiles)"],
    )
    assert run_main(tmp_path, capsys, "check-config", "config.yaml") == (
        0,
        ["config.yaml: ok (1 profiles)"],
    )


def test_config_option_resolves_the_triggers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "config.yaml").write_text(CONFIG)
    obj = scaled_object(spec__triggers__0__metadata__profile="nope")
    lines = rejected(tmp_path, capsys, obj, args=("--config", "config.yaml"))
    assert lines == [
        HEAD + "spec.triggers[0].metadata.profile: 'nope' is not a profile in config.yaml; "
        "known: llama"
    ]


def test_a_live_object_and_a_list_as_kubectl_prints_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`kubectl get scaledobject -o yaml`: KEDA's status passes, a misspelt status field does not;
    several objects come as a `kind: List`."""
    live = scaled_object(
        status={
            "scaleTargetKind": "apps/v1.Deployment",
            "originalReplicaCount": 1,
            "conditions": [{"type": "Ready", "status": "True", "reason": "ScalerReady"}],
            "health": {"s0-synthetic-llama": {"numberOfFailures": 0, "status": "Happy"}},
        }
    )
    listed = {"apiVersion": "v1", "kind": "List", "items": [live, scaled_object(spec__x=1)]}
    code, lines = lint(tmp_path, capsys, listed)
    assert code == 1
    assert lines[0].startswith(HEAD + "ok (1 trigger")
    assert lines[1].startswith(HEAD + "spec.x: unknown field; accepted: advanced, ")
    code, lines = lint(tmp_path, capsys, scaled_object(status={"helth": {}}))
    assert (code, lines) == (1, [HEAD + "status.helth: unknown field; did you mean health?"])


# --- input: stdin, not YAML, missing, bounded output ----------------------------------------------


def test_stdin_and_exit_codes_through_the_command() -> None:
    good = yaml.safe_dump(scaled_object())
    bad = yaml.safe_dump(scaled_object(spec__triggers__0__metricType="Value"))

    def scaler_check(stdin: str, *files: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpu_queue_scaler", "check", *files, "-"],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
            check=False,
        )

    result = scaler_check(good)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("<stdin>: ScaledObject team-a/llama: ok (1 trigger")
    assert scaler_check(bad).returncode == 1
    result = scaler_check(good, "no-such-file.yaml")
    assert result.returncode == 2
    assert result.stdout.splitlines()[0] == (
        "no-such-file.yaml: <file>: cannot read: No such file or directory"
    )


def test_a_file_that_is_not_yaml_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not.yaml").write_text("spec: [unclosed\n")
    (tmp_path / "binary.yaml").write_bytes(b"\x00\xff\xfe garbage")
    code, lines = run_main(tmp_path, capsys, "check", "not.yaml", "binary.yaml")
    assert code == 2
    assert lines[0].startswith("not.yaml: line 2, column 1: not valid YAML: ")
    assert lines[1].startswith("binary.yaml: ") and "not valid YAML" in lines[1]


def test_a_billion_laughs_document_is_stopped_within_its_own_bound(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each document gets the ConfigMap's node bound (anchors do not cross documents): a bomb
    after a good document is one line and exit 2."""
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)
    )
    (tmp_path / "so.yaml").write_text(yaml.safe_dump(scaled_object()) + "---\n" + bomb)
    code, lines = run_main(tmp_path, capsys, "check", "so.yaml")
    assert code == 2
    assert len(lines) == 1 and "not accepted: more than 10000 nodes" in lines[0], lines


def test_output_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """500 unknown keys in one trigger, 300 bad documents, a 100 KB key: bounded lines."""
    many = scaled_object()
    many["spec"]["triggers"][0]["metadata"].update({f"colour{i}": "x" for i in range(500)})
    code, lines = lint(tmp_path, capsys, many)
    assert code == 1
    assert len(lines) == check.LINES_PER_DOCUMENT + 1
    assert lines[-1] == HEAD + "... and 450 more findings not shown"
    docs = [scaled_object(spec__minReplicaCont=1, metadata__name=f"o{i}") for i in range(300)]
    code, lines = lint(tmp_path, capsys, *docs)
    assert len(lines) == check.MAX_LINES + 1
    assert lines[-1] == "... and 100 more lines not shown"
    long_key = scaled_object(**{"spec__" + "k" * 100_000: 1})
    code, lines = lint(tmp_path, capsys, long_key)
    assert code == 1 and len(lines) == 1 and len(lines[0]) < 400
    long_type = scaled_object(spec__triggers__0__metricType="V" * 100_000)
    code, lines = lint(tmp_path, capsys, long_type)
    assert code == 1 and len(lines) == 1 and len(lines[0]) < 500
    deep = Path("d" * 200, "d" * 200, "so.yaml")  # a long file name: each line is cut
    (tmp_path / deep).parent.mkdir(parents=True)
    (tmp_path / deep).write_text(yaml.safe_dump(scaled_object(spec__minReplicaCont=1)))
    code, lines = run_main(tmp_path, capsys, "check", str(deep))
    assert code == 1 and len(lines) == 1
    assert len(lines[0]) == check.LINE_CHARS and "[cut: " in lines[0]


# --- the gRPC error KEDA shows --------------------------------------------------------------------


async def test_the_grpc_error_names_the_nearest_key_not_every_key(start_server: Any) -> None:
    _, client = await start_server()
    for key, wanted in (
        ("targetConcurency", "did you mean 'targetConcurrency'? (accepted keys: see `scaler "),
        ("colour", "unknown key; accepted keys: see `scaler reference`"),
    ):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await client.stub.GetMetricSpec(ref("typo", synthetic(**{key: "8"})))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        message = info.value.details() or ""
        assert f"{key}: " in message and wanted in message, message
        listed = [k for k in TRIGGER_KEYS if k in message and k != "targetConcurrency"]
        assert listed == [], message  # the pointer, not the 50-key list
