"""SnapshotWriter against a real nats-server: a burst of snapshots (written many in
flight) ends up in KV once per node, newest wins; writes that JetStream refuses keep their
nodes pending and are all written once space returns. No timing is asserted."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator

import nats
import pytest
from nats.js.kv import KeyValue

from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import WRITES_IN_FLIGHT, SnapshotWriter, load_nodes, open_bucket
from aggregator.metrics import Metrics
from tests.support.builders import snapshot

pytestmark = pytest.mark.integration

_names = itertools.count()


@pytest.fixture
async def bucket(nats_server: NatsServer) -> AsyncIterator[tuple[KeyValue, str]]:
    nc = await nats.connect(nats_server.url)
    name = f"store-writer-{next(_names)}"
    try:
        yield await open_bucket(nc.jetstream(), name), name
        await nc.jetstream().delete_key_value(name)
    finally:
        await nc.close()


def writes(metrics: Metrics, sample: str) -> float:
    value = metrics.registry.get_sample_value(sample, {"bucket": "nicfleet-nodes"})
    return value or 0.0


async def test_a_burst_is_written_once_per_node_newest_wins(
    bucket: tuple[KeyValue, str],
) -> None:
    kv, _ = bucket
    metrics = Metrics.create()
    writer = SnapshotWriter(kv, metrics)
    nodes = [f"gpu-{i:03d}" for i in range(3 * WRITES_IN_FLIGHT + 5)]
    for node in nodes:
        writer.submit(snapshot(node, seq=1), 1.0)
    writer.submit(snapshot(nodes[7], seq=2), 2.0)  # coalesced: only seq 2 is written
    await writer.flush()
    assert writer.pending == 0 and writer.healthy
    stored = {s.snapshot.node: s async for s in load_nodes(kv)}
    assert sorted(stored) == nodes
    assert (stored[nodes[7]].snapshot.seq, stored[nodes[7]].received_at) == (2, 2.0)
    assert writes(metrics, "nicfleet_kv_writes_total") == len(nodes)


async def test_refused_writes_stay_pending_until_space_returns(
    bucket: tuple[KeyValue, str], nats_server: NatsServer
) -> None:
    kv, name = bucket
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        stream = f"KV_{name}"
        config = (await js.stream_info(stream)).config
        await js.update_stream(dataclasses.replace(config, max_bytes=4096))
        metrics = Metrics.create()
        writer = SnapshotWriter(kv, metrics)
        nodes = [f"gpu-{i:03d}" for i in range(WRITES_IN_FLIGHT + 8)]
        for node in nodes:
            writer.submit(snapshot(node), 1.0)
        await writer.flush()
        assert not writer.healthy and writer.last_error is not None
        assert writer.pending > 0
        assert writes(metrics, "nicfleet_kv_write_errors_total") >= writer.pending
        await js.update_stream(dataclasses.replace(config, max_bytes=-1))
        await writer.flush()
        assert writer.pending == 0 and writer.healthy
        assert sorted([s.snapshot.node async for s in load_nodes(kv)]) == nodes
    finally:
        await nc.close()
