"""The whole aggregator against a Kubernetes API fake (kmock) and a real nats-server:
policies come from NicFleetPolicy objects, the replica takes the Lease and leads, desired
config lands in KV, status is written back, and the API serves the reconcile report."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx
import kmock
import pytest

from aggregator.bus.natsserver import NatsServer
from aggregator.kube.client import KubeSettings
from aggregator.service import AggregatorService, AggregatorSettings
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

POLICIES = "nicfleet.io/v1alpha1/nicfleetpolicies"
NODES = "v1/nodes"
LEASES = "coordination.k8s.io/v1/leases"
NCP = "mellanox.com/v1alpha1/nicclusterpolicies"
NODE = "kube-roce-01"


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    emu.resources[POLICIES] = kmock.ResourceInfo(
        kind="NicFleetPolicy", namespaced=False, subresources={"status"}
    )
    emu.resources[NODES] = kmock.ResourceInfo(kind="Node", namespaced=False)
    emu.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", namespaced=True)
    emu.resources["v1/events"] = kmock.ResourceInfo(kind="Event", namespaced=True)
    emu.resources[LEASES] = kmock.ResourceInfo(kind="Lease", namespaced=True)
    emu.resources[NCP] = kmock.ResourceInfo(kind="NicClusterPolicy", namespaced=False)
    async with emu:
        yield emu


def roce_policy() -> dict[str, Any]:
    return {
        "apiVersion": "nicfleet.io/v1alpha1",
        "kind": "NicFleetPolicy",
        "metadata": {"name": "roce", "generation": 3, "uid": "u-roce"},
        "spec": {
            "nodeSelector": {"matchLabels": {"pool": "gpu"}},
            "rdmaSharedDevicePlugin": {
                "configList": [
                    {"resourceName": "roce", "rdmaHcaMax": 4, "selectors": {"linkTypes": ["ether"]}}
                ]
            },
            "expect": {"linkLayer": "Ethernet"},
        },
    }


async def test_aggregator_with_a_cluster_leads_plans_and_reports(
    emulator: kmock.KubernetesEmulator, nats_server: NatsServer, tmp_path: Any
) -> None:
    emulator.objects[POLICIES, None, "roce"] = roce_policy()
    emulator.objects[NODES, None, NODE] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE, "labels": {"pool": "gpu"}},
        "status": {"allocatable": {"rdma/roce": "4"}, "capacity": {"rdma/roce": "4"}},
    }
    # An NVIDIA NicClusterPolicy whose embedded config is not JSON: audited, never written.
    emulator.objects[NCP, None, "nic-cluster-policy"] = {
        "apiVersion": "mellanox.com/v1alpha1",
        "kind": "NicClusterPolicy",
        "metadata": {"name": "nic-cluster-policy"},
        "spec": {"rdmaSharedDevicePlugin": {"config": "{not json"}},
    }
    root = lab_node(tmp_path, "roce-cx6dx", NODE)
    async with kmock.Server(emulator) as server:
        service = AggregatorService(
            AggregatorSettings(
                nats_url=nats_server.url,
                listen_port=0,
                kube=KubeSettings(host=str(server.url)),
                identity="replica-a",
                reconcile_tick=0.2,
            )
        )
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), 15)
                async with agent(nats_server.url, root, NODE):
                    leader = service.leader
                    assert leader is not None
                    await wait_until(lambda: leader.is_leader, timeout=15, what="the Lease taken")

                    def status_written() -> bool:
                        status: Any = emulator.objects[POLICIES, None, "roce"].get("status")
                        return bool(status) and status.get("observedGeneration") == 3

                    await wait_until(status_written, timeout=20, what="policy status written")
                    report: dict[str, Any] = {}
                    async with httpx.AsyncClient(base_url=service.api_url or "") as client:

                        async def reported_as_leader() -> bool:
                            report.update((await client.get("/api/v1/policy")).json())
                            return report["leader"] is True

                        await wait_until(reported_as_leader, timeout=20, what="leader report")
                    assert [p["metadata"]["name"] for p in report["items"]] == ["roce"]
                    assert [n["node"] for n in report["nodes"]] == [NODE]
                    await wait_until(
                        lambda: (
                            emulator.objects[NODES, None, NODE]["metadata"]["labels"].get(
                                "nicfleet.io/rdma"
                            )
                            == "true"
                        ),
                        timeout=20,
                        what="node labelled",
                    )
                    labels = emulator.objects[NODES, None, NODE]["metadata"]["labels"]
                    assert labels["pool"] == "gpu"
                    await wait_until(
                        lambda: any(
                            f.rule == "nvidia-policy-invalid" for f in service.nvidia_findings
                        ),
                        timeout=20,
                        what="the NicClusterPolicy audited",
                    )
                    assert "status" not in emulator.objects[NCP, None, "nic-cluster-policy"]
                    assert labels["nicfleet.io/link-layer"] == "Ethernet"
            finally:
                stop.set()
