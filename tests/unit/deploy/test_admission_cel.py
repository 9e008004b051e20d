"""The ValidatingAdmissionPolicies of deploy/, evaluated offline with a real CEL
implementation (tests/unit/deploy/admission.py) on the expressions read from the rendered
kustomization: the pods aggregator/validations/record.py builds from the shipped template
are admitted, and pods that would make a stolen aggregator token a way onto the host
(privileged, hostPath, hostNetwork, SYS_ADMIN, another ServiceAccount or image, a
Secret) are refused; node updates by the aggregator may touch `nicfleet.io/` labels only.
Each forbidden example is refused by exactly the rule that names it."""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from aggregator.reconcile import nodelabels
from aggregator.validations.record import (
    POD_PREFIX,
    ValidationSettings,
    build_pod,
    new_record,
)
from aggregator.validations.request import ValidationRequest
from proto.messages.validation import ValidationRole
from tests.unit.deploy import admission, policies
from tests.unit.deploy.rendered import find, render

AGGREGATOR = "system:serviceaccount:nicfleet-system:nicfleet-aggregator"
NAMESPACE = "nicfleet-system"
Change = Callable[[dict[str, Any]], object]
POLICIES = (
    "nicfleet-aggregator-pods",
    "nicfleet-aggregator-pod-deletes",
    "nicfleet-aggregator-node-labels",
)


def policy(name: str) -> dict[str, Any]:
    return policies.policy("", name)


def binding(name: str) -> dict[str, Any]:
    return policies.binding("", name)


