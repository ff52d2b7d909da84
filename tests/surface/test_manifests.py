"""Checks of the Kubernetes material under deploy/: schemas, wiring, and the settings that matter.

Every object under deploy/base, deploy/examples, deploy/companion, deploy/karpenter and
deploy/monitoring is validated strictly (unknown fields fail):
built-in kinds with kubernetes_validate, custom resources against the upstream CRDs in deploy/crds
(see k8s_schema.py). cert-manager's CRDs are not in deploy/crds: its objects (deploy/cert-manager)
are checked structurally against the cert-manager.io/v1 fields they may use. The other tests check
what a schema cannot: that the pieces point at each other and that the hardening and scaling
settings are the intended ones.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests import k8s_schema
from tests.tools import kustomize

DEPLOY = k8s_schema.REPO_ROOT / "deploy"
BASE = DEPLOY / "base"
EXAMPLES = DEPLOY / "examples"
KUSTOMIZATION = BASE / "kustomization.yaml"
COMPANION = DEPLOY / "companion"
COMPANION_KUSTOMIZATION = COMPANION / "kustomization.yaml"
PLACEHOLDER_TEMPLATE = COMPANION / "placeholder-template.yaml"
KARPENTER = DEPLOY / "karpenter"
CERT_MANAGER = DEPLOY / "cert-manager"
CERT_MANAGER_KUSTOMIZATION = CERT_MANAGER / "kustomization.yaml"
CERT_MANAGER_GROUP = "cert-manager.io"
MONITORING = DEPLOY / "monitoring"
MONITORING_KUSTOMIZATION = MONITORING / "kustomization.yaml"

CORE_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ClusterRole",
    "ClusterRoleBinding",
    "ConfigMap",
    "Deployment",
    "Service",
    "PodDisruptionBudget",
    "PriorityClass",
    "Role",
    "RoleBinding",
    "NetworkPolicy",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
CLUSTER_SCOPED = {
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "PriorityClass",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}
EXTERNAL_TRIGGERS = {"external", "external-push"}
# The oldest Kubernetes the manifests target, and the newest kubernetes_validate ships.
K8S_VERSIONS = sorted({k8s_schema.K8S_VERSION, kubernetes_validate.latest_version()})


def _yaml_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.suffix in (".yaml", ".yml"))


BASE_FILES = [p for p in _yaml_files(BASE) if p != KUSTOMIZATION]
EXAMPLE_FILES = _yaml_files(EXAMPLES)
COMPANION_FILES = [p for p in _yaml_files(COMPANION) if p != COMPANION_KUSTOMIZATION]
KARPENTER_FILES = _yaml_files(KARPENTER)
CERT_MANAGER_FILES = [p for p in _yaml_files(CERT_MANAGER) if p != CERT_MANAGER_KUSTOMIZATION]
MONITORING_FILES = [p for p in _yaml_files(MONITORING) if p != MONITORING_KUSTOMIZATION]
OBJECTS = k8s_schema.load_yaml_documents(
    BASE_FILES
    + EXAMPLE_FILES
    + COMPANION_FILES
    + KARPENTER_FILES
    + CERT_MANAGER_FILES
    + MONITORING_FILES
)


def _id(entry: tuple[Path, int, dict[str, Any]]) -> str:
    path, index, obj = entry
    name = (obj.get("metadata") or {}).get("name", "?")
    return f"{path.relative_to(DEPLOY)}#{index}:{obj.get('kind')}/{name}"


def _is_custom(obj: dict[str, Any]) -> bool:
    group, _ = k8s_schema.split_api_version(str(obj.get("apiVersion", "")))
    return k8s_schema.has_crd(group, str(obj.get("kind", "")))


def _is_cert_manager(obj: dict[str, Any]) -> bool:
    return k8s_schema.split_api_version(str(obj.get("apiVersion", "")))[0] == CERT_MANAGER_GROUP


CERT_MANAGER_OBJECTS = [entry for entry in OBJECTS if _is_cert_manager(entry[2])]
CORE_OBJECTS = [
    entry for entry in OBJECTS if not _is_custom(entry[2]) and not _is_cert_manager(entry[2])
]
CUSTOM_OBJECTS = [entry for entry in OBJECTS if _is_custom(entry[2])]


def _only(kind: str, entries: list[tuple[Path, int, dict[str, Any]]] = OBJECTS) -> dict[str, Any]:
    found = [obj for _, _, obj in entries if obj.get("kind") == kind]
    assert len(found) == 1, f"expected exactly one {kind} under deploy/base, found {len(found)}"
    return found[0]


def _base_objects() -> list[tuple[Path, int, dict[str, Any]]]:
    return [entry for entry in OBJECTS if entry[0].is_relative_to(BASE)]


def _scaled_objects() -> list[dict[str, Any]]:
    return [obj for _, _, obj in OBJECTS if obj.get("kind") == "ScaledObject"]


def _scaler_container() -> dict[str, Any]:
    containers = _only("Deployment", _base_objects())["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _config_text() -> str:
    text = _only("ConfigMap", _base_objects())["data"]["config.yaml"]
    assert isinstance(text, str)
    return text


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable complex key: let SafeLoader report it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# --- files and kustomization ----------------------------------------------------------------------


@pytest.mark.parametrize("path", _yaml_files(DEPLOY), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_deploy_yaml_is_clean(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "\t" not in text, f"{path} contains a tab"
    docs = list(yaml.load_all(text, Loader=UniqueKeyLoader))
    assert docs == list(yaml.safe_load_all(text))
    for doc in docs:
        assert yaml.safe_load(yaml.safe_dump(doc, sort_keys=False)) == doc


def test_kustomization_lists_exactly_the_base_files() -> None:
    kustomization = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kustomization["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == "gpu-queue-scaler"
    assert "commonLabels" not in kustomization  # it would rewrite the immutable selector
    assert kustomization["labels"] == [
        {
            "pairs": {"app.kubernetes.io/part-of": "gpu-queue-scaler"},
            "includeSelectors": False,
        }
    ]

    resources = kustomization["resources"]
    assert len(resources) == len(set(resources)), "duplicate entries in resources"
    for name in resources:
        assert (BASE / name).is_file(), f"kustomization names missing file {name}"
    listed = set(resources)
    present = {str(p.relative_to(BASE)) for p in BASE_FILES}
    assert listed == present, f"missing: {present - listed}; extra: {listed - present}"


def test_base_objects_live_in_the_scaler_namespace() -> None:
    namespace = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))["namespace"]
    assert _only("Namespace", _base_objects())["metadata"]["name"] == namespace
    for _, _, obj in _base_objects():
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]["name"]


def test_crds_are_documented_and_licensed() -> None:
    crd_dir = k8s_schema.CRD_DIR
    readme = (crd_dir / "README.md").read_text(encoding="utf-8")
    for path in sorted(crd_dir.glob("*.yaml")):
        assert f"| {path.name} |" in readme, f"{path.name} missing from deploy/crds/README.md"
    license_text = (crd_dir / "LICENSE").read_text(encoding="utf-8")
    assert "Apache License" in license_text
    assert "Version 2.0, January 2004" in license_text
    assert "END OF TERMS AND CONDITIONS" in license_text


# --- schema validation ----------------------------------------------------------------------------


def test_every_object_has_a_schema_kind_we_expect() -> None:
    kinds = {obj["kind"] for _, _, obj in CORE_OBJECTS}
    assert kinds == CORE_KINDS
    assert {obj["kind"] for _, _, obj in CUSTOM_OBJECTS} == {
        "ScaledObject",
        "ClusterTriggerAuthentication",
        "NodePool",
        "EC2NodeClass",
        "ServiceMonitor",
        "PodMonitor",
        "PrometheusRule",
    }
    assert {obj["kind"] for _, _, obj in CERT_MANAGER_OBJECTS} == {
        "Issuer",
        "ClusterIssuer",
        "Certificate",
    }
    assert all(entry[0].is_relative_to(CERT_MANAGER) for entry in CERT_MANAGER_OBJECTS)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("entry", CORE_OBJECTS, ids=_id)
def test_core_object_is_valid(entry: tuple[Path, int, dict[str, Any]], version: str) -> None:
    _, _, obj = entry
    try:
        k8s_schema.validate_core(obj, version)
    except (k8s_schema.ManifestInvalidError, k8s_schema.SchemaNotFoundError) as exc:
        pytest.fail(str(exc))


@pytest.mark.parametrize("entry", CUSTOM_OBJECTS, ids=_id)
def test_custom_resource_is_valid(entry: tuple[Path, int, dict[str, Any]]) -> None:
    _, _, obj = entry
    try:
        k8s_schema.validate_custom_resource(obj)
    except (k8s_schema.ManifestInvalidError, k8s_schema.SchemaNotFoundError) as exc:
        pytest.fail(str(exc))


def _vllm_example() -> dict[str, Any]:
    [obj] = [o for o in _scaled_objects() if o["metadata"]["name"] == "llama-3-8b"]
    return copy.deepcopy(obj)


def test_unknown_scaledobject_spec_field_is_rejected() -> None:
    obj = _vllm_example()
    obj["spec"]["pollingIntervall"] = 15
    with pytest.raises(k8s_schema.ManifestInvalidError, match="pollingIntervall"):
        k8s_schema.validate_custom_resource(obj)


def test_unknown_nested_scaledobject_field_is_rejected() -> None:
    obj = _vllm_example()
    obj["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleUp"]["tolerence"] = (
        "0"
    )
    with pytest.raises(k8s_schema.ManifestInvalidError, match="tolerence"):
        k8s_schema.validate_custom_resource(obj)


def test_unquoted_trigger_metadata_number_is_rejected() -> None:
    obj = _vllm_example()
    obj["spec"]["triggers"][0]["metadata"]["targetConcurrency"] = 16
    with pytest.raises(k8s_schema.ManifestInvalidError, match="targetConcurrency"):
        k8s_schema.validate_custom_resource(obj)


def test_custom_resource_metadata_is_checked_as_object_meta() -> None:
    obj = _vllm_example()
    obj["metadata"]["lables"] = {"a": "b"}
    with pytest.raises(k8s_schema.ManifestInvalidError, match="lables"):
        k8s_schema.validate_custom_resource(obj)


def test_unknown_container_field_is_rejected() -> None:
    deployment = copy.deepcopy(_only("Deployment", _base_objects()))
    deployment["spec"]["template"]["spec"]["containers"][0]["imagePullPolice"] = "Always"
    with pytest.raises(k8s_schema.ManifestInvalidError, match="imagePullPolice"):
        k8s_schema.validate_core(deployment)


@pytest.mark.parametrize(
    "obj",
    [
        {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}},
        {"apiVersion": "v1", "kind": "Gadget", "metadata": {"name": "g"}},
        {
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledWidget",
            "metadata": {"name": "s"},
        },
        {"kind": "ConfigMap", "metadata": {"name": "no-api-version"}},
    ],
    ids=["unknown-group", "unknown-core-kind", "unknown-crd-kind", "no-apiVersion"],
)
def test_object_without_a_schema_fails_loudly(obj: dict[str, Any]) -> None:
    with pytest.raises(k8s_schema.SchemaNotFoundError):
        k8s_schema.validate_object(obj)


def test_unserved_crd_version_fails_loudly() -> None:
    obj = _vllm_example()
    obj["apiVersion"] = "keda.sh/v1alpha2"
    with pytest.raises(k8s_schema.SchemaNotFoundError, match="v1alpha2"):
        k8s_schema.validate_custom_resource(obj)


def test_strict_closes_objects_but_keeps_open_ones_open() -> None:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {
            "closed": {"type": "object", "properties": {"a": {"type": "string"}}},
            "preserved": {
                "type": "object",
                "properties": {"a": {"type": "string"}},
                "x-kubernetes-preserve-unknown-fields": True,
            },
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "list": {
                "type": "array",
                "items": {"type": "object", "properties": {"b": {}}},
            },
            "intOrString": {"x-kubernetes-int-or-string": True},
            "maybe": {"type": "string", "nullable": True},
        },
        "required": ["closed"],
    }
    strict = k8s_schema.strict(schema)
    # The input is left untouched.
    assert "additionalProperties" not in schema["properties"]["closed"]
    assert strict["additionalProperties"] is False
    assert strict["properties"]["closed"]["additionalProperties"] is False
    assert "additionalProperties" not in strict["properties"]["preserved"]
    assert strict["properties"]["labels"]["additionalProperties"] == {"type": "string"}
    assert strict["properties"]["list"]["items"]["additionalProperties"] is False
    assert strict["properties"]["intOrString"]["anyOf"] == [
        {"type": "integer"},
        {"type": "string"},
    ]
    assert strict["properties"]["maybe"]["type"] == ["string", "null"]
    assert "required" not in k8s_schema.strict(schema, drop_required=True)


def test_partial_validation_accepts_a_patch_body_but_not_unknown_fields() -> None:
    patch: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "spec": {"maxReplicaCount": 3},
    }
    k8s_schema.validate_custom_resource(patch, partial=True)
    with pytest.raises(k8s_schema.ManifestInvalidError, match="required"):
        k8s_schema.validate_custom_resource(patch)
    patch["spec"]["maxReplicaCounts"] = 3
    with pytest.raises(k8s_schema.ManifestInvalidError, match="maxReplicaCounts"):
        k8s_schema.validate_custom_resource(patch, partial=True)


# --- the scaler Deployment and its wiring ---------------------------------------------------------


def _arg(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing from args {args}"
    return args[args.index(flag) + 1]


def test_deployment_is_hardened_and_probed_over_grpc() -> None:
    deployment = _only("Deployment", _base_objects())
    assert deployment["spec"]["replicas"] == 2
    template = deployment["spec"]["template"]
    pod = template["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template["metadata"]["labels"].items()

    assert pod["serviceAccountName"] == _only("ServiceAccount", _base_objects())["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [spread] = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname"
    assert spread["labelSelector"]["matchLabels"].items() <= template["metadata"]["labels"].items()

    container = _scaler_container()
    args = container["args"]
    assert args[0] == "serve"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": 6000, "health": 6001, "metrics": 9090}
    assert _arg(args, "--address").rsplit(":", 1)[1] == str(ports["grpc"])
    assert _arg(args, "--metrics-address").rsplit(":", 1)[1] == str(ports["metrics"])
    assert _arg(args, "--health-address").rsplit(":", 1)[1] == str(ports["health"])

    # The kubelet's gRPC probes cannot do TLS: they use the plaintext health-only port.
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[probe_name]
        assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"grpc"}, probe_name
        assert probe["grpc"]["port"] == ports["health"], probe_name
    assert container["readinessProbe"]["grpc"]["service"] == "externalscaler.ExternalScaler"
    assert container["livenessProbe"]["grpc"].get("service", "") == ""

    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]

    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"])
    assert "memory" in resources["limits"]
    assert "cpu" not in resources["limits"]  # CPU limits throttle gRPC latency

    # The config: a whole-directory ConfigMap mount (subPath mounts never see updates).
    config_path = PurePosixPath(_arg(args, "--config"))
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == str(config_path.parent)]
    assert "subPath" not in mount
    assert "subPathExpr" not in mount
    assert mount["readOnly"] is True
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    configmap = _only("ConfigMap", _base_objects())
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    assert config_path.name in configmap["data"]
    assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


def test_service_is_headless_and_selects_the_scaler_pods() -> None:
    service = _only("Service", _base_objects())
    pod_labels = _only("Deployment", _base_objects())["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["selector"].items() <= pod_labels.items()
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert set(ports) == {"grpc", "metrics"}
    assert ports["grpc"]["port"] == 6000
    assert ports["grpc"]["appProtocol"] == "grpc"
    assert ports["metrics"]["port"] == 9090
    container_ports = {p["name"] for p in _scaler_container()["ports"]}
    for port in ports.values():
        assert port["targetPort"] in container_ports

    pdb = _only("PodDisruptionBudget", _base_objects())
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_rbac_is_least_privilege() -> None:
    role = _only("ClusterRole", _base_objects())
    assert role["rules"] == [
        {
            "apiGroups": ["discovery.k8s.io"],
            "resources": ["endpointslices"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    binding = _only("ClusterRoleBinding", _base_objects())
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = _only("ServiceAccount", _base_objects())["metadata"]
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["name"],
            "namespace": account["namespace"],
        }
    ]
    kinds = [obj["kind"] for _, _, obj in _base_objects()]
    assert "Role" not in kinds
    assert "RoleBinding" not in kinds


def test_configmap_config_parses_with_defaults_profiles_and_server() -> None:
    config = yaml.load(_config_text(), Loader=UniqueKeyLoader)
    assert isinstance(config, dict)
    assert set(config) == {"defaults", "profiles", "server"}
    assert all(isinstance(config[key], dict) for key in config)
    assert "llama-3-8b" in config["profiles"]
    for obj in _scaled_objects():
        for trigger in obj["spec"]["triggers"]:
            profile = trigger["metadata"].get("profile")
            assert profile is None or profile in config["profiles"], profile


# --- example ScaledObjects ------------------------------------------------------------------------


def test_example_scaledobjects_point_at_the_scaler_and_agree_with_their_spec() -> None:
    service = _only("Service", _base_objects())
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    address = (
        f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc.cluster.local"
        f":{grpc_port}"
    )
    objects = _scaled_objects()
    assert {o["metadata"]["name"] for o in objects} == {
        "llama-3-8b",
        "resnet50",
        "qwen-7b",
        "synthetic-demo",
    }
    for obj in objects:
        spec, name = obj["spec"], obj["metadata"]["name"]
        lo, hi = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
        assert lo <= hi, name  # the CRD's CEL rule, which jsonschema cannot run
        behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
        for direction in ("scaleUp", "scaleDown"):
            assert behavior[direction]["tolerance"] == "0", (name, direction)
            assert behavior[direction]["stabilizationWindowSeconds"] == 0, (
                name,
                direction,
            )
        triggers = [t for t in spec["triggers"] if t["type"] in EXTERNAL_TRIGGERS]
        assert triggers, name
        for trigger in triggers:
            metadata = trigger["metadata"]
            assert trigger.get("metricType", "AverageValue") == "AverageValue", name
            assert metadata["scalerAddress"] == address, name
            assert all(isinstance(value, str) for value in metadata.values()), name
            if "minReplicas" in metadata:
                assert int(metadata["minReplicas"]) == lo, name
            if "maxReplicas" in metadata:
                assert int(metadata["maxReplicas"]) == hi, name
            if "pollingIntervalSeconds" in metadata:
                polling = float(metadata["pollingIntervalSeconds"])
                assert polling == spec.get("pollingInterval", 30), name
    [synthetic] = [o for o in objects if o["metadata"]["name"] == "synthetic-demo"]
    assert [t["type"] for t in synthetic["spec"]["triggers"]] == ["external-push"]


def test_example_trigger_metadata_parses_with_scaler_schema() -> None:
    from gpu_queue_scaler.settings.config import load_config_text
    from gpu_queue_scaler.settings.spec import resolve
    from gpu_queue_scaler.settings.trigger import parse_trigger

    config = load_config_text(_config_text())
    profiles = config.profiles
    checked = 0
    for obj in _scaled_objects():
        namespace, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        for trigger in obj["spec"]["triggers"]:
            if trigger["type"] not in EXTERNAL_TRIGGERS:
                continue
            metadata = dict(trigger["metadata"])
            trigger_spec = parse_trigger(namespace, name, metadata)
            if "profile" in metadata:
                assert metadata["profile"] in profiles, (name, metadata["profile"])
            # Valid together with the shipped ConfigMap too (profile queries, signal source).
            resolve(trigger_spec, config)
            checked += 1
    assert checked == 4


# --- TLS: mTLS on the gRPC port, cert-manager, NetworkPolicy, KEDA's authentication ---------------

# cert-manager.io/v1 fields (from its API reference) that the objects here may use; anything else
# is a typo the API server would reject (strict) or prune.
CERTIFICATE_SPEC = {
    "additionalOutputFormats", "commonName", "dnsNames", "duration", "emailAddresses",
    "encodeUsagesInRequest", "ipAddresses", "isCA", "issuerRef", "keystores", "literalSubject",
    "nameConstraints", "otherNames", "privateKey", "renewBefore", "renewBeforePercentage",
    "revisionHistoryLimit", "secretName", "secretTemplate", "signatureAlgorithm", "subject", "uris",
    "usages",
}  # fmt: skip
PRIVATE_KEY = {"algorithm": {"RSA", "ECDSA", "Ed25519"}, "encoding": {"PKCS1", "PKCS8"},
               "rotationPolicy": {"Never", "Always"}, "size": None}  # fmt: skip
KEY_USAGES = {
    "signing", "digital signature", "content commitment", "key encipherment", "key agreement",
    "data encipherment", "cert sign", "crl sign", "encipher only", "decipher only", "any",
    "server auth", "client auth", "code signing", "email protection", "s/mime", "ipsec end system",
    "ipsec tunnel", "ipsec user", "timestamping", "ocsp signing", "microsoft sgc", "netscape sgc",
}  # fmt: skip
ISSUER_TYPES = {
    "selfSigned": {"crlDistributionPoints"},
    "ca": {"secretName", "crlDistributionPoints", "ocspServers", "issuingCertificateURLs"},
    "acme": None,
    "vault": None,
    "venafi": None,
}
ISSUER_KINDS = {"Issuer", "ClusterIssuer"}


def _hours(duration: str) -> float:
    """A Go duration as cert-manager accepts it ("2160h", "90m", "1h30m") in hours."""
    assert re.fullmatch(r"([0-9]+(\.[0-9]+)?(h|m|s))+", duration), duration
    unit = {"h": 1.0, "m": 1 / 60, "s": 1 / 3600}
    return sum(
        float(n) * unit[u] for n, _, u in re.findall(r"([0-9]+(\.[0-9]+)?)(h|m|s)", duration)
    )


def cert_manager_problems(obj: dict[str, Any]) -> list[str]:
    """Structural check of a cert-manager.io/v1 Issuer, ClusterIssuer or Certificate."""
    problems: list[str] = []
    if obj.get("apiVersion") != f"{CERT_MANAGER_GROUP}/v1":
        problems.append(f"apiVersion {obj.get('apiVersion')!r}")
    kind = obj.get("kind")
    top = set(obj) - {"apiVersion", "kind", "metadata", "spec"}
    if top:
        problems.append(f"unknown top-level fields {sorted(top)}")
    problems += [
        f"metadata.{p}"
        for p in k8s_schema._object_meta_problems(obj.get("metadata"), k8s_schema.K8S_VERSION)
    ]
    meta, spec = obj.get("metadata") or {}, obj.get("spec")
    if not isinstance(spec, dict):
        return [*problems, "spec missing"]
    if (kind == "ClusterIssuer") == ("namespace" in meta):
        problems.append("namespace: ClusterIssuer has none, Issuer and Certificate need one")
    if kind in ISSUER_KINDS:
        types = set(spec) & set(ISSUER_TYPES)
        if set(spec) - set(ISSUER_TYPES):
            problems.append(f"spec: unknown fields {sorted(set(spec) - set(ISSUER_TYPES))}")
        if len(types) != 1:
            problems.append(f"spec: exactly one issuer type expected, got {sorted(types)}")
        for name in types:
            allowed, body = ISSUER_TYPES[name], spec[name]
            if not isinstance(body, dict):
                problems.append(f"spec.{name}: not an object")
            elif allowed is not None and set(body) - allowed:
                problems.append(f"spec.{name}: unknown fields {sorted(set(body) - allowed)}")
        if "ca" in spec and not spec["ca"].get("secretName"):
            problems.append("spec.ca.secretName missing")
    elif kind == "Certificate":
        if set(spec) - CERTIFICATE_SPEC:
            problems.append(f"spec: unknown fields {sorted(set(spec) - CERTIFICATE_SPEC)}")
        if not spec.get("secretName"):
            problems.append("spec.secretName missing")
        ref = spec.get("issuerRef") or {}
        if not ref.get("name") or set(ref) - {"name", "kind", "group"}:
            problems.append(f"spec.issuerRef: {ref!r}")
        if ref.get("kind", "Issuer") not in ISSUER_KINDS:
            problems.append(f"spec.issuerRef.kind {ref.get('kind')!r}")
        key = spec.get("privateKey") or {}
        for field, value in key.items():
            if field not in PRIVATE_KEY:
                problems.append(f"spec.privateKey: unknown field {field!r}")
            elif PRIVATE_KEY[field] is not None and value not in PRIVATE_KEY[field]:  # type: ignore[operator]
                problems.append(f"spec.privateKey.{field}: {value!r}")
        if key.get("algorithm") == "ECDSA" and key.get("size", 256) not in (256, 384, 521):
            problems.append(f"spec.privateKey.size {key.get('size')!r} for ECDSA")
        for usage in spec.get("usages", []):
            if usage not in KEY_USAGES:
                problems.append(f"spec.usages: {usage!r}")
        duration = _hours(spec.get("duration", "2160h"))
        if duration < 1:
            problems.append("spec.duration below cert-manager's 1h minimum")
        if "renewBefore" in spec and not 0 < _hours(spec["renewBefore"]) < duration:
            problems.append("spec.renewBefore must be below duration")
        for field in ("dnsNames", "usages", "ipAddresses", "uris"):
            if field in spec and not (
                isinstance(spec[field], list) and all(isinstance(v, str) for v in spec[field])
            ):
                problems.append(f"spec.{field}: a list of strings expected")
    else:
        problems.append(f"unexpected kind {kind!r}")
    return problems


@pytest.mark.parametrize("entry", CERT_MANAGER_OBJECTS, ids=_id)
def test_cert_manager_object_is_structurally_valid(entry: tuple[Path, int, dict[str, Any]]) -> None:
    _, _, obj = entry
    assert cert_manager_problems(obj) == []


def test_cert_manager_checker_rejects_misspelt_fields() -> None:
    [server] = [
        o for _, _, o in CERT_MANAGER_OBJECTS if o["metadata"]["name"] == "gpu-queue-scaler-tls"
    ]
    for path, value in (
        (("spec", "dnsName"), ["x"]),
        (("spec", "privateKey", "rotation"), "Always"),
        (("spec", "issuerRef", "namespace"), "x"),
        (("metadata", "lables"), {}),
    ):
        obj = copy.deepcopy(server)
        *parents, leaf = path
        target = obj
        for part in parents:
            target = target[part]
        target[leaf] = value
        assert any(leaf in p for p in cert_manager_problems(obj)), path
    obj = copy.deepcopy(server)
    obj["spec"]["usages"] = ["server-auth"]
    assert cert_manager_problems(obj)


def _cert_manager(kind: str, name: str) -> dict[str, Any]:
    [found] = [
        o for _, _, o in CERT_MANAGER_OBJECTS if o["kind"] == kind and o["metadata"]["name"] == name
    ]
    return found


def _secret_volume(secret_name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The scaler pod's volume holding Secret `secret_name`, and the container's mount of it."""
    pod = _only("Deployment", _base_objects())["spec"]["template"]["spec"]
    [volume] = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret_name]
    [mount] = [m for m in _scaler_container()["volumeMounts"] if m["name"] == volume["name"]]
    return volume, mount


