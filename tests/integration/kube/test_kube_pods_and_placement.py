"""Which pods the cluster view keeps and where DaemonSets run, against kmock's
KubernetesEmulator over real HTTP on loopback, driven by the official client: an SR-IOV pod
(the sriov-network-device-plugin's resource and its network, as the network-resources
injector leaves it), a GPU-only pod, a pod attaching a network with no device resource, and
a plain web pod; a cordoned, GPU-tainted Node and Multus / OFED DaemonSets with tolerations
and required node affinity as the Network Operator renders them.

Shapes: k8s.io/api core/v1 Node (spec.taints, spec.unschedulable) and Pod, apps/v1
DaemonSet (spec.template.spec.{tolerations, affinity, hostNetwork}); Multus' networks and
network-status annotations."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest

from aggregator.cluster import ClusterView
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.objects import node_from_object
from aggregator.placement import Taint
from aggregator.trace.components import components_link
from aggregator.trace.host import ChainContext
from aggregator.trace.pod import trace_pod
from tests.support.builders import T0

pytestmark = pytest.mark.integration

NODES = "v1/nodes"
PODS = "v1/pods"
DAEMONSETS = "apps/v1/daemonsets"
OPERATOR_NS = "nvidia-network-operator"
SRIOV = "nvidia.com/mlnx_sriov_rdma"
PCI_LABEL = "feature.node.kubernetes.io/pci-15b3.present"


def pod(name: str, limits: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"u-{name}",
                     "annotations": annotations},
        "spec": {"nodeName": "gpu-1", "containers": [
            {"name": "c", "image": "i", "resources": {"limits": limits, "requests": limits}},
        ]},
        "status": {"phase": "Running"},
    }  # fmt: skip


NETWORK_STATUS = [
    {"name": "ovn-kubernetes", "interface": "eth0", "ips": ["10.128.0.7"], "default": True},
    {"name": "ml/sriov-rdma", "interface": "net1", "ips": ["192.168.10.4"],
     "mac": "2a:1c:a3:8e:10:01", "dns": {},
     "device-info": {"type": "pci", "version": "1.1.0",
                     "pci": {"pci-address": "0000:3b:00.2", "rdma-device": "mlx5_5"}}},
]  # fmt: skip


def multus(tolerations: list[dict[str, Any]]) -> dict[str, Any]:
    labels = {"app": "multus", "name": "multus"}
    return {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "kube-multus-ds", "namespace": OPERATOR_NS, "labels": labels},
        "spec": {"selector": {"matchLabels": {"name": "multus"}}, "template": {
            "metadata": {"labels": labels},
            "spec": {"hostNetwork": True, "tolerations": tolerations,
                     "containers": [{"name": "kube-multus", "image": "i"}]},
        }},
        "status": {"desiredNumberScheduled": 1, "numberReady": 1, "numberAvailable": 1,
                   "updatedNumberScheduled": 1, "currentNumberScheduled": 1,
                   "numberMisscheduled": 0, "observedGeneration": 1},
    }  # fmt: skip


OFED = {
    "apiVersion": "apps/v1", "kind": "DaemonSet",
    "metadata": {"name": "mofed-ubuntu22.04-ds", "namespace": OPERATOR_NS,
                 "labels": {"app": "mofed-ubuntu22.04", "nvidia.com/ofed-driver": ""}},
    "spec": {"selector": {"matchLabels": {"app": "mofed-ubuntu22.04"}}, "template": {
        "metadata": {"labels": {"app": "mofed-ubuntu22.04"}},
        "spec": {
            "nodeSelector": {PCI_LABEL: "true"},
            # The operator's rendering: only nodes of this OS and version.
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "feature.node.kubernetes.io/system-os_release.ID",
                     "operator": "In", "values": ["ubuntu"]},
                    {"key": "feature.node.kubernetes.io/system-os_release.VERSION_ID",
                     "operator": "In", "values": ["22.04"]},
                ]}]}}},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
            "containers": [{"name": "mofed-container", "image": "i"}],
        },
    }},
    "status": {"desiredNumberScheduled": 0, "numberReady": 0, "numberAvailable": 0,
               "updatedNumberScheduled": 0, "currentNumberScheduled": 0,
               "numberMisscheduled": 0, "observedGeneration": 1},
}  # fmt: skip

NODE = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "gpu-1", "labels": {
        PCI_LABEL: "true", "kubernetes.io/hostname": "gpu-1",
        "feature.node.kubernetes.io/system-os_release.ID": "rhel",
        "feature.node.kubernetes.io/system-os_release.VERSION_ID": "9.4",
    }},
    "spec": {"unschedulable": True, "taints": [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule",
         "timeAdded": "2027-01-15T08:00:00Z"},
        {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
    ]},
    "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
}  # fmt: skip


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    objects = emu.objects
    objects[NODES, None, "gpu-1"] = NODE
    objects[PODS, "ml", "vf-0"] = pod(
        "vf-0", {SRIOV: "1", "cpu": "2"},
        {"k8s.v1.cni.cncf.io/networks": "sriov-rdma",
         "k8s.v1.cni.cncf.io/network-status": json.dumps(NETWORK_STATUS)},
    )  # fmt: skip
    objects[PODS, "ml", "gpu-0"] = pod("gpu-0", {"nvidia.com/gpu": "8"}, {})
    objects[PODS, "ml", "net-0"] = pod(
        "net-0", {"cpu": "1"}, {"k8s.v1.cni.cncf.io/networks": '[{"name": "ib"}]'}
    )
    objects[PODS, "web", "nginx"] = pod("nginx", {"cpu": "1", "hugepages-2Mi": "1Gi"}, {})
    # Multus tolerates nothing of its own: the GPU taint keeps it off gpu-1.
    objects[DAEMONSETS, OPERATOR_NS, "kube-multus-ds"] = multus([])
    objects[DAEMONSETS, OPERATOR_NS, "mofed-ubuntu22.04-ds"] = OFED
    async with emu:
        yield emu


@pytest.fixture
async def kube(emulator: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    async with kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            yield client


async def test_pods_with_a_network_or_a_device_resource_are_kept(kube: KubeClient) -> None:
    requests, _ = await kube.list_pods_and_components()
    by_name = {p.name: p for p in requests}
    assert sorted(by_name) == ["gpu-0", "net-0", "vf-0"]  # not the web pod
    assert by_name["vf-0"].requests == {SRIOV: 1}
    assert [s.pci_address for s in by_name["vf-0"].network_status] == ["0000:3b:00.2"]
    assert (by_name["net-0"].requests, by_name["net-0"].networks) == ({}, ("ml/ib",))
    view = ClusterView(present=True, pods=requests)
    vf = trace_pod("ml", "vf-0", fleet={}, cluster=view, policies=(), now=T0, stale_after=30.0)
    assert vf.traces == () and SRIOV in vf.untraced
    assert vf.no_chain is not None and "no RDMA chain to trace" in vf.no_chain


async def test_daemonset_placement_by_affinity_and_taints(kube: KubeClient) -> None:
    _, sets = await kube.list_pods_and_components()
    (raw_node,) = (await kube.list_nodes()).items
    node = node_from_object(raw_node)
    assert node is not None
    assert node.taints[1] == Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
    by_name = {ds.name: ds for ds in sets}
    multus = by_name["kube-multus-ds"]
    assert multus.host_network and multus.tolerations == ()
    assert by_name["mofed-ubuntu22.04-ds"].affinity is not None
    view = ClusterView(present=True, nodes={"gpu-1": node}, daemonsets=sets)
    ctx = ChainContext(
        node="gpu-1", resource="rdma/ib", record=None, cluster=view, policies=(), config=None,
        status=None, now=T0, stale_after=30.0,
    )  # fmt: skip
    link = components_link(ctx)
    assert link.status == "broken"
    # Multus is meant for every node; the cordon is tolerated (the controller adds that),
    # the GPU taint is not. The Ubuntu driver is not meant for this RHEL node at all.
    assert link.cause == (
        "Multus DaemonSet nvidia-network-operator/kube-multus-ds is meant for gpu-1 but it "
        "does not tolerate the node's taint nvidia.com/gpu=present:NoSchedule, so the "
        "controller runs no pod there"
    )
    assert link.evidence["also"] == []
    ofed = next(d for d in link.evidence["daemonsets"] if d["role"] == "driver")
    assert ofed["not_here"] == "its required node affinity does not match the node"