@pytest.mark.parametrize("target", ["", "overlays/cdi", "overlays/nicclusterpolicy-import"])
def test_every_overlay_binds_every_policy_to_deny(target: str) -> None:
    docs = render(target)
    bound = {
        d["spec"]["policyName"]: d["spec"]
        for d in docs
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    policies = {d["metadata"]["name"] for d in docs if d["kind"] == "ValidatingAdmissionPolicy"}
    assert set(bound) == policies == set(POLICIES)
    for name, spec in bound.items():
        assert spec["validationActions"] == ["Deny"], name
        assert find(docs, "ValidatingAdmissionPolicy", name)["spec"]["failurePolicy"] == "Fail"


def test_every_expression_is_standard_cel() -> None:
    """Compiles, and uses only functions standard CEL and Kubernetes share: the results
    here are what the API server computes."""
    found = [e for n in POLICIES for e in policies.expressions(policy(n))]
    assert len(found) >= 15
    for expression in found:
        admission.check_standard(expression)
    with pytest.raises(admission.NotStandard, match="split"):
        admission.check_standard("params.data.images.split(',').exists(i, i == 'x')")


def test_every_policy_matches_the_aggregator_only() -> None:
    for name in POLICIES:
        (condition,) = policy(name)["spec"]["matchConditions"]
        subjects = find(render(""), "ClusterRoleBinding", "nicfleet-aggregator")["subjects"]
        (sa,) = subjects
        assert f"system:serviceaccount:{sa['namespace']}:{sa['name']}" == AGGREGATOR
        bindings = {"request": admission.request("UPDATE", AGGREGATOR)}
        assert admission.outcome(condition["expression"], bindings) is True
        for other in ("system:node:gpu-node-01", f"{AGGREGATOR}x", "system:admin"):
            bindings = {"request": admission.request("UPDATE", other)}
            assert admission.outcome(condition["expression"], bindings) is False


# --- Pods: validation pods only -----------------------------------------------------------


def params() -> dict[str, Any]:
    name = binding("nicfleet-aggregator-pods")["spec"]["paramRef"]["name"]
    result: dict[str, Any] = find(render(""), "ConfigMap", name)
    return result


def template() -> dict[str, Any]:
    """The template the aggregator reads: the rendered ConfigMap it mounts."""
    data = find(render(""), "ConfigMap", "nicfleet-validation-template")["data"]
    loaded: dict[str, Any] = yaml.safe_load(data["pod-template.yaml"])
    return loaded


def validation_pod(
    role: ValidationRole = "server", tmpl: dict[str, Any] | None = None
) -> dict[str, Any]:
    """What `create_pod` sends for one side of a validation (record.build_pod)."""
    record = new_record(
        ValidationRequest(nodes=("gpu-a", "gpu-b"), resource="rdma/ib_compute", network="ib-0"),
        id="abc123",
        namespace=NAMESPACE,
        runner="r1",
        now=0.0,
    )
    if role == "client":
        record = msgspec.structs.replace(record, server_ip="10.1.2.3")
    return build_pod(tmpl or template(), record, role, ValidationSettings())


def pod_decision(
    pod: dict[str, Any] | None, *, username: str = AGGREGATOR, operation: str = "CREATE"
) -> admission.Decision:
    return admission.admit(
        policy("nicfleet-aggregator-pods"),
        resource="pods",
        operation=operation,
        username=username,
        obj=pod,
        params=params(),
    )


def test_the_pods_the_aggregator_builds_are_admitted() -> None:
    for role in ("server", "client"):
        pod = validation_pod(role)
        decision = pod_decision(pod)
        assert decision.applies and decision.allowed, decision.refused
        (container,) = pod["spec"]["containers"]
        assert container["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
        assert container["resources"]["limits"]["rdma/ib_compute"] == "1"


def test_the_policy_image_is_the_template_image_at_the_project_version() -> None:
    (container,) = template()["spec"]["containers"]
    images = {c["image"] for c in find(render(""), "Deployment", "nicfleet-aggregator")[
        "spec"]["template"]["spec"]["containers"]}  # fmt: skip
    assert params()["data"] == {"image": container["image"]}
    assert images == {container["image"]}
    ref = binding("nicfleet-aggregator-pods")["spec"]["paramRef"]
    assert ref["namespace"] == params()["metadata"]["namespace"] == NAMESPACE
    assert ref["parameterNotFoundAction"] == "Deny"
    kind = policy("nicfleet-aggregator-pods")["spec"]["paramKind"]
    assert (kind["apiVersion"], kind["kind"]) == ("v1", params()["kind"])


def test_the_validation_serviceaccount_has_no_token_and_no_rbac() -> None:
    docs = render("")
    account = find(docs, "ServiceAccount", "nicfleet-validation")
    assert account["metadata"]["namespace"] == NAMESPACE
    assert account["automountServiceAccountToken"] is False
    assert template()["spec"]["serviceAccountName"] == "nicfleet-validation"
    subjects = [
        s["name"]
        for d in docs
        if d["kind"] in ("RoleBinding", "ClusterRoleBinding")
        for s in d["subjects"]
    ]
    assert "nicfleet-validation" not in subjects


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    first: dict[str, Any] = pod["spec"]["containers"][0]
    return first


def _sc(pod: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = _container(pod)["securityContext"]
    return found


def _add_volume(volume: dict[str, Any]) -> Change:
    return lambda pod: pod["spec"].setdefault("volumes", []).append({"name": "x", **volume})


NAME_RULE = "validation pods are named nicfleet-validate-<id>-<role>"
SA_RULE = "validation pods run as ServiceAccount nicfleet-validation"
TOKEN_RULE = "validation pods mount no ServiceAccount token (automountServiceAccountToken: false)"
HOST_RULE = "no hostNetwork, hostPID or hostIPC"
IMAGE_RULE = "every container runs ghcr.io/nicfleet/nicfleet:0.1.0"
PRIVILEGED_RULE = "no privileged container"
ESCALATION_RULE = "every container sets allowPrivilegeEscalation: false"
CAPS_RULE = "every container drops ALL capabilities and adds at most IPC_LOCK"
CONTAINER_SC_RULE = (
    "no procMount, SELinux or Windows options and no Unconfined seccomp/AppArmor profile"
)
VOLUME_RULE = (
    "volumes: emptyDir, downwardAPI and Secret nicfleet-nats-validation only (no hostPath)"
)
ENV_RULE = "no Secret in environment variables"


@pytest.mark.parametrize(
    ("change", "rule"),
    [
        pytest.param(lambda p: p["metadata"].update(name="nicfleet-nats-3"), NAME_RULE,
                     id="another-name"),
        pytest.param(lambda p: p["spec"].pop("serviceAccountName"), SA_RULE, id="no-sa"),
        pytest.param(lambda p: p["spec"].update(serviceAccountName="default"), SA_RULE,
                     id="default-sa"),
        pytest.param(lambda p: p["spec"].update(serviceAccountName="nicfleet-aggregator"),
                     SA_RULE, id="aggregator-sa"),
        pytest.param(lambda p: p["spec"].update(automountServiceAccountToken=True), TOKEN_RULE,
                     id="token"),
        pytest.param(lambda p: p["spec"].pop("automountServiceAccountToken"), TOKEN_RULE,
                     id="token-unset"),
        pytest.param(lambda p: p["spec"].update(hostNetwork=True), HOST_RULE, id="hostNetwork"),
        pytest.param(lambda p: p["spec"].update(hostPID=True), HOST_RULE, id="hostPID"),
        pytest.param(lambda p: p["spec"].update(hostIPC=True), HOST_RULE, id="hostIPC"),
        pytest.param(lambda p: _container(p).update(image="docker.io/library/busybox:1"),
                     IMAGE_RULE, id="another-image"),
        pytest.param(lambda p: _container(p).update(image="ghcr.io/nicfleet/nicfleet:0.1.0-x"),
                     IMAGE_RULE, id="another-tag"),
        pytest.param(lambda p: p["spec"].update(initContainers=[
            {**copy.deepcopy(_container(p)), "name": "i", "image": "busybox"}]),
                     IMAGE_RULE, id="init-container-image"),
        pytest.param(lambda p: _sc(p).update(privileged=True), PRIVILEGED_RULE, id="privileged"),
        pytest.param(lambda p: _sc(p).update(allowPrivilegeEscalation=True), ESCALATION_RULE,
                     id="escalation"),
        pytest.param(lambda p: _sc(p).pop("allowPrivilegeEscalation"), ESCALATION_RULE,
                     id="escalation-unset"),
        pytest.param(lambda p: _sc(p)["capabilities"]["add"].append("SYS_ADMIN"), CAPS_RULE,
                     id="SYS_ADMIN"),
        pytest.param(lambda p: _sc(p)["capabilities"]["add"].append("CAP_SYS_ADMIN"), CAPS_RULE,
                     id="CAP_SYS_ADMIN"),
        pytest.param(lambda p: _sc(p)["capabilities"]["add"].append("NET_RAW"), CAPS_RULE,
                     id="NET_RAW"),
        pytest.param(lambda p: _sc(p)["capabilities"].update(drop=[]), CAPS_RULE, id="no-drop"),
        pytest.param(lambda p: _sc(p).pop("capabilities"), CAPS_RULE, id="no-capabilities"),
        pytest.param(lambda p: _sc(p).update(procMount="Unmasked"), CONTAINER_SC_RULE,
                     id="procMount"),
        pytest.param(lambda p: _sc(p).update(seccompProfile={"type": "Unconfined"}),
                     CONTAINER_SC_RULE, id="seccomp-unconfined"),
        pytest.param(lambda p: _sc(p).update(seLinuxOptions={"type": "spc_t"}),
                     CONTAINER_SC_RULE, id="selinux-spc"),
        pytest.param(lambda p: p["spec"]["securityContext"].update(
            seccompProfile={"type": "Unconfined"}), CONTAINER_SC_RULE.replace(
                "no procMount, ", "no sysctls, "), id="pod-seccomp-unconfined"),
        pytest.param(lambda p: p["spec"]["securityContext"].update(
            sysctls=[{"name": "kernel.msgmax", "value": "1"}]), CONTAINER_SC_RULE.replace(
                "no procMount, ", "no sysctls, "), id="sysctls"),
        pytest.param(lambda p: _container(p).update(ports=[{"containerPort": 22,
                                                            "hostPort": 22}]),
                     "no hostPort", id="hostPort"),
        pytest.param(_add_volume({"hostPath": {"path": "/"}}), VOLUME_RULE, id="hostPath-root"),
        pytest.param(_add_volume({"hostPath": {"path": "/dev/infiniband"}}), VOLUME_RULE,
                     id="hostPath-dev-infiniband"),
        pytest.param(_add_volume({"secret": {"secretName": "nicfleet-nats-auth"}}), VOLUME_RULE,
                     id="another-secret"),
        pytest.param(_add_volume({"projected": {"sources": [
            {"serviceAccountToken": {"path": "token"}}]}}), VOLUME_RULE, id="projected-token"),
        pytest.param(_add_volume({"persistentVolumeClaim": {"claimName": "jetstream-0"}}),
                     VOLUME_RULE, id="pvc"),
        pytest.param(lambda p: _container(p)["env"].append({"name": "S", "valueFrom": {
            "secretKeyRef": {"name": "nicfleet-aggregator-nats", "key": "aggregator.nk"}}}),
                     ENV_RULE, id="env-secret"),
        pytest.param(lambda p: _container(p).update(envFrom=[
            {"secretRef": {"name": "nicfleet-nats-auth"}}]), ENV_RULE, id="envFrom-secret"),
    ],
)  # fmt: skip
def test_a_forbidden_pod_is_refused_by_its_rule(change: Change, rule: str) -> None:
    pod = validation_pod()
    change(pod)
    decision = pod_decision(pod)
    assert decision.applies
    assert decision.refused == (rule,)
    assert pod_decision(pod, operation="UPDATE").refused == (rule,)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda p: _sc(p)["capabilities"].pop("add"), id="no-IPC_LOCK"),
        pytest.param(_add_volume({"emptyDir": {"sizeLimit": "1Mi"}}), id="emptyDir"),
        pytest.param(lambda p: _sc(p).update(seccompProfile={"type": "RuntimeDefault"}),
                     id="container-seccomp"),
        pytest.param(lambda p: _sc(p).update(procMount="Default"), id="procMount-default"),
        pytest.param(lambda p: _container(p).update(ports=[{"containerPort": 18515}]),
                     id="containerPort"),
        pytest.param(lambda p: p["spec"].update(initContainers=[
            {**copy.deepcopy(_container(p)), "name": "init"}]), id="init-container"),
    ],
)  # fmt: skip
def test_a_template_change_within_the_bounds_is_admitted(change: Change) -> None:
    pod = validation_pod()
    change(pod)
    assert pod_decision(pod).refused == ()