def _server_certificate() -> dict[str, Any]:
    [server] = [
        o
        for _, _, o in CERT_MANAGER_OBJECTS
        if o["kind"] == "Certificate" and "server auth" in o["spec"].get("usages", [])
    ]
    return server


def _cluster_trigger_authentication() -> dict[str, Any]:
    return _only("ClusterTriggerAuthentication")


def test_grpc_port_serves_mtls_from_the_mounted_certificate_secret() -> None:
    from gpu_queue_scaler.cli import parser

    args = parser().parse_args(_scaler_container()["args"])  # exits on a flag the CLI lacks
    assert args.insecure_plaintext is False
    server = _server_certificate()
    volume, mount = _secret_volume(server["spec"]["secretName"])
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # renewals arrive as a swap of the whole directory
    assert "items" not in volume["secret"]
    assert volume["secret"]["defaultMode"] & 0o007 == 0  # not world-readable
    # cert-manager's keys in a Secret it issues: tls.crt, tls.key and (CA issuer) ca.crt.
    for flag, key in (("tls_cert", "tls.crt"), ("tls_key", "tls.key"), ("tls_client_ca", "ca.crt")):
        assert getattr(args, flag) == f"{mount['mountPath']}/{key}", flag
    assert not PurePosixPath(mount["mountPath"]).is_relative_to(PurePosixPath(args.config).parent)


