"""aggregator.dra.publisher through aggregator.kube.client against kmock over loopback
HTTP: published snapshots and port events (fed to a Fleet and its ChangeFeed as Ingest
does) become rdma.nicfleet.io ResourceSlices; another driver's slice is never touched;
409 and 5xx answers are retried from a fresh list without losing the pending change.

kmock stores objects but knows no resourceVersion and no PUT: `ApiServer` adds what the
API server does for ResourceSlices (a new resourceVersion on every write, 409 for a
replace or delete whose version is stale, replace = the whole object) and answers the
next writes with injected statuses.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import pytest

from agent.lab.faults import port_down
from aggregator.bus.natsserver import NatsServer
from aggregator.dra.publisher import PublishSettings, SlicePublisher
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.service import AggregatorService, AggregatorSettings
from proto.inventory import NodeSnapshot
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.support.builders import T0, nic, port_event, snapshot
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

SLICES = "resource.k8s.io/v1/resourceslices"
PATH = f"/apis/{SLICES}"
OURS = "gpu-001-rdma-nicfleet-io-0"


def status(code: int, reason: str) -> aiohttp.web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code}
    return aiohttp.web.json_response({**body, "reason": reason}, status=code)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    fail_writes: list[int] = attrs.field(factory=list)  # statuses for the next writes
    _versions: itertools.count[int] = attrs.field(factory=lambda: itertools.count(1000))

    def stored(self, name: str) -> dict[str, Any] | None:
        key = (kmock.resource("resource.k8s.io", "v1", "resourceslices"), None, name)
        if key not in self.objects or self.objects[key].deleted:
            return None
        return dict(self.objects[key].raw)

    def put_slice(self, obj: dict[str, Any]) -> None:
        """Store `obj` as the API server would hand it out (server-set metadata added)."""
        obj = copy.deepcopy(obj)
        obj["metadata"].update(
            uid=f"uid-{obj['metadata']['name']}",
            resourceVersion=str(next(self._versions)),
            generation=1,
            creationTimestamp="2026-12-02T04:00:00Z",
            managedFields=[{"manager": "someone", "operation": "Update"}],
        )
        self.objects[SLICES, None, obj["metadata"]["name"]] = obj

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        if not request.url.path.startswith(PATH) or request.method == "GET":
            return await super()._handle(request)
        if self.fail_writes:
            code = self.fail_writes.pop(0)
            return status(code, "Conflict" if code == 409 else "InternalError")
        name = request.url.path.removeprefix(PATH).strip("/")
        if request.method == "POST":
            request.data.setdefault("metadata", {})["resourceVersion"] = str(next(self._versions))
            return await super()._handle(request)
        old = self.stored(name)
        if old is None:
            return status(404, "NotFound")
        wanted = (
            request.data.get("metadata", {}).get("resourceVersion")
            if request.method == "PUT"
            else (request.data or {}).get("preconditions", {}).get("resourceVersion")
        )
        if wanted is not None and wanted != old["metadata"]["resourceVersion"]:
            return status(409, "Conflict")
        if request.method == "DELETE":
            return await super()._handle(request)
        new = copy.deepcopy(request.data)
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        self.objects[SLICES, None, name] = new  # a replace: nothing of the old is kept
        return aiohttp.web.json_response(new)


def node(down: bool = False, seq: int = 1) -> NodeSnapshot:
    devices = (nic("mlx5_0", state="DOWN" if down else "ACTIVE"), nic("mlx5_1", index=1))
    return snapshot("gpu-001", seq=seq, devices=devices)


def port_state(obj: dict[str, Any] | None, device: str) -> str | None:
    if obj is None:
        return None
    entry = [d for d in obj["spec"]["devices"] if d["name"] == device]
    return str(entry[0]["attributes"]["portState"]["string"]) if entry else None


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
        self.nodes: set[str] | None = None
        self.publisher = SlicePublisher(
            PublishSettings(stale_after=1e9, retry_s=0.05),
            api=kube,
            changes=self.changes.subscribe(),
            records=self.fleet.view,
            cluster_nodes=lambda: self.nodes,
            is_leader=lambda: self.leader,
            clock=lambda: T0 + 2,
        )

    def publish_snapshot(self, snap: NodeSnapshot) -> None:
        self.fleet.apply_snapshot(snap, received_at=T0)
        self.changes.publish(snap.node, "snapshot")


@asynccontextmanager
async def rig() -> AsyncIterator[Rig]:
    api = ApiServer()
    api.resources[SLICES] = kmock.ResourceInfo(kind="ResourceSlice", namespaced=False)
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

        r.nodes = set()  # the Node object is gone: our slice goes, theirs stays
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
    api = ApiServer()
    api.resources[SLICES] = kmock.ResourceInfo(kind="ResourceSlice", namespaced=False)
    for path, kind, namespaced in [
        ("nicfleet.io/v1alpha1/nicfleetpolicies", "NicFleetPolicy", False),
        ("v1/nodes", "Node", False),
        ("v1/pods", "Pod", True),
        ("v1/events", "Event", True),
        ("coordination.k8s.io/v1/leases", "Lease", True),
    ]:
        api.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
    api.objects["v1/nodes", None, name] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
    }
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
    assert published["spec"]["devices"], "the lab node's RDMA devices"
    assert api.stored("theirs") is not None
