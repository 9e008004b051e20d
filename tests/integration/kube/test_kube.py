"""aggregator.kube.client and aggregator.kube.watch against kmock's KubernetesEmulator over real
HTTP on loopback, driven by the official client (kubernetes.aio)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock
import pytest
import yaml

from aggregator.errors import KubeError, KubeUnavailableError
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.objects import LeaseRecord
from aggregator.kube.watch import ClusterWatcher, WatchSettings
from tests.support.paths import REPO
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

EXAMPLE = REPO / "deploy" / "examples" / "policy.yaml"
POLICIES = "nicfleet.io/v1alpha1/nicfleetpolicies"
NODES = "v1/nodes"
PODS = "v1/pods"
EVENTS = "v1/events"
LEASES = "coordination.k8s.io/v1/leases"
NADS = "k8s.cni.cncf.io/v1/network-attachment-definitions"
NCP = "mellanox.com/v1alpha1/nicclusterpolicies"


def example_policy(name: str = "h100-compute") -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"] = {"name": name, "generation": 3, "uid": "u-1", "resourceVersion": "7"}
    return document


def node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    res = emu.resources
    res[POLICIES] = kmock.ResourceInfo(
        kind="NicFleetPolicy", namespaced=False, subresources={"status"}
    )
    res[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
    res[PODS] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    res[EVENTS] = kmock.ResourceInfo(kind="Event", namespaced=True)
    res[LEASES] = kmock.ResourceInfo(kind="Lease", namespaced=True)
    async with emu:
        yield emu


@pytest.fixture
async def kube(emulator: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    async with kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            yield client


async def post(emu: kmock.KubernetesEmulator, path: str, body: dict[str, Any]) -> None:
    response = await emu.post(path, json=body)
    assert response.status < 300, await response.text()


async def test_policies_listed_as_policy_objects(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.objects[POLICIES, None, "h100-compute"] = example_policy()
    watcher = ClusterWatcher(kube)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await asyncio.wait_for(watcher.policies_synced.wait(), 10)
        stop.set()
    (policy,) = watcher.policies()
    assert policy.metadata.name == "h100-compute"
    assert policy.spec.expect.max_gpu_nic_relation == "PXB"
    assert policy.spec.rdma_shared_device_plugin is not None
    assert watcher.policy_errors() == ()
    assert watcher.policy_objects()["h100-compute"].generation == 3


@pytest.mark.parametrize(
    ("spec_patch", "path"),
    [
        pytest.param({"expect": {"mtu": "big"}}, "$.spec.expect.mtu", id="wrong-type"),
        pytest.param({"expect": {"mtuu": 4096}}, "$.spec.expect", id="unknown-key"),
        pytest.param(
            {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}},
            "$.spec.nodeSelector.matchExpressions[0].values",
            id="bad-selector",
        ),
        pytest.param(
            {"rdmaSharedDevicePlugin": {"configList": [{"resourceName": "x", "rdmaHcaMax": 1}]}},
            "$.spec.rdmaSharedDevicePlugin.configList[0].selectors",
            id="selects-nothing",
        ),
    ],
)
async def test_invalid_policy_is_an_error_record_naming_the_field(
    emulator: kmock.KubernetesEmulator, kube: KubeClient, spec_patch: dict[str, Any], path: str
) -> None:
    good = example_policy("good")
    bad = example_policy("bad")
    bad["spec"] = {**bad["spec"], **spec_patch}
    if "expect" in spec_patch:
        bad["spec"]["expect"] = {**example_policy()["spec"]["expect"], **spec_patch["expect"]}
    emulator.objects[POLICIES, None, "good"] = good
    emulator.objects[POLICIES, None, "bad"] = bad
    watcher = ClusterWatcher(kube)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await asyncio.wait_for(watcher.policies_synced.wait(), 10)
        stop.set()
    assert [p.metadata.name for p in watcher.policies()] == ["good"]
    (error,) = watcher.policy_errors()
    assert (error.name, error.generation) == ("bad", 3)
    assert error.path.startswith(path), error
    assert "NicFleetPolicy bad" in str(error)


async def test_watch_sees_policies_and_nodes_come_and_go(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.objects[NODES, None, "gpu-1"] = node("gpu-1", {"gpu": "yes"}, {"rdma/ib": "0"})
    changes: list[str] = []
    watcher = ClusterWatcher(kube, on_change=changes.append)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await asyncio.wait_for(watcher.nodes_synced.wait(), 10)
        await asyncio.wait_for(watcher.policies_synced.wait(), 10)
        assert watcher.policies() == ()
        view = watcher.cluster_view()
        assert view.present
        assert view.nodes["gpu-1"].allocatable == {"rdma/ib": "0"}
        watcher.changed.clear()

        await post(emulator, f"/apis/{POLICIES}", example_policy("later"))
        await wait_until(lambda: len(watcher.policies()) == 1, what="policy from the watch")
        assert watcher.changed.is_set()

        await post(emulator, f"/api/{NODES}", node("gpu-2", {}, {"rdma/ib": "8"}))
        await wait_until(lambda: "gpu-2" in watcher.cluster_view().nodes, what="node added")
        assert watcher.cluster_view().nodes["gpu-2"].allocatable["rdma/ib"] == "8"

        response = await emulator.delete(f"/apis/{POLICIES}/later")
        assert response.status == 200
        await wait_until(lambda: watcher.policies() == (), what="policy deleted")
        stop.set()
    assert {"policies", "nodes"} <= set(changes)


async def test_status_patch_is_recorded(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.objects[POLICIES, None, "p"] = example_policy("p")
    status = {
        "observedGeneration": 3,
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "ResourcesNotAdvertised",
                "message": "gpu-1 advertises rdma/ib_compute: 0",
                "lastTransitionTime": "2026-11-30T11:00:00Z",
            }
        ],
        "nodes": {"selected": 2, "configured": 2, "advertising": 1, "healthy": 1},
    }
    await kube.patch_policy_status("p", status)
    stored = emulator.objects[POLICIES, None, "p"]
    assert stored["status"]["nodes"]["advertising"] == 1
    assert stored["status"]["conditions"][0]["reason"] == "ResourcesNotAdvertised"
    assert stored["spec"]["expect"]["linkLayer"] == "InfiniBand"  # the spec is untouched
    (request,) = [r for r in list(emulator) if r.method == "PATCH"]
    assert request.url.path.endswith("/nicfleetpolicies/p/status")


async def test_patch_status_of_a_missing_policy_is_a_kube_error(kube: KubeClient) -> None:
    with pytest.raises(KubeError) as caught:
        await kube.patch_policy_status("absent", {"observedGeneration": 1})
    assert caught.value.status == 404


async def test_event_created_on_node_and_policy(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    await kube.create_event(
        kind="Node", name="gpu-1", reason="PortDown", message="mlx5_3/1 is DOWN", type="Warning"
    )
    await kube.create_event(
        kind="NicFleetPolicy", name="p", uid="u-1", reason="ConfigApplied", message="8/8 nodes"
    )
    events = [obj for (res, _, _), obj in emulator.objects.items() if res == EVENTS]
    by_reason = {e["reason"]: e for e in events}
    assert set(by_reason) == {"PortDown", "ConfigApplied"}
    assert by_reason["PortDown"]["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": "gpu-1",
    }
    assert by_reason["PortDown"]["type"] == "Warning"
    assert by_reason["ConfigApplied"]["involvedObject"]["uid"] == "u-1"
    assert by_reason["ConfigApplied"]["metadata"]["namespace"] == "default"


async def test_event_reason_must_be_a_code(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    with pytest.raises(ValueError, match="reason"):
        await kube.create_event(kind="Node", name="n", reason="port down", message="m")
    assert list(emulator) == []


async def test_node_labels_patched_only_under_our_prefix(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.objects[NODES, None, "gpu-1"] = node("gpu-1", {"team": "a"}, {})
    await kube.patch_node_labels(
        "gpu-1", {"nicfleet.io/rdma": "true", "nicfleet.io/link-layer": "InfiniBand"}
    )
    labels = emulator.objects[NODES, None, "gpu-1"]["metadata"]["labels"]
    assert labels == {
        "team": "a",
        "nicfleet.io/rdma": "true",
        "nicfleet.io/link-layer": "InfiniBand",
    }
    (request,) = [r for r in list(emulator) if r.method == "PATCH"]
    assert request.headers["Content-Type"] == "application/merge-patch+json"

    with pytest.raises(ValueError, match="team"):
        await kube.patch_node_labels("gpu-1", {"team": "b"})
    with pytest.raises(ValueError, match="valid label value"):
        await kube.patch_node_labels("gpu-1", {"nicfleet.io/rdma": "not ok"})
    assert len([r for r in list(emulator) if r.method == "PATCH"]) == 1


async def test_nic_cluster_policy_read_only(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.resources[NCP] = kmock.ResourceInfo(kind="NicClusterPolicy", namespaced=False)
    assert await kube.read_nic_cluster_policy() is None
    config = {"configList": [{"resourceName": "a", "rdmaHcaMax": 1, "selectors": {}}]}
    emulator.objects[NCP, None, "nic-cluster-policy"] = {
        "apiVersion": "mellanox.com/v1alpha1",
        "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        "spec": {"rdmaSharedDevicePlugin": {"config": json.dumps(config)}},
    }
    found = await kube.read_nic_cluster_policy()
    assert found is not None
    assert json.loads(found["spec"]["rdmaSharedDevicePlugin"]["config"]) == config
    assert {r.method for r in list(emulator)} == {"GET"}


async def test_nic_cluster_policy_crd_absent_is_none(kube: KubeClient) -> None:
    assert await kube.read_nic_cluster_policy() is None


async def test_network_attachments_crd_absent_is_empty(kube: KubeClient) -> None:
    assert await kube.list_network_attachments() == ()


async def test_network_attachments_and_pods(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.resources[NADS] = kmock.ResourceInfo(
        kind="NetworkAttachmentDefinition", namespaced=True
    )
    emulator.objects[NADS, "ml", "ib-net"] = {
        "metadata": {
            "name": "ib-net",
            "namespace": "ml",
            "annotations": {"k8s.v1.cni.cncf.io/resourceName": "rdma/ib_compute"},
        },
        "spec": {"config": json.dumps({"cniVersion": "0.3.1", "type": "ipoib", "master": "ib0"})},
    }
    emulator.objects[NADS, "ml", "broken"] = {
        "metadata": {"name": "broken", "namespace": "ml"},
        "spec": {"config": "{not json"},
    }
    emulator.objects[PODS, "ml", "trainer-0"] = {
        "metadata": {
            "name": "trainer-0",
            "namespace": "ml",
            "annotations": {"k8s.v1.cni.cncf.io/networks": "ib-net"},
        },
        "spec": {
            "nodeName": "gpu-1",
            "containers": [
                {"name": "c", "resources": {"limits": {"rdma/ib_compute": "1", "cpu": "4"}}}
            ],
        },
        "status": {"phase": "Running"},
    }
    emulator.objects[PODS, "web", "nginx"] = {
        "metadata": {"name": "nginx", "namespace": "web"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]},
    }
    attachments = {a.name: a for a in await kube.list_network_attachments()}
    assert attachments["ib-net"].resource_name == "rdma/ib_compute"
    assert attachments["ib-net"].master == "ib0"
    assert attachments["broken"].master is None
    (pod,) = await kube.list_pod_requests()
    assert (pod.namespace, pod.name, pod.node, pod.phase) == ("ml", "trainer-0", "gpu-1", "Running")
    assert pod.requests == {"rdma/ib_compute": 1}
    assert pod.networks == ("ml/ib-net",)


async def test_watcher_fills_pods_and_tolerates_missing_nad_crd(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    emulator.objects[PODS, "ml", "p"] = {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"rdma/a": 2}}}]},
    }
    watcher = ClusterWatcher(kube, WatchSettings(pods_every_s=60))
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as group:
        group.create_task(watcher.run(stop))
        await wait_until(lambda: len(watcher.cluster_view().pods) == 1, what="pods listed")
        stop.set()
    assert watcher.cluster_view().attachments == ()


async def test_lease_create_read_replace(
    emulator: kmock.KubernetesEmulator, kube: KubeClient
) -> None:
    assert await kube.read_lease("nicfleet-aggregator") is None
    record = LeaseRecord(holder="a", duration_s=10, renew_time="2026-11-30T11:00:00.000000Z")
    assert await kube.write_lease("nicfleet-aggregator", record, create=True)
    assert not await kube.write_lease("nicfleet-aggregator", record, create=True)  # exists
    read = await kube.read_lease("nicfleet-aggregator")
    assert read is not None
    assert (read.holder, read.duration_s) == ("a", 10)
    renewed = LeaseRecord(holder="b", duration_s=10, renew_time="2026-11-30T11:00:03.000000Z")
    assert await kube.write_lease("nicfleet-aggregator", renewed, create=False)
    read = await kube.read_lease("nicfleet-aggregator")
    assert read is not None
    assert read.holder == "b"


async def test_unreachable_api_server() -> None:
    settings = KubeSettings(host="http://127.0.0.1:9", request_timeout_s=2)
    async with await KubeClient.connect(settings) as kube:
        with pytest.raises(KubeUnavailableError):
            await kube.list_policies()
        watcher = ClusterWatcher(kube, WatchSettings(retry_s=0.05, retry_max_s=0.1))
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            task = group.create_task(watcher.run(stop))
            await asyncio.sleep(0)
            stop.set()
        assert task.done()
        assert watcher.policies() == ()


async def test_bad_kubeconfig_is_a_kube_error(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    with pytest.raises(KubeError, match="configuration"):
        await KubeClient.connect(KubeSettings(kubeconfig=config))


def test_the_aggregator_without_a_cluster_does_not_import_kubernetes() -> None:
    # `kubernetes` costs ~0.4 s of every start; it is imported when a KubeClient connects.
    probe = "import sys, aggregator.cli.main; print('kubernetes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "False"
