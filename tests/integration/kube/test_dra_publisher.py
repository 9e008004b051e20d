"""aggregator.dra.publisher through aggregator.kube.client against kmock over loopback
HTTP: published snapshots and port events (fed to a Fleet and its ChangeFeed as Ingest
does) become rdma.nicfleet.io ResourceSlices; another driver's slice is never touched;
409 and 5xx answers are retried from a fresh list without losing the pending change.

The API server is tests/integration/kube/sliceapi.py (kmock plus resourceVersions and PUT).
Pools are built with the sharing the node's agent reported and owned by the Node object.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock
import pytest
from prometheus_client import CollectorRegistry

from agent.lab.faults import port_down
from aggregator.bus.natsserver import NatsServer
from aggregator.dra.publisher import PublishSettings, SlicePublisher
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.service import AggregatorService, AggregatorSettings
from proto.inventory import NodeSnapshot
from proto.messages.status import DevicePluginStatus, DraPluginStatus, DraSliceConfig
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.integration.kube.sliceapi import (
    SLICES,
    ApiServer,
    aggregator_api,
    port_state,
    slices_api,
)
from tests.support.builders import T0, nic, port_event, snapshot
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

OURS = "gpu-001-rdma-nicfleet-io-0"


def node(down: bool = False, seq: int = 1) -> NodeSnapshot:
    devices = (nic("mlx5_0", state="DOWN" if down else "ACTIVE"), nic("mlx5_1", index=1))
    return snapshot("gpu-001", seq=seq, devices=devices)


def foreign_slice() -> dict[str, Any]:
    """NVIDIA's GPU driver, in a pool of the same (node) name."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "gpu-001-gpu.nvidia.com-xk2p"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": "gpu-001",
            "pool": {"name": "gpu-001", "generation": 7, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0", "attributes": {"index": {"int": 0}}}],
        },
    }


