"""The whole agent with its device plugin on: lab tree → AgentService → kubelet emulator
(real gRPC over unix sockets) and → NATS status messages. Health follows a port fault in
the tree; an edit of the config file is applied live, without a restart."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import nats.aio.msg
import pytest

from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.faults import port_down, port_up
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import decode
from proto.deviceplugin import api_pb2
from proto.messages.status import DevicePluginStatus
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE = "dp-agent-01"
# mlx5_0 is the only IB NIC behind GPU0's switch on the 12-NIC node.
CONFIG = {
    "periodicUpdateInterval": 300,
    "configList": [
        {"resourceName": "ib_gpu0", "rdmaHcaMax": 8, "selectors": {"rdmaDevices": ["mlx5_0"]}}
    ],
}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dpa", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@asynccontextmanager
async def running_agent(settings: AgentSettings) -> AsyncIterator[AgentService]:
    service = AgentService(settings)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            yield service
        finally:
            stop.set()


def health(response: api_pb2.ListAndWatchResponse) -> set[str]:
    return {d.health for d in response.devices}


async def test_agent_serves_the_kubelet_follows_faults_and_config_edits(
    nats_server: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("h100-ib-12nic"), NODE), root)
    config_file = short_dir / "config.json"
    config_file.write_text(json.dumps(CONFIG))
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=NODE,
        sysfs_root=root,
        nats_url=nats_server.url,
        netlink=False,
        state_poll_interval=0.05,
        config_watch_interval=0.05,
        device_plugin_config=config_file,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins,
            plugins_registry_dir=short_dir / "no-registry",
            registration_mode="legacy",
            watch_interval=0.02,
            call_timeout=1.0,
            backoff=Backoff(initial=0.05, maximum=0.5),
        ),
    )
    statuses: asyncio.Queue[DevicePluginStatus] = asyncio.Queue()
    nc = await nats.connect(nats_server.url)

    async def on_status(msg: nats.aio.msg.Msg) -> None:
        await statuses.put(decode(msg.data, DevicePluginStatus))

    await nc.subscribe(subjects.node_subject(NODE, subjects.STATUS), cb=on_status)
    try:
        async with KubeletEmulator(plugins) as kubelet, running_agent(settings):
            plugin = await kubelet.plugin("rdma/ib_gpu0", timeout=15)
            first = await plugin.wait_list(lambda r: len(r.devices) == 8, timeout=15)
            assert health(first) == {"Healthy"}
            assert {n.ID for d in first.devices for n in d.topology.nodes} == {0}

            port_down(root, "mlx5_0", 1)
            await plugin.wait_list(lambda r: health(r) == {"Unhealthy"}, timeout=10)
            port_up(root, "mlx5_0", 1)
            await plugin.wait_list(lambda r: health(r) == {"Healthy"}, timeout=10)

            response = await plugin.allocate(["0"])
            paths = {d.host_path for d in response.container_responses[0].devices}
            assert "/dev/infiniband/uverbs0" in paths
            assert response.container_responses[0].envs["NICFLEET_RDMA_DEVICES"] == "mlx5_0"

            # A live edit: the resource grows to 16 slots without an agent restart.
            edited = json.loads(json.dumps(CONFIG))
            edited["configList"][0]["rdmaHcaMax"] = 16
            config_file.write_text(json.dumps(edited))
            await plugin.wait_list(lambda r: len(r.devices) == 16, timeout=10)

            async def status_shows(advertised: int) -> DevicePluginStatus:
                while True:
                    status = await statuses.get()
                    if any(r.advertised == advertised for r in status.resources):
                        return status

            status = await asyncio.wait_for(status_shows(16), timeout=10)
            assert status.node == NODE
            assert status.config_generation >= 2
            assert [r.name for r in status.resources] == ["rdma/ib_gpu0"]
    finally:
        await nc.close()


async def test_a_broken_config_edit_keeps_the_last_good_one_serving(
    nats_server: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), root)
    config_file = short_dir / "config.json"
    good = {
        "configList": [
            {"resourceName": "roce", "rdmaHcaMax": 4, "selectors": {"linkTypes": ["ether"]}}
        ]
    }
    config_file.write_text(json.dumps(good))
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=NODE,
        sysfs_root=root,
        nats_url=nats_server.url,
        netlink=False,
        config_watch_interval=0.05,
        device_plugin_config=config_file,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins,
            plugins_registry_dir=short_dir / "no-registry",
            registration_mode="legacy",
            watch_interval=0.02,
        ),
    )
    async with KubeletEmulator(plugins) as kubelet, running_agent(settings) as agent:
        plugin = await kubelet.plugin("rdma/roce", timeout=15)
        await plugin.wait_list(lambda r: len(r.devices) == 4, timeout=15)
        config_file.write_text('{"configList": [{"resourceName": "roce", "rdmaHcaMax": -1}]}')
        await wait_until(lambda: agent.config_errors >= 1, what="the broken edit to be read")
        # Still serving the good config: Allocate works, nothing was deregistered.
        response = await plugin.allocate(["1"])
        assert response.container_responses[0].devices
        assert agent.plugin is not None
        assert [r.advertised for r in agent.plugin.status()] == [4]
