"""proto.operatorwebhook (pure): the Network Operator webhook's refusals of repositories,
ibKubernetes' pKey GUID pool, docaTelemetryService's ConfigMap name and ofedDriver's
safeLoad (api/v1alpha1/validator/nicpolicy_webhook.go)."""

from __future__ import annotations

from typing import Any

import pytest

from proto.nicclusterpolicy import audit_policy
from proto.operatorwebhook import repository_error, webhook_notes


@pytest.mark.parametrize(
    ("repo", "ok"),
    [
        pytest.param("nvcr.io/nvidia/mellanox", True, id="registry-path"),
        pytest.param("ghcr.io/mellanox", True, id="ghcr"),
        pytest.param("mellanox", True, id="hub-single-name"),
        pytest.param("localhost:5000/team/images", True, id="localhost-port"),
        pytest.param("registry.local:5000/x", True, id="domain-port"),
        pytest.param("[fd00::1]:5000/x", True, id="ipv6-domain"),
        pytest.param("nvcr.io/nvidia/mellanox:tag", True, id="with-tag"),
        pytest.param("", False, id="empty"),
        pytest.param("nvcr.io/NVIDIA/mellanox", False, id="uppercase-path"),
        pytest.param("nvcr.io//mellanox", False, id="empty-component"),
        pytest.param("nvcr.io/mellanox/", False, id="trailing-slash"),
        pytest.param("nvcr.io/mel lanox", False, id="space"),
        pytest.param("a" * 64, False, id="hex-identifier"),
        pytest.param("nvcr.io/" + "a" * 260, False, id="too-long"),
    ],
)
def test_repository(repo: str, ok: bool) -> None:
    assert (repository_error(repo) is None) is ok


def ncp(**spec: Any) -> dict[str, Any]:
    return {"kind": "NicClusterPolicy", "metadata": {"name": "nic-cluster-policy"}, "spec": spec}


@pytest.mark.parametrize(
    ("spec", "paths"),
    [
        pytest.param({"nvIpam": {"image": "nvidia-k8s-ipam", "repository": "ghcr.io/mellanox"}},
                     [], id="good-repository"),
        pytest.param({"nvIpam": {"image": "nvidia-k8s-ipam", "repository": "Ghcr.io/Mellanox"}},
                     ["spec.nvIpam.repository"], id="bad-repository"),
        # A section without its own repository takes spec.global's; neither: refused.
        pytest.param({"global": {"repository": "nvcr.io/nvidia/mellanox"},
                      "secondaryNetwork": {"multus": {"image": "multus-cni"}}}, [],
                     id="global-repository"),
        pytest.param({"secondaryNetwork": {"multus": {"image": "multus-cni"}}},
                     ["spec.secondaryNetwork.multus.repository"], id="no-repository-at-all"),
        pytest.param({"ibKubernetes": {"repository": "ghcr.io/mellanox",
                                       "pKeyGUIDPoolRangeStart": "02:00:00:00:00:00:00:00",
                                       "pKeyGUIDPoolRangeEnd": "02:FF:FF:FF:FF:FF:FF:FF"}},
                     [], id="guid-range"),
        pytest.param({"ibKubernetes": {"repository": "ghcr.io/mellanox",
                                       "pKeyGUIDPoolRangeStart": "02:00:00:00:00:00:00",
                                       "pKeyGUIDPoolRangeEnd": "zz:00:00:00:00:00:00:00"}},
                     ["spec.ibKubernetes.pKeyGUIDPoolRangeStart",
                      "spec.ibKubernetes.pKeyGUIDPoolRangeEnd"], id="guid-format"),
        pytest.param({"ibKubernetes": {"repository": "ghcr.io/mellanox",
                                       "pKeyGUIDPoolRangeStart": "02:00:00:00:00:00:00:10",
                                       "pKeyGUIDPoolRangeEnd": "02:00:00:00:00:00:00:10"}},
                     ["spec.ibKubernetes.pKeyGUIDPoolRangeEnd"], id="guid-empty-range"),
        pytest.param({"docaTelemetryService": {"repository": "nvcr.io/nvidia/doca",
                                               "config": {"fromConfigMap": "dts-config"}}},
                     [], id="telemetry-configmap"),
        pytest.param({"docaTelemetryService": {"repository": "nvcr.io/nvidia/doca",
                                               "config": {"fromConfigMap": "DTS_Config"}}},
                     ["spec.docaTelemetryService.config.fromConfigMap"], id="telemetry-bad-name"),
        pytest.param({"docaTelemetryService": {"repository": "nvcr.io/nvidia/doca"}}, [],
                     id="telemetry-default-config"),
        pytest.param({"ofedDriver": {"repository": "nvcr.io/nvidia/mellanox",
                                     "upgradePolicy": {"safeLoad": True}}},
                     ["spec.ofedDriver.upgradePolicy.safeLoad"], id="safe-load-alone"),
        pytest.param({"ofedDriver": {"repository": "nvcr.io/nvidia/mellanox",
                                     "upgradePolicy": {"safeLoad": True, "autoUpgrade": True}}},
                     [], id="safe-load-with-auto-upgrade"),
    ],
)  # fmt: skip
def test_cluster_policy_refusals(spec: dict[str, Any], paths: list[str]) -> None:
    notes = webhook_notes("NicClusterPolicy", spec)
    assert [n.path for n in notes] == paths
    assert all(n.severity == "critical" and "webhook refuses" in n.message for n in notes)


def test_node_policy_is_checked_for_safe_load_only() -> None:
    spec = {"ofedDriver": {"upgradePolicy": {"safeLoad": True}},
            "nvIpam": {"repository": "BAD"}}  # fmt: skip
    assert [n.path for n in webhook_notes("NicNodePolicy", spec)] == [
        "spec.ofedDriver.upgradePolicy.safeLoad"
    ]


def test_the_audit_reports_them() -> None:
    obj = ncp(nvIpam={"image": "nvidia-k8s-ipam", "repository": "bad repo"})
    (note,) = [n for n in audit_policy(obj, {}).notes if n.section == "webhook"]
    assert note.path == "spec.nvIpam.repository"