class Rig:
    def __init__(self, api: ApiServer, kube: KubeClient) -> None:
        self.api = api
        self.fleet = Fleet()
        self.changes = ChangeFeed()
        self.leader = True
        self.nodes: dict[str, str | None] | None = None  # the Node objects: name -> uid
        self.registry = CollectorRegistry()
        self.publisher = SlicePublisher(
            PublishSettings(stale_after=1e9, retry_s=0.05),
            api=kube,
            changes=self.changes.subscribe(),
            records=self.fleet.view,
            cluster_nodes=lambda: self.nodes,
            is_leader=lambda: self.leader,
            clock=lambda: T0 + 2,
            registry=self.registry,
        )

    def metric(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def publish_snapshot(self, snap: NodeSnapshot) -> None:
        self.fleet.apply_snapshot(snap, received_at=T0)
        self.changes.publish(snap.node, "snapshot")


@asynccontextmanager
async def rig() -> AsyncIterator[Rig]:
    api = slices_api()
    async with api, kmock.Server(api) as server:
        kube = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with kube:
            setup = Rig(api, kube)
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(setup.publisher.run(stop))
                try:
                    yield setup
                finally:
                    stop.set()


async def test_port_down_updates_the_slice_and_other_drivers_are_untouched() -> None:
    async with rig() as r:
        r.api.put_slice(foreign_slice())
        before = r.api.stored("gpu-001-gpu.nvidia.com-xk2p")
        r.publish_snapshot(node())
        await wait_until(lambda: r.api.stored(OURS) is not None, what="slice created")
        created = r.api.stored(OURS)
        assert created is not None
        assert created["spec"]["pool"] == {
            "name": "gpu-001",
            "generation": 1,
            "resourceSliceCount": 1,
        }
        assert port_state(created, "mlx5-0") == "ACTIVE"

        started = time.perf_counter()
        r.fleet.apply_event(port_event("gpu-001", device="mlx5_0"), received_at=T0 + 1)
        r.changes.publish("gpu-001", "event")
        await wait_until(
            lambda: port_state(r.api.stored(OURS), "mlx5-0") == "DOWN", what="port down"
        )
        print(f"port-down fault -> slice updated in {time.perf_counter() - started:.3f} s")
        updated = r.api.stored(OURS)
        assert updated is not None
        assert updated["metadata"]["resourceVersion"] != created["metadata"]["resourceVersion"]
        assert port_state(updated, "mlx5-1") == "ACTIVE"
        assert r.api.stored("gpu-001-gpu.nvidia.com-xk2p") == before

        r.nodes = {}  # the Node object is gone: our slice goes, theirs stays
        r.changes.publish("gpu-001", "snapshot")
        await wait_until(lambda: r.api.stored(OURS) is None, what="slice deleted")
        assert r.api.stored("gpu-001-gpu.nvidia.com-xk2p") == before
        writes = [q for q in list(r.api) if q.method != "GET"]
        assert all("gpu.nvidia.com" not in str(q.url) for q in writes)
        (delete,) = [q for q in writes if q.method == "DELETE"]
        assert (
            delete.data["preconditions"]["resourceVersion"]
            == updated["metadata"]["resourceVersion"]
        )


@pytest.mark.parametrize("codes", [[409], [500, 503]], ids=["conflict", "server-errors"])
async def test_failed_writes_are_retried_without_losing_the_change(codes: list[int]) -> None:
    async with rig() as r:
        r.publish_snapshot(node())
        await wait_until(lambda: r.api.stored(OURS) is not None, what="slice created")
        r.api.fail_writes.extend(codes)
        r.publish_snapshot(node(down=True, seq=2))
        await wait_until(lambda: port_state(r.api.stored(OURS), "mlx5-0") == "DOWN", what="retried")
        assert r.api.fail_writes == []
        assert r.publisher.errors == len(codes)
        result = "conflict" if codes == [409] else "error"
        writes = "nicfleet_dra_slice_writes_total"
        assert r.metric(writes, action="update", result=result) == len(codes)
        assert r.metric(writes, action="update", result="ok") == 1
        assert r.metric(writes, action="create", result="ok") == 1


UID = "2b1f0c9e-5d4a-4e3b-8c7d-6a5b4c3d2e1f"


def owners(obj: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    return None if obj is None else obj["metadata"].get("ownerReferences")


async def test_slices_follow_the_agents_sharing_and_are_owned_by_the_node() -> None:
    async with rig() as r:
        r.nodes = {"gpu-001": UID}
        copies = DraPluginStatus(slices=DraSliceConfig(sharing="copies", share=2))
        r.fleet.apply_status(
            DevicePluginStatus(node="gpu-001", observed_at=T0, dra=copies), received_at=T0
        )
        r.publish_snapshot(node())
        await wait_until(lambda: r.api.stored(OURS) is not None, what="slice created")
        created = r.api.stored(OURS)
        assert created is not None
        assert [d["name"] for d in created["spec"]["devices"]] == [
            "mlx5-0-s0", "mlx5-0-s1", "mlx5-1-s0", "mlx5-1-s1",
        ]  # fmt: skip
        owner = {"apiVersion": "v1", "kind": "Node", "name": "gpu-001", "controller": True}
        assert owners(created) == [{**owner, "uid": UID}]

        r.nodes = {"gpu-001": "uid-of-the-recreated-node"}  # same name, a new Node object
        r.changes.publish("gpu-001", "snapshot")
        await wait_until(
            lambda: owners(r.api.stored(OURS)) == [{**owner, "uid": "uid-of-the-recreated-node"}],
            what="owner reference replaced",
        )
        replaced = r.api.stored(OURS)
        assert replaced is not None
        assert replaced["spec"] == created["spec"]  # the devices untouched, no bump
        writes = "nicfleet_dra_slice_writes_total"
        assert r.metric(writes, action="create", result="ok") == 1
        assert r.metric(writes, action="update", result="ok") == 1
        assert r.metric("nicfleet_dra_slice_publish_seconds_count") == 2
        assert r.metric("nicfleet_dra_published_pools") == 1


async def test_a_stale_version_is_relisted_and_a_foreign_edit_replaced() -> None:
    async with rig() as r:
        r.publish_snapshot(node())
        await wait_until(lambda: r.api.stored(OURS) is not None, what="slice created")
        edited = r.api.stored(OURS)
        assert edited is not None
        edited["spec"]["devices"] = []
        r.api.put_slice(edited)  # someone else wrote it: our cached version is stale
        r.publish_snapshot(node(down=True, seq=2))
        await wait_until(
            lambda: port_state(r.api.stored(OURS), "mlx5-0") == "DOWN", what="rewritten"
        )
        assert r.publisher.errors == 1  # the 409, then a fresh list
        final = r.api.stored(OURS)
        assert final is not None and len(final["spec"]["devices"]) == 2
        assert final["spec"]["pool"]["generation"] == 2  # the device set changed back


async def test_a_follower_writes_nothing() -> None:
    async with rig() as r:
        r.leader = False
        r.publish_snapshot(node())
        r.changes.publish("gpu-001", "snapshot")
        await wait_until(lambda: r.publisher.rounds == 0 and len(r.fleet) == 1, what="idle")
        assert r.api.stored(OURS) is None
        r.leader = True
        r.changes.publish("gpu-001", "snapshot")
        await wait_until(lambda: r.api.stored(OURS) is not None, what="leader writes")
        assert r.publisher.rounds >= 1


async def test_the_client_refuses_to_write_another_drivers_slice() -> None:
    api = ApiServer()
    api.resources[SLICES] = kmock.ResourceInfo(kind="ResourceSlice", namespaced=False)
    async with api, kmock.Server(api) as server:
        kube = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with kube:
            with pytest.raises(ValueError, match=r"only rdma\.nicfleet\.io"):
                await kube.create_resource_slice(foreign_slice())
            with pytest.raises(ValueError, match=r"only rdma\.nicfleet\.io"):
                await kube.replace_resource_slice("x", foreign_slice())
    assert [q for q in list(api) if q.method != "GET"] == []


async def test_the_aggregator_with_dra_publish_publishes_a_lab_agents_slices(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    """End to end: a lab agent's snapshot and port event over NATS, the leader's
    publisher, the API."""
    name = "kube-roce-01"
    api = aggregator_api(name, node_uid=UID)
    api.put_slice(foreign_slice() | {"metadata": {"name": "theirs"}})
    root = lab_node(tmp_path, "roce-cx6dx", name)
    slice_name = f"{name}-rdma-nicfleet-io-0"
    async with api, kmock.Server(api) as server:
        settings = AggregatorSettings(
            nats_url=nats_server.url,
            listen_port=0,
            kube=KubeSettings(host=str(server.url)),
            identity="replica-a",
            dra_publish=True,
        )
        service = AggregatorService(settings)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), 15)
                async with agent(nats_server.url, root, name):
                    await wait_until(
                        lambda: api.stored(slice_name) is not None,
                        timeout=30,
                        what="the leader published the node's slice",
                    )
                    assert port_state(api.stored(slice_name), "mlx5-0") == "ACTIVE"
                    started = time.perf_counter()
                    port_down(root, "mlx5_0", 1)
                    await wait_until(
                        lambda: port_state(api.stored(slice_name), "mlx5-0") == "DOWN",
                        timeout=30,
                        what="the lab port fault in the slice",
                    )
                    took = time.perf_counter() - started
                    print(f"lab port_down -> agent -> NATS -> slice updated in {took:.3f} s")
            finally:
                stop.set()
    published = api.stored(slice_name)
    assert published is not None
    assert published["spec"]["nodeName"] == name
    # The watcher's Node uid (kube.objects.node_from_object) reached the publisher.
    assert owners(published) == [
        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": UID, "controller": True}
    ]
    assert published["spec"]["devices"], "the lab node's RDMA devices"
    assert api.stored("theirs") is not None
