"""Faults around NATS: the server SIGKILLed mid-stream, and a slow alert subscriber.

Real nats-server, real agents on lab trees, the aggregator in-process. After recovery the
fleet view must equal what each agent reads from its tree, and every alert transition is
on the wire exactly once (counted in a file-backed stream that survives the kill).
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import socket
import struct
import termios
from pathlib import Path

import nats
import pytest

from agent.lab.faults import port_down, port_up
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService
from proto import subjects
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.integration.alerts.test_alerts import aggregator
from tests.support.faults import (
    ALERTS,
    add_alert_recorder,
    comparable,
    duplicates,
    read_tree,
    recorded_alerts,
    transitions,
)
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def fleet_matches_trees(agg: AggregatorService, trees: dict[str, Path]) -> bool:
    for node, root in trees.items():
        record = agg.fleet.get(node)
        if record is None or record.snapshot is None:
            return False
        if comparable(record.snapshot) != read_tree(root, node):
            return False
    return True


async def test_nats_killed_mid_stream_fleet_and_alerts_recover(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    trees = {
        "kill-ib-01": lab_node(tmp_path, "h100-ib-12nic", "kill-ib-01"),
        "kill-roce-01": lab_node(tmp_path, "roce-cx6dx", "kill-roce-01"),
    }
    ib, roce = trees["kill-ib-01"], trees["kill-roce-01"]
    nc = await nats.connect(own_nats.url, reconnect_time_wait=0.05, max_reconnect_attempts=-1)
    try:
        await add_alert_recorder(nc)
        async with (
            aggregator(own_nats.url) as agg,
            agent(own_nats.url, ib, "kill-ib-01"),
            agent(own_nats.url, roce, "kill-roce-01"),
        ):
            await wait_until(lambda: fleet_matches_trees(agg, trees), what="fleet = trees")
            port_down(ib, "mlx5_0", 1)  # fires before the kill, resolved after it

            async def fired() -> bool:
                alerts = await recorded_alerts(nc)
                return transitions(alerts, "kill-ib-01", "mlx5_0/1") == ["firing"]

            await wait_until(fired, what="port-down firing before the kill")
            await asyncio.to_thread(own_nats.stop, kill=True)
            port_down(roce, "mlx5_1", 1)  # happens while NATS is down
            await asyncio.to_thread(own_nats.start)
            await wait_until(
                lambda: fleet_matches_trees(agg, trees), timeout=30, what="fleet = trees after"
            )
            port_up(ib, "mlx5_0", 1)

            async def settled() -> bool:
                alerts = await recorded_alerts(nc)
                return transitions(alerts, "kill-ib-01", "mlx5_0/1") == [
                    "firing",
                    "resolved",
                ] and transitions(alerts, "kill-roce-01", "mlx5_1/1") == ["firing"]

            await wait_until(settled, timeout=30, what="alert transitions after recovery")
            await wait_until(lambda: fleet_matches_trees(agg, trees), what="fleet = trees, end")
            # Field by field, so a mismatch shows which field differs.
            for node, root in trees.items():
                record = agg.fleet.get(node)
                assert record is not None and record.snapshot is not None
                assert comparable(record.snapshot) == read_tree(root, node)
            await wait_until(lambda: agg.readiness()[0], timeout=20, what="ready again")
            alerts = await recorded_alerts(nc)
            assert duplicates(alerts) == {}
            assert transitions(alerts, "kill-ib-01", "mlx5_0/1") == ["firing", "resolved"]
            assert transitions(alerts, "kill-roce-01", "mlx5_1/1") == ["firing"]
    finally:
        await nc.close()


def stalled_subscriber(port: int) -> socket.socket:
    """A raw NATS client that subscribes to every alert and never reads again."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.recv(4096)  # INFO
    sock.sendall(f'CONNECT {{"verbose":false}}\r\nSUB {ALERTS} 1\r\nPING\r\n'.encode())
    sock.recv(4096)  # PONG: subscribed; from here on nothing is read
    return sock


def advanced(agg: AggregatorService, node: str, start: int) -> bool:
    return counter_seq(agg, node) > start + 2


def unread(sock: socket.socket) -> int:
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]


def counter_seq(agg: AggregatorService, node: str) -> int:
    record = agg.fleet.get(node)
    return record.counters.seq if record is not None and record.counters is not None else 0


async def test_stalled_alert_subscriber_does_not_stall_ingest(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "slow-sub-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    assert own_nats.port is not None
    stalled = await asyncio.to_thread(stalled_subscriber, own_nats.port)
    nc = await nats.connect(own_nats.url)
    try:
        noise = b"x" * 60_000
        for _ in range(200):  # ~12 MB of alert-subject traffic the stalled reader never reads
            await nc.publish("nicfleet.v1.alert.info.noise._fleet", noise)
        await nc.flush()
        # The stalled reader's socket is full: the server holds the rest for it.
        await wait_until(lambda: unread(stalled) > 2048, what="backlog at the stalled reader")
        healthy = await nc.subscribe(f"nicfleet.v1.alert.critical.port-down.{node}")
        async with aggregator(own_nats.url) as agg, agent(own_nats.url, root, node):
            await wait_until(lambda: counter_seq(agg, node) > 0, what="first counters")
            port_down(root, "mlx5_0", 1)
            msg = await healthy.next_msg(timeout=15)
            assert msg.subject == f"nicfleet.v1.alert.critical.port-down.{node}"
            for _ in range(3):  # the stalled reader keeps getting more; ingest goes on
                start = counter_seq(agg, node)
                for _ in range(20):
                    await nc.publish("nicfleet.v1.alert.info.noise._fleet", noise)
                await wait_until(functools.partial(advanced, agg, node, start), what="counters")
            assert agg.readiness()[0]
            kv = await nc.jetstream().key_value(subjects.KV_NODES)
            assert (await kv.get(subjects.node_token(node))).value
    finally:
        await nc.close()
        stalled.close()
