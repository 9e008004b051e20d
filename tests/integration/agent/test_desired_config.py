"""The agent side of desired config on a real nats-server, fed by the aggregator's own
responder and writer (`DesiredFeed`, `ConfigStore`): the watcher waits for an aggregator,
applies valid configs, refuses bad ones, never applies an older one after a newer, hands
no spurious `None` while the aggregator restarts, survives a server restart; the agent
serves the aggregator's config over its file and falls back to the file on delete."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from agent.bus.desired import DesiredConfigWatcher, DesiredSettings
from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.desiredanswer import DesiredFeed
from aggregator.bus.natsserver import NatsServer
from aggregator.reconcile.apply import ConfigStore
from aggregator.reconcile.plan import DeleteDesiredConfig, PutDesiredConfig
from proto import subjects
from proto.codec import encode
from proto.messages.config import (
    DesiredConfig,
    DesiredUpdate,
    DevicePluginConfig,
    ResourceConfig,
    Selectors,
)
from proto.runtime.natsconnect import NO_SECURITY, NatsClientSecurity, connect_options
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
FAST = DesiredSettings(retry_initial=0.05, retry_max=0.2)


def desired(node: str, generation: int, hca_max: int = 4, name: str = "roce") -> DesiredConfig:
    resource = ResourceConfig(
        resource_name=name, rdma_hca_max=hca_max, selectors=Selectors(link_types=("ether",))
    )
    return DesiredConfig(
        node=node, generation=generation, device_plugin=DevicePluginConfig(config_list=(resource,))
    )


def file_config(hca_max: int) -> str:
    entry = {"resourceName": "roce", "rdmaHcaMax": hca_max, "selectors": {"linkTypes": ["ether"]}}
    return json.dumps({"configList": [entry]})


@dataclass
class Feeder:
    """The aggregator's side: KV nicfleet-config, written through `ConfigStore` (which
    announces each write) and answered by a running `DesiredFeed`."""

    nc: NatsClient
    kv: KeyValue
    store: ConfigStore
    feed: DesiredFeed
    registry: CollectorRegistry

    async def put(self, config: DesiredConfig) -> None:
        put = PutDesiredConfig(node=config.node, config=config, policy="p")
        assert await self.store.apply([put]) == []

    async def delete(self, node: str) -> None:
        assert await self.store.apply([DeleteDesiredConfig(node=node)]) == []

    async def put_raw(self, node: str, value: bytes) -> None:
        """Whatever the KV holds is relayed as it is (the agent decodes and validates)."""
        revision = await self.kv.put(subjects.node_token(node), value)
        await self.feed.announce(node, revision, value)

    def count(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def feeding(
    url: str,
    *,
    fresh: bool = True,
    preload: tuple[DesiredConfig, ...] = (),
    security: NatsClientSecurity = NO_SECURITY,
) -> AsyncIterator[Feeder]:
    """`preload` goes into KV before anything answers, unannounced: only an agent's own
    request can find it."""
    nc = await nats.connect(url, max_reconnect_attempts=-1, **connect_options(security))
    try:
        js = nc.jetstream()
        if fresh:
            with suppress(nats.js.errors.NotFoundError):
                await js.delete_key_value(subjects.KV_CONFIG)
            kv = await js.create_key_value(bucket=subjects.KV_CONFIG, history=1)
        else:
            kv = await js.key_value(subjects.KV_CONFIG)
        for config in preload:
            await kv.put(subjects.node_token(config.node), encode(config))
        registry = CollectorRegistry()
        feed = DesiredFeed(nc, kv, registry=registry)
        await feed.open()
        store = ConfigStore(kv, announce=feed.announce)
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(feed.run(stop))
            try:
                yield Feeder(nc=nc, kv=kv, store=store, feed=feed, registry=registry)
            finally:
                stop.set()
        await feed.close()
    finally:
        await nc.close()


@asynccontextmanager
async def running(task_owner: DesiredConfigWatcher | AgentService) -> AsyncIterator[None]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(task_owner.run(stop))
        try:
            yield
        finally:
            stop.set()


async def test_watcher_waits_for_an_aggregator_applies_refuses_and_deletes(
    own_nats: NatsServer,
) -> None:
    seen: list[DesiredConfig | None] = []
    watcher = DesiredConfigWatcher(
        node="w-01", url=own_nats.url, on_config=seen.append, settings=FAST
    )
    async with running(watcher):
        await wait_until(lambda: watcher.unanswered >= 2, what="asking while no aggregator runs")
        assert not watcher.watching.is_set()
        async with feeding(own_nats.url, preload=(desired("w-01", 1),)) as feeder:
            await wait_until(watcher.watching.is_set, what="answered once the aggregator is up")
            await wait_until(lambda: len(seen) == 1, what="first config, asked for")
            assert seen[0] == desired("w-01", 1)
            await feeder.put(desired("w-02", 1))  # another node's key

            await feeder.put_raw("w-01", b"\x93garbage")
            await feeder.put_raw("w-01", encode(desired("w-01", 2, hca_max=-1)))
            await feeder.put_raw("w-01", encode(desired("w-99", 3)))
            await wait_until(lambda: watcher.rejected == 3, what="three refusals")
            assert len(seen) == 1  # nothing bad was handed on

            await feeder.put(desired("w-01", 4))
            await wait_until(lambda: len(seen) == 2, what="a change announced")
            assert seen[1] == desired("w-01", 4)
            await feeder.delete("w-01")
            await wait_until(lambda: len(seen) == 3, what="delete seen")
            assert seen[2] is None
            assert feeder.count("nicfleet_desired_requests_answered_total") >= 1


async def test_an_older_update_after_a_newer_one_is_not_applied(own_nats: NatsServer) -> None:
    seen: list[DesiredConfig | None] = []
    watcher = DesiredConfigWatcher(
        node="w-01", url=own_nats.url, on_config=seen.append, settings=FAST
    )
    async with feeding(own_nats.url) as feeder, running(watcher):
        await wait_until(watcher.watching.is_set, what="answered")
        for revision, generation in ((10, 10), (5, 5), (10, 99), (11, 11)):
            update = DesiredUpdate(
                node="w-01", revision=revision, config=encode(desired("w-01", generation))
            )
            await feeder.nc.publish(subjects.desired_subject("w-01"), encode(update))
        await wait_until(lambda: len(seen) == 2, what="the newest update")
        assert [c.generation for c in seen if c is not None] == [10, 11]
        assert watcher.last_revision == 11


async def test_an_aggregator_restart_hands_on_no_spurious_none(own_nats: NatsServer) -> None:
    seen: list[DesiredConfig | None] = []
    settings = DesiredSettings(retry_initial=0.05, retry_max=0.2, rewatch_interval=0.05)
    watcher = DesiredConfigWatcher(
        node="w-01", url=own_nats.url, on_config=seen.append, settings=settings
    )
    async with running(watcher):
        async with feeding(own_nats.url) as feeder:
            await feeder.put(desired("w-01", 1))
            await wait_until(lambda: seen == [desired("w-01", 1)], what="first config")
        before = watcher.unanswered
        await wait_until(lambda: watcher.unanswered >= before + 3, what="asks while it is down")
        async with feeding(own_nats.url, fresh=False) as feeder:
            await wait_until(
                lambda: feeder.count("nicfleet_desired_requests_answered_total") >= 2,
                what="the new aggregator answering",
            )
            assert seen == [desired("w-01", 1)]  # the same entry again: not handed on twice
            await feeder.put(desired("w-01", 2))
            await wait_until(lambda: len(seen) == 2, what="update from the new aggregator")
        assert seen == [desired("w-01", 1), desired("w-01", 2)]


async def test_watcher_survives_a_server_restart(own_nats: NatsServer) -> None:
    seen: list[DesiredConfig | None] = []
    watcher = DesiredConfigWatcher(
        node="w-01", url=own_nats.url, on_config=seen.append, settings=FAST
    )
    async with feeding(own_nats.url) as feeder:
        async with running(watcher):
            await feeder.put(desired("w-01", 1))
            await wait_until(lambda: len(seen) == 1, what="first config")
        async with running(watcher):  # a second run of the same watcher, then a restart under it
            await wait_until(watcher.watching.is_set, what="answered")
            await asyncio.to_thread(own_nats.restart)
            await wait_until(lambda: feeder.nc.is_connected, what="aggregator reconnected")
            await feeder.put(desired("w-01", 2))
            await wait_until(
                lambda: seen[-1] == desired("w-01", 2), timeout=20, what="update after restart"
            )
        assert seen == [desired("w-01", 1), desired("w-01", 2)]


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dsc", dir="/tmp"))  # unix socket path limit
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_agent_prefers_desired_config_and_falls_back_to_its_file(
    own_nats: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    node = "dc-agent-01"
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("roce-cx6dx"), node), root)
    config_file = short_dir / "config.json"
    config_file.write_text(file_config(2))
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=node,
        sysfs_root=root,
        nats_url=own_nats.url,
        netlink=False,
        config_watch_interval=0.05,
        device_plugin_config=config_file,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins,
            plugins_registry_dir=short_dir / "no-registry",
            registration_mode="legacy",
            watch_interval=0.02,
            backoff=Backoff(initial=0.05, maximum=0.5),
        ),
        desired=FAST,
    )
    agent = AgentService(settings)
    async with KubeletEmulator(plugins) as kubelet, feeding(own_nats.url) as feeder, running(agent):
        plugin = await kubelet.plugin("rdma/roce", timeout=15)
        await plugin.wait_list(lambda r: len(r.devices) == 2, timeout=15)
        assert agent.config_source == "file"

        await feeder.put(desired(node, 7, hca_max=6))
        await plugin.wait_list(lambda r: len(r.devices) == 6, timeout=15)
        assert agent.config_source == "aggregator"
        assert agent.plugin is not None and agent.plugin.plugin_status().config_generation == 7

        # A file edit while the aggregator's config is in force is kept, not served.
        config_file.write_text(file_config(3))
        await feeder.delete(node)
        await plugin.wait_list(lambda r: len(r.devices) == 3, timeout=15)
        assert agent.config_source == "file"


async def test_agent_with_plugin_but_no_file_serves_only_desired_config(
    own_nats: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    node = "dc-agent-02"
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("roce-cx6dx"), node), root)
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=node,
        sysfs_root=root,
        nats_url=own_nats.url,
        netlink=False,
        device_plugin_enabled=True,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins,
            plugins_registry_dir=short_dir / "no-registry",
            registration_mode="legacy",
            watch_interval=0.02,
        ),
        desired=FAST,
    )
    agent = AgentService(settings)
    async with KubeletEmulator(plugins) as kubelet, running(agent):
        assert agent.plugin is not None and agent.plugin.status() == ()
        async with feeding(own_nats.url) as feeder:  # up after the agent started
            await feeder.put(desired(node, 1, hca_max=5))
            plugin = await kubelet.plugin("rdma/roce", timeout=15)
            await plugin.wait_list(lambda r: len(r.devices) == 5, timeout=15)
            await feeder.delete(node)
            await wait_until(lambda: agent.plugin is not None and agent.plugin.status() == (),
                             what="resources removed")  # fmt: skip