def test_cert_manager_chain_issues_the_server_and_keda_certificates() -> None:
    ca = _cert_manager("Certificate", "gpu-queue-scaler-ca")
    assert ca["spec"]["isCA"] is True
    root = ca["spec"]["issuerRef"]
    assert root["kind"] == "Issuer"
    selfsigned = _cert_manager("Issuer", root["name"])
    assert "selfSigned" in selfsigned["spec"]
    assert selfsigned["metadata"]["namespace"] == ca["metadata"]["namespace"]
    # A ClusterIssuer reads its CA Secret from cert-manager's cluster resource namespace.
    assert ca["metadata"]["namespace"] == "cert-manager"
    [cluster_issuer] = [o for _, _, o in CERT_MANAGER_OBJECTS if o["kind"] == "ClusterIssuer"]
    assert cluster_issuer["spec"]["ca"]["secretName"] == ca["spec"]["secretName"]
    issued_by_ca = {
        "group": "cert-manager.io",
        "kind": "ClusterIssuer",
        "name": cluster_issuer["metadata"]["name"],
    }

    server = _server_certificate()
    assert server["metadata"]["namespace"] == _only("Namespace")["metadata"]["name"]
    assert server["spec"]["issuerRef"] == issued_by_ca
    assert server["spec"]["privateKey"]["rotationPolicy"] == "Always"
    # KEDA verifies the scaler against the host of each trigger's scalerAddress.
    service = _only("Service", _base_objects())["metadata"]
    for obj in _scaled_objects():
        for trigger in obj["spec"]["triggers"]:
            host = trigger["metadata"]["scalerAddress"].rsplit(":", 1)[0]
            assert host in server["spec"]["dnsNames"], host
    assert f"{service['name']}.{service['namespace']}.svc" in server["spec"]["dnsNames"]

    [client] = [
        o
        for _, _, o in CERT_MANAGER_OBJECTS
        if o["kind"] == "Certificate" and "client auth" in o["spec"].get("usages", [])
    ]
    assert client["spec"]["issuerRef"] == issued_by_ca  # the CA the scaler's ca.crt holds
    assert "server auth" not in client["spec"]["usages"]
    assert "client auth" not in server["spec"]["usages"]
    # In KEDA's namespace: a ClusterTriggerAuthentication reads Secrets there; the NetworkPolicy
    # admits that namespace.
    policy = _only("NetworkPolicy", _base_objects())
    keda_namespaces = [
        peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
        for rule in policy["spec"]["ingress"]
        if [p["port"] for p in rule["ports"]] == ["grpc"]
        for peer in rule["from"]
    ]
    assert keda_namespaces == [client["metadata"]["namespace"]]
    refs = {
        ref["parameter"]: (ref["name"], ref["key"])
        for ref in _cluster_trigger_authentication()["spec"]["secretTargetRef"]
    }
    secret = client["spec"]["secretName"]
    assert refs == {
        "caCert": (secret, "ca.crt"),
        "tlsClientCert": (secret, "tls.crt"),
        "tlsClientKey": (secret, "tls.key"),
    }


