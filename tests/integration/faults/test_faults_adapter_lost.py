"""Fault: an RDMA device goes away under a running agent (`nicfleet-agent lab fault
device-remove`: the ib_device unregistered, its PCI function left on the bus), then comes
back (`device-add`).

Real nats-server, the aggregator in-process with every rule, the agent in-process with its
device plugin serving the kubelet emulator (real gRPC on unix sockets). The loss must be a
critical `adapter-lost` finding naming the adapter (and the resource whose capacity fell),
the trace must say degraded, and both must clear when the device returns.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.cli import lab
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService
from tests.integration.agent.test_pipeline import lab_node
from tests.integration.alerts.test_alerts import aggregator
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "lost-ib-01"
RESOURCE = "rdma/ib"
# Every ConnectX-6 of the 4-NIC node behind 8 shared device IDs: a lost adapter leaves the
# count at 8 (shared IDs stay while any adapter serves them) — the adapters behind it drop.
CONFIG = {
    "periodicUpdateInterval": 300,
    "configList": [{"resourceName": "ib", "rdmaHcaMax": 8, "selectors": {"vendors": ["15b3"]}}],
}
GONE, GONE_PCI = "mlx5_1", "0000:4a:00.0"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="fal", dir="/tmp"))  # unix socket path limit
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


def lab_fault(*args: str) -> dict[str, Any]:
    """`nicfleet-agent lab fault ...` as an operator runs it; its JSON record."""
    result = CliRunner().invoke(lab, ["fault", *args])
    assert result.exit_code == 0, result.output
    record: dict[str, Any] = json.loads(result.stdout)
    return record


def serving(agg: AggregatorService) -> tuple[int, int] | None:
    """rdma/ib's advertised count and the adapters behind it, as the agent reported."""
    record = agg.fleet.get(NODE)
    status = record.device_plugin if record is not None else None
    served = {r.name: r for r in status.resources} if status is not None else {}
    r = served.get(RESOURCE)
    return None if r is None else (r.advertised, len(r.devices))


async def lost_findings(http: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    answer = await http.get("/api/v1/findings", params={"rule": "adapter-lost"})
    assert answer.status_code == 200, answer.text
    return {f["subject"]: f for f in answer.json()["items"] if f["node"] == NODE}


async def test_device_remove_is_a_critical_finding_and_a_degraded_trace_until_it_returns(
    nats_server: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    root = lab_node(tmp_path, "a100-ib-4nic", NODE)
    config_file = short_dir / "config.json"
    config_file.write_text(json.dumps(CONFIG))
    plugins = short_dir / "device-plugins"
    settings = AgentSettings(
        node_name=NODE, sysfs_root=root, nats_url=nats_server.url, netlink=False,
        state_poll_interval=0.05, config_watch_interval=0.05, counter_interval=0.5,
        device_plugin_config=config_file,
        device_plugin=DevicePluginSettings(
            device_plugin_dir=plugins, plugins_registry_dir=short_dir / "no-registry",
            registration_mode="legacy", watch_interval=0.02, call_timeout=1.0,
            backoff=Backoff(initial=0.05, maximum=0.5),
        ),
    )  # fmt: skip
    async with (
        aggregator(nats_server.url) as agg,
        KubeletEmulator(plugins),
        running_agent(settings),
        httpx.AsyncClient(base_url=agg.api_url or "") as http,
    ):
        await wait_until(lambda: serving(agg) == (8, 4), timeout=30, what="rdma/ib served")
        assert await lost_findings(http) == {}

        removed = lab_fault("device-remove", "--root", str(root), "--device", GONE)
        assert removed["fault"] == "device-remove"
        await wait_until(lambda: serving(agg) == (8, 3), timeout=30, what="3 adapters left")

        async def both_found() -> bool:
            return set(await lost_findings(http)) == {GONE, RESOURCE}

        await wait_until(
            both_found, timeout=30, interval=0.1, what="adapter-lost for the device and rdma/ib"
        )
        found = await lost_findings(http)
        device = found[GONE]
        assert device["severity"] == "critical"
        assert (device["evidence"]["pci_address"], device["evidence"]["pci_function"]) == (
            GONE_PCI, "present",  # device-remove leaves the function: the driver let go
        )  # fmt: skip
        assert f"RDMA device {GONE} ({GONE_PCI}" in device["message"]
        capacity = found[RESOURCE]["evidence"]
        assert (capacity["adapters_serving"], capacity["most_adapters"]) == (3, 4)
        assert (capacity["adapters"], capacity["gone_from_inventory"]) == (GONE, GONE)

        trace = (
            await http.get("/api/v1/trace", params={"node": NODE, "resource": RESOURCE})
        ).json()
        assert trace["verdict"] == "degraded", trace["verdict_reason"]
        assert trace["verdict_reason"].startswith(f"capacity reduced on {GONE} (advertised")

        added = lab_fault("device-add", "--root", str(root), "--device", GONE)
        assert added["fault"] == "device-add"
        await wait_until(lambda: serving(agg) == (8, 4), timeout=30, what="4 adapters again")

        async def cleared() -> bool:
            return await lost_findings(http) == {}

        await wait_until(cleared, timeout=30, interval=0.1, what="adapter-lost resolved")
        trace = (
            await http.get("/api/v1/trace", params={"node": NODE, "resource": RESOURCE})
        ).json()
        assert trace["verdict"] != "degraded", trace["verdict_reason"]
