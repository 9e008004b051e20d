"""Netlink for real: a private network namespace with a veth pair, links flipped through
rtnetlink (`ip`), the agent's watcher reading the kernel's notifications and the
resulting LinkEvents arriving at a subscriber of a real nats-server.

Needs root and `ip netns`; skipped with the reason otherwise. Every namespace is unique
per test and deleted afterwards (which deletes its veths), also when the test fails.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import nats
import pytest
from nats.aio.msg import Msg

from agent.bus.publisher import Publisher
from agent.links.netdevs import (
    Netdevs,
    Observation,
    diff_netdevs,
    netdevs_from_dump,
    update_netdevs,
)
from agent.links.netlink import NETNS_RUN_DIR, NetlinkUnavailable, NetlinkWatcher
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import decode
from proto.inventory import NodeSnapshot
from proto.messages.events import LinkEvent
from proto.runtime.natsflush import flush_in_order
from tests.support.paths import REPO

pytestmark = pytest.mark.integration

NETDEV = "enp26s0f0np0"  # mlx5_0 port 1 of the roce-cx6dx lab node
PEER = "nfpeer0"
TIMEOUT = 10.0
T = TypeVar("T", LinkEvent, NodeSnapshot)


def _netns_unusable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"`ip netns` does not work here: {probe.stderr.strip()}"
    return None


_UNUSABLE = _netns_unusable()
requires_netns = pytest.mark.skipif(_UNUSABLE is not None, reason=_UNUSABLE or "")


def ip(netns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", netns, *args], check=True, capture_output=True, timeout=10)


async def aip(netns: str, *args: str) -> None:
    await asyncio.to_thread(ip, netns, *args)


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh namespace holding an up veth pair NETDEV <-> PEER."""
    name = f"nftest-{uuid.uuid4().hex[:10]}"
    subprocess.run(["ip", "netns", "add", name], check=True, capture_output=True, timeout=10)
    try:
        ip(name, "link", "add", NETDEV, "type", "veth", "peer", "name", PEER)
        ip(name, "link", "set", PEER, "up")
        ip(name, "link", "set", NETDEV, "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True, timeout=10)


@dataclass
class Inbox(Generic[T]):
    """Messages from NATS in arrival order, with a wait for the one a test expects."""

    kind: type[T]
    messages: list[T] = field(default_factory=list)
    arrived: asyncio.Condition = field(default_factory=asyncio.Condition)

    async def deliver(self, msg: Msg) -> None:
        async with self.arrived:
            self.messages.append(decode(msg.data, self.kind))
            self.arrived.notify_all()

    async def wait_for(self, match: Callable[[T], bool], what: str) -> T:
        async def first() -> T:
            async with self.arrived:
                while True:
                    for message in self.messages:
                        if match(message):
                            return message
                    await self.arrived.wait()

        try:
            return await asyncio.wait_for(first(), TIMEOUT)
        except TimeoutError:
            pytest.fail(f"no {what} within {TIMEOUT}s; received {self.messages}")


@asynccontextmanager
async def subscribed(url: str, node: str, kind: str, type_: type[T]) -> AsyncIterator[Inbox[T]]:
    inbox = Inbox(type_)
    nc = await nats.connect(url)
    try:
        await nc.subscribe(subjects.node_subject(node, kind), cb=inbox.deliver)
        await flush_in_order(nc)
        yield inbox
    finally:
        await nc.close()


def named(table: Netdevs, name: str) -> int:
    return next(index for index, netdev in table.items() if netdev.name == name)


@requires_netns
async def test_watcher_dump_and_changes_follow_the_kernel(netns: str) -> None:
    async with NetlinkWatcher(netns=netns) as watcher:
        table = netdevs_from_dump(await watcher.dump())
        assert {n.name for n in table.values()} == {"lo", NETDEV, PEER}
        veth = table[named(table, NETDEV)]
        assert (veth.operstate, veth.carrier, veth.mtu) == ("up", True, 1500)

        async def until(done: Callable[[Netdevs], bool]) -> Netdevs:
            nonlocal table
            while not done(table):
                for observation in await watcher.changes():
                    table = update_netdevs(table, observation)
            return table

        index = named(table, NETDEV)
        await aip(netns, "link", "set", NETDEV, "down")
        await asyncio.wait_for(until(lambda t: t[index].operstate == "down"), TIMEOUT)
        assert table[named(table, PEER)].name == PEER
        await aip(netns, "link", "set", NETDEV, "mtu", "9000")
        await asyncio.wait_for(until(lambda t: t[index].mtu == 9000), TIMEOUT)
        await aip(netns, "addr", "add", "192.0.2.11/24", "dev", NETDEV)
        await asyncio.wait_for(until(lambda t: "192.0.2.11/24" in t[index].ips), TIMEOUT)
        await aip(netns, "link", "del", NETDEV)  # takes its peer with it
        await asyncio.wait_for(until(lambda t: index not in t), TIMEOUT)


@requires_netns
async def test_link_changes_reach_a_nats_subscriber(netns: str, nats_server: NatsServer) -> None:
    node = "netlink-01"
    ports = {NETDEV: ("mlx5_0", 1)}  # what a snapshot of the lab node would map
    stop = asyncio.Event()
    publisher = Publisher(node=node, url=nats_server.url, on_reconnect=_nothing)
    assert await publisher.connect(stop)
    seq = 0

    async def follow(watcher: NetlinkWatcher, table: Netdevs) -> None:
        # The service's netlink loop in miniature: observations -> table -> events.
        nonlocal seq
        while True:
            batch: list[Observation] = list(await watcher.changes())
            new = table
            for observation in batch:
                new = update_netdevs(new, observation)
            changes = diff_netdevs(table, new, ports=ports, node=node, now=1.0, seq=seq)
            table = new
            for event in changes.events:
                seq = event.seq
                await publisher.publish(event)

    try:
        async with (
            subscribed(nats_server.url, node, subjects.EVENT, LinkEvent) as received,
            NetlinkWatcher(netns=netns) as watcher,
        ):
            table = netdevs_from_dump(await watcher.dump())
            async with asyncio.TaskGroup() as tasks:
                follower = tasks.create_task(follow(watcher, table))
                try:
                    await aip(netns, "link", "set", NETDEV, "down")
                    down = await received.wait_for(
                        lambda e: e.kind == "netdev-state", "netdev-state event"
                    )
                    await aip(netns, "link", "set", NETDEV, "mtu", "4200")
                    mtu = await received.wait_for(
                        lambda e: e.kind == "netdev-mtu", "netdev-mtu event"
                    )
                    await aip(netns, "link", "set", PEER, "down")  # not an RDMA netdev
                    await aip(netns, "link", "set", NETDEV, "up")
                    back = await received.wait_for(
                        lambda e: e.kind == "netdev-state" and e.seq > mtu.seq, "link back"
                    )
                finally:
                    follower.cancel()
    finally:
        await publisher.close()
    assert (down.device, down.port, down.netdev) == ("mlx5_0", 1, NETDEV)
    assert (down.old_state, down.new_state, down.node) == ("up", "down", node)
    assert (mtu.netdev, mtu.old_state, mtu.new_state) == (NETDEV, "1500", "4200")
    # Its peer is down, so the veth comes back without carrier.
    assert (back.old_state, back.new_state) == ("down", "lowerlayerdown")
    assert all(e.netdev == NETDEV for e in received.messages)
    assert [e.seq for e in received.messages] == list(range(1, len(received.messages) + 1))


async def _nothing() -> None:
    return None


@requires_netns
async def test_missing_netns_is_unavailable_and_not_created() -> None:
    name = f"nftest-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(NetlinkUnavailable, match="no network namespace"):
        async with NetlinkWatcher(netns=name):
            pass
    assert not (NETNS_RUN_DIR / name).exists()


@requires_netns
async def test_agent_publishes_netdev_events_for_its_rdma_ports(
    netns: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    # The lab node's sysfs tree names mlx5_0 port 1's netdev NETDEV; the veth of that
    # name in the namespace stands in for it. Imported here so that the tests above do
    # not depend on the sysfs readers.
    from agent.lab.render import render
    from agent.lab.spec import load_builtin, with_node_name
    from agent.service import AgentService, AgentSettings

    node = "netlink-agent-01"
    root = tmp_path / node
    render(with_node_name(load_builtin("roce-cx6dx"), node), root)
    settings = AgentSettings(node_name=node, sysfs_root=root, nats_url=nats_server.url, netns=netns)
    service = AgentService(settings)
    stop = asyncio.Event()
    async with (
        subscribed(nats_server.url, node, subjects.EVENT, LinkEvent) as events,
        subscribed(nats_server.url, node, subjects.SNAPSHOT, NodeSnapshot) as snapshots,
        asyncio.TaskGroup() as tasks,
    ):
        tasks.create_task(service.run(stop))
        try:
            await asyncio.wait_for(service.netlink_watching.wait(), TIMEOUT)
            first = await snapshots.wait_for(lambda s: True, "the first snapshot")
            await aip(netns, "link", "set", NETDEV, "down")
            down = await events.wait_for(lambda e: e.kind == "netdev-state", "netdev-state")
            await snapshots.wait_for(lambda s: s.seq > first.seq, "a snapshot after the event")
            await aip(netns, "link", "set", NETDEV, "mtu", "9000")
            mtu = await events.wait_for(lambda e: e.kind == "netdev-mtu", "netdev-mtu")
            await aip(netns, "link", "set", PEER, "mtu", "9000")  # not an RDMA netdev
            await aip(netns, "link", "set", NETDEV, "up")
            up = await events.wait_for(
                lambda e: e.kind == "netdev-state" and e.new_state == "up", "link up"
            )
        finally:
            stop.set()
    assert (down.device, down.port, down.netdev) == ("mlx5_0", 1, NETDEV)
    assert (down.old_state, down.new_state) == ("up", "down")
    assert (mtu.device, mtu.old_state, mtu.new_state) == ("mlx5_0", "1500", "9000")
    assert up.old_state in ("down", "lowerlayerdown")
    assert {e.netdev for e in events.messages} == {NETDEV}


@requires_netns
async def test_agent_command_watches_a_netns_until_sigterm(
    netns: str, nats_server: NatsServer, tmp_path: Path
) -> None:
    # The console script installs SIGTERM/SIGINT handlers; opening the namespace must
    # not stop it (a helper process forked by pyroute2 once relayed its own SIGTERM to
    # the agent's event loop).
    from agent.lab.render import render
    from agent.lab.spec import load_builtin, with_node_name

    node = "netlink-cli-01"
    root = tmp_path / node
    render(with_node_name(load_builtin("roce-cx6dx"), node), root)
    args = ["-m", "agent", "run", "--nats-url", nats_server.url, "--sysfs-root", str(root),
            "--node-name", node, "--netns", netns]  # fmt: skip
    log: list[str] = []
    agent = await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=REPO, stderr=asyncio.subprocess.PIPE
    )
    assert agent.stderr is not None
    try:

        async def until_logged(text: str) -> None:
            assert agent.stderr is not None
            while not any(text in line for line in log):
                line = await agent.stderr.readline()
                if not line:
                    pytest.fail(f"agent exited before logging {text!r}: {log}")
                log.append(line.decode())

        async with subscribed(nats_server.url, node, subjects.EVENT, LinkEvent) as events:
            await asyncio.wait_for(until_logged("via netlink"), TIMEOUT)
            await aip(netns, "link", "set", NETDEV, "mtu", "9000")
            mtu = await events.wait_for(lambda e: e.kind == "netdev-mtu", "netdev-mtu")
            assert (mtu.device, mtu.port, mtu.new_state) == ("mlx5_0", 1, "9000")
            assert agent.returncode is None, log
            agent.send_signal(signal.SIGTERM)
            _, rest = await asyncio.wait_for(agent.communicate(), TIMEOUT)
            log.append(rest.decode())
    finally:
        if agent.returncode is None:
            agent.kill()
            await agent.wait()
    assert agent.returncode == 0, log
    assert "Traceback" not in "".join(log)


@requires_netns
async def test_overrun_socket_is_reported_as_unavailable(netns: str) -> None:
    # The kernel drops notifications a full socket buffer cannot take and says so
    # (ENOBUFS) on the next read; the service then re-opens and compares a new dump.
    async with NetlinkWatcher(netns=netns, rcvbuf=4096) as watcher:
        await watcher.dump()
        # Blocks the event loop on purpose: nothing reads while the kernel notifies.
        batch = "".join(f"link set {NETDEV} mtu {1280 + i}\n" for i in range(200))
        subprocess.run(  # noqa: ASYNC221
            ["ip", "-n", netns, "-batch", "-"], input=batch.encode(), check=True, timeout=30
        )
        with pytest.raises(NetlinkUnavailable, match="rtnetlink socket failed"):
            await asyncio.wait_for(drain(watcher), TIMEOUT)


async def drain(watcher: NetlinkWatcher) -> None:
    while True:
        await watcher.changes()
