"""Audit of NVIDIA's NicClusterPolicy plugin config against the fleet (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from aggregator.fleet.state import NodeRecord
from aggregator.reconcile.nvidia import (
    RULE_INVALID,
    RULE_MATCHES_NOTHING,
    audit_nic_cluster_policy,
    selects,
)
from proto.messages.config import ResourceConfig, Selectors
from tests.support.builders import T0, nic, snapshot

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
        "spec": {"rdmaSharedDevicePlugin": plugin},
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
        pytest.param({"spec": {"ofedDriver": {}}}, id="no-plugin"),
        pytest.param(ncp(None), id="plugin-without-config"),
    ],
)
def test_nothing_to_audit(obj: dict[str, Any]) -> None:
    assert audit_nic_cluster_policy(obj, FLEET) == ()


@pytest.mark.parametrize(
    ("config", "path", "words"),
    [
        pytest.param("{not json", "config", "not valid JSON", id="not-json"),
        pytest.param("configList: []", "config", "JSON only", id="yaml-not-json"),
        pytest.param(42, "config", "must be a string", id="not-a-string"),
        pytest.param(
            {
                "configList": [
                    {"resourceName": "a", "rdmaHcaMax": -1, "selectors": {"vendors": ["15b3"]}}
                ]
            },
            "config.configList[0].rdmaHcaMax",
            "between 0",
            id="negative-hca-max",
        ),
        pytest.param(
            {"configList": [{"resourceName": "a", "rdmaHcaMax": 1}]},
            "config.configList[0].selectors",
            "select nothing",
            id="no-selectors",
        ),
        pytest.param(
            {"configList": [entry("rdma-a")]},
            "config.configList[0].resourceName",
            "only letters, digits and '_'",
            id="upstream-name",
        ),
        pytest.param(
            {"configList": [entry("a"), {**entry("a"), "resourcePrefix": "other"}]},
            "config.configList[1].resourceName",
            "duplicate",
            id="duplicate-without-prefix",
        ),
        pytest.param(
            {"configList": [entry("a", numaNodes=[0])]},
            "config.configList[0]",
            "refuses to start",
            id="only-nicfleet-selectors",
        ),
        pytest.param({"configList": []}, "config.configList", "empty", id="empty-list"),
        pytest.param({"configLst": []}, "config.configLst", "did you mean", id="typo"),
    ],
)
def test_invalid_config_is_a_finding_naming_the_field(config: Any, path: str, words: str) -> None:
    obj = ncp(config) if not isinstance(config, int) else ncp(None)
    if isinstance(config, int):
        obj["spec"]["rdmaSharedDevicePlugin"]["config"] = config
    findings = audit_nic_cluster_policy(obj, FLEET)
    assert findings, "expected a finding"
    finding = findings[0]
    assert finding.rule == RULE_INVALID
    assert finding.node is None
    assert finding.subject == "NicClusterPolicy/nic-cluster-policy"
    assert str(finding.evidence["path"]) == f"spec.rdmaSharedDevicePlugin.{path}"
    assert words in finding.message


def test_nicfleet_only_selector_next_to_upstream_ones_is_a_warning() -> None:
    config = {"configList": [entry("a", vendors=["15b3"], linkLayers=["InfiniBand"])]}
    (finding,) = audit_nic_cluster_policy(ncp(config), FLEET)
    assert (finding.rule, finding.severity) == (RULE_INVALID, "warning")
    assert "selectors.linkLayers" in finding.message
    assert "more adapters" in finding.message


def test_selector_matching_nothing() -> None:
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
    assert all(f.evidence["adapters"] == 2 for f in findings)


def test_no_inventory_means_no_matching_verdict() -> None:
    config = {"configList": [entry("cx6", deviceIDs=["101b"])]}
    empty = {"gpu-002": FLEET["gpu-002"]}
    assert audit_nic_cluster_policy(ncp(config), empty) == ()


@pytest.mark.parametrize(
    ("selectors", "devices", "expected"),
    [
        pytest.param(Selectors(vendors=("15b3",)), (), True, id="vendor"),
        pytest.param(Selectors(vendors=("8086",)), (), False, id="other-vendor"),
        pytest.param(Selectors(drivers=("mlx5_core",)), (), True, id="driver"),
        pytest.param(Selectors(if_names=("ib0",)), (), True, id="ifname"),
        pytest.param(None, ("ib0",), True, id="devices-as-ifnames"),
        pytest.param(Selectors(link_types=("ether",)), (), False, id="link-type"),
        pytest.param(Selectors(vendors=("15b3",), device_ids=("101d",)), (), False, id="all-anded"),
    ],
)
def test_selects(selectors: Selectors | None, devices: tuple[str, ...], expected: bool) -> None:
    resource = ResourceConfig(resource_name="r", selectors=selectors, devices=devices)
    assert selects(resource, nic("mlx5_0", netdevs=("ib0",))) is expected