def test_example_scaledobjects_authenticate_with_the_cluster_trigger_authentication() -> None:
    name = _cluster_trigger_authentication()["metadata"]["name"]
    for obj in _scaled_objects():
        for trigger in obj["spec"]["triggers"]:
            assert trigger["authenticationRef"] == {
                "name": name,
                "kind": "ClusterTriggerAuthentication",
            }, obj["metadata"]["name"]
            assert trigger["metadata"].get("unsafeSsl", "false") == "false"


def test_network_policy_admits_keda_to_grpc_and_only_monitoring_and_companion_to_metrics() -> None:
    policy = _only("NetworkPolicy", _base_objects())
    pod_labels = _only("Deployment", _base_objects())["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"]
    container_ports = {p["name"] for p in _scaler_container()["ports"]}
    by_port: dict[str, list[dict[str, Any]]] = {}
    for rule in spec["ingress"]:
        assert rule["from"], "an empty `from` admits everyone"
        for port in rule["ports"]:
            assert port["port"] in container_ports
            assert port["protocol"] == "TCP"
            by_port.setdefault(port["port"], []).extend(rule["from"])
    assert set(by_port) == {"grpc", "metrics"}  # health: the kubelet only (node traffic)
    assert by_port["grpc"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}}}
    ]
    companion_labels = _only("Deployment", _companion_objects())["spec"]["template"]["metadata"][
        "labels"
    ]
    metrics_peers = by_port["metrics"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in metrics_peers
    [companion] = [p for p in metrics_peers if "podSelector" in p]
    assert "namespaceSelector" not in companion  # this namespace only
    assert companion["podSelector"]["matchLabels"].items() <= companion_labels.items()
    assert not (companion["podSelector"]["matchLabels"].items() <= pod_labels.items())


def test_cert_manager_kustomization_adds_the_pki_to_the_base() -> None:
    kustomization = yaml.safe_load(CERT_MANAGER_KUSTOMIZATION.read_text(encoding="utf-8"))
    base = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert "namespace" not in kustomization  # the PKI spans three namespaces
    assert kustomization["labels"] == base["labels"]
    present = {str(p.relative_to(CERT_MANAGER)) for p in CERT_MANAGER_FILES}
    assert set(kustomization["resources"]) == {"../base"} | present


def test_cert_manager_kustomize_build_keeps_every_namespace() -> None:
    placed = {
        (obj["kind"], obj["metadata"]["name"]): obj["metadata"].get("namespace")
        for obj in kustomize(CERT_MANAGER)
    }
    expected = {
        (obj["kind"], obj["metadata"]["name"]): obj["metadata"].get("namespace")
        for _, _, obj in _base_objects() + CERT_MANAGER_OBJECTS
    }
    assert placed == expected


# --- the Karpenter companion (deploy/companion) ---------------------------------------------------


def _under(directory: Path) -> list[tuple[Path, int, dict[str, Any]]]:
    return [entry for entry in OBJECTS if entry[0].is_relative_to(directory)]


def _companion_objects() -> list[tuple[Path, int, dict[str, Any]]]:
    """What `kubectl apply -k deploy/companion` applies: not the placeholder template."""
    return [entry for entry in _under(COMPANION) if entry[0] != PLACEHOLDER_TEMPLATE]


def _placeholder_template() -> dict[str, Any]:
    return _only("Deployment", _under(PLACEHOLDER_TEMPLATE))


def _companion_container() -> dict[str, Any]:
    containers = _only("Deployment", _companion_objects())["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _companion_args() -> Any:
    from gpu_queue_scaler.cli import parser

    args = _companion_container()["args"]
    assert args[0] == "companion"
    return parser().parse_args(args)  # exits (SystemExit) on a flag the CLI does not have


def test_companion_kustomization_lists_its_files_but_not_the_placeholder_template() -> None:
    kustomization = yaml.safe_load(COMPANION_KUSTOMIZATION.read_text(encoding="utf-8"))
    base = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["namespace"] == base["namespace"]
    assert kustomization["labels"] == base["labels"]
    assert "commonLabels" not in kustomization
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    present = {str(p.relative_to(COMPANION)) for p in COMPANION_FILES}
    assert set(resources) == present - {PLACEHOLDER_TEMPLATE.name}


def _companion_namespace() -> str:
    namespace: str = yaml.safe_load(COMPANION_KUSTOMIZATION.read_text(encoding="utf-8"))[
        "namespace"
    ]
    return namespace


def _is_events_rbac(obj: dict[str, Any]) -> bool:
    """The Role and RoleBinding granting Events in --event-namespace (not the companion's)."""
    return obj["kind"] in ("Role", "RoleBinding") and obj["metadata"]["name"].endswith("-events")


def test_companion_objects_live_in_the_scaler_namespace() -> None:
    namespace = _companion_namespace()
    args = _companion_args()
    for _, _, obj in _under(COMPANION):
        if obj["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        elif _is_events_rbac(obj):
            assert obj["metadata"]["namespace"] == args.event_namespace, obj["metadata"]["name"]
        else:
            assert obj["metadata"].get("namespace") == namespace, obj["metadata"]["name"]
    assert args.namespace == namespace


def _companion_grants() -> set[tuple[str, str, str, str]]:
    """What deploy/companion's RBAC grants the companion's ServiceAccount, as kube.client.API_ACCESS
    spells it: (group, resource, verb, scope)."""
    from gpu_queue_scaler.companion.kube.client import CLUSTER, EVENTS, LEASE, NAMESPACE

    args = _companion_args()
    account = _only("ServiceAccount", _companion_objects())["metadata"]
    objects = [obj for _, _, obj in _companion_objects()]
    roles = [obj for obj in objects if obj["kind"] in ("ClusterRole", "Role")]
    bindings = {
        (obj["metadata"].get("namespace"), obj["roleRef"]["kind"], obj["roleRef"]["name"]): obj
        for obj in objects
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding")
    }
    assert len(bindings) == len(roles)  # one binding per role, none dangling
    grants: set[tuple[str, str, str, str]] = set()
    for role in roles:
        namespace = role["metadata"].get("namespace")
        binding = bindings[(namespace, role["kind"], role["metadata"]["name"])]
        assert binding["roleRef"]["apiGroup"] == "rbac.authorization.k8s.io"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account["name"], "namespace": account["namespace"]}
        ]
        for rule in role["rules"]:
            assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
            if role["kind"] == "ClusterRole":
                assert "resourceNames" not in rule, rule
                scope = CLUSTER
            elif namespace == args.event_namespace and _is_events_rbac(role):
                assert "resourceNames" not in rule, rule
                scope = EVENTS
            elif namespace == args.namespace and "resourceNames" in rule:
                # get/update on the Lease are limited to the companion's own.
                assert rule["resources"] == ["leases"], rule
                assert rule["resourceNames"] == [args.lease_name], rule
                scope = LEASE
            elif namespace == args.namespace:
                scope = NAMESPACE
            else:
                raise AssertionError(f"{role['kind']} in unexpected namespace {namespace!r}")
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grant = (group, resource, verb, scope)
                        assert grant not in grants, f"granted twice: {grant}"
                        grants.add(grant)
    return grants


def test_companion_rbac_grants_exactly_what_it_uses() -> None:
    """The rules grant exactly kube.client.API_ACCESS, the requests the companion's code sends
    (checked against every request in tests/surface/test_companion_kube.py): nothing more, nothing
    missing."""
    from gpu_queue_scaler.companion.kube.client import API_ACCESS

    grants = _companion_grants()
    assert sorted(grants - API_ACCESS) == [], "granted but never used"
    assert sorted(API_ACCESS - grants) == [], "used but not granted"
    for group, resource, verb, _ in grants:
        assert "*" not in {group, resource, verb}
        assert resource != "secrets"
        assert verb not in ("delete", "deletecollection", "escalate", "bind", "impersonate")


def test_companion_kustomize_build_keeps_the_events_role_in_the_event_namespace() -> None:
    """`kubectl kustomize deploy/companion`: the kustomization's `namespace:` moves everything to
    the companion's namespace, and its transformer moves the Events Role and binding back."""
    args = _companion_args()
    placed = {
        (obj["kind"], obj["metadata"]["name"]): obj["metadata"].get("namespace")
        for obj in kustomize(COMPANION)
    }
    assert placed == {
        (obj["kind"], obj["metadata"]["name"]): (
            None
            if obj["kind"] in CLUSTER_SCOPED
            else args.event_namespace
            if _is_events_rbac(obj)
            else args.namespace
        )
        for _, _, obj in _companion_objects()
    }


def test_companion_deployment_is_hardened_and_probed_on_its_metrics_port() -> None:
    deployment = _only("Deployment", _companion_objects())
    assert deployment["spec"]["replicas"] == 2  # leader election: one acts, one stands by
    template = deployment["spec"]["template"]
    pod = template["spec"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= (
        template["metadata"]["labels"].items()
    )
    account = _only("ServiceAccount", _companion_objects())["metadata"]["name"]
    assert pod["serviceAccountName"] == account
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}

    container = _companion_container()
    assert container["image"] == _scaler_container()["image"]  # same image, `companion` command
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert "memory" in container["resources"]["limits"]

    args = _companion_args()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": args.metrics_port}
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container[probe_name]
        assert set(probe) & {"grpc", "httpGet", "tcpSocket", "exec"} == {"httpGet"}, probe_name
        assert probe["httpGet"] == {"path": "/metrics", "port": "metrics"}, probe_name

    # --scaler-url: the scaler's Service, on the port serving /decisions and /metrics.
    service = _only("Service", _base_objects())
    metrics_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "metrics")
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert args.scaler_url == f"http://{host}:{metrics_port}"
    assert args.priority_class == _only("PriorityClass", _companion_objects())["metadata"]["name"]


