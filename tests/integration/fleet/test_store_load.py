"""`load_nodes` against a real nats-server: one pass over the bucket returns every node's
latest entry; an undecodable entry is skipped (logged) and the rest still load; deleted
keys and an empty bucket give nothing; a caller that stops early leaves the bucket usable."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import nats
import pytest
from nats.js.kv import KeyValue

from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import StoredNode, load_nodes, open_bucket
from proto import subjects
from proto.codec import encode
from tests.support.builders import snapshot

pytestmark = pytest.mark.integration

_names = itertools.count()


@pytest.fixture
async def kv(nats_server: NatsServer) -> AsyncIterator[KeyValue]:
    nc = await nats.connect(nats_server.url)
    name = f"store-load-{next(_names)}"
    try:
        yield await open_bucket(nc.jetstream(), name)
        await nc.jetstream().delete_key_value(name)
    finally:
        await nc.close()


async def put(kv: KeyValue, node: str, seq: int) -> None:
    stored = StoredNode(snapshot=snapshot(node, seq=seq), received_at=float(seq))
    await kv.put(subjects.node_token(node), encode(stored))


async def test_every_node_loads_once_with_its_latest_entry(kv: KeyValue) -> None:
    nodes = [f"gpu-{i:03d}" for i in range(40)]
    for node in nodes:
        await put(kv, node, 1)
    await put(kv, nodes[3], 2)
    loaded = [s async for s in load_nodes(kv)]
    assert sorted(s.snapshot.node for s in loaded) == nodes
    assert {s.snapshot.node: s.snapshot.seq for s in loaded}[nodes[3]] == 2


async def test_undecodable_entry_is_skipped_and_the_rest_load(
    kv: KeyValue, caplog: pytest.LogCaptureFixture
) -> None:
    await put(kv, "gpu-a", 1)
    await kv.put("gpu-bad", b"\xc1 not msgpack")
    await kv.put("gpu-wrong", encode(snapshot("gpu-wrong")))  # a snapshot, not a StoredNode
    await put(kv, "gpu-b", 1)
    with caplog.at_level(logging.WARNING, logger="aggregator.fleet.store"):
        loaded = sorted([s.snapshot.node async for s in load_nodes(kv)])
    assert loaded == ["gpu-a", "gpu-b"]
    skipped = " ".join(r.getMessage() for r in caplog.records)
    assert "gpu-bad" in skipped and "gpu-wrong" in skipped
    await put(kv, "gpu-c", 1)  # the bucket still takes writes
    assert len([s async for s in load_nodes(kv)]) == 3


async def test_deleted_keys_and_an_empty_bucket_give_nothing(kv: KeyValue) -> None:
    assert [s async for s in load_nodes(kv)] == []
    await put(kv, "gpu-a", 1)
    await put(kv, "gpu-b", 1)
    await kv.delete(subjects.node_token("gpu-a"))
    await kv.purge(subjects.node_token("gpu-b"))
    assert [s async for s in load_nodes(kv)] == []
    await put(kv, "gpu-c", 1)
    assert [s.snapshot.node async for s in load_nodes(kv)] == ["gpu-c"]


async def test_stopping_early_leaves_the_bucket_usable(kv: KeyValue) -> None:
    for i in range(10):
        await put(kv, f"gpu-{i}", 1)
    loads = cast(AsyncGenerator[StoredNode, None], load_nodes(kv))
    first = await anext(loads)
    await loads.aclose()
    assert first.snapshot.node.startswith("gpu-")
    assert len([s async for s in load_nodes(kv)]) == 10


async def test_a_load_leaves_no_consumer_behind(kv: KeyValue) -> None:
    for i in range(600):  # more than one pull batch
        await put(kv, f"gpu-{i:03d}", 1)
    assert len([s async for s in load_nodes(kv)]) == 600
    loads = cast(AsyncGenerator[StoredNode, None], load_nodes(kv))
    await anext(loads)
    await loads.aclose()
    info = await kv._js.stream_info(kv._stream)
    assert info.state.consumer_count == 0


async def test_keys_rewritten_during_the_pass_still_load_with_their_new_entry(
    kv: KeyValue,
) -> None:
    """Another replica rewrites keys the pass has not reached yet (their old entries are
    gone with history 1, the new ones lie past the sequence the pass began at): each still
    loads, once, with the new entry; a key deleted meanwhile does not load."""
    nodes = [f"gpu-{i:03d}" for i in range(600)]  # three pull batches
    for node in nodes:
        await put(kv, node, 1)
    loads = load_nodes(kv)
    first = await anext(loads)  # the pass has begun: one batch fetched
    rewritten, deleted = nodes[400], nodes[500]
    await put(kv, rewritten, 2)
    await put(kv, nodes[550], 2)
    await kv.delete(subjects.node_token(deleted))
    rest = [s async for s in loads]
    seqs = {s.snapshot.node: s.snapshot.seq for s in [first, *rest]}
    assert len(rest) + 1 == len(seqs)  # each node once
    assert sorted(seqs) == [n for n in nodes if n != deleted]
    assert seqs[rewritten] == 2 and seqs[nodes[550]] == 2
