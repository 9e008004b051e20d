"""Findings of the NicClusterPolicy audit against the fleet (pure): upstream would not start
(or the webhook refuses), advertises 0 on every node, nicfleet would differ, other sections."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from aggregator.fleet.state import NodeRecord
from aggregator.reconcile.nvidia import (
    AUDIT_RULES,
    RULE_DIFFERS,
    RULE_INVALID,
    RULE_MATCHES_NOTHING,
    RULE_SECTION,
    audit_nic_cluster_policy,
)
from tests.support.builders import T0, nic, snapshot
from tests.support.paths import REPO

FLEET = {
    "gpu-001": NodeRecord(
        name="gpu-001",
        snapshot=snapshot(
            "gpu-001",
            devices=(
                nic("mlx5_0", netdevs=("ib0",)),
                nic(
                    "mlx5_1", index=1, netdevs=("eth2",), link_layer="Ethernet", device_id="0x101d"
                ),
            ),
        ),
        first_seen=T0,
        last_seen=T0,
    ),
    "gpu-002": NodeRecord(name="gpu-002", first_seen=T0, last_seen=T0),  # no snapshot yet
}


REPOSITORY = "nvcr.io/nvidia/mellanox"


def ncp(config: Any) -> dict[str, Any]:
    if not isinstance(config, str) and config is not None:
        config = json.dumps(config)
    plugin: dict[str, Any] = {"image": "k8s-rdma-shared-dev-plugin", "version": "v1.5.3"}
    if config is not None:
        plugin["config"] = config
    return {
        "apiVersion": "mellanox.com/v1alpha1",
        "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        # Every section needs a repository, its own or global's (the webhook).
        "spec": {"global": {"repository": REPOSITORY}, "rdmaSharedDevicePlugin": plugin},
    }


def entry(name: str = "rdma_shared_a", **selectors: Any) -> dict[str, Any]:
    return {"resourceName": name, "rdmaHcaMax": 63, "selectors": selectors or {"vendors": ["15b3"]}}


def test_a_good_config_has_no_findings() -> None:
    config = {"periodicUpdateInterval": 300, "configList": [entry(linkTypes=["infiniband"])]}
    assert audit_nic_cluster_policy(ncp(config), FLEET) == ()


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param({}, id="no-spec"),
        pytest.param(
            {"spec": {"global": {"repository": REPOSITORY}, "ofedDriver": {}}}, id="no-plugin"
        ),
        pytest.param(ncp(None), id="plugin-without-config"),
    ],
)
def test_nothing_to_audit(obj: dict[str, Any]) -> None:
    assert audit_nic_cluster_policy(obj, FLEET) == ()


@pytest.mark.parametrize(
    ("config", "path", "words"),
    [
        pytest.param("{not json", "config", "not valid JSON", id="not-json"),
        pytest.param("configList: []", "config", "not valid JSON", id="yaml-not-json"),
        pytest.param(42, "config", "must be a string", id="not-a-string"),
        pytest.param(
            {
                "configList": [
                    {"resourceName": "a", "rdmaHcaMax": -1, "selectors": {"vendors": ["15b3"]}}
                ]
            },
            "config.configList[0].rdmaHcaMax",
            "rdmaHcaMax < 0",
            id="negative-hca-max",
        ),
        pytest.param(
            {"configList": [{"resourceName": "a", "rdmaHcaMax": 1}]},
            "config.configList[0].selectors",
            "neither",
            id="no-selectors",
        ),
        pytest.param(
            {"configList": [entry("rdma-a")]},
            "config.configList[0].resourceName",
            "invalid characters",
            id="upstream-name",
        ),
        pytest.param(
            {"configList": [entry("a"), {**entry("a"), "resourcePrefix": "other"}]},
            "config.configList[1].resourceName",
            "already exists",
            id="duplicate-without-prefix",
        ),
        pytest.param(
            {"configList": [entry("a", numaNodes=[0])]},
            "config.configList[0].selectors",
            "neither",
            id="only-nicfleet-selectors",
        ),
        pytest.param({"configList": []}, "config.configList", "no resources", id="empty-list"),
        pytest.param({"configLst": []}, "config.configList", "no resources", id="typo-ignored"),
        pytest.param(
            {"configList": [{**entry("a"), "rdmaHcaMax": "63"}]},
            "config.configList[0].rdmaHcaMax",
            "cannot unmarshal string",
            id="string-hca-max",
        ),
    ],
)
def test_upstream_would_not_start_is_a_finding_naming_the_field(
    config: Any, path: str, words: str
) -> None:
    obj = ncp(config) if not isinstance(config, int) else ncp(None)
    if isinstance(config, int):
        obj["spec"]["rdmaSharedDevicePlugin"]["config"] = config
    findings = audit_nic_cluster_policy(obj, FLEET)
    assert findings, "expected a finding"
    finding = findings[0]
    assert (finding.rule, finding.severity) == (RULE_INVALID, "critical")
    assert finding.node is None
    assert finding.subject == "NicClusterPolicy/nic-cluster-policy"
    assert str(finding.evidence["path"]) == f"spec.rdmaSharedDevicePlugin.{path}"
    assert words in finding.message
    assert "upstream would not start" in finding.message


def test_webhook_refusal_is_a_finding() -> None:
    config = {"configList": [{"resourceName": "a", "selectors": {"vendors": ["15b3"]}}]}
    findings = audit_nic_cluster_policy(ncp(config), FLEET)
    refused = [f for f in findings if "webhook refuses" in f.message]
    assert refused and refused[0].rule == RULE_INVALID
    assert "rdmaHcaMax is required" in refused[0].message


def test_selector_matching_nothing_on_every_node() -> None:
    config = {
        "configList": [
            entry("ib", deviceIDs=["1021"], linkTypes=["infiniband"]),
            entry("roce", deviceIDs=["101d"], linkTypes=["ether"]),
            entry("cx6", deviceIDs=["101b"]),
            {"resourceName": "wrong_if", "rdmaHcaMax": 1, "devices": ["ib7"]},
        ]
    }
    findings = audit_nic_cluster_policy(ncp(config), FLEET)
    assert {(f.rule, f.subject) for f in findings} == {
        (RULE_MATCHES_NOTHING, "NicClusterPolicy/nic-cluster-policy/cx6"),
        (RULE_MATCHES_NOTHING, "NicClusterPolicy/nic-cluster-policy/wrong_if"),
    }
    cx6 = next(f for f in findings if f.subject.endswith("/cx6"))
    assert "deviceIDs ['101b'] does not contain '1021'" in cx6.message


def test_nicfleet_differs_per_node() -> None:
    config = {"configList": [entry("ib", deviceIDs=["0x1021"])]}
    findings = audit_nic_cluster_policy(ncp(config), FLEET)
    differs = [f for f in findings if f.rule == RULE_DIFFERS]
    assert [(f.node, f.severity) for f in differs] == [("gpu-001", "warning")]
    assert "upstream advertises 0, nicfleet would advertise 63" in differs[0].message


def test_other_sections_become_findings_skipping_info() -> None:
    obj = ncp(None)
    obj["spec"]["ofedDriver"] = {"version": "latest"}
    obj["spec"]["nvIpam"] = {"image": "nvidia-k8s-ipam"}
    obj["status"] = {"state": "error", "reason": "driver pod crashed"}
    findings = audit_nic_cluster_policy(obj, FLEET)
    assert {(f.rule, f.severity, f.evidence["path"]) for f in findings} == {
        (RULE_SECTION, "warning", "spec.nvIpam"),
        (RULE_SECTION, "warning", "status.state"),
        (RULE_SECTION, "critical", "spec.ofedDriver.version"),
    }


def test_no_inventory_means_no_matching_verdict() -> None:
    config = {"configList": [entry("cx6", deviceIDs=["101b"])]}
    empty = {"gpu-002": FLEET["gpu-002"]}
    assert audit_nic_cluster_policy(ncp(config), empty) == ()


def test_an_entry_nicfleet_leaves_out_differs_with_the_field() -> None:
    # Upstream serves kubernetes.io/ib (the kubelet then refuses it); nicfleet's agent serves
    # the other entry and leaves this one out (registration config-invalid).
    config = {"configList": [entry("ib"), {**entry("ib_k"), "resourcePrefix": "kubernetes.io"}]}
    findings = audit_nic_cluster_policy(ncp(config), FLEET)
    (differs,) = [f for f in findings if f.rule == RULE_DIFFERS]
    assert differs.evidence["resource"] == "kubernetes.io/ib_k"
    assert "nicfleet would advertise 0: it leaves this resource out:" in differs.message
    assert "configList[1].resourcePrefix" in differs.message


def test_every_finding_carries_an_audit_rule_and_one_of_its_severities() -> None:
    """AUDIT_RULES (what docs/rules.md is checked against) covers what the audit says."""
    objs = [
        yaml.safe_load(path.read_text())
        for path in sorted((REPO / "tests/data/network-operator").glob("*.yaml"))
    ]
    findings = [f for obj in objs for f in audit_nic_cluster_policy(obj, FLEET)]
    assert {f.rule for f in findings} >= {RULE_INVALID, RULE_SECTION, RULE_MATCHES_NOTHING}
    for f in findings:
        assert f.severity in AUDIT_RULES.get(f.rule, ()), (f.rule, f.severity)


def test_a_section_without_any_repository_is_refused() -> None:
    obj = ncp(None)
    del obj["spec"]["global"]
    (finding,) = audit_nic_cluster_policy(obj, FLEET)
    assert (finding.rule, finding.evidence["path"]) == (
        RULE_INVALID, "spec.rdmaSharedDevicePlugin.repository",
    )  # fmt: skip