def test_companion_cli_defaults_agree_with_deploy() -> None:
    """Run without flags, the companion still matches deploy/companion: the PriorityClass its
    placeholders name, the Lease its Role lets it renew, the namespace its Events Role covers."""
    from gpu_queue_scaler.cli import parser

    defaults = parser().parse_args(["companion"])
    assert (
        defaults.priority_class == _only("PriorityClass", _companion_objects())["metadata"]["name"]
    )
    assert (
        defaults.priority_class
        == _placeholder_template()["spec"]["template"]["spec"]["priorityClassName"]
    )
    assert defaults.lease_name == _companion_args().lease_name
    events_role = [obj for _, _, obj in _companion_objects() if _is_events_rbac(obj)]
    assert {obj["metadata"]["namespace"] for obj in events_role} == {defaults.event_namespace}


def test_placeholder_priority_class_exists_and_is_below_every_real_pod() -> None:
    template = _placeholder_template()
    name = template["spec"]["template"]["spec"]["priorityClassName"]
    [priority_class] = [
        obj
        for _, _, obj in OBJECTS
        if obj["kind"] == "PriorityClass" and obj["metadata"]["name"] == name
    ]
    assert priority_class["value"] < 0
    assert priority_class["preemptionPolicy"] == "Never"
    assert priority_class["globalDefault"] is False
    labels = template["spec"]["template"]["metadata"]["labels"]
    from gpu_queue_scaler.companion.model import MANAGED_BY, MANAGED_BY_LABEL

    assert labels[MANAGED_BY_LABEL] == MANAGED_BY
    assert template["spec"]["replicas"] == 0


