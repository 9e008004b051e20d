"""The operator webhook's container-resources check and its policy-overlap refusals
(validateContainerResources, pkg/policyoverlap at b06827e): the operator's sample policies
pass; hand-made bad ones are refused with the section, the policies and the nodes named."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from proto.nicclusterpolicy import audit, overlap_notes
from proto.operatorwebhook import container_resource_notes, node_overlaps, parse_quantity
from tests.support.paths import REPO

SAMPLES = REPO / "tests/data/network-operator"
FULL = SAMPLES / "mellanox.com_v1alpha1_nicclusterpolicy_cr-full.yaml"
NODE_POLICY = SAMPLES / "mellanox.com_v1alpha1_nicnodepolicy.yaml"


def load(path: Path) -> dict[str, Any]:
    doc = yaml.safe_load(path.read_text())
    assert isinstance(doc, dict)
    return doc


def nnp(name: str, selector: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    body = {"nodeSelector": selector, **spec} if selector is not None else spec
    return {"kind": "NicNodePolicy", "metadata": {"name": name}, "spec": body}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        pytest.param("100m", Fraction(1, 10), id="milli"),
        pytest.param("1Gi", Fraction(2**30), id="binary"),
        pytest.param("1.5", Fraction(3, 2), id="decimal"),
        pytest.param("2e3", Fraction(2000), id="exponent"),
        pytest.param(2, Fraction(2), id="yaml-number"),
        pytest.param("0", Fraction(0), id="zero"),
        pytest.param("1Gb", None, id="bad-suffix"),
        pytest.param("lots", None, id="not-a-number"),
        pytest.param(True, None, id="bool"),
    ],
)  # fmt: skip
def test_parse_quantity(text: object, value: Fraction | None) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "path",
    sorted(SAMPLES.glob("mellanox.com_v1alpha1_nicclusterpolicy*.yaml")),
    ids=lambda p: p.stem,
)
def test_the_samples_pass(path: Path) -> None:
    assert container_resource_notes(load(path)["spec"]) == []


def test_a_named_container_of_each_state_passes() -> None:
    ok = [{"name": "rdma-shared-dp", "requests": {"cpu": "100m", "memory": "64Mi"},
           "limits": {"cpu": "1", "memory": "64Mi"}}]  # fmt: skip
    spec = {"rdmaSharedDevicePlugin": {"containerResources": ok},
            "nvIpam": {"containerResources": [{"name": "nv-ipam-node"},
                                              {"name": "nv-ipam-controller"}]},
            "secondaryNetwork": {"multus": {"containerResources": [
                {"name": "kube-multus"}]}}}  # fmt: skip
    assert container_resource_notes(spec) == []


@pytest.mark.parametrize(
    ("entry", "found"),
    [
        pytest.param({"name": "rdma-shared-dev-plugin"},
                     [("name", "'rdma-shared-dev-plugin' is not in this state's manifests "
                               "(supported: rdma-shared-dp)")], id="unknown-container"),
        pytest.param({"name": "rdma-shared-dp", "requests": {"cpu": "0"}},
                     [("requests.cpu", "the request for cpu is zero")], id="zero-request"),
        pytest.param({"name": "rdma-shared-dp", "limits": {"memory": "0Mi"}},
                     [("limits.memory", "the limit for memory is zero")], id="zero-limit"),
        pytest.param({"name": "rdma-shared-dp", "requests": {"memory": "1Gi"},
                      "limits": {"memory": "512Mi"}},
                     [("requests.memory", "the memory request is greater than the limit")],
                     id="limit-below-request"),
        pytest.param({"name": "rdma-shared-dp", "limits": {"rdma/hca": "1"}},
                     [("limits.rdma/hca", "'rdma/hca' is not supported (only cpu, memory)")],
                     id="not-cpu-or-memory"),
        pytest.param({"name": "rdma-shared-dp", "requests": {"cpu": "a lot"}},
                     [("requests.cpu", "'a lot' is not a Kubernetes quantity")],
                     id="not-a-quantity"),
    ],
)  # fmt: skip
def test_bad_container_resources(entry: dict[str, Any], found: list[tuple[str, str]]) -> None:
    spec = load(FULL)["spec"]
    spec["rdmaSharedDevicePlugin"]["containerResources"] = [entry]
    notes = container_resource_notes(spec)
    where = "spec.rdmaSharedDevicePlugin.containerResources[0]."
    assert [n.path.removeprefix(where) for n in notes] == [path for path, _ in found]
    assert all(message in n.message for n, (_, message) in zip(notes, found, strict=True))
    assert all(n.severity == "critical" for n in notes)


def test_the_audit_reports_container_resources_for_cluster_policies_only() -> None:
    bad = {"containerResources": [{"name": "nope"}]}
    cluster = {"kind": "NicClusterPolicy", "metadata": {"name": "nic-cluster-policy"},
               "spec": {"ofedDriver": {"repository": "nvcr.io/nvidia/mellanox",
                                       **bad}}}  # fmt: skip
    report = audit([cluster, nnp("n", nvIpam=bad)], {})
    paths = [[n.path for n in p.notes if n.section == "webhook"] for p in report.policies]
    assert paths == [["spec.ofedDriver.containerResources[0].name"], []]


def test_section_set_in_both_the_samples() -> None:
    # Both samples set ofedDriver and rdmaSharedDevicePlugin: whichever is applied second
    # is refused.
    objs = [load(FULL), load(NODE_POLICY)]
    notes = overlap_notes(objs, ["gpu-001"], None)
    assert list(notes) == [1]
    assert [n.path for n in notes[1]] == ["spec.ofedDriver", "spec.rdmaSharedDevicePlugin"]
    assert all(n.severity == "critical" for n in notes[1])
    assert notes[1][0].message.startswith(
        "NicClusterPolicy nic-cluster-policy sets ofedDriver too: the operator's webhook refuses"
    )
    assert "every node labelled node-role.kubernetes.io/gpu=" in notes[1][0].message


def test_each_conflicting_section_is_named_with_the_live_nodes() -> None:
    cluster = {"kind": "NicClusterPolicy", "metadata": {"name": "nic-cluster-policy"},
               "spec": {"rdmaSharedDevicePlugin": {}, "sriovDevicePlugin": {},
                        "nvIpam": {}}}  # fmt: skip
    node = nnp("gpu", {"pool": "gpu"}, rdmaSharedDevicePlugin={}, sriovDevicePlugin={},
               nvIpam={}, ofedDriver={})  # fmt: skip
    notes = overlap_notes([cluster, node], ["a", "b"], {"gpu": frozenset({"b", "a"})})
    assert [n.path for n in notes[1]] == ["spec.rdmaSharedDevicePlugin", "spec.sriovDevicePlugin"]
    assert all(n.message.endswith("(both would deploy it on a, b)") for n in notes[1])


def test_a_null_section_is_not_set() -> None:
    cluster = {"kind": "NicClusterPolicy", "metadata": {"name": "c"}, "spec": {"ofedDriver": None}}
    assert overlap_notes([cluster, nnp("n", ofedDriver={})], [], None) == {}


def test_node_overlaps() -> None:
    picked = {"a": frozenset({"n1", "n2"}), "b": frozenset({"n2", "n3"}), "c": frozenset({"n2"})}
    assert node_overlaps(picked) == [("n2", ("a", "b", "c"))]


def test_two_node_policies_on_the_same_live_nodes() -> None:
    objs = [nnp("gpu", {"pool": "gpu"}), nnp("all"), nnp("eth", {"pool": "eth"})]
    selected = {"gpu": frozenset({"g1", "g2"}), "all": frozenset({"g1", "g2", "e1"}),
                "eth": frozenset({"e1"})}  # fmt: skip
    notes = overlap_notes(objs, ["e1", "g1", "g2"], selected)
    assert sorted(notes) == [1, 2]  # reported on the later policy of each pair
    (all_gpu,) = notes[1]
    assert all_gpu.severity == "critical" and all_gpu.path == "spec.nodeSelector"
    assert all_gpu.message.startswith("NicNodePolicies gpu and all both select g1, g2: ")
    assert "refuses NicNodePolicy all" in all_gpu.message
    (all_eth,) = notes[2]
    assert all_eth.message.startswith("NicNodePolicies all and eth both select e1: ")


def test_from_snapshots_only_selectors_are_compared() -> None:
    objs = [nnp("a"), nnp("b"), nnp("gpu", {"pool": "gpu"}), nnp("eth", {"pool": "eth"}),
            nnp("gpu-ib", {"pool": "gpu", "fabric": "ib"})]  # fmt: skip
    notes = overlap_notes(objs, ["n1", "n2"], None)
    by = {(i, n.severity): n.message for i, found in notes.items() for n in found}
    # No selector on either: both select every node, certainly.
    assert by[1, "critical"].startswith(
        "NicNodePolicies a and b have no nodeSelector, so both select every node (n1, n2)"
    )
    # gpu and eth can share no node (pool has one value); gpu-ib is within gpu.
    found = [(i, n.message.split(";")[0]) for i, ns in sorted(notes.items()) for n in ns if i > 1]
    assert not [m for _, m in found if m.startswith("NicNodePolicies gpu and eth")]
    assert (4, "NicNodePolicies gpu and gpu-ib both select any node labelled fabric=ib, "
               "pool=gpu") in found  # fmt: skip
    assert all(n.severity == "info" for i, ns in notes.items() if i > 1 for n in ns)
    assert "known only against the live fleet" in notes[4][-1].message


def test_a_live_fleet_without_labels_falls_back_to_selectors() -> None:
    # The aggregator knows no labels: live_selections gives {} and names no policy.
    notes = overlap_notes([nnp("a"), nnp("b")], ["n1"], {})
    (note,) = notes[1]
    assert "have no nodeSelector" in note.message
