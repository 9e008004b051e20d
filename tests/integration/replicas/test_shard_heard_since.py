"""A sharded replica's `heard_since` (RuleInput.heard_since): each node it loads from KV
at a takeover counts from when the partition was taken, its record keeping the true
receive time; a released partition's nodes leave the mapping with them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import nats
import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import StoredNode, open_bucket
from aggregator.replicas.owner import KV_SHARDS, ShardOwner
from aggregator.replicas.partitions import ShardSettings, partition_of, plan
from proto import subjects
from proto.codec import encode
from proto.messages.shards import ShardSummary
from tests.integration.agent.test_pipeline import lab_node

pytestmark = pytest.mark.integration

PARTITIONS = 4
T0 = 1_000_000.0  # when the earlier process received the stored snapshots
NOW = T0 + 500.0  # this replica's (fixed) clock


def _one_node_each(mine: frozenset[int], theirs: frozenset[int]) -> tuple[str, str]:
    names = [f"heard-{i:02d}" for i in range(64)]
    part = {n: partition_of(subjects.node_token(n), PARTITIONS) for n in names}
    return next(n for n in names if part[n] in mine), next(n for n in names if part[n] in theirs)


async def test_taken_over_nodes_count_from_the_takeover_and_leave_on_release(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    share = plan(PARTITIONS, {"me", "other"})
    kept, released = _one_node_each(share["me"], share["other"])
    template = collect_snapshot(
        Sysfs(lab_node(tmp_path, "a100-ib-4nic", "t")),
        node="t", seq=1, now=T0, agent_version="t",
    )  # fmt: skip
    nc = await nats.connect(own_nats.url)
    try:
        nodes_kv = await open_bucket(nc.jetstream())
        for name in (kept, released):
            stored = StoredNode(snapshot=msgspec.structs.replace(template, node=name),
                                received_at=T0)  # fmt: skip
            await nodes_kv.put(subjects.node_token(name), encode(stored))
        fleet = Fleet()
        owner = ShardOwner(
            nc, ShardSettings(partitions=PARTITIONS), identity="me", fleet=fleet,
            nodes_kv=nodes_kv, handle=lambda subject, data: True,
            on_change=lambda node, why: None, resync=lambda held: None, clock=lambda: NOW,
        )  # fmt: skip
        await owner.start()  # alone: every partition taken, both nodes loaded
        assert dict(owner.heard_since) == {kept: NOW, released: NOW}
        record = fleet.get(kept)
        assert record is not None and record.last_seen == T0  # the true receive time
        # Another replica's heartbeat: the plan gives it its share, released here.
        shards = await nc.jetstream().key_value(KV_SHARDS)
        await shards.put("other", encode(ShardSummary(replica="other", sent_at=NOW)))
        await owner.replan()
        assert owner.held == share["me"]
        assert dict(owner.heard_since) == {kept: NOW}
    finally:
        await nc.close()
