"""Fault of the agent process: `nicfleet-agent run` SIGKILLed mid-stream, a port goes down
while it is dead, then it is started again.

Real nats-server, the aggregator in-process, the kubelet emulator (real gRPC on unix
sockets). The restarted agent must re-register its device plugin over the stale socket,
advertise the port's new health, and bring the fleet view back to what its tree says.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from agent.deviceplugin.sockets import socket_id
from agent.lab.faults import port_down
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService
from proto.deviceplugin import api_pb2
from tests.integration.agent.test_pipeline import lab_node
from tests.integration.alerts.test_alerts import aggregator
from tests.support.faults import (
    AgentProcess,
    add_alert_recorder,
    comparable,
    duplicates,
    read_tree,
    recorded_alerts,
    transitions,
)
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NODE = "agent-kill-01"
RESOURCE = "rdma/ib_gpu0"
# mlx5_0 is the only IB NIC behind GPU0's switch on the 12-NIC node.
CONFIG = {
    "periodicUpdateInterval": 300,
    "configList": [
        {"resourceName": "ib_gpu0", "rdmaHcaMax": 8, "selectors": {"rdmaDevices": ["mlx5_0"]}}
    ],
}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="fka", dir="/tmp"))  # unix socket path limit
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def health(response: api_pb2.ListAndWatchResponse) -> set[str]:
    return {d.health for d in response.devices}


def fleet_matches_tree(agg: AggregatorService, root: Path) -> bool:
    record = agg.fleet.get(NODE)
    if record is None or record.snapshot is None:
        return False
    return comparable(record.snapshot) == read_tree(root, NODE)


def counter_seq(agg: AggregatorService) -> int:
    record = agg.fleet.get(NODE)
    return record.counters.seq if record is not None and record.counters is not None else 0


async def test_agent_sigkill_restart_reregisters_and_catches_up(
    own_nats: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    root = lab_node(tmp_path, "h100-ib-12nic", NODE)
    config = short_dir / "config.json"
    config.write_text(json.dumps(CONFIG))
    plugins = short_dir / "device-plugins"
    proc = AgentProcess(own_nats.url, root, NODE, work=tmp_path, plugin_dir=plugins, config=config)
    nc = await nats.connect(own_nats.url)
    try:
        await add_alert_recorder(nc)
        async with KubeletEmulator(plugins) as kubelet, aggregator(own_nats.url) as agg:
            proc.start()
            first = await kubelet.plugin(RESOURCE, timeout=30)
            listed = await first.wait_list(lambda r: len(r.devices) == 8, timeout=15)
            assert health(listed) == {"Healthy"}
            assert len(kubelet.registrations) == 1
            await wait_until(lambda: fleet_matches_tree(agg, root), timeout=20, what="fleet")
            seq = counter_seq(agg)
            await wait_until(lambda: counter_seq(agg) > seq + 2, what="counters streaming")
            endpoint = first.endpoint
            before = socket_id(endpoint)

            await asyncio.to_thread(proc.kill)  # mid-stream: counters every 0.2 s
            await asyncio.wait_for(first.stream_ended.wait(), timeout=10)
            assert socket_id(endpoint) == before  # the dead process's socket is left behind
            port_down(root, "mlx5_0", 1)

            proc.start()
            second = await kubelet.reconnected(RESOURCE, first, timeout=30)
            relisted = await second.wait_list(
                lambda r: len(r.devices) == 8 and health(r) == {"Unhealthy"}, timeout=15
            )
            assert len(relisted.devices) == 8
            assert len(kubelet.registrations) == 2
            assert [r.resource_name for r in kubelet.registrations] == [RESOURCE, RESOURCE]
            assert second.endpoint == endpoint
            assert socket_id(endpoint) not in (None, before)  # replaced, and it serves

            await wait_until(lambda: fleet_matches_tree(agg, root), timeout=20, what="fleet after")
            record = agg.fleet.get(NODE)
            assert record is not None and record.snapshot is not None
            # Field by field, so a mismatch shows which field differs.
            assert comparable(record.snapshot) == read_tree(root, NODE)
            assert record.snapshot.devices[0].ports[0].state == "DOWN"

            async def fired() -> bool:
                alerts = await recorded_alerts(nc)
                return transitions(alerts, NODE, "mlx5_0/1") == ["firing"]

            await wait_until(fired, timeout=20, what="port-down firing after the restart")
            seq = counter_seq(agg)
            await wait_until(lambda: counter_seq(agg) > seq + 2, what="counters again")
            await nc.flush()
            alerts = await recorded_alerts(nc)
            assert transitions(alerts, NODE, "mlx5_0/1") == ["firing"]
            assert duplicates(alerts) == {}
            assert agg.readiness()[0]
    finally:
        await asyncio.to_thread(proc.stop)
        await nc.close()
