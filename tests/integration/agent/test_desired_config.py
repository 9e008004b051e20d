"""The agent side of desired config on a real nats-server: the watcher waits for the
bucket, applies valid configs, refuses bad ones, survives a server restart; the agent
serves the aggregator's config over its file and falls back to the file on delete."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import nats
import pytest
from nats.js.kv import KeyValue

from agent.bus.desired import DesiredConfigWatcher, DesiredSettings
from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import encode
from proto.messages.config import DesiredConfig, DevicePluginConfig, ResourceConfig, Selectors
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


@asynccontextmanager
async def bucket(url: str) -> AsyncIterator[KeyValue]:
    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        with suppress(nats.js.errors.NotFoundError):
            await js.delete_key_value(subjects.KV_CONFIG)
        yield await js.create_key_value(bucket=subjects.KV_CONFIG, history=1)
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


async def test_watcher_waits_for_bucket_applies_refuses_and_deletes(own_nats: NatsServer) -> None:
    seen: list[DesiredConfig | None] = []
    watcher = DesiredConfigWatcher(
        node="w-01", url=own_nats.url, on_config=seen.append, settings=FAST
    )
    async with running(watcher), bucket(own_nats.url) as kv:
        await wait_until(watcher.watching.is_set, what="watch open once the bucket exists")
        await kv.put("w-01", encode(desired("w-01", 1)))
        await kv.put("w-02", encode(desired("w-02", 1)))  # another node's key
        await wait_until(lambda: len(seen) == 1, what="first config")
        assert seen[0] == desired("w-01", 1)

        await kv.put("w-01", b"\x93garbage")
        await kv.put("w-01", encode(desired("w-01", 2, hca_max=-1)))
        await kv.put("w-01", encode(desired("w-99", 3)))
        await wait_until(lambda: watcher.rejected == 3, what="three refusals")
        assert len(seen) == 1  # nothing bad was handed on

        await kv.delete("w-01")
        await wait_until(lambda: len(seen) == 2, what="delete seen")
        assert seen[1] is None


async def test_watcher_survives_a_server_restart(own_nats: NatsServer) -> None:
    seen: list[DesiredConfig | None] = []
    watcher = DesiredConfigWatcher(
        node="w-01", url=own_nats.url, on_config=seen.append, settings=FAST
    )
    async with bucket(own_nats.url) as kv, running(watcher):
        await kv.put("w-01", encode(desired("w-01", 1)))
        await wait_until(lambda: len(seen) == 1, what="first config")
    async with running(watcher):  # a second run of the same watcher, then a restart under it
        await wait_until(watcher.watching.is_set, what="watch open")
        await asyncio.to_thread(own_nats.restart)
        nc = await nats.connect(own_nats.url)
        try:
            kv = await nc.jetstream().key_value(subjects.KV_CONFIG)
            await kv.put("w-01", encode(desired("w-01", 2)))
            await wait_until(
                lambda: seen[-1] == desired("w-01", 2), timeout=20, what="update after restart"
            )
        finally:
            await nc.close()


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
    async with KubeletEmulator(plugins) as kubelet, bucket(own_nats.url) as kv, running(agent):
        plugin = await kubelet.plugin("rdma/roce", timeout=15)
        await plugin.wait_list(lambda r: len(r.devices) == 2, timeout=15)
        assert agent.config_source == "file"

        await kv.put(subjects.node_token(node), encode(desired(node, 7, hca_max=6)))
        await plugin.wait_list(lambda r: len(r.devices) == 6, timeout=15)
        assert agent.config_source == "aggregator"
        assert agent.plugin is not None and agent.plugin.plugin_status().config_generation == 7

        # A file edit while the aggregator's config is in force is kept, not served.
        config_file.write_text(file_config(3))
        await kv.delete(subjects.node_token(node))
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
        async with bucket(own_nats.url) as kv:  # created after the agent started
            await kv.put(subjects.node_token(node), encode(desired(node, 1, hca_max=5)))
            plugin = await kubelet.plugin("rdma/roce", timeout=15)
            await plugin.wait_list(lambda r: len(r.devices) == 5, timeout=15)
            await kv.delete(subjects.node_token(node))
            await wait_until(lambda: agent.plugin is not None and agent.plugin.status() == (),
                             what="resources removed")  # fmt: skip
