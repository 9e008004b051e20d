"""A real link going down in a network namespace becomes a port-down alert: veth in a netns
named like a RoCE netdev of a lab node → agent (netlink) → NATS → aggregator (fleet, rules,
alert lifecycle) → an alert on nicfleet.v1.alert.critical.port-down.<node>."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
import nats.aio.msg
import pytest

from agent.lab import faults
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto.codec import decode
from proto.messages.alerts import Alert
from tests.integration.agent.test_netlink import NETDEV, aip, requires_netns
from tests.integration.agent.test_netlink import netns as netns
from tests.integration.agent.test_pipeline import aggregator, lab_node

pytestmark = pytest.mark.integration

NODE = "netdev-alert-01"


def mirror_in_sysfs(root: Path, up: bool) -> None:
    """What the kernel shows in /sys/class/net for the netdev too: the agent re-reads its
    inventory after a link event, and that snapshot must not contradict netlink."""
    net = faults.tree_root(root) / "class" / "net" / NETDEV
    faults.write(root, net / "operstate", "up\n" if up else "down\n", True)
    faults.write(root, net / "carrier", "1\n" if up else "0\n", True)


@requires_netns
async def test_veth_down_in_a_netns_fires_and_resolves_port_down(
    netns: str,
    own_nats: NatsServer,
    tmp_path: Path,
) -> None:
    root = lab_node(tmp_path, "roce-cx6dx", NODE)
    alerts: asyncio.Queue[Alert] = asyncio.Queue()
    nc = await nats.connect(own_nats.url)

    async def on_alert(msg: nats.aio.msg.Msg) -> None:
        await alerts.put(decode(msg.data, Alert))

    await nc.subscribe(f"nicfleet.v1.alert.critical.port-down.{NODE}", cb=on_alert)

    async def next_alert(state: str) -> Alert:
        while True:
            alert = await alerts.get()
            if alert.state == state and alert.evidence.get("netdev") == NETDEV:
                return alert

    settings = AgentSettings(node_name=NODE, sysfs_root=root, nats_url=own_nats.url, netns=netns)
    service = AgentService(settings)
    stop = asyncio.Event()
    try:
        async with aggregator(own_nats.url), asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.netlink_watching.wait(), 20)
                mirror_in_sysfs(root, up=False)
                await aip(netns, "link", "set", NETDEV, "down")
                fired = await asyncio.wait_for(next_alert("firing"), 20)
                assert fired.subject == "mlx5_0/1"
                assert fired.evidence["netdev_operstate"] == "down"
                mirror_in_sysfs(root, up=True)
                await aip(netns, "link", "set", NETDEV, "up")
                resolved = await asyncio.wait_for(next_alert("resolved"), 20)
                assert resolved.fingerprint == fired.fingerprint
            finally:
                stop.set()
    finally:
        await nc.close()
