"""Claims forwarded over NATS: ResourceClaims in kmock's API server, watched by the
aggregator's ClaimWatcher and answered by its ClaimFeed on a real nats-server, asked by the
agent's DRA plugin (NatsClaims) through the lab DRA kubelet.

A claim allocated to this node prepares with its CDI id; one allocated to another node is
a per-claim error; with the aggregator gone, Prepare is a retryable ClaimUnavailable per
claim and the plugin keeps serving. The whole agent with `claims_from="nats"` asks over its
own (publisher's) connection.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kmock
import nats
import pytest
from nats.aio.client import Client as NatsClient
from prometheus_client import CollectorRegistry

from agent.dra.claimsnats import NatsClaims
from agent.dra.pluginrunner import DraPlugin
from agent.host.inventory import collect_port_states, collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.kubeletdra import DraKubeletEmulator, claim_object
from agent.service import AgentService, AgentSettings
from aggregator.bus.claimanswer import ClaimFeed
from aggregator.bus.natsserver import NatsServer
from aggregator.dra.claims import ClaimIndex
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClaimWatcher, WatchSettings
from proto.runtime.natsconnect import agent_inbox_prefix
from tests.integration.dra.fixtures import lab_dra_settings
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE, OTHER = "dra-node-01", "dra-node-02"
DRIVER = "rdma.nicfleet.io"
CLAIMS = "resource.k8s.io/v1/resourceclaims"
UID_A = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_B = "1c5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_C = "2d5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
CLAIM_A = ("ml", UID_A, "nic-a")  # allocated on NODE
CLAIM_B = ("ml", UID_B, "nic-b")  # allocated on OTHER
CLAIM_C = ("ml", UID_C, "nic-c")  # allocated on NODE after the aggregator went away


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="drac", dir="/tmp"))  # unix sockets: 107 bytes
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def emulator() -> AsyncIterator[kmock.KubernetesEmulator]:
    emu = kmock.KubernetesEmulator()
    emu.resources[CLAIMS] = kmock.ResourceInfo(kind="ResourceClaim", namespaced=True)
    async with emu:
        yield emu


@pytest.fixture
async def kube(emulator: kmock.KubernetesEmulator) -> AsyncIterator[KubeClient]:
    async with kmock.Server(emulator) as server:
        client = await KubeClient.connect(KubeSettings(host=str(server.url)))
        async with client:
            yield client


async def post_claim(emu: kmock.KubernetesEmulator, obj: dict[str, Any]) -> None:
    path = f"/apis/resource.k8s.io/v1/namespaces/{obj['metadata']['namespace']}/resourceclaims"
    response = await emu.post(path, json=obj)
    assert response.status < 300, await response.text()


def allocated(claim: tuple[str, str, str], pool: str, device: str) -> dict[str, Any]:
    return claim_object(claim, [("nic", DRIVER, pool, device)])


def plugin_for(root: Path, nc: NatsClient) -> DraPlugin:
    settings = lab_dra_settings(root, NODE)
    plugin = DraPlugin(settings, node=NODE, source=NatsClaims(lambda: nc, node=NODE, timeout=1))
    sysfs = Sysfs(root / "sys")
    snapshot = collect_snapshot(sysfs, node=NODE, seq=1, now=0.0, agent_version="t")
    plugin.update(snapshot, collect_port_states(sysfs))
    return plugin


async def test_prepare_with_claims_from_the_aggregator(
    nats_server: NatsServer,
    emulator: kmock.KubernetesEmulator,
    kube: KubeClient,
    short_dir: Path,
) -> None:
    await post_claim(emulator, allocated(CLAIM_A, NODE, "mlx5-0"))  # listed
    aggregator = await nats.connect(nats_server.url)
    agent = await nats.connect(nats_server.url, inbox_prefix=agent_inbox_prefix(NODE))
    index = ClaimIndex()
    watcher = ClaimWatcher(kube, index, WatchSettings(retry_s=0.05, retry_max_s=0.2))
    feed = ClaimFeed(aggregator, index, registry=CollectorRegistry())
    await feed.open()
    plugin = plugin_for(short_dir, agent)
    stop, aggregator_stop = asyncio.Event(), asyncio.Event()
    try:
        async with (
            DraKubeletEmulator(plugin.settings.plugins_registry_dir) as kubelet,
            asyncio.TaskGroup() as tasks,
        ):
            tasks.create_task(plugin.run(stop))
            tasks.create_task(watcher.run(aggregator_stop))
            tasks.create_task(feed.run(aggregator_stop))
            try:
                conn = await kubelet.plugin(DRIVER, timeout=10)
                await wait_until(lambda: len(index) == 1, what="claim A listed")
                await post_claim(emulator, allocated(CLAIM_B, OTHER, "mlx5-0"))
                await wait_until(lambda: len(index) == 2, what="claim B watched")

                both = await conn.prepare(CLAIM_A, CLAIM_B)
                mine = both.claims[UID_A]
                assert mine.error == ""
                assert [(d.pool_name, d.device_name) for d in mine.devices] == [(NODE, "mlx5-0")]
                assert list(mine.devices[0].cdi_device_ids) == [f"{DRIVER}/claim={UID_A}-mlx5-0"]
                # Another node's claim: refused by the aggregator, one claim's error only.
                assert both.claims[UID_B].devices == []
                assert f"not allocated on node {NODE}" in both.claims[UID_B].error

                # The aggregator goes away: claim C cannot be known; A stays prepared.
                aggregator_stop.set()
                await feed.close()
                await aggregator.drain()
                await post_claim(emulator, allocated(CLAIM_C, NODE, "mlx5-1"))
                later = await conn.prepare(CLAIM_C, CLAIM_A)
                assert later.claims[UID_C].devices == []
                assert "no answer from the aggregator" in later.claims[UID_C].error
                assert later.claims[UID_A] == mine  # the checkpoint answers
                assert plugin.state == "registered"
            finally:
                aggregator_stop.set()
                stop.set()
    finally:
        await feed.close()
        await agent.close()
        if not aggregator.is_closed:
            await aggregator.close()


async def test_the_agent_asks_the_aggregator_by_default_over_its_own_connection(
    nats_server: NatsServer, short_dir: Path
) -> None:
    dra = lab_dra_settings(short_dir, NODE)
    settings = AgentSettings(
        node_name=NODE, sysfs_root=short_dir / "sys", nats_url=nats_server.url, netlink=False,
        dra=dra,
    )  # fmt: skip
    index = ClaimIndex()
    index.replace([allocated(CLAIM_A, NODE, "mlx5-1")])
    aggregator = await nats.connect(nats_server.url)
    feed = ClaimFeed(aggregator, index, registry=CollectorRegistry())
    await feed.open()
    service = AgentService(settings)
    stop = asyncio.Event()
    try:
        async with (
            DraKubeletEmulator(dra.plugins_registry_dir) as kubelet,
            asyncio.TaskGroup() as tg,
        ):
            tg.create_task(service.run(stop))
            tg.create_task(feed.run(stop))
            try:
                conn = await kubelet.plugin(DRIVER, timeout=15)
                await conn.wait_health(lambda r: len(r.devices) == 4, timeout=15)  # inventory
                await wait_until(lambda: service.nats_connected, what="agent connected")
                prepared = await conn.prepare(CLAIM_A)
                assert prepared.claims[UID_A].error == ""
                assert prepared.claims[UID_A].devices[0].device_name == "mlx5-1"
            finally:
                stop.set()
    finally:
        await feed.close()
        await aggregator.close()
