"""The trace's components section (pure): Node conditions, the chain's DaemonSets on the
node, a leftover upstream rdma-shared-dev-plugin and the NicClusterPolicy's status, shaped
as the kubelet / node-problem-detector, the DaemonSet controller and the Network Operator
write them (network-operator manifests/state-*/ for the names)."""

from __future__ import annotations

import pytest

from aggregator.cluster import (
    AppliedState,
    ClusterNode,
    ClusterView,
    DaemonSetState,
    NodeCondition,
    OperatorStatus,
)
from aggregator.trace.components import components_link
from aggregator.trace.host import ChainContext
from proto.messages.status import ResourceStatus
from tests.support.builders import T0, resource_status

NODE = "gpu-001"
LABELS = {"feature.node.kubernetes.io/pci-15b3.present": "true", "kubernetes.io/os": "linux"}
READY = (
    NodeCondition(type="MemoryPressure", status="False", reason="KubeletHasSufficientMemory"),
    NodeCondition(type="NetworkUnavailable", status="False", reason="CalicoIsUp"),
    NodeCondition(type="KernelDeadlock", status="False", reason="KernelHasNoDeadlock"),
    NodeCondition(type="Ready", status="True", reason="KubeletReady"),
)
MULTUS = DaemonSetState(
    namespace="nvidia-network-operator", name="kube-multus-ds", role="multus",
    desired=2, ready=2, available=2, updated=2, ready_nodes=(NODE, "gpu-002"),
)  # fmt: skip
OFED = DaemonSetState(
    namespace="nvidia-network-operator", name="mofed-ubuntu22.04-ds", role="driver",
    node_selector={"feature.node.kubernetes.io/pci-15b3.present": "true"},
    desired=2, ready=1, available=1, updated=2, ready_nodes=("gpu-002",), unready_nodes=(NODE,),
)  # fmt: skip
NV_IPAM_ELSEWHERE = DaemonSetState(
    namespace="nvidia-network-operator", name="nv-ipam-node", role="nv-ipam",
    node_selector={"nvidia.com/ipam": "true"}, desired=1, ready=1, ready_nodes=("gpu-002",),
)  # fmt: skip
RSDP = DaemonSetState(
    namespace="nvidia-network-operator", name="rdma-shared-dp-ds", role="rdma-shared-dp",
    desired=2, ready=2, ready_nodes=(NODE, "gpu-002"),
)  # fmt: skip
OPERATOR_READY = OperatorStatus(
    state="ready",
    applied=(AppliedState(name="state-multus-cni", state="ready"),
             AppliedState(name="state-OFED", state="ready")),
)  # fmt: skip


def ctx(
    *,
    conditions: tuple[NodeCondition, ...] = READY,
    sets: tuple[DaemonSetState, ...] = (MULTUS,),
    operator: OperatorStatus | None = OPERATOR_READY,
    status: ResourceStatus | None = None,
    present: bool = True,
) -> ChainContext:
    nodes = {
        NODE: ClusterNode(name=NODE, labels=LABELS, conditions=conditions),
        "gpu-002": ClusterNode(name="gpu-002", labels=LABELS),
    }
    cluster = (
        ClusterView(present=True, nodes=nodes, daemonsets=sets, nic_cluster_policy=operator)
        if present
        else ClusterView()
    )
    return ChainContext(
        node=NODE, resource="rdma/ib", record=None, cluster=cluster, policies=(), config=None,
        status=status, now=T0, stale_after=30.0,
    )  # fmt: skip


def test_everything_in_place_is_ok_with_the_evidence() -> None:
    link = components_link(ctx())
    assert link.status == "ok", link.cause
    assert link.evidence["conditions"]["Ready"] == "True"
    (multus,) = link.evidence["daemonsets"]
    assert multus == {
        "name": "nvidia-network-operator/kube-multus-ds", "role": "multus", "desired": 2,
        "ready": 2, "available": 2, "updated": 2, "selects_node": True, "pod_here": "ready",
        "nodes_lacking": [],
    }  # fmt: skip
    assert link.evidence["nic_cluster_policy"]["state"] == "ready"


