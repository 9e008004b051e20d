"""The cluster view behind the trace's scheduling link and components section, against
kmock's KubernetesEmulator over real HTTP on loopback, driven by the official client: Nodes
with the kubelet's and node-problem-detector's conditions, the scheduler's FailedScheduling
Events (core/v1 and the events.k8s.io/v1 shape), the Network Operator's DaemonSets with the
DaemonSet controller's status and their pods, and the NicClusterPolicy's status.

Shapes: k8s.io/api core/v1 Node/Pod/Event and apps/v1 DaemonSet; pkg/scheduler's
FitError message; Mellanox/network-operator manifests/state-*/ (names, labels) and
api/v1alpha1 NicClusterPolicyStatus (state, appliedStates[{name, state, message}])."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from aggregator.cluster import AppliedState, NodeCondition, OperatorStatus
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClusterWatcher, WatchSettings
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODES = "v1/nodes"
PODS = "v1/pods"
EVENTS = "v1/events"
DAEMONSETS = "apps/v1/daemonsets"
NCP = "mellanox.com/v1alpha1/nicclusterpolicies"
OPERATOR_NS = "nvidia-network-operator"
HEARTBEAT = "2027-01-15T08:00:00Z"
FAILED = (
    "0/2 nodes are available: 1 Insufficient rdma/ib, 1 node(s) had untolerated taint "
    "{nvidia.com/gpu: }. preemption: 0/2 nodes are available: 1 No preemption victims found "
    "for incoming pod, 1 Preemption is not helpful for scheduling."
)


def condition(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {
        "type": kind, "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": HEARTBEAT, "lastTransitionTime": "2027-01-01T00:00:00Z",
    }  # fmt: skip


def node(name: str, *conditions: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"feature.node.kubernetes.io/pci-15b3.present": "true"},
        },
        "status": {"allocatable": {"rdma/ib": "1"}, "conditions": list(conditions)},
    }


def daemonset(
    name: str, labels: dict[str, str], status: dict[str, int], selector: dict[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": OPERATOR_NS, "labels": labels, "generation": 1},
        "spec": {
            "selector": {"matchLabels": {"app": labels.get("app", name)}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": selector, "containers": [{"name": "c", "image": "i"}]},
            },
        },
        # As the DaemonSet controller writes it (pkg/controller/daemon, status subresource).
        "status": {
            "currentNumberScheduled": status["desired"],
            "desiredNumberScheduled": status["desired"],
            "numberMisscheduled": 0,
            "numberReady": status["ready"],
            "numberAvailable": status["ready"],
            "numberUnavailable": status["desired"] - status["ready"],
            "updatedNumberScheduled": status["desired"],
            "observedGeneration": 1,
        },
    }


def daemon_pod(owner: str, node_name: str, ready: bool) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{owner}-{node_name}",
            "namespace": OPERATOR_NS,
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": owner, "uid": "u",
                 "controller": True, "blockOwnerDeletion": True}
            ],
        },
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]},
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": "PodScheduled", "status": "True"},
                {"type": "Ready", "status": "True" if ready else "False",
                 **({} if ready else {"reason": "ContainersNotReady"})},
            ],
        },
    }  # fmt: skip


PENDING_POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "train-7", "namespace": "ml", "uid": "p-7"},
    "spec": {"containers": [{"name": "c", "resources": {"limits": {"rdma/ib": "2"}}}]},
    "status": {
        "phase": "Pending",
        # The scheduler's condition on the pod (pkg/scheduler handleSchedulingFailure).
        "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": FAILED, "lastTransitionTime": "2027-01-15T07:59:00Z"}
        ],
    },
}  # fmt: skip
# core/v1 view of an Event the scheduler records through events.k8s.io/v1 (since 1.19: the
# `count`/`lastTimestamp` pair is empty, `series` and `eventTime` carry the times).
CORE_EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "train-7.17a1b2c3d4e5f6a7", "namespace": "ml"},
    "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "train-7", "namespace": "ml",
                       "uid": "p-7"},
    "reason": "FailedScheduling",
    "message": FAILED,
    "type": "Warning",
    "source": {},
    "reportingComponent": "default-scheduler",
    "reportingInstance": "default-scheduler-cp-1",
    "action": "Scheduling",
    "eventTime": "2027-01-15T07:59:00.000000Z",
    "series": {"count": 5, "lastObservedTime": "2027-01-15T08:04:00.000000Z"},
    "firstTimestamp": None,
    "lastTimestamp": None,
}  # fmt: skip
OTHER_EVENT = {
    "apiVersion": "v1", "kind": "Event",
    "metadata": {"name": "train-7.pulled", "namespace": "ml"},
    "involvedObject": {"kind": "Pod", "name": "train-0", "namespace": "ml"},
    "reason": "Pulled", "message": "Successfully pulled image", "type": "Normal",
    "count": 1, "lastTimestamp": "2027-01-15T08:00:00Z",
}  # fmt: skip
NIC_CLUSTER_POLICY = {
    "apiVersion": "mellanox.com/v1alpha1",
    "kind": "NicClusterPolicy",
    "metadata": {"name": "nic-cluster-policy"},
    "spec": {"ofedDriver": {"image": "doca-driver"}},
    "status": {
        "state": "notReady",
        "appliedStates": [
            {"name": "state-OFED", "state": "notReady",
             "message": "Waiting for DaemonSet mofed-ubuntu22.04-ds to become ready"},
            {"name": "state-multus-cni", "state": "ready"},
            {"name": "state-nv-ipam-cni", "state": "ignore"},
        ],
    },
}  # fmt: skip


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    res = emu.resources
    res["nicfleet.io/v1alpha1/nicfleetpolicies"] = kmock.ResourceInfo(
        kind="NicFleetPolicy", namespaced=False
    )
    res[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
    res[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    res[EVENTS] = kmock.ResourceInfo(kind="Event", namespaced=True)
    res[DAEMONSETS] = kmock.ResourceInfo(kind="DaemonSet", namespaced=True)
    res[NCP] = kmock.ResourceInfo(kind="NicClusterPolicy", namespaced=False)
    objects = emu.objects
    objects[NODES, None, "gpu-1"] = node(
        "gpu-1",
        condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        condition("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock"),
        condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    )
    objects[NODES, None, "gpu-2"] = node(
        "gpu-2",
        condition("NetworkUnavailable", "True", "NoRouteCreated", "Node created without a route"),
        condition("Ready", "False", "KubeletNotReady", "container runtime network not ready"),
    )
    multus_labels = {"tier": "node", "app": "multus", "name": "multus"}
    ofed_labels = {"app": "mofed-ubuntu22.04", "nvidia.com/ofed-driver": ""}
    pci = {"feature.node.kubernetes.io/pci-15b3.present": "true"}
    objects[DAEMONSETS, OPERATOR_NS, "kube-multus-ds"] = daemonset(
        "kube-multus-ds", multus_labels, {"desired": 2, "ready": 2}, {}
    )
    objects[DAEMONSETS, OPERATOR_NS, "mofed-ubuntu22.04-ds"] = daemonset(
        "mofed-ubuntu22.04-ds", ofed_labels, {"desired": 2, "ready": 1}, pci
    )
    objects[DAEMONSETS, OPERATOR_NS, "node-exporter"] = daemonset(
        "node-exporter", {"app": "node-exporter"}, {"desired": 2, "ready": 2}, {}
    )
    for owner, node_name, ready in (
        ("kube-multus-ds", "gpu-1", True),
        ("kube-multus-ds", "gpu-2", True),
        ("mofed-ubuntu22.04-ds", "gpu-1", True),
        ("mofed-ubuntu22.04-ds", "gpu-2", False),
    ):
        objects[PODS, OPERATOR_NS, f"{owner}-{node_name}"] = daemon_pod(owner, node_name, ready)
    objects[PODS, "ml", "train-7"] = PENDING_POD
    objects[EVENTS, "ml", "train-7.17a1b2c3d4e5f6a7"] = CORE_EVENT
    objects[EVENTS, "ml", "train-7.pulled"] = OTHER_EVENT
    objects[NCP, None, "nic-cluster-policy"] = NIC_CLUSTER_POLICY
    async with emu:
        yield emu


@pytest.fixture
async def kube(emulator: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    async with kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            yield client


async def test_daemonsets_of_the_chain_with_the_nodes_their_pods_are_ready_on(
    kube: KubeClient,
) -> None:
    requests, sets = await kube.list_pods_and_components()
    (pending,) = requests
    assert (pending.name, pending.node, pending.unschedulable) == ("train-7", None, FAILED)
    by_name = {ds.name: ds for ds in sets}
    assert set(by_name) == {"kube-multus-ds", "mofed-ubuntu22.04-ds"}  # not node-exporter
    ofed = by_name["mofed-ubuntu22.04-ds"]
    assert (ofed.role, ofed.desired, ofed.ready, ofed.available, ofed.updated) == (
        "driver", 2, 1, 1, 2,
    )  # fmt: skip
    assert (ofed.ready_nodes, ofed.unready_nodes) == (("gpu-1",), ("gpu-2",))
    assert ofed.node_selector == {"feature.node.kubernetes.io/pci-15b3.present": "true"}
    assert by_name["kube-multus-ds"].ready_nodes == ("gpu-1", "gpu-2")


async def test_failed_scheduling_events_only(kube: KubeClient) -> None:
    (event,) = await kube.list_scheduling_events()
    assert (event.namespace, event.pod, event.message) == ("ml", "train-7", FAILED)
    assert (event.count, event.last_seen) == (5, "2027-01-15T08:04:00.000000Z")


async def test_operator_status(kube: KubeClient) -> None:
    status = await kube.read_operator_status()
    assert status == OperatorStatus(
        state="notReady",
        applied=(
            AppliedState(name="state-OFED", state="notReady",
                         message="Waiting for DaemonSet mofed-ubuntu22.04-ds to become ready"),
            AppliedState(name="state-multus-cni", state="ready"),
            AppliedState(name="state-nv-ipam-cni", state="ignore"),
        ),
    )  # fmt: skip


async def test_operator_status_absent_is_none(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    del emulator.objects[NCP, None, "nic-cluster-policy"]
    assert await kube.read_operator_status() is None


async def test_the_watcher_view_holds_all_of_it_and_only_reads(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    watcher = ClusterWatcher(kube, WatchSettings(pods_every_s=60))
    stop = asyncio.Event()

    def complete() -> bool:
        view = watcher.cluster_view()
        return bool(
            view.daemonsets and view.scheduling_events and view.nic_cluster_policy and view.nodes
        )

    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await wait_until(complete, what="components, events and operator status listed")
        stop.set()
    view = watcher.cluster_view()
    assert view.nodes["gpu-2"].conditions == (
        NodeCondition(type="NetworkUnavailable", status="True", reason="NoRouteCreated",
                      message="Node created without a route"),
        NodeCondition(type="Ready", status="False", reason="KubeletNotReady",
                      message="container runtime network not ready"),
    )  # fmt: skip
    assert view.nic_cluster_policy is not None and view.nic_cluster_policy.state == "notReady"
    assert {r.method for r in list(emulator)} == {"GET"}


async def test_forbidden_daemonsets_and_operator_read_as_none_and_pods_still_count(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    # An older ClusterRole (no daemonsets), the base without the nicclusterpolicy overlay.
    forbidden = kmock.Response(status=403, payload={"kind": "Status", "code": 403})
    emulator["get", f"/apis/{DAEMONSETS}"] << forbidden
    emulator["get", f"/apis/{NCP}/nic-cluster-policy"] << forbidden
    requests, sets = await kube.list_pods_and_components()
    assert ([p.name for p in requests], sets) == (["train-7"], ())
    assert await kube.read_operator_status() is None
