"""deploy/kubernetes/ and deploy/compose.yaml, checked offline: every manifest against the
Kubernetes API schemas that `kubernetes-validate` ships (strict: no unknown fields), and the
parts that matter for this gateway in both (probes, instance ids, migrations once, graceful
stops longer than the gateway's drain, secrets from the environment)."""

from __future__ import annotations

import inspect
import re
from typing import Any

import kubernetes_validate
import pytest
import yaml
from starlette.applications import Starlette

from gateway.run_lifecycle.manager import RunManager
from gateway.server.config import gateway_config
from gateway.settings import load_settings
from tests.support.containers import ROOT

pytestmark = pytest.mark.deploy

KUBERNETES = ROOT / "deploy" / "kubernetes"
COMPOSE = ROOT / "deploy" / "compose.yaml"
# The oldest Kubernetes release still supported upstream when these were written, and the
# newest the package knows.
KUBERNETES_VERSIONS = ("1.31.0", kubernetes_validate.latest_version())
LABELS = {"app.kubernetes.io/name": "agents-ws-gateway", "app.kubernetes.io/component": "gateway"}


def drain_s() -> float:
    """The longest a gateway takes from SIGTERM to its exit: open requests and sockets
    (uvicorn's graceful timeout), then streaming runs reaching a turn boundary."""
    settings = load_settings(secret="x" * 40)
    sockets = float(gateway_config(Starlette(), settings).timeout_graceful_shutdown or 0)
    runs = float(inspect.signature(RunManager.close).parameters["grace_s"].default)
    return sockets + runs


def documents() -> dict[str, dict[str, Any]]:
    """Every manifest, by kind."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(KUBERNETES.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            assert document["kind"] not in found, f"two {document['kind']}s"
            found[document["kind"]] = document
    return found


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_manifest_is_valid_against_the_kubernetes_schemas(version: str) -> None:
    manifests = documents()
    assert set(manifests) == {
        "ConfigMap",
        "Deployment",
        "Ingress",
        "Job",
        "PodDisruptionBudget",
        "Service",
    }
    for kind, manifest in manifests.items():
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as invalid:
            pytest.fail(f"{kind}: {invalid.message} at {list(invalid.path)}")


def test_the_deployment_probes_stops_and_names_its_pods_as_the_gateway_needs() -> None:
    manifests = documents()
    deployment = manifests["Deployment"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    assert deployment["spec"]["selector"]["matchLabels"] == LABELS == pod["metadata"]["labels"]
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["args"] == ["serve", "--no-migrate"]
    instance_id = next(e for e in container["env"] if e["name"] == "GATEWAY_INSTANCE_ID")
    assert instance_id["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    grace = pod["spec"]["terminationGracePeriodSeconds"]
    assert grace >= float(pre_stop[1]) + drain_s() + 5, (grace, drain_s())

    assert container["resources"]["requests"]["memory"] and container["resources"]["limits"]
    # The image's user (deploy/Dockerfile), a read-only root and /tmp in memory.
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert f"--uid {pod['spec']['securityContext']['runAsUser']} " in dockerfile
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]

    # The Service and the budget find these pods, the Job runs the migrations.
    assert manifests["Service"]["spec"]["selector"] == LABELS
    assert manifests["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"] == LABELS
    job = manifests["Job"]["spec"]["template"]["spec"]["containers"][0]
    assert job["args"] == ["migrate"] and job["image"] == container["image"]
    # Secrets from a Secret, never written in a manifest.
    assert not re.search(r"GATEWAY_SECRET:|postgresql://", yaml.safe_dump(manifests["ConfigMap"]))
    assert {"secretRef": {"name": "agents-ws-gateway"}} in container["envFrom"]


def test_the_compose_file_runs_migrations_once_then_two_replicas_behind_the_proxy() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    replicas = {name: s for name, s in services.items() if s.get("command", [None])[0] == "serve"}
    assert len(replicas) == 2
    ids = {s["environment"]["GATEWAY_INSTANCE_ID"] for s in replicas.values()}
    assert len(ids) == 2
    migrate = services["migrate"]
    assert migrate["command"] == ["migrate"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    for replica in replicas.values():
        assert replica["command"] == ["serve", "--no-migrate"]
        assert replica["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
        assert replica["read_only"] is True
        assert float(replica["stop_grace_period"].removesuffix("s")) > drain_s()
        env = replica["environment"]
        assert env["GATEWAY_DATABASE_URL"].startswith("postgresql://")
        assert env["GATEWAY_BUS_URL"].startswith("redis://")
        # Secrets only from the environment, and compose refuses to start without them.
        assert env["GATEWAY_SECRET"].startswith("${GATEWAY_SECRET:?")
        assert "${POSTGRES_PASSWORD:?" in env["GATEWAY_DATABASE_URL"]
        assert "ports" not in replica
    proxy = services["proxy"]
    assert set(proxy["depends_on"]) == set(replicas)
    for mount in proxy["volumes"]:
        assert (COMPOSE.parent / mount.split(":")[0]).is_file(), mount
    upstream = (ROOT / "deploy" / "nginx" / "upstream-compose.conf").read_text()
    assert {f"{name}:8000" for name in replicas} == set(re.findall(r"server (\S+);", upstream))