def test_the_template_before_this_policy_would_be_refused() -> None:
    """The shipped template had no serviceAccountName (the namespace's `default`)."""
    old = template()
    del old["spec"]["serviceAccountName"]
    pod = validation_pod(tmpl=old)
    pod["spec"]["serviceAccountName"] = "default"  # what ServiceAccount admission sets
    assert pod_decision(pod).refused == (SA_RULE,)


def test_other_creators_and_deletes_are_not_matched() -> None:
    """The agent DaemonSet's pod (hostNetwork, hostPath) made by the DaemonSet controller
    is not this policy's business; the same pod from the aggregator is refused."""
    agent = find(render(""), "DaemonSet", "nicfleet-agent")["spec"]["template"]
    controller = "system:serviceaccount:kube-system:daemon-set-controller"
    assert not pod_decision(agent, username=controller).applies
    refused = pod_decision(agent).refused
    assert {NAME_RULE, SA_RULE, HOST_RULE, VOLUME_RULE} <= set(refused)
    assert not pod_decision(None, operation="DELETE").applies  # cleaning up stays possible


def test_without_the_parameter_every_pod_is_refused() -> None:
    decision = admission.admit(
        policy("nicfleet-aggregator-pods"),
        resource="pods",
        operation="CREATE",
        username=AGGREGATOR,
        obj=validation_pod(),
        params=None,
    )
    assert decision.applies and not decision.allowed


