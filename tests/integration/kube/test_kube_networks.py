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


NV_IPPOOL = {
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


async def test_ip_pools_absent_crds_are_empty(kube: KubeClient) -> None:
    assert await kube.list_ip_pools() == ()


async def test_ip_pools_of_every_kind_listed(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    install_crds(emulator)
    emulator.objects[IPPOOLS, "nvidia-network-operator", "pool1"] = NV_IPPOOL
    emulator.objects[CIDRPOOLS, "nvidia-network-operator", "cidr1"] = NV_CIDRPOOL
    emulator.objects[WHEREABOUTS, "kube-system", "192.168.5.0-29"] = WB_POOL
    pools = {(p.kind, p.name): p for p in await kube.list_ip_pools()}
    assert set(pools) == {
        ("nv-ipam-ippool", "pool1"), ("nv-ipam-cidrpool", "cidr1"),
        ("whereabouts", "192.168.5.0-29"),
    }  # fmt: skip
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
