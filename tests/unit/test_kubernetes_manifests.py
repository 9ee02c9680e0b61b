"""deploy/kubernetes: every manifest validates offline against the Kubernetes API schemas
(kubernetes-validate, strict: unknown fields are errors) of the oldest and newest release it
knows, and says what the agent and controller need and nothing more. No API server can run on
these machines; this is as far as the manifests can be checked here."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tensorlights.agent.config import build_config as agent_config
from tensorlights.controller.config import build_config as controller_config
from tensorlights.controller.kubernetes import KUBEFLOW_JOB

MANIFESTS = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSIONS = ("1.29.0", "1.37.0")
CUSTOM_KINDS = {"ServiceMonitor"}
"""Kinds of CRDs (the Prometheus Operator's): no schema in the Kubernetes API's."""


def _documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(MANIFESTS.glob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text()):
            if document is not None:
                found.append((f"{path.name}:{document['kind']}", document))
    return found


DOCUMENTS = _documents()
STANDARD = [(where, doc) for where, doc in DOCUMENTS if doc["kind"] not in CUSTOM_KINDS]
"""What the Kubernetes API schemas cover; the custom kinds are checked against the Services."""


def _one(kind: str) -> dict[str, Any]:
    (found,) = [doc for _, doc in DOCUMENTS if doc["kind"] == kind]
    return found


def _config_map(name: str) -> dict[str, Any]:
    (found,) = [
        doc
        for _, doc in DOCUMENTS
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == name
    ]
    return found


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(("where", "document"), STANDARD, ids=[w for w, _ in STANDARD])
def test_every_manifest_validates_strictly(
    where: str, document: dict[str, Any], version: str
) -> None:
    kubernetes_validate.validate(document, version, strict=True)


def test_the_validator_refuses_what_is_wrong() -> None:
    """The check above can fail: an unknown field and a wrong type are refused."""
    daemonset = _one("DaemonSet")
    typo = {**daemonset, "spec": {**daemonset["spec"], "hostNetwrok": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, VERSIONS[-1], strict=True)
    wrong = {**daemonset, "spec": {**daemonset["spec"], "minReadySeconds": "soon"}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, VERSIONS[-1], strict=True)


def test_the_agent_sees_the_host_with_three_capabilities_and_a_read_only_root() -> None:
    pod = _one("DaemonSet")["spec"]["template"]["spec"]
    assert pod["hostNetwork"] and pod["hostPID"]
    (container,) = pod["containers"]
    security = container["securityContext"]
    assert security["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "SYS_PTRACE", "DAC_READ_SEARCH"],
    }
    assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
    assert not security["privileged"]
    # The node's name is the host it registers as, and names its certificate in the Secret.
    env = {item["name"]: item for item in container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--host=$(NODE_NAME)" in container["args"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    secret = {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]
    assert (
        secret["secretName"] == "tensorlights-agent-tls"
        and mounts["tls"] == "/etc/tensorlights/pki"
    )
    # Its state (the qdisc it replaced) outlives the pod: a restart after a crash restores it.
    state = {v["name"]: v for v in pod["volumes"]}["state"]
    assert state["hostPath"]["path"] == mounts["state"] == "/var/lib/tensorlights"


def test_the_config_maps_are_configs_the_daemons_accept(tmp_path: Path) -> None:
    """The TOML in each ConfigMap, with the Secrets' files where they are mounted."""
    pki = tmp_path / "pki"
    pki.mkdir()
    for name in ("ca.pem", "gpu7.pem", "gpu7.key", "controller.pem", "controller.key"):
        (pki / name).write_text("x")

    def mounted(text: str) -> dict[str, Any]:
        values = tomllib.loads(text.replace("/etc/tensorlights/pki", str(pki)))
        return values

    agent = mounted(_config_map("tensorlights-agent")["data"]["agent.toml"])
    built = agent_config(agent, {"controller.host": "gpu7"})
    assert built.host_name == "gpu7" and not built.standalone
    assert built.controller_tls is not None and built.controller_tls.cert == pki / "gpu7.pem"
    assert built.controller == "tensorlights-controller.tensorlights.svc:9740"
    assert built.metrics_address == ("0.0.0.0", 9731)

    controller = controller_config(
        mounted(_config_map("tensorlights-controller")["data"]["controller.toml"]), {}
    )
    assert controller.kubernetes_url == "https://kubernetes.default.svc"
    assert controller.listen[1] == 9740 and controller.metrics_address[1] == 9741


def test_the_controller_may_read_pods_and_nothing_else() -> None:
    (rule,) = _one("ClusterRole")["rules"]
    assert rule == {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}
    binding = _one("ClusterRoleBinding")
    (subject,) = binding["subjects"]
    assert binding["roleRef"]["name"] == _one("ClusterRole")["metadata"]["name"]
    assert subject["name"] == _one("Deployment")["spec"]["template"]["spec"]["serviceAccountName"]
    # The label it watches is the one the source selects on.
    text = (MANIFESTS / "controller.yaml").read_text()
    assert KUBEFLOW_JOB in text


def test_the_service_monitor_finds_both_metrics_ports() -> None:
    monitor = _one("ServiceMonitor")
    (expression,) = monitor["spec"]["selector"]["matchExpressions"]
    (endpoint,) = monitor["spec"]["endpoints"]
    services = [doc for _, doc in DOCUMENTS if doc["kind"] == "Service"]
    assert len(services) == 2
    for service in services:
        assert service["metadata"]["labels"][expression["key"]] in expression["values"]
        assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
        assert service["metadata"]["namespace"] == monitor["metadata"]["namespace"]
