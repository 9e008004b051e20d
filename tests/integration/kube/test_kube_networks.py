"""Secondary networks from the API: NADs, pods' network-status, NV-IPAM IPPool/CIDRPool and
whereabouts IPPool listed by aggregator.kube.client against kmock over real HTTP, kept by the
ClusterWatcher, and the chain's attachment/ip-pool links on that cluster view. The objects
are shaped as Multus, NV-IPAM and whereabouts write them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import kmock
import msgspec
import pytest

from aggregator.fleet.state import NodeRecord
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClusterWatcher, WatchSettings
from aggregator.trace.chain import trace
from tests.support.builders import (
    T0,
    modules,
    nic,
    plugin_status,
    rdma_policy,
    resource_status,
    snapshot,
)
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

PODS = "v1/pods"
NADS = "k8s.cni.cncf.io/v1/network-attachment-definitions"
IPPOOLS = "nv-ipam.nvidia.com/v1alpha1/ippools"
CIDRPOOLS = "nv-ipam.nvidia.com/v1alpha1/cidrpools"
WHEREABOUTS = "whereabouts.cni.cncf.io/v1alpha1/ippools"
NODESLICES = "whereabouts.cni.cncf.io/v1alpha1/nodeslicepools"
NODE = "gpu-001"
RES = "rdma/ib"


def nad(name: str, config: dict[str, Any], resource: str | None = None) -> dict[str, Any]:
    annotations = {"k8s.v1.cni.cncf.io/resourceName": resource} if resource else {}
    return {
        "apiVersion": "k8s.cni.cncf.io/v1", "kind": "NetworkAttachmentDefinition",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {"config": json.dumps(config)},
    }  # fmt: skip


def pod(name: str, network: str, ip: str | None) -> dict[str, Any]:
    annotations = {"k8s.v1.cni.cncf.io/networks": network}
    if ip is not None:
        annotations["k8s.v1.cni.cncf.io/network-status"] = json.dumps([
            {"name": "cbr0", "interface": "eth0", "ips": ["10.244.1.7"], "default": True,
             "dns": {}},
            {"name": f"ml/{network.split('@')[0]}", "interface": "net1", "ips": [ip],
             "mac": "ae:12:4f:55:00:01", "dns": {}},
        ])  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {"nodeName": NODE, "containers": [
            {"name": "c", "resources": {"limits": {RES: "1"}}}]},
        "status": {"phase": "Running"},
    }  # fmt: skip


NV_IPPOOL: dict[str, Any] = {
    "apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "IPPool",
    "metadata": {"name": "pool1", "namespace": "nvidia-network-operator"},
    "spec": {"subnet": "192.168.0.0/24", "perNodeBlockSize": 2, "gateway": "192.168.0.254"},
    "status": {"allocations": [
        {"nodeName": NODE, "startIP": "192.168.0.1", "endIP": "192.168.0.2"}]},
}  # fmt: skip
NV_CIDRPOOL = {
    "apiVersion": "nv-ipam.nvidia.com/v1alpha1", "kind": "CIDRPool",
    "metadata": {"name": "cidr1", "namespace": "nvidia-network-operator"},
    "spec": {"cidr": "10.10.0.0/16", "gatewayIndex": 1, "perNodeNetworkPrefix": 24},
    "status": {"allocations": [
        {"nodeName": NODE, "prefix": "10.10.3.0/24", "gateway": "10.10.3.1"}]},
}  # fmt: skip
WB_POOL = {
    "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
    "metadata": {"name": "192.168.5.0-29", "namespace": "kube-system"},
    "spec": {"range": "192.168.5.0/29", "allocations": {
        "1": {"id": "c0ffee", "podref": "ml/other", "ifname": "net1"}}},
}  # fmt: skip


# As whereabouts' node controller writes it: every slice listed, free ones with nodeName "".
WB_SLICES = {
    "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "NodeSlicePool",
    "metadata": {"name": "rdma-net", "namespace": "kube-system"},
    "spec": {"range": "10.1.0.0/24", "sliceSize": "/28"},
    "status": {"allocations": [{"nodeName": NODE, "sliceRange": "10.1.0.0/28"}] + [
        {"nodeName": "", "sliceRange": f"10.1.0.{16 * i}/28"} for i in range(1, 16)]},
}  # fmt: skip


def node(labels: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "labels": labels}}


def other_pod(name: str, ip: str, phase: str = "Running") -> dict[str, Any]:
    """A pod of another workload (no RDMA resource) on the node, on a NAD of the same pool."""
    status = [{"name": "cbr0", "interface": "eth0", "ips": ["10.244.1.9"], "default": True},
              {"name": "web/storage-net", "interface": "net1", "ips": [ip]}]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "web", "annotations": {
            "k8s.v1.cni.cncf.io/networks": "storage-net",
            "k8s.v1.cni.cncf.io/network-status": json.dumps(status)}},
        "spec": {"nodeName": NODE, "containers": [{"name": "c"}]},
        "status": {"phase": phase},
    }  # fmt: skip


def traced(view: Any) -> Any:
    devices = (msgspec.structs.replace(nic("mlx5_0", netdevs=("ib0",)), fw_ver="28.39.1002"),)
    record = NodeRecord(
        name=NODE, first_seen=T0, last_seen=T0,
        snapshot=msgspec.structs.replace(snapshot(NODE, devices=devices), modules=modules()),
        device_plugin=plugin_status(NODE, resource_status(RES, devices=("mlx5_0",))),
    )  # fmt: skip
    result = trace(NODE, RES, fleet={NODE: record}, cluster=view,
                   policies=(rdma_policy("ib", RES),), now=T0 + 1, stale_after=30.0)  # fmt: skip
    return {link.name: link for link in result.links}["ip-pool"]


async def watched(kube: KubeClient, ready: Any) -> Any:
    watcher = ClusterWatcher(kube, WatchSettings(pods_every_s=60))
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await wait_until(lambda: bool(ready(watcher.cluster_view())), what="cluster listed")
        stop.set()
    return watcher.cluster_view()


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    emu.resources["v1/nodes"] = kmock.ResourceInfo(kind="Node", namespaced=False)
    emu.resources["nicfleet.io/v1alpha1/nicfleetpolicies"] = kmock.ResourceInfo(
        kind="NicFleetPolicy", namespaced=False
    )
    emu.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    # Listed in the same loop as the pods (the components link); empty here.
    emu.resources["apps/v1/daemonsets"] = kmock.ResourceInfo(kind="DaemonSet", namespaced=True)
    emu.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True)
    async with emu:
        yield emu


@pytest.fixture
async def kube(emulator: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    async with kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            yield client


def install_crds(emu: kmock.KubernetesEmulator) -> None:
    emu.resources[NADS] = kmock.ResourceInfo(kind="NetworkAttachmentDefinition", namespaced=True)
    emu.resources[IPPOOLS] = kmock.ResourceInfo(kind="IPPool", namespaced=True)
    emu.resources[CIDRPOOLS] = kmock.ResourceInfo(kind="CIDRPool", namespaced=True)
    emu.resources[WHEREABOUTS] = kmock.ResourceInfo(kind="IPPool", namespaced=True)
    emu.resources[NODESLICES] = kmock.ResourceInfo(kind="NodeSlicePool", namespaced=True)


async def test_ip_pools_absent_crds_are_empty(kube: KubeClient) -> None:
    assert await kube.list_ip_pools() == ()


async def test_ip_pools_of_every_kind_listed(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    install_crds(emulator)
    emulator.objects[IPPOOLS, "nvidia-network-operator", "pool1"] = NV_IPPOOL
    emulator.objects[CIDRPOOLS, "nvidia-network-operator", "cidr1"] = NV_CIDRPOOL
    emulator.objects[WHEREABOUTS, "kube-system", "192.168.5.0-29"] = WB_POOL
    emulator.objects[NODESLICES, "kube-system", "rdma-net"] = WB_SLICES
    pools = {(p.kind, p.name): p for p in await kube.list_ip_pools()}
    assert set(pools) == {
        ("nv-ipam-ippool", "pool1"), ("nv-ipam-cidrpool", "cidr1"),
        ("whereabouts", "192.168.5.0-29"), ("whereabouts-nodeslice", "rdma-net"),
    }  # fmt: skip
    assert pools["whereabouts-nodeslice", "rdma-net"].blocks[NODE].prefix == "10.1.0.0/28"
    assert pools["nv-ipam-ippool", "pool1"].blocks[NODE].last == "192.168.0.2"
    assert pools["nv-ipam-cidrpool", "cidr1"].blocks[NODE].prefix == "10.10.3.0/24"
    assert pools["whereabouts", "192.168.5.0-29"].allocated == {"192.168.5.1": "ml/other"}
    assert {r.method for r in list(emulator)} == {"GET"}


async def test_watcher_view_feeds_the_attachment_and_pool_links(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    install_crds(emulator)
    ipoib = {"cniVersion": "0.3.1", "type": "ipoib", "master": "ib0",
             "ipam": {"type": "nv-ipam", "poolName": "pool1"}}  # fmt: skip
    emulator.objects[NADS, "ml", "rdma-net"] = nad("rdma-net", ipoib)
    emulator.objects[IPPOOLS, "nvidia-network-operator", "pool1"] = NV_IPPOOL
    emulator.objects[PODS, "ml", "t-0"] = pod("t-0", "rdma-net@net1", "192.168.0.1")
    emulator.objects[PODS, "ml", "t-1"] = pod("t-1", "rdma-net", "192.168.0.2")

    watcher = ClusterWatcher(kube, WatchSettings(pods_every_s=60))
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await wait_until(lambda: len(watcher.cluster_view().ip_pools) == 1, what="pools listed")
        stop.set()
    view = watcher.cluster_view()
    assert {p.name for p in view.pods} == {"t-0", "t-1"}
    assert view.pods[0].network_status[0].interface == "net1"

    devices = (msgspec.structs.replace(nic("mlx5_0", netdevs=("ib0",)), fw_ver="28.39.1002"),)
    record = NodeRecord(
        name=NODE, first_seen=T0, last_seen=T0,
        snapshot=msgspec.structs.replace(snapshot(NODE, devices=devices), modules=modules()),
        device_plugin=plugin_status(NODE, resource_status(RES, devices=("mlx5_0",))),
    )  # fmt: skip
    result = trace(NODE, RES, fleet={NODE: record}, cluster=view,
                   policies=(rdma_policy("ib", RES),), now=T0 + 1, stale_after=30.0)  # fmt: skip
    links = {link.name: link for link in result.links}
    assert links["attachment"].status == "ok", links["attachment"]
    pool = links["ip-pool"]
    assert pool.status == "broken"  # both addresses of the node's 2-address block are held
    assert "0 of 2 addresses free" in (pool.cause or "")


async def test_nv_ipam_counts_every_pods_addresses_on_the_selected_node(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    install_crds(emulator)
    ipoib = {"cniVersion": "0.3.1", "type": "ipoib", "master": "ib0",
             "ipam": {"type": "nv-ipam", "poolName": "pool1"}}  # fmt: skip
    emulator.objects[NADS, "ml", "rdma-net"] = nad("rdma-net", ipoib)
    selected = NV_IPPOOL | {"spec": NV_IPPOOL["spec"] | {"nodeSelector": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "nvidia.com/rdma", "operator": "In",
                               "values": ["true"]}]}]}}}  # fmt: skip
    emulator.objects[IPPOOLS, "nvidia-network-operator", "pool1"] = selected
    emulator.objects["v1/nodes", None, NODE] = node({"nvidia.com/rdma": "true"})
    emulator.objects[PODS, "ml", "t-0"] = pod("t-0", "rdma-net", "192.168.0.1")
    # The block's other address is held by a pod that requests no RDMA resource; a
    # finished pod's stale network-status holds nothing.
    emulator.objects[PODS, "web", "web-0"] = other_pod("web-0", "192.168.0.2")
    emulator.objects[PODS, "web", "done"] = other_pod("done", "192.168.0.9", "Succeeded")

    view = await watched(kube, lambda v: v.ip_pools and v.nodes and v.held_addresses)
    assert {(h.name, h.ips) for h in view.held_addresses} == {
        ("t-0", ("192.168.0.1",)), ("web-0", ("192.168.0.2",)),
    }  # fmt: skip
    link = traced(view)
    assert link.status == "broken", link
    assert "0 of 2 addresses free" in (link.cause or "")
    (evidence,) = link.evidence["pools"]
    assert (evidence["used"], evidence["counted"]) == (2, "network-status")
    assert evidence["detail"].startswith("at least 2 used")


async def test_nv_ipam_pool_not_selecting_the_node_is_not_its_pool(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    install_crds(emulator)
    ipoib = {"cniVersion": "0.3.1", "type": "ipoib", "master": "ib0",
             "ipam": {"type": "nv-ipam", "poolName": "pool1"}}  # fmt: skip
    emulator.objects[NADS, "ml", "rdma-net"] = nad("rdma-net", ipoib)
    # The controller discards a node's block once its selector stops matching; a stale
    # status entry must not make the pool look like the node's.
    storage_only = NV_IPPOOL | {"spec": NV_IPPOOL["spec"] | {"nodeSelector": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "pool", "operator": "In", "values": ["storage"]}]}]}}}  # fmt: skip
    emulator.objects[IPPOOLS, "nvidia-network-operator", "pool1"] = storage_only
    emulator.objects["v1/nodes", None, NODE] = node({"pool": "gpu"})
    emulator.objects[PODS, "ml", "t-0"] = pod("t-0", "rdma-net", None)

    link = traced(await watched(kube, lambda v: v.ip_pools and v.nodes))
    assert link.status == "broken", link
    assert "nodeSelector does not select gpu-001" in (link.cause or "")
    assert "nodeSelector" in (link.fix or "")


async def test_whereabouts_fast_ipam_counts_the_nodes_slice(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    install_crds(emulator)
    macvlan = {"cniVersion": "0.3.1", "name": "rdma-net", "type": "ipoib", "master": "ib0",
               "ipam": {"type": "whereabouts", "range": "10.1.0.0/24", "node_slice_size": "/28",
                        "exclude": ["10.1.0.0/29"]}}  # fmt: skip
    emulator.objects[NADS, "ml", "rdma-net"] = nad("rdma-net", macvlan)
    emulator.objects[NODESLICES, "kube-system", "rdma-net"] = WB_SLICES
    # The node's own pool, named <node>-<slice>, offsets from the slice's network address.
    emulator.objects[WHEREABOUTS, "kube-system", f"{NODE}-10.1.0.0-28"] = {
        "apiVersion": "whereabouts.cni.cncf.io/v1alpha1", "kind": "IPPool",
        "metadata": {"name": f"{NODE}-10.1.0.0-28", "namespace": "kube-system"},
        "spec": {"range": "10.1.0.0/28", "allocations": {
            "1": {"id": "c0ffee", "podref": "ml/t-0", "ifname": "net1"}}},
    }  # fmt: skip
    emulator.objects[PODS, "ml", "t-0"] = pod("t-0", "rdma-net", "10.1.0.1")

    link = traced(await watched(kube, lambda v: len(v.ip_pools) == 2))
    assert link.status == "ok", link
    (evidence,) = link.evidence["pools"]
    # 14 usable addresses of the /28 (exclude does not apply to node slices), 1 held.
    assert (evidence["block"], evidence["capacity"], evidence["used"]) == ("10.1.0.0/28", 14, 1)
    assert evidence["pool"] == f"kube-system/{NODE}-10.1.0.0-28"