def test_placeholder_template_is_what_the_companion_creates() -> None:
    from gpu_queue_scaler.companion.patches import placeholder_deployment

    template = _placeholder_template()
    args = _companion_args()
    pool = template["spec"]["template"]["spec"]["nodeSelector"]["karpenter.sh/nodepool"]
    assert template == placeholder_deployment(
        pool,
        0,
        args.placeholder_gpus,
        args.namespace,
        args.priority_class,
        args.placeholder_image,
        args.placeholder_toleration_key,
    )


# --- example Karpenter NodePools and EC2NodeClass (deploy/karpenter) ------------------------------


def _nodepools() -> dict[str, dict[str, Any]]:
    return {
        obj["metadata"]["name"]: obj for _, _, obj in _under(KARPENTER) if obj["kind"] == "NodePool"
    }


def _seconds(duration: str) -> int:
    """A Karpenter duration ("60s", "1h30m") in seconds."""
    assert re.fullmatch(r"([0-9]+[smh])+", duration), duration
    unit = {"s": 1, "m": 60, "h": 3600}
    return sum(int(n) * unit[u] for n, u in re.findall(r"([0-9]+)([smh])", duration))


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """The scheduler's toleration match for one taint."""
    for t in tolerations:
        if t.get("effect") not in (None, "", taint["effect"]):
            continue
        if t.get("operator", "Equal") == "Exists":
            if t.get("key") in (None, "", taint["key"]):
                return True
        elif t.get("key") == taint["key"] and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def test_gpu_nodepools_consolidate_when_empty_taint_gpus_and_cap_them() -> None:
    from gpu_queue_scaler.companion.model import GPU_RESOURCE

    pools = _nodepools()
    assert set(pools) == {"gpu-spot", "gpu-on-demand"}
    [node_class] = [obj for _, _, obj in _under(KARPENTER) if obj["kind"] == "EC2NodeClass"]
    tolerations = _placeholder_template()["spec"]["template"]["spec"]["tolerations"]
    for name, pool in pools.items():
        spec = pool["spec"]
        disruption = spec["disruption"]
        assert disruption["consolidationPolicy"] == "WhenEmpty", name
        assert 0 < _seconds(disruption["consolidateAfter"]) <= 300, name
        assert disruption["budgets"] == [{"nodes": "10%"}], name
        node = spec["template"]["spec"]
        taints = node["taints"]
        assert {"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"} in taints, name
        for taint in taints:  # placeholders fit either pool
            assert _tolerates(tolerations, taint), (name, taint)
        assert int(spec["limits"][GPU_RESOURCE]) > 0, name
        assert "cpu" in spec["limits"], name
        assert node["nodeClassRef"] == {
            "group": "karpenter.k8s.aws",
            "kind": "EC2NodeClass",
            "name": node_class["metadata"]["name"],
        }, name
        requirements = {r["key"]: r for r in node["requirements"]}
        assert len(requirements) == len(node["requirements"]), name
        assert requirements["karpenter.k8s.aws/instance-gpu-manufacturer"]["values"] == ["nvidia"]
        for requirement in node["requirements"]:  # CEL rules jsonschema cannot run
            assert requirement["operator"] != "In" or requirement["values"], (name, requirement)
            assert requirement["key"] not in ("karpenter.sh/nodepool", "kubernetes.io/hostname")
    capacity = {
        name: pool["spec"]["template"]["spec"]["requirements"] for name, pool in pools.items()
    }
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]} in (
        capacity["gpu-spot"]
    )
    assert {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]} in (
        capacity["gpu-on-demand"]
    )
    # Karpenter tries the higher weight first: Spot, then the on-demand fallback.
    assert pools["gpu-spot"]["spec"]["weight"] > pools["gpu-on-demand"]["spec"]["weight"]
    # The placeholders warm a pool that exists.
    selector = _placeholder_template()["spec"]["template"]["spec"]["nodeSelector"]
    assert selector["karpenter.sh/nodepool"] in pools


