"""The cluster view's DRA part from kmock's KubernetesEmulator over real HTTP on loopback,
driven by the official client through ClusterWatcher: objects as their writers leave them
(k8s.io/api resource/v1 and core/v1) — a ResourceClaim the resourceclaim controller made
from a pod's template and the scheduler allocated a gpu.nvidia.com GPU and an
rdma.nicfleet.io NIC (results, nodeSelector, reservedFor), both drivers' ResourceSlices
(ours from proto.draslices, as the publisher writes it), the DeviceClasses of deploy/dra,
and the pod with the controller's resourceClaimStatuses and the kubelet's
allocatedResourcesStatus. An API server without resource.k8s.io (404) or an aggregator that
may not read it (403) leaves `dra_present=False` while the pods are still listed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest
import yaml

from aggregator.cluster import ClaimHealth, DraResult, PodClaim
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClusterWatcher, WatchSettings
from proto.draslices import SliceSettings, build_slices
from tests.support.builders import nic, snapshot
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

PODS = "v1/pods"
NODES = "v1/nodes"
POLICIES = "nicfleet.io/v1alpha1/nicfleetpolicies"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
SLICES = "resource.k8s.io/v1/resourceslices"
CLASSES = "resource.k8s.io/v1/deviceclasses"
GPU, RDMA = "gpu.nvidia.com", "rdma.nicfleet.io"
NODE = "gpu-1"
GENERATED = "train-0-devices-x7k2p"  # the resourceclaim controller's <pod>-<entry>-<random>


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock, counting ResourceClaim lists (the first of each DRA round) and refusing
    paths with 403."""

    forbidden: set[str] = attrs.field(factory=set)  # path prefixes answered 403
    rounds: int = 0

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        path = request.url.path
        if path.endswith("/resourceclaims") and request.method == "GET":
            self.rounds += 1
        if any(path.startswith(prefix) for prefix in self.forbidden):
            body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
                    "reason": "Forbidden", "message": f"{path} is forbidden"}  # fmt: skip
            return aiohttp.web.json_response(body, status=403)
        return await super()._handle(request)


