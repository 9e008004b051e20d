"""The NicClusterPolicy audit on the network-operator's own sample policies
(tests/data/network-operator) against the built-in lab nodes, read by the agent's collector;
then each section's findings on small hand-built fleets."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from proto.inventory import ModuleInfo, NodeSnapshot
from proto.nicclusterpolicy import PolicyAudit, audit, audit_policy
from tests.support.builders import nic, snapshot
from tests.support.labsnapshots import lab_fleet
from tests.support.paths import REPO

SAMPLES = REPO / "tests/data/network-operator"
RESOURCE = "rdma/rdma_shared_device_a"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NodeSnapshot]:
    return lab_fleet(tmp_path_factory.mktemp("lab"))


def sample(name: str) -> dict[str, Any]:
    obj = yaml.safe_load((SAMPLES / name).read_text())
    assert isinstance(obj, dict)
    return obj


def advertised(report: PolicyAudit) -> dict[str, dict[str, int]]:
    return {v.node: {r.resource: r.advertised for r in v.resources} for v in report.nodes}


CX6_ONLY = {  # deviceIDs ["101b"]: ConnectX-6 only, which only the A100 lab node has
    "a100-ib-4nic": 63,
    "cx8-dd-lag": 0,
    "h100-ib-12nic": 0,
    "h100-iommu-acs": 0,
    "roce-cx6dx": 0,
    "roce-cx6dx-2": 0,
}


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("mellanox.com_v1alpha1_nicclusterpolicy_cr.yaml", CX6_ONLY, id="cr"),
        pytest.param("mellanox.com_v1alpha1_nicclusterpolicy_cr-full.yaml", CX6_ONLY, id="full"),
        pytest.param("mellanox.com_v1alpha1_nicclusterpolicy_cr-ipoib.yaml", CX6_ONLY, id="ipoib"),
        pytest.param(
            "mellanox.com_v1alpha1_nicclusterpolicy_cr-nvidia-ipam.yaml", CX6_ONLY, id="nv-ipam"
        ),
        pytest.param(
            "mellanox.com_v1alpha1_nicclusterpolicy.yaml", dict.fromkeys(CX6_ONLY, 63), id="sample"
        ),
        pytest.param(
            "mellanox.com_v1alpha1_nicnodepolicy.yaml", dict.fromkeys(CX6_ONLY, 63), id="node"
        ),
    ],
)
def test_operator_samples_on_the_lab_fleet(
    fleet: dict[str, NodeSnapshot], name: str, expected: dict[str, int]
) -> None:
    report = audit_policy(sample(name), fleet)
    assert report.start_failure is None
    assert advertised(report) == {node: {RESOURCE: n} for node, n in expected.items()}
    # The samples use upstream's spellings: nicfleet agrees on every node.
    assert all(r.nicfleet is None for v in report.nodes for r in v.resources)
    assert not [n for n in report.notes if n.section == "webhook"]


def test_zero_names_the_selector_and_the_value(fleet: dict[str, NodeSnapshot]) -> None:
    report = audit_policy(sample("mellanox.com_v1alpha1_nicclusterpolicy_cr.yaml"), fleet)
    roce = next(v for v in report.nodes if v.node == "roce-cx6dx")
    assert roce.sentence.startswith(f"upstream advertises 0 for {RESOURCE}: no adapter matches")
    assert "deviceIDs ['101b'] does not contain '101d'" in roce.sentence


def test_ofed_version_against_the_modules(fleet: dict[str, NodeSnapshot]) -> None:
    report = audit_policy(sample("mellanox.com_v1alpha1_nicclusterpolicy.yaml"), fleet)
    ofed = {n.node: n.message for n in report.notes if n.section == "ofedDriver"}
    assert "5.8-3.0.7 is loaded, the policy asks for 25.01-0.3.9" in ofed["a100-ib-4nic"]
    assert "inbox driver" in ofed["roce-cx6dx"]


def test_sriov_sample_selects_the_fleet(fleet: dict[str, NodeSnapshot]) -> None:
    report = audit_policy(sample("mellanox.com_v1alpha1_nicclusterpolicy_cr-full.yaml"), fleet)
    (note,) = [n for n in report.notes if n.section == "sriovDevicePlugin"]
    assert (note.severity, note.path) == ("info", "spec.sriovDevicePlugin.config.resourceList[0]")
    assert "'hostdev' selects" in note.message


def test_migration_example_shows_where_nicfleet_differs(fleet: dict[str, NodeSnapshot]) -> None:
    report = audit_policy(sample("migration-example.yaml"), fleet)
    a100 = next(v for v in report.nodes if v.node == "a100-ib-4nic")
    by_name = {r.resource: r for r in a100.resources}
    ib = by_name["rdma/rdma_ib"]
    assert (ib.advertised, ib.nicfleet) == (0, 63)
    assert ib.why is not None and "write '15b3', not '0x15B3'" in ib.why
    absent = by_name["rdma/rdma_any"]
    assert absent.advertised == 0 and absent.why is not None and "rdmaHcaMax is 0" in absent.why
    assert absent.nicfleet is None  # nicfleet refuses it: 0 too
    webhook = [n.message for n in report.notes if n.section == "webhook"]
    assert any("rdmaHcaMax is required" in m for m in webhook)
    status = [n.path for n in report.notes if n.section == "status"]
    assert status == ["status.state", "status.appliedStates[1]"]


def ncp(config: Any, **spec: Any) -> dict[str, Any]:
    text = config if isinstance(config, str) else json.dumps(config)
    return {
        "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        "spec": {"rdmaSharedDevicePlugin": {"config": text}, **spec},
    }


ONE = {"n1": snapshot("n1", devices=(nic("mlx5_0", netdevs=("ib0",)),))}


def test_would_not_start_on_every_node() -> None:
    config = {"configList": [{"resourceName": "a-b", "rdmaHcaMax": 1, "devices": ["ib0"]}]}
    report = audit_policy(ncp(config), {**ONE, "n2": snapshot("n2")})
    assert [v.verdict for v in report.nodes] == ["would-not-start", "would-not-start"]
    assert report.nodes[0].sentence.startswith(
        "upstream would not start: spec.rdmaSharedDevicePlugin.config.configList[0].resourceName"
    )


def test_yaml_config_is_not_json_for_go() -> None:
    report = audit_policy(ncp("configList: []"), ONE)
    assert report.start_failure is not None and report.start_failure.stage == "decode"
    assert "not valid for Go's json.Unmarshal" in (report.nodes[0].reason or "")


@pytest.mark.parametrize(
    ("modules", "version", "words"),
    [
        pytest.param({"mlx5_core": ModuleInfo(version="24.10-1.1.4")}, "24.10-1.1.4.0", None,
                     id="match"),
        pytest.param({"mlx5_core": ModuleInfo(version="24.10-1.1.4")}, "doca2.9.1-24.10-1.1.4.0-0",
                     None, id="doca-prefix"),
        pytest.param({"mlx5_core": ModuleInfo(version="24.07-0.6.1")}, "24.10-1.1.4.0",
                     "24.07-0.6.1 is loaded", id="older"),
        pytest.param({}, "24.10-1.1.4.0", "not loaded", id="not-loaded"),
        pytest.param({"mlx5_core": ModuleInfo()}, "24.10-1.1.4.0", "inbox", id="inbox"),
        pytest.param({}, "latest", "webhook refuses", id="bad-version"),
        pytest.param({}, "sha256:" + "a" * 64, "digest", id="digest"),
    ],
)  # fmt: skip
def test_ofed(modules: dict[str, ModuleInfo], version: str, words: str | None) -> None:
    snap = NodeSnapshot(node="n1", agent_version="t", seq=1, collected_at=0.0, modules=modules)
    ofed = {"version": version, "repository": "nvcr.io/nvidia/mellanox"}
    obj = {"kind": "NicClusterPolicy", "spec": {"ofedDriver": ofed}}
    notes = audit_policy(obj, {"n1": snap}).notes
    if words is None:
        assert notes == ()
    else:
        assert len(notes) == 1 and words in notes[0].message


@pytest.mark.parametrize(
    ("spec", "section", "words"),
    [
        pytest.param({"secondaryNetwork": {"cniPlugins": {}}}, "secondaryNetwork", "without Multus",
                     id="no-multus"),
        pytest.param({"secondaryNetwork": {"multus": {}, "ipoib": {}}}, "secondaryNetwork",
                     "no node has an InfiniBand port", id="ipoib-on-roce"),
        pytest.param({"nvIpam": {}}, "nvIpam", "no Multus", id="nv-ipam-without-multus"),
        pytest.param({"sriovDevicePlugin": {"config": json.dumps({"resourceList": [
            {"resourceName": "vf", "selectors": {"devices": ["101e"]}}]})}},
            "sriovDevicePlugin", "selects no adapter", id="sriov-nothing"),
        pytest.param({"sriovDevicePlugin": {"config": "{"}}, "webhook", "Invalid json",
                     id="sriov-not-json"),
        pytest.param({"sriovDevicePlugin": {"config": "{"}}, "sriovDevicePlugin",
                     "the sriov device plugin would not start", id="sriov-not-json-plugin"),
    ],
)  # fmt: skip
def test_sections(spec: dict[str, Any], section: str, words: str) -> None:
    roce = {
        "n1": snapshot("n1", devices=(nic("mlx5_0", netdevs=("eth0",), link_layer="Ethernet"),))
    }
    notes = [n for n in audit_policy({"spec": spec}, roce).notes if n.section == section]
    assert notes and any(words in n.message for n in notes)


def test_node_policy_name_length_is_refused() -> None:
    obj = {"kind": "NicNodePolicy", "metadata": {"name": "x" * 31}, "spec": {}}
    (note,) = audit_policy(obj, ONE).notes
    assert (note.section, note.path, note.severity) == ("webhook", "metadata.name", "critical")


def test_worst_and_json_shape(fleet: dict[str, NodeSnapshot]) -> None:
    report = audit([sample("mellanox.com_v1alpha1_nicclusterpolicy_cr.yaml")], fleet)
    assert report.worst == "warning"
    assert audit([], fleet).worst is None


def test_only_the_policy_named_nic_cluster_policy_is_reconciled() -> None:
    other = ncp({"configList": []}) | {"metadata": {"name": "my-policy"}}
    notes = [n for n in audit_policy(other, ONE).notes if n.section == "operator"]
    assert [(n.path, n.severity) for n in notes] == [("metadata.name", "critical")]
    assert "reconciles only the NicClusterPolicy named nic-cluster-policy" in notes[0].message
    assert not [n for n in audit_policy(ncp({"configList": []}), ONE).notes
                if n.section == "operator"]  # fmt: skip


NODE_POLICY = {
    "kind": "NicNodePolicy", "metadata": {"name": "gpu-nodes"},
    "spec": {"nodeSelector": {"pool": "gpu"}, "rdmaSharedDevicePlugin": {"config": json.dumps(
        {"configList": [{"resourceName": "ib", "rdmaHcaMax": 4,
                         "selectors": {"ifNames": ["ib0"]}}]})}},
}  # fmt: skip
TWO = {**ONE, "n2": snapshot("n2", devices=(nic("mlx5_0", netdevs=("ib0",)),))}


def test_node_policy_from_snapshots_says_it_has_no_labels() -> None:
    report = audit_policy(NODE_POLICY, TWO)
    assert [v.node for v in report.nodes] == ["n1", "n2"]
    (note,) = [n for n in report.notes if n.section == "nicNodePolicy"]
    assert "snapshots carry no node labels" in note.message


def test_node_policy_is_audited_on_the_nodes_its_selector_picks() -> None:
    report = audit([NODE_POLICY], TWO, selected={"gpu-nodes": frozenset({"n2", "n9"})})
    (policy,) = report.policies
    assert [v.node for v in policy.nodes] == ["n2"]
    (note,) = [n for n in policy.notes if n.section == "nicNodePolicy"]
    assert (note.severity, note.message) == (
        "info",
        "applies to 1 of 2 nodes by their labels (pool=gpu): n2; audited against those",
    )


def test_node_policy_selecting_no_node_deploys_nothing() -> None:
    report = audit_policy(NODE_POLICY, TWO, selected_nodes=frozenset())
    assert report.nodes == ()
    (note,) = [n for n in report.notes if n.section == "nicNodePolicy"]
    assert note.severity == "warning" and "selects none of the 2 nodes" in note.message