def test_ec2nodeclass_meets_the_rules_its_crd_checks_with_cel() -> None:
    [node_class] = [obj for _, _, obj in _under(KARPENTER) if obj["kind"] == "EC2NodeClass"]
    spec = node_class["spec"]
    assert ("role" in spec) != ("instanceProfile" in spec)
    [term] = spec["amiSelectorTerms"]  # an alias must be the only term, alone in it
    assert set(term) == {"alias"}
    assert re.fullmatch(r"(al2023|bottlerocket)@.+", term["alias"])
    assert "amiFamily" not in spec
    roots = [m for m in spec["blockDeviceMappings"] if m.get("rootVolume")]
    assert len(roots) == 1
    assert int(roots[0]["ebs"]["volumeSize"].removesuffix("Gi")) >= 200  # images and weights
    for key in ("subnetSelectorTerms", "securityGroupSelectorTerms"):
        assert spec[key] and all(term.get("tags") for term in spec[key]), key


# --- monitoring (deploy/monitoring) ---------------------------------------------------------------


def test_monitoring_kustomization_lists_its_files_and_wraps_the_dashboard() -> None:
    kustomization = yaml.safe_load(MONITORING_KUSTOMIZATION.read_text(encoding="utf-8"))
    base = yaml.safe_load(KUSTOMIZATION.read_text(encoding="utf-8"))
    assert kustomization["namespace"] == base["namespace"]
    assert kustomization["labels"] == base["labels"]
    present = {str(p.relative_to(MONITORING)) for p in MONITORING_FILES}
    assert set(kustomization["resources"]) == present
    [generator] = kustomization["configMapGenerator"]
    assert generator["files"] == ["dashboard.json"]
    assert (MONITORING / "dashboard.json").is_file()
    assert generator["options"]["labels"] == {"grafana_dashboard": "1"}  # Grafana's sidecar


