"""The components section judges a DaemonSet's placement as its controller does: the
template's nodeSelector AND required node affinity choose the nodes it is meant for, and a
NoSchedule/NoExecute taint it does not tolerate (beyond the controller's own tolerations)
keeps it off a node it is meant for — a broken link naming the taint."""

from __future__ import annotations

import msgspec

from aggregator.cluster import ClusterNode, ClusterView, DaemonSetState
from aggregator.placement import Requirement, SelectorTerm, Taint, Toleration
from aggregator.trace.components import components_link
from aggregator.trace.host import ChainContext
from tests.support.builders import T0

NODE = "gpu-001"
LABELS = {"feature.node.kubernetes.io/pci-15b3.present": "true", "kubernetes.io/os": "linux"}
GPU_TAINT = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
CORDONED = Taint(key="node.kubernetes.io/unschedulable", effect="NoSchedule")
MULTUS = DaemonSetState(
    namespace="nvidia-network-operator", name="kube-multus-ds", role="multus",
    desired=1, ready=1, available=1, updated=1, ready_nodes=("gpu-002",),
)  # fmt: skip
WINDOWS_ONLY = (
    SelectorTerm(
        match_expressions=(Requirement(key="kubernetes.io/os", operator="In", values=("windows",)),)
    ),
)


def ctx(ds: DaemonSetState, *taints: Taint) -> ChainContext:
    nodes = {
        NODE: ClusterNode(name=NODE, labels=LABELS, taints=taints),
        "gpu-002": ClusterNode(name="gpu-002", labels=LABELS),
    }
    cluster = ClusterView(present=True, nodes=nodes, daemonsets=(ds,))
    return ChainContext(
        node=NODE, resource="rdma/ib", record=None, cluster=cluster, policies=(), config=None,
        status=None, now=T0, stale_after=30.0,
    )  # fmt: skip


def test_an_untolerated_taint_on_a_node_it_is_meant_for_is_named() -> None:
    link = components_link(ctx(MULTUS, GPU_TAINT))
    assert link.status == "broken"
    assert link.cause == (
        "Multus DaemonSet nvidia-network-operator/kube-multus-ds is meant for gpu-001 but it "
        "does not tolerate the node's taint nvidia.com/gpu=present:NoSchedule, so the "
        "controller runs no pod there"
    )
    assert "kubectl taint node gpu-001 nvidia.com/gpu=present:NoSchedule-" in (link.fix or "")
    (multus,) = link.evidence["daemonsets"]
    assert multus["selects_node"] is False and multus["nodes_lacking"] == []
    assert multus["not_here"].startswith("it does not tolerate")


def test_a_tolerated_taint_leaves_the_missing_pod_to_explain() -> None:
    tolerant = msgspec.structs.replace(
        MULTUS, tolerations=(Toleration(key="nvidia.com/gpu", operator="Exists"),)
    )
    link = components_link(ctx(tolerant, GPU_TAINT))
    assert link.status == "broken"
    assert link.cause == (
        "Multus DaemonSet nvidia-network-operator/kube-multus-ds has no pod on gpu-001 "
        "(1/1 ready cluster-wide)"
    )
    assert link.evidence["daemonsets"][0]["nodes_lacking"] == [NODE]


def test_a_cordoned_node_still_gets_its_daemons() -> None:
    # The controller adds node.kubernetes.io/unschedulable:NoSchedule to every daemon pod.
    link = components_link(ctx(MULTUS, CORDONED))
    assert link.status == "broken" and "has no pod on gpu-001" in (link.cause or "")


def test_affinity_that_excludes_the_node_is_not_a_problem() -> None:
    elsewhere = msgspec.structs.replace(MULTUS, affinity=WINDOWS_ONLY)
    link = components_link(ctx(elsewhere, GPU_TAINT))
    assert link.status == "ok", link.cause
    (multus,) = link.evidence["daemonsets"]
    assert multus["selects_node"] is False
    assert multus["not_here"] == "its required node affinity does not match the node"
    assert multus["nodes_lacking"] == []  # gpu-002 is linux too


def test_a_ready_pod_counts_whatever_the_taints_say() -> None:
    here = msgspec.structs.replace(MULTUS, ready_nodes=(NODE, "gpu-002"))
    # NoSchedule does not evict a pod already running (only NoExecute would).
    assert components_link(ctx(here, GPU_TAINT)).status == "ok"


def test_an_unready_pod_under_a_newer_taint_is_the_pods_problem() -> None:
    # NoSchedule keeps new pods off; the one already there is judged by its readiness.
    there = msgspec.structs.replace(MULTUS, unready_nodes=(NODE,))
    link = components_link(ctx(there, GPU_TAINT))
    assert link.cause == (
        "the pod of Multus DaemonSet nvidia-network-operator/kube-multus-ds on gpu-001 is not "
        "Ready (1/1 ready cluster-wide)"
    )