# --- Nodes: nicfleet.io/ labels only ----------------------------------------------------------


def written_labels() -> set[str]:
    """Every `nicfleet.io/...` key aggregator/reconcile/nodelabels.py writes."""
    tree = ast.parse(Path(nodelabels.__file__).read_text())
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant)
        and isinstance(n.value, str)
        and n.value.startswith("nicfleet.io/")
        and len(n.value) > len("nicfleet.io/")
    }


def node() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": "gpu-a",
            "labels": {
                "kubernetes.io/hostname": "gpu-a",
                "nvidia.com/gpu.present": "true",
                "nicfleet.io/rdma": "true",
                "nicfleet.io/rdma-rate-gbps": "200",
                "nicfleet.io/retired-key": "x",
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "providerID": "baremetal://gpu-a",
            "taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}],
        },
        "status": {
            "allocatable": {"rdma/ib_compute": "64"},
            "nodeInfo": {"kubeletVersion": "v1.37.0"},
        },
    }  # fmt: skip


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, what the API server does with application/merge-patch+json."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def node_decision(
    new: dict[str, Any] | None,
    old: dict[str, Any] | None,
    *,
    operation: str = "UPDATE",
    username: str = AGGREGATOR,
) -> admission.Decision:
    return policies.decide(
        policy("nicfleet-aggregator-node-labels"), "nodes", operation, new, old, username=username
    )


def test_the_policy_allows_exactly_the_labels_nodelabels_writes() -> None:
    spec = policy("nicfleet-aggregator-node-labels")["spec"]
    (written,) = [v for v in spec["variables"] if v["name"] == "written"]
    assert set(admission.evaluate(written["expression"], {})) == written_labels()
    assert len(written_labels()) == 4


def _labels(patch: dict[str, str | None]) -> dict[str, Any]:
    """The body of KubeClient.patch_node_labels."""
    return {"metadata": {"labels": patch}}


@pytest.mark.parametrize(
    "patch",
    [
        pytest.param(lambda w: _labels(dict.fromkeys(w, "true")), id="every-written-label"),
        pytest.param(lambda w: _labels({"nicfleet.io/rdma-rate-gbps": "400"}), id="change"),
        pytest.param(lambda w: _labels({"nicfleet.io/rdma": None}), id="remove-written"),
        pytest.param(lambda w: _labels({"nicfleet.io/retired-key": None}), id="remove-stale"),
        pytest.param(lambda w: _labels({}), id="nothing"),
    ],
)
def test_the_aggregator_may_write_its_labels(patch: Callable[[set[str]], Any]) -> None:
    old = node()
    new = merge_patch(old, patch(written_labels()))
    assert node_decision(new, old).refused == ()


