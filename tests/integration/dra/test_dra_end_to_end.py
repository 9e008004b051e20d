"""The DRA path end to end through the real services: the AggregatorService (kmock as its
Kubernetes API, `dra_publish` on, a real nats-server) and an AgentService with `--dra` and
claims from NATS on a lab sysfs tree, registered with the lab DRA kubelet.

The aggregator publishes the node's ResourceSlice; a ResourceClaim allocated the way the
scheduler writes it (status.allocation.devices.results + nodeSelector) prepares with its
CDI id through the aggregator's own claim watcher and answerer; another node's claim is
that claim's error only; a lab port fault turns the slice's portState DOWN and the health
stream Unhealthy; unprepare removes the CDI spec. Nothing here is wired by hand.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import kmock
import pytest

from agent.deviceplugin.registration import Backoff
from agent.dra.cdi import spec_file_name
from agent.dra.pluginrunner import DraSettings
from agent.lab.faults import port_down
from agent.lab.kubeletdra import DraKubeletEmulator, claim_object
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.kube.client import KubeSettings
from aggregator.service import AggregatorService, AggregatorSettings
from proto.dra import api_pb2, health_pb2
from tests.integration.kube.test_dra_publisher import SLICES, ApiServer, port_state
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE, OTHER = "e2e-roce-01", "e2e-roce-02"
DRIVER = "rdma.nicfleet.io"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
SLICE = f"{NODE}-rdma-nicfleet-io-0"
UID_MINE = "3e5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_OTHER = "4f5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
MINE = ("ml", UID_MINE, "nic-mine")  # allocated mlx5-0 on NODE
ELSEWHERE = ("ml", UID_OTHER, "nic-elsewhere")  # allocated on OTHER


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drae", dir="/tmp"))  # unix sockets: 107 bytes
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def api_server() -> ApiServer:
    """kmock with what the aggregator lists and watches, and this node's Node object."""
    api = ApiServer()
    for path, kind, namespaced in [
        (SLICES, "ResourceSlice", False),
        (CLAIMS, "ResourceClaim", True),
        ("nicfleet.io/v1alpha1/nicfleetpolicies", "NicFleetPolicy", False),
        ("v1/nodes", "Node", False),
        ("v1/pods", "Pod", True),
        ("v1/events", "Event", True),
        ("coordination.k8s.io/v1/leases", "Lease", True),
    ]:
        api.resources[path] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
    api.objects["v1/nodes", None, NODE] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE},
    }
    return api


def scheduled(claim: tuple[str, str, str], node: str, device: str) -> dict[str, Any]:
    """The claim as the scheduler leaves it: one result in `node`'s pool, pinned there."""
    obj = claim_object(claim, [("nic", DRIVER, node, device)])
    obj["spec"] = {
        "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": "rdma"}}]}
    }
    obj["status"]["allocation"]["nodeSelector"] = {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
        ]
    }
    return obj


async def post_claim(api: ApiServer, obj: dict[str, Any]) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{obj['metadata']['namespace']}/resourceclaims"
    response = await api.post(path, json=obj)
    assert response.status < 300, await response.text()


@asynccontextmanager
async def running(
    service: AggregatorService | AgentService,
) -> AsyncIterator[None]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            yield
        finally:
            stop.set()


def agent_settings(root: Path, nats_url: str) -> AgentSettings:
    tree = root / "sys"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), tree)
    dra = DraSettings(
        plugins_dir=root / "plugins",
        plugins_registry_dir=root / "registry",
        cdi_dir=root / "cdi",
        state_dir=root / "state",
        claims_from="nats",
        watch_interval=0.02,
        backoff=Backoff(initial=0.05, maximum=0.5),
    )
    dra.plugins_registry_dir.mkdir(parents=True)
    return AgentSettings(node_name=NODE, sysfs_root=tree, nats_url=nats_url, netlink=False, dra=dra)