def test_service_monitor_scrapes_the_scaler_metrics_port_keeping_the_workload_namespace() -> None:
    monitor = _only("ServiceMonitor", _under(MONITORING))
    service = _only("Service", _base_objects())
    namespace = service["metadata"]["namespace"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    [port] = [p for p in service["spec"]["ports"] if p["name"] == endpoint["port"]]
    assert port["port"] == 9090 and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True  # the per-workload `namespace` label is the workload's
    # The NetworkPolicy admits Prometheus's namespace to this port.
    policy = _only("NetworkPolicy", _base_objects())
    assert any(
        port["port"] == endpoint["port"]
        and {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        in rule["from"]
        for rule in policy["spec"]["ingress"]
        for port in rule["ports"]
    )


def test_pod_monitor_scrapes_the_companion_pods_metrics_port() -> None:
    monitor = _only("PodMonitor", _under(MONITORING))
    deployment = _only("Deployment", _companion_objects())
    assert not [o for _, _, o in _companion_objects() if o["kind"] == "Service"]
    assert monitor["spec"]["namespaceSelector"] == {
        "matchNames": [deployment["metadata"]["namespace"]]
    }
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    scaler_labels = _only("Deployment", _base_objects())["spec"]["template"]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= scaler_labels.items()
    [endpoint] = monitor["spec"]["podMetricsEndpoints"]
    [port] = [p for p in _companion_container()["ports"] if p["name"] == endpoint["port"]]
    assert port["containerPort"] == _companion_args().metrics_port
    assert endpoint["path"] == "/metrics"


def test_monitoring_kustomize_build_holds_the_dashboard_configmap() -> None:
    objects = {obj["kind"]: obj for obj in kustomize(MONITORING)}
    assert set(objects) == {"ConfigMap", "ServiceMonitor", "PodMonitor", "PrometheusRule"}
    config_map = objects["ConfigMap"]
    assert config_map["metadata"]["name"] == "gpu-queue-scaler-dashboard"
    assert config_map["metadata"]["namespace"] == "gpu-queue-scaler"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    text = (MONITORING / "dashboard.json").read_text(encoding="utf-8")
    assert config_map["data"] == {"dashboard.json": text}
    for version in K8S_VERSIONS:
        k8s_schema.validate_core(config_map, version)


# --- the companion's pod patches, narrowed by a ValidatingAdmissionPolicy -------------------------


def _admission_policy() -> tuple[dict[str, Any], dict[str, Any]]:
    policy = _only("ValidatingAdmissionPolicy", _companion_objects())
    binding = _only("ValidatingAdmissionPolicyBinding", _companion_objects())
    return policy, binding


def test_companion_admission_policy_covers_exactly_its_pod_patch_grant() -> None:
    """The policy matches what RBAC lets the companion do to pods beyond reading them (patch =
    UPDATE in admission), only for the companion's own ServiceAccount, and its binding denies."""
    from gpu_queue_scaler.companion.kube.client import API_ACCESS, CLUSTER

    policy, binding = _admission_policy()
    pod_writes = {
        verb for group, resource, verb, _ in API_ACCESS if (group, resource) == ("", "pods")
    } - {"list", "get", "watch"}
    assert pod_writes == {"patch"}
    assert ("", "pods", "patch", CLUSTER) in _companion_grants()
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
    ]
    account = _only("ServiceAccount", _companion_objects())["metadata"]
    [condition] = spec["matchConditions"]
    username = f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert condition["expression"].split("==") == [
        "request.userInfo.username ",
        f' "{username}"',
    ]
    assert binding["spec"] == {
        "policyName": policy["metadata"]["name"],
        "validationActions": ["Deny"],
    }
    assert all(
        v["message"] and v["reason"] in ("Forbidden", "Invalid") for v in spec["validations"]
    )


def _admit(old: dict[str, Any], new: dict[str, Any], username: str) -> list[str]:
    """The policy as the API server applies it, evaluated with cel-python: the messages of the
    validations that fail, or [] (admitted). A request its matchConditions exclude is admitted."""
    import celpy

    spec = _admission_policy()[0]["spec"]
    env = celpy.Environment()

    def run(expression: str, activation: dict[str, Any]) -> Any:
        return env.program(env.compile(expression)).evaluate(activation)

    activation: dict[str, Any] = {
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
        "request": celpy.json_to_cel({"userInfo": {"username": username}, "operation": "UPDATE"}),
    }
    if not all(bool(run(c["expression"], activation)) for c in spec["matchConditions"]):
        return []
    variables: dict[str, Any] = {}
    for variable in spec["variables"]:  # in order: a later one may read an earlier one
        variables[variable["name"]] = run(
            variable["expression"], {**activation, "variables": celpy.json_to_cel(variables)}
        )
    activation["variables"] = celpy.json_to_cel(variables)
    return [v["message"] for v in spec["validations"] if not bool(run(v["expression"], activation))]


def _workload_pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "llama-7d9-abcde",
            "namespace": "team-a",
            "labels": {"app": "llama", "pod-template-hash": "7d9"},
            "annotations": {"team": "a"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "llama-7d9"}
            ],
        },
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.11.0"}]},
    }


def _cost_patch(cost: int) -> dict[str, Any]:
    """The body the companion's packing sends (kube.pack_sync) for one CostChange."""
    from gpu_queue_scaler.companion.packing import DELETION_COST_ANNOTATION, CostChange

    change = CostChange(pod=None, cost=cost)  # type: ignore[arg-type]  # only .value is read
    return {"metadata": {"annotations": {DELETION_COST_ANNOTATION: change.value}}}


COMPANION_USER = "system:serviceaccount:gpu-queue-scaler:gpu-queue-scaler-companion"


@pytest.mark.parametrize(
    "patch",
    [
        _cost_patch(3),
        _cost_patch(-2),
        {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": None}}},
    ],
    ids=["set", "negative", "remove"],
)
def test_companion_admission_policy_admits_the_deletion_cost_patch(patch: dict[str, Any]) -> None:
    old = _workload_pod()
    old_with_cost = k8s_schema.merge_patch(old, _cost_patch(1))
    for before in (old, old_with_cost):
        assert _admit(before, k8s_schema.merge_patch(before, patch), COMPANION_USER) == []


@pytest.mark.parametrize(
    ("patch", "refused"),
    [
        ({"metadata": {"labels": {"app": "other"}}}, "labels"),
        ({"metadata": {"labels": {"pod-template-hash": None}}}, "labels"),
        ({"spec": {"containers": [{"name": "vllm", "image": "evil:latest"}]}}, "spec"),
        ({"metadata": {"annotations": {"team": "b"}}}, "only the"),
        ({"metadata": {"annotations": {"team": None}}}, "only the"),
        ({"metadata": {"annotations": {"new": "x"}}}, "only the"),
        ({"metadata": {"ownerReferences": None}}, "owner references"),
        ({"metadata": {"finalizers": ["example.com/hold"]}}, "finalizers"),
        (
            {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "high"}}},
            "integer",
        ),
    ],
    ids=[
        "relabel",
        "drop-label",
        "image",
        "other-annotation",
        "drop-annotation",
        "add-annotation",
        "orphan",
        "finalizer",
        "cost-not-integer",
    ],
)
def test_companion_admission_policy_refuses_any_other_pod_change(
    patch: dict[str, Any], refused: str
) -> None:
    old = _workload_pod()
    new = k8s_schema.merge_patch(old, patch)
    messages = _admit(old, new, COMPANION_USER)
    assert messages and any(refused in m for m in messages), messages
    # The same change by anyone else is not this policy's business.
    assert _admit(old, new, "system:serviceaccount:kube-system:replicaset-controller") == []
