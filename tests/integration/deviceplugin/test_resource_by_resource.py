"""Resource by resource, end to end on real parts: a config file with two valid entries and
one the kubelet would refuse (a reserved prefix) → the agent serves the two over real gRPC
to the kubelet emulator, its DevicePluginStatus lists the third with the field at fault, and
the aggregator (in process, on a real nats-server) raises resource-config-invalid; a live
edit that fixes the entry serves all three and the finding resolves."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService
from tests.integration.agent.test_pipeline import aggregator
from tests.integration.deviceplugin.test_agent_deviceplugin import running_agent
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE = "dp-split-01"
BAD_NAME = "nvidia.kubernetes.io/ib_c"
FIXED_NAME = "nvidia.com/ib_c"


def config(prefix: str) -> dict[str, object]:
    def entry(name: str, device: str, **extra: str) -> dict[str, object]:
        return {"resourceName": name, "rdmaHcaMax": 4, "selectors": {"rdmaDevices": [device]},
                **extra}  # fmt: skip

    return {
        "configList": [
            entry("ib_a", "mlx5_0"),
            entry("ib_c", "mlx5_4", resourcePrefix=prefix),
            entry("ib_b", "mlx5_3"),
        ]
    }


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # unix socket paths are limited to 107 bytes; pytest's tmp_path can be longer.
    root = Path(tempfile.mkdtemp(prefix="dps", dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def findings(
    agg: AggregatorService, rule: str = "resource-config-invalid"
) -> set[tuple[str | None, str, str]]:
    engine = agg.alerts
    assert engine is not None
    return {
        (f.node, f.subject, str(f.evidence.get("field"))) for f in engine.findings if f.rule == rule
    }


async def test_the_valid_resources_are_served_and_the_invalid_one_reported(
    nats_server: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("h100-ib-12nic"), NODE), root)
    config_file = short_dir / "config.json"
    config_file.write_text(json.dumps(config("nvidia.kubernetes.io")))
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=NODE,
        sysfs_root=root,
        nats_url=nats_server.url,
        netlink=False,
        config_watch_interval=0.05,
        device_plugin_config=config_file,
        desired_config=False,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins,
            plugins_registry_dir=short_dir / "no-registry",
            registration_mode="legacy",
            watch_interval=0.02,
            call_timeout=1.0,
            backoff=Backoff(initial=0.05, maximum=0.5),
        ),
    )
    async with (
        aggregator(nats_server.url) as agg,
        KubeletEmulator(plugins) as kubelet,
        running_agent(settings) as agent,
    ):
        for name in ("rdma/ib_a", "rdma/ib_b"):
            plugin = await kubelet.plugin(name, timeout=15)
            await plugin.wait_list(lambda r: len(r.devices) == 4, timeout=15)
            response = await plugin.allocate(["0"])
            assert response.container_responses[0].devices
        assert {r.resource_name for r in kubelet.registrations} == {"rdma/ib_a", "rdma/ib_b"}

        assert agent.plugin is not None
        rows = {r.name: r for r in agent.plugin.status()}
        assert rows[BAD_NAME].registration == "config-invalid"
        assert rows[BAD_NAME].config_path == "configList[1].resourcePrefix"
        assert "reserved for Kubernetes" in (rows[BAD_NAME].config_error or "")
        assert agent.config_errors == 0  # served, not refused

        # The aggregator stores the status and raises the finding naming node, resource, field.
        await wait_until(
            lambda: findings(agg) == {(NODE, BAD_NAME, "configList[1].resourcePrefix")},
            timeout=15,
            what="resource-config-invalid for the reserved prefix",
        )
        assert not any(subject == BAD_NAME for _, subject, _ in findings(agg, "resource-zero"))
        async with httpx.AsyncClient(base_url=agg.api_url or "") as http:
            body = (await http.get("/api/v1/resources", params={"node": NODE})).json()
        rows_api = {item["name"]: item["nodes"][0] for item in body["items"]}
        assert rows_api[BAD_NAME]["registration"] == "config-invalid"

        # A live edit fixes the prefix: three served, the finding resolves.
        config_file.write_text(json.dumps(config("nvidia.com")))
        fixed = await kubelet.plugin(FIXED_NAME, timeout=15)
        await fixed.wait_list(lambda r: len(r.devices) == 4, timeout=15)
        assert set(kubelet.plugins) == {"rdma/ib_a", "rdma/ib_b", FIXED_NAME}
        await wait_until(lambda: findings(agg) == set(), timeout=15, what="the finding resolved")
        assert all(r.config_error is None for r in agent.plugin.status())