def training_pod() -> dict[str, Any]:
    """A pod whose template claim the controller generated and the kubelet prepared."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "train-0", "namespace": "ml", "uid": "p-1"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "devices", "resourceClaimTemplateName": "gpu-and-nic"}],
            "containers": [{"name": "trainer", "image": "i",
                            "resources": {"claims": [{"name": "devices"}]}}],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "devices", "resourceClaimName": GENERATED}],
            "containerStatuses": [{
                "name": "trainer", "ready": True, "restartCount": 0, "image": "i",
                "imageID": "", "started": True, "state": {"running": {}},
                "allocatedResourcesStatus": [
                    {"name": "claim:devices/gpu", "resources": [
                        {"resourceID": f"{GPU}/{NODE}/gpu-0", "health": "Healthy"}]},
                    {"name": "claim:devices/nic", "resources": [
                        {"resourceID": f"{RDMA}/{NODE}/mlx5-0", "health": "Unhealthy"}]},
                ],
            }],
        },
    }  # fmt: skip


def allocated_claim() -> dict[str, Any]:
    """The generated claim after the scheduler allocated it and reserved it for the pod."""
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {
            "name": GENERATED, "namespace": "ml", "uid": "c-1",
            "annotations": {"resource.kubernetes.io/pod-claim-name": "devices"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train-0",
                                 "uid": "p-1", "controller": True,
                                 "blockOwnerDeletion": True}],
            "finalizers": ["resource.kubernetes.io/delete-protection"],
        },
        "spec": {"devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": GPU}},
                {"name": "nic", "exactly": {"deviceClassName": RDMA,
                                            "allocationMode": "ExactCount", "count": 1}},
            ],
            "constraints": [{"requests": ["gpu", "nic"],
                             "matchAttribute": "resource.kubernetes.io/pcieRoot"}],
        }},
        "status": {
            "allocation": {
                "devices": {"results": [
                    {"request": "gpu", "driver": GPU, "pool": NODE, "device": "gpu-0"},
                    {"request": "nic", "driver": RDMA, "pool": NODE, "device": "mlx5-0"},
                ]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]},
                "allocationTimestamp": "2026-12-02T07:00:00Z",
            },
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "p-1"}],
        },
    }  # fmt: skip


def gpu_slice() -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{NODE}-gpu.nvidia.com-9zq4x"},
        "spec": {
            "driver": GPU, "nodeName": NODE,
            "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {
                "type": {"string": "gpu"}, "index": {"int": 0},
                "resource.kubernetes.io/pcieRoot": {"string": "pci0000:3a"},
            }, "capacity": {"memory": {"value": "80Gi"}}}],
        },
    }  # fmt: skip


def our_slice() -> dict[str, Any]:
    (built,) = build_slices(snapshot(NODE, devices=(nic("mlx5_0"),)), {}, SliceSettings())
    return built


def device_classes() -> list[dict[str, Any]]:
    ours = list(yaml.safe_load_all((REPO / "deploy/dra/deviceclasses.yaml").read_text()))
    selector = {"cel": {"expression": f"device.driver == '{GPU}'"}}
    gpu = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": GPU}, "spec": {"selectors": [selector]}}  # fmt: skip
    return [gpu, *ours]


def declare(emu: kmock.KubernetesEmulator, *, dra: bool) -> None:
    emu.resources[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    emu.resources[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
    emu.resources[POLICIES] = kmock.ResourceInfo(kind="NicFleetPolicy", namespaced=False)
    emu.objects[PODS, "ml", "train-0"] = training_pod()
    if dra:
        emu.resources[CLAIMS] = kmock.ResourceInfo(kind="ResourceClaim", namespaced=True)
        emu.resources[SLICES] = kmock.ResourceInfo(kind="ResourceSlice", namespaced=False)
        emu.resources[CLASSES] = kmock.ResourceInfo(kind="DeviceClass", namespaced=False)
        emu.objects[CLAIMS, "ml", GENERATED] = allocated_claim()
        for obj in (gpu_slice(), our_slice()):
            emu.objects[SLICES, None, obj["metadata"]["name"]] = obj
        for obj in device_classes():
            emu.objects[CLASSES, None, obj["metadata"]["name"]] = obj


@asynccontextmanager
async def watching(
    api: ApiServer, changes: list[str] | None = None
) -> AsyncIterator[ClusterWatcher]:
    async with api, kmock.Server(api) as server:
        kube = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with kube:
            on_change = changes.append if changes is not None else None
            watcher = ClusterWatcher(kube, WatchSettings(pods_every_s=0.02), on_change=on_change)
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as group:
                group.create_task(watcher.run(stop))
                try:
                    yield watcher
                finally:
                    stop.set()


async def test_the_view_holds_claims_slices_classes_and_the_pods_claims() -> None:
    api = ApiServer()
    declare(api, dra=True)
    async with watching(api) as watcher:
        await wait_until(
            lambda: watcher.cluster_view().dra_present and len(watcher.cluster_view().pods) == 1,
            what="DRA objects and the pod listed",
        )
        view = watcher.cluster_view()
    (claim,) = view.claims
    assert (claim.namespace, claim.name, claim.uid, claim.node) == ("ml", GENERATED, "c-1", NODE)
    assert claim.allocated and not claim.deleting
    assert claim.results == (
        DraResult(request="gpu", driver=GPU, pool=NODE, device="gpu-0"),
        DraResult(request="nic", driver=RDMA, pool=NODE, device="mlx5-0"),
    )
    assert claim.reserved_for == ("ml/train-0",)
    assert claim.spec == allocated_claim()["spec"]

    devices = {(d.driver, d.name): d for d in view.dra_devices}
    assert set(devices) == {(GPU, "gpu-0"), (RDMA, "mlx5-0")}
    nic_device = devices[RDMA, "mlx5-0"]
    assert (nic_device.node, nic_device.pool, nic_device.slice) == (
        NODE, NODE, f"{NODE}-rdma-nicfleet-io-0",
    )  # fmt: skip
    assert nic_device.attributes[f"{RDMA}/portState"] == "ACTIVE"
    assert nic_device.attributes["resource.kubernetes.io/pciBusID"] == "0000:19:00.0"
    assert devices[GPU, "gpu-0"].capacity == {f"{GPU}/memory": "80Gi"}
    assert devices[GPU, "gpu-0"].attributes["resource.kubernetes.io/pcieRoot"] == "pci0000:3a"

    classes = {c.name: c.selectors for c in view.device_classes}
    assert set(classes) == {GPU, RDMA, "ib.rdma.nicfleet.io", "roce.rdma.nicfleet.io"}
    assert classes[RDMA][0] == 'device.driver == "rdma.nicfleet.io"'
    assert 'portState == "ACTIVE"' in classes[RDMA][1]  # every class: up ports only

    (pod,) = view.pods
    assert pod.requests == {} and pod.networks == ()
    assert pod.claims == (PodClaim(name="devices", claim=GENERATED, template="gpu-and-nic"),)
    assert pod.claim_health == (
        ClaimHealth(container="trainer", entry="devices", request="gpu",
                    resource_id=f"{GPU}/{NODE}/gpu-0", health="Healthy"),
        ClaimHealth(container="trainer", entry="devices", request="nic",
                    resource_id=f"{RDMA}/{NODE}/mlx5-0", health="Unhealthy"),
    )  # fmt: skip


async def test_a_change_is_announced_only_when_the_dra_objects_change() -> None:
    api = ApiServer()
    declare(api, dra=True)
    changes: list[str] = []
    async with watching(api, changes) as watcher:
        await wait_until(lambda: watcher.cluster_view().dra_present, what="DRA listed")
        listed = api.rounds
        await wait_until(lambda: api.rounds >= listed + 3, what="three more DRA rounds")
        assert changes.count("dra") == 1
        gone = allocated_claim()
        gone["metadata"]["deletionTimestamp"] = "2026-12-02T08:00:00Z"
        api.objects[CLAIMS, "ml", GENERATED] = gone
        await wait_until(
            lambda: all(c.deleting for c in watcher.cluster_view().claims),
            what="the claim seen deleting",
        )
        assert changes.count("dra") == 2


async def test_without_resource_k8s_io_the_pods_are_still_listed() -> None:
    api = ApiServer()
    declare(api, dra=False)
    async with watching(api) as watcher:
        await wait_until(lambda: len(watcher.cluster_view().pods) == 1, what="pods listed")
        await wait_until(lambda: api.rounds >= 2, what="DRA asked twice")
        view = watcher.cluster_view()
    assert not view.dra_present
    assert (view.claims, view.dra_devices, view.device_classes) == ((), (), ())
    assert view.pods[0].claims[0].claim == GENERATED  # the pod's own status still reads


async def test_a_forbidden_list_leaves_dra_absent_until_it_is_granted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    api = ApiServer(forbidden={"/apis/resource.k8s.io/v1/deviceclasses"})
    declare(api, dra=True)
    async with watching(api) as watcher:
        await wait_until(lambda: api.rounds >= 3, what="three forbidden rounds")
        view = watcher.cluster_view()
        assert not view.dra_present and view.claims == () and len(view.pods) == 1
        api.forbidden.clear()  # the ClusterRole is updated
        await wait_until(lambda: watcher.cluster_view().dra_present, what="DRA granted")
        assert len(watcher.cluster_view().claims) == 1
    refused = [r for r in caplog.records if "DRA objects not readable" in r.getMessage()]
    assert len(refused) == 1  # logged once, not every round
    assert "403" in refused[0].getMessage()
