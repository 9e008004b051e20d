"""aggregator.dra.publisher's pure part: which fleet records become pools, and when stale."""

from __future__ import annotations

from aggregator.dra.publisher import pool_sources
from aggregator.fleet.state import NodeRecord
from tests.support.builders import T0, snapshot


def record(name: str, last_seen: float, with_snapshot: bool = True) -> NodeRecord:
    snap = snapshot(name) if with_snapshot else None
    return NodeRecord(name=name, snapshot=snap, first_seen=T0, last_seen=last_seen)


def test_pools_are_the_nodes_with_a_snapshot_stale_past_stale_after() -> None:
    records = {
        "fresh": record("fresh", T0 - 30),
        "stale": record("stale", T0 - 30.5),
        "unknown": record("unknown", T0, with_snapshot=False),
    }
    found = pool_sources(records, T0, 30.0)
    assert {name: source.stale for name, source in found.items()} == {
        "fresh": False,
        "stale": True,
    }
    assert found["fresh"].snapshot.node == "fresh"
