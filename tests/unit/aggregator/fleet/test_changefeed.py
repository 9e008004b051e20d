"""aggregator.fleet.changefeed: every subscriber sees every change, coalesced; `ignore` keeps the
kinds a subscriber has no use for (counters of known nodes, for the reconciler) from
waking it; the ingest publishes only messages the fleet applied."""

from __future__ import annotations

from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet
from aggregator.metrics import Metrics
from proto import subjects
from proto.codec import encode
from tests.support.builders import T0, counters


async def test_each_subscriber_gets_every_change_coalesced() -> None:
    feed = ChangeFeed()
    first, second = feed.subscribe(), feed.subscribe()
    for node, kind in [("a", "counters"), ("b", "snapshot"), ("a", "counters")]:
        feed.publish(node, kind)
    assert await first.wait(0) == ({"a", "b"}, {"counters", "snapshot"})
    assert await second.wait(0) == ({"a", "b"}, {"counters", "snapshot"})
    assert await first.wait(0) == (set(), set())  # read: nothing until the next change


async def test_ignored_kinds_of_known_nodes_do_not_wake_the_subscriber() -> None:
    feed = ChangeFeed()
    quiet, other = feed.subscribe(), feed.subscribe()
    known: set[str] = {"a"}
    quiet.ignore(frozenset({"counters"}), known)
    feed.publish("a", "counters")
    assert await quiet.wait(0) == (set(), set())
    feed.publish("b", "counters")  # a node it does not know yet
    feed.publish("a", "status")  # a kind it wants
    assert await quiet.wait(0) == ({"a", "b"}, {"counters", "status"})
    known.add("b")  # held by reference: the subscriber's own set grows
    feed.publish("b", "counters")
    assert await quiet.wait(0) == (set(), set())
    assert await other.wait(0) == ({"a", "b"}, {"counters", "status"})


async def test_only_messages_the_fleet_applied_reach_the_feed() -> None:
    feed, fleet = ChangeFeed(), Fleet()
    sub = feed.subscribe()
    ingest = Ingest(fleet=fleet, metrics=Metrics.create(), clock=lambda: T0,
                    on_snapshot=lambda snap, now: None, on_change=feed.publish)  # fmt: skip
    subject = subjects.node_subject("gpu-001", subjects.COUNTERS)
    assert ingest.handle(subject, encode(counters(seq=2)))
    assert await sub.wait(0) == ({"gpu-001"}, {"counters"})
    assert ingest.handle(subject, encode(counters(seq=1, collected_at=T0 - 1)))  # older
    assert ingest.handle(subject, encode(counters(seq=2)))  # redelivered
    assert fleet.ignored == 2
    assert await sub.wait(0) == (set(), set())