def test_a_node_without_labels_may_get_them() -> None:
    old = node()
    del old["metadata"]["labels"]
    new = merge_patch(old, _labels({"nicfleet.io/rdma": "true"}))
    assert node_decision(new, old).refused == ()


LABEL_RULE = (
    "only nicfleet.io/ labels change: the ones nicfleet writes are set,"
    " any nicfleet.io/ label may be removed"
)
SPEC_RULE = "spec unchanged (taints, unschedulable, podCIDR, providerID, ...)"


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        pytest.param(_labels({"kubernetes.io/hostname": "other"}), LABEL_RULE, id="hostname"),
        pytest.param(_labels({"node-role.kubernetes.io/control-plane": ""}), LABEL_RULE,
                     id="add-role"),
        pytest.param(_labels({"nvidia.com/gpu.present": None}), LABEL_RULE, id="remove-label"),
        pytest.param(_labels({"nicfleet.io/other": "x"}), LABEL_RULE, id="unwritten-nicfleet"),
        pytest.param(_labels({"nicfleet.io/retired-key": "y"}), LABEL_RULE,
                     id="change-unwritten-nicfleet"),
        pytest.param({"metadata": {"annotations": {"a": "b"}}}, "annotations unchanged",
                     id="add-annotation"),
        pytest.param({"metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "5"}}},
                     "annotations unchanged", id="change-annotation"),
        pytest.param({"metadata": {"annotations": None}}, "annotations unchanged",
                     id="remove-annotations"),
        pytest.param({"spec": {"taints": []}}, SPEC_RULE, id="remove-taint"),
        pytest.param({"spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                                          {"key": "x", "effect": "NoExecute"}]}},
                     SPEC_RULE, id="add-taint"),
        pytest.param({"spec": {"unschedulable": True}}, SPEC_RULE, id="cordon"),
        pytest.param({"spec": {"providerID": "aws:///x"}}, SPEC_RULE, id="provider-id"),
        pytest.param({"status": {"allocatable": {"rdma/ib_compute": "0"}}}, "status unchanged",
                     id="status"),
        pytest.param({"metadata": {"finalizers": ["x/y"]}},
                     "owner references and finalizers unchanged", id="finalizer"),
        pytest.param({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                                        "name": "p", "uid": "u"}]}},
                     "owner references and finalizers unchanged", id="owner"),
    ],
)  # fmt: skip
def test_any_other_node_change_is_refused_by_its_rule(patch: dict[str, Any], rule: str) -> None:
    old = node()
    new = merge_patch(old, patch)
    assert node_decision(new, old).refused == (rule,)
    # The same change by anyone else (the kubelet, an admin) is not this policy's business.
    assert not node_decision(new, old, username="system:node:gpu-a").applies


def test_labels_and_a_taint_in_one_patch_are_refused() -> None:
    old = node()
    new = merge_patch(old, {**_labels({"nicfleet.io/rdma": "true"}), "spec": {"taints": []}})
    assert node_decision(new, old).refused == (SPEC_RULE,)


@pytest.mark.parametrize("operation", ["CREATE", "DELETE"])
def test_the_aggregator_neither_creates_nor_deletes_nodes(operation: str) -> None:
    new, old = (node(), None) if operation == "CREATE" else (None, node())
    decision = node_decision(new, old, operation=operation)
    assert decision.applies and not decision.allowed
    assert decision.refused[0] == "the aggregator only updates nodes"


@pytest.mark.parametrize(
    ("name", "allowed"),
    [
        ("nicfleet-validate-abc123-server", True),
        ("nicfleet-nats-0", False),
        ("nicfleet-agent-7xk2p", False),
        ("nicfleet-aggregator-7d9f-abcde", False),
    ],
)
def test_the_aggregator_deletes_its_validation_pods_only(name: str, allowed: bool) -> None:
    assert validation_pod()["metadata"]["name"].startswith(POD_PREFIX)
    existing = {**validation_pod(), "metadata": {"name": name, "namespace": NAMESPACE}}
    decision = admission.admit(
        policy("nicfleet-aggregator-pod-deletes"),
        resource="pods",
        operation="DELETE",
        username=AGGREGATOR,
        obj=None,
        old=existing,
    )
    assert decision.applies and decision.allowed is allowed
    assert POD_PREFIX in policy("nicfleet-aggregator-pod-deletes")["spec"]["validations"][0][
        "expression"]  # fmt: skip
