"""A desired config with one invalid entry (written by another version or by hand: the
aggregator's own writes are valid whole) reaches the agent over a real nats-server: the
watcher hands it on, the agent serves the valid entry to the kubelet emulator and reports
the invalid one in its status; a duplicate name is still refused whole."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.deviceplugin.advertised import DevicePluginSettings
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto.codec import encode
from proto.messages.config import DesiredConfig, DevicePluginConfig, ResourceConfig, Selectors
from tests.integration.agent.test_desired_config import FAST, feeding, running
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
NODE = "dc-split-01"
ETHER = Selectors(link_types=("ether",))


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="dcs", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def desired(generation: int, *resources: ResourceConfig) -> bytes:
    config = DevicePluginConfig(config_list=resources)
    return encode(DesiredConfig(node=NODE, generation=generation, device_plugin=config))


async def test_a_desired_config_is_served_resource_by_resource(
    own_nats: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("roce-cx6dx"), NODE), root)
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=NODE,
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
    good = ResourceConfig(resource_name="roce", rdma_hca_max=3, selectors=ETHER)
    bad = ResourceConfig(
        resource_name="roce_b", resource_prefix="kubernetes.io", rdma_hca_max=3, selectors=ETHER
    )
    agent = AgentService(settings)
    async with (
        KubeletEmulator(plugins) as kubelet,
        feeding(own_nats.url) as feeder,
        running(agent),
    ):
        await feeder.put_raw(NODE, desired(1, good, bad))
        plugin = await kubelet.plugin("rdma/roce", timeout=15)
        await plugin.wait_list(lambda r: len(r.devices) == 3, timeout=15)
        assert agent.plugin is not None
        rows = {r.name: r for r in agent.plugin.status()}
        assert rows["kubernetes.io/roce_b"].config_path == "configList[1].resourcePrefix"
        assert [r.resource_name for r in kubelet.registrations] == ["rdma/roce"]

        # What upstream exits on stays fatal: the last good config keeps serving.
        await feeder.put_raw(NODE, desired(2, good, good))
        await wait_until(lambda: _rejected(agent) >= 1, what="the duplicate refused")
        assert agent.plugin.plugin_status().config_generation == 1


def _rejected(agent: AgentService) -> int:
    watcher = agent.desired
    return watcher.rejected if watcher is not None else 0