def health_of(response: health_pb2.NodeWatchResourcesResponse, device: str) -> int | None:
    for entry in response.devices:
        if entry.device.device_name == device:
            return int(entry.health)
    return None


async def test_slices_claims_and_health_through_both_services(
    nats_server: NatsServer, short_dir: Path
) -> None:
    api = api_server()
    settings = agent_settings(short_dir, nats_server.url)
    assert settings.dra is not None
    cdi_spec = settings.dra.cdi_dir / spec_file_name(UID_MINE)
    async with api, kmock.Server(api) as server:
        aggregator = AggregatorService(
            AggregatorSettings(
                nats_url=nats_server.url,
                listen_port=0,
                kube=KubeSettings(host=str(server.url)),
                identity="replica-a",
                dra_publish=True,
            )
        )
        async with running(aggregator):
            await asyncio.wait_for(aggregator.ready.wait(), 15)
            agent = AgentService(settings)
            async with (
                DraKubeletEmulator(settings.dra.plugins_registry_dir) as kubelet,
                running(agent),
            ):
                conn = await kubelet.plugin(DRIVER, timeout=15)
                await wait_until(
                    lambda: port_state(api.stored(SLICE), "mlx5-0") == "ACTIVE",
                    timeout=30,
                    what="the leader published the node's ResourceSlice",
                )
                published = api.stored(SLICE)
                assert published is not None
                assert published["spec"]["nodeName"] == NODE
                assert published["spec"]["pool"]["name"] == NODE
                names = sorted(d["name"] for d in published["spec"]["devices"])
                assert names == ["mlx5-0", "mlx5-1", "mlx5-2", "mlx5-3"]

                await conn.wait_health(lambda r: len(r.devices) == 4, timeout=15)
                await wait_until(lambda: agent.nats_connected, what="agent connected")
                await post_claim(api, scheduled(MINE, NODE, "mlx5-0"))
                await post_claim(api, scheduled(ELSEWHERE, OTHER, "mlx5-0"))

                answer: api_pb2.NodePrepareResourcesResponse | None = None

                # The aggregator's watcher may not have the claims yet: a retryable
                # per-claim error until it does; wait for the answer, not a time.
                async def both_answered() -> bool:
                    nonlocal answer
                    answer = await conn.prepare(MINE, ELSEWHERE)
                    other = answer.claims[UID_OTHER].error
                    return answer.claims[UID_MINE].error == "" and "not allocated" in other

                await wait_until(both_answered, timeout=20, interval=0.1, what="claims answered")
                assert answer is not None
                mine = answer.claims[UID_MINE]
                assert [(d.pool_name, d.device_name) for d in mine.devices] == [(NODE, "mlx5-0")]
                assert list(mine.devices[0].cdi_device_ids) == [f"{DRIVER}/claim={UID_MINE}-mlx5-0"]
                assert answer.claims[UID_OTHER].devices == []
                assert f"not allocated on node {NODE}" in answer.claims[UID_OTHER].error
                assert cdi_spec.exists()
                assert not (settings.dra.cdi_dir / spec_file_name(UID_OTHER)).exists()

                port_down(settings.sysfs_root, "mlx5_0", 1)
                await wait_until(
                    lambda: port_state(api.stored(SLICE), "mlx5-0") == "DOWN",
                    timeout=30,
                    what="the port fault in the published slice",
                )
                assert port_state(api.stored(SLICE), "mlx5-1") == "ACTIVE"
                await conn.wait_health(
                    lambda r: health_of(r, "mlx5-0") == health_pb2.UNHEALTHY, timeout=15
                )
                assert "mlx5-0" in conn.unhealthy()
                assert "mlx5-1" not in conn.unhealthy()

                done = await conn.unprepare(MINE)
                assert done.claims[UID_MINE].error == ""
                assert not cdi_spec.exists()
                assert agent.dra is not None and agent.dra.state == "registered"