def test_without_a_cluster_it_is_unknown() -> None:
    assert components_link(ctx(present=False)).status == "unknown"


@pytest.mark.parametrize(
    ("kwargs", "cause"),
    [
        pytest.param(
            {"conditions": (NodeCondition(type="Ready", status="Unknown",
                                          reason="NodeStatusUnknown",
                                          message="Kubelet stopped posting node status."),)},
            "node gpu-001 is not Ready (Unknown, NodeStatusUnknown: Kubelet stopped posting "
            "node status.)",
            id="not-ready",
        ),
        pytest.param(
            {"conditions": (*READY[:1], NodeCondition(type="NetworkUnavailable", status="True",
                                                      reason="NoRouteCreated"), READY[3])},
            "node gpu-001 has NetworkUnavailable=True, NoRouteCreated",
            id="network-unavailable",
        ),
        pytest.param(
            {"conditions": (NodeCondition(type="KernelDeadlock", status="True",
                                          reason="DockerHung", message="task docker:7 blocked"),
                            READY[3])},
            "node gpu-001 has KernelDeadlock=True, DockerHung: task docker:7 blocked",
            id="node-problem-detector",
        ),
        pytest.param(
            {"sets": (MULTUS, OFED)},
            "the pod of OFED/DOCA driver DaemonSet nvidia-network-operator/mofed-ubuntu22.04-ds "
            "on gpu-001 is not Ready (1/2 ready cluster-wide)",
            id="driver-pod-not-ready",
        ),
        pytest.param(
            {"sets": (DaemonSetState(namespace="kube-system", name="kube-multus-ds",
                                     role="multus", desired=1, ready=1,
                                     ready_nodes=("gpu-002",)),)},
            "Multus DaemonSet kube-system/kube-multus-ds has no pod on gpu-001 (1/1 ready "
            "cluster-wide)",
            id="multus-missing-here",
        ),
        pytest.param(
            {"sets": (MULTUS, RSDP), "status": resource_status("rdma/ib")},
            "k8s-rdma-shared-dev-plugin DaemonSet nvidia-network-operator/rdma-shared-dp-ds "
            "still runs on gpu-001 beside nicfleet's device plugin: both register the same "
            "resource names and the kubelet keeps whichever registered last",
            id="rsdp-still-deployed",
        ),
        pytest.param(
            {"operator": OperatorStatus(state="error", applied=(
                AppliedState(name="state-OFED", state="error",
                             message="failed to render manifests"),
                AppliedState(name="state-multus-cni", state="ready")))},
            "NicClusterPolicy nic-cluster-policy is in state error (state-OFED error: failed "
            "to render manifests)",
            id="operator-error",
        ),
    ],
)  # fmt: skip
def test_a_missing_component_breaks_the_section(kwargs: dict[str, object], cause: str) -> None:
    link = components_link(ctx(**kwargs))  # type: ignore[arg-type]
    assert link.status == "broken"
    assert link.cause == cause
    assert link.fix


def test_what_does_not_concern_the_node_stays_ok() -> None:
    # nv-ipam selects other nodes only; the upstream plugin runs but nicfleet serves nothing
    # here (the migration is not done on this node); the operator is merely rolling out.
    link = components_link(
        ctx(
            sets=(MULTUS, NV_IPAM_ELSEWHERE, RSDP),
            operator=OperatorStatus(state="notReady", applied=()),
        )
    )
    assert link.status == "ok", link.cause
    ipam = link.evidence["daemonsets"][1]
    assert (ipam["selects_node"], ipam["pod_here"]) == (False, "none")


def test_every_problem_is_listed_and_the_lacking_nodes_named() -> None:
    not_ready = (NodeCondition(type="Ready", status="False", reason="KubeletNotReady"),)
    link = components_link(ctx(conditions=not_ready, sets=(MULTUS, OFED)))
    assert link.cause is not None and link.cause.startswith("node gpu-001 is not Ready")
    assert len(link.evidence["also"]) == 1 and "mofed-ubuntu22.04-ds" in link.evidence["also"][0]
    assert link.evidence["daemonsets"][1]["nodes_lacking"] == [NODE]
