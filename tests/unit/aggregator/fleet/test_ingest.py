"""Ingest.handle: packed and map counter batches are applied alike, and the subject cache
changes nothing about what is rejected or counted (every bad message counted, each time)."""

from __future__ import annotations

import msgspec

from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet
from aggregator.metrics import Metrics
from proto import subjects
from proto.codec import encode, encode_map
from tests.support.builders import counters


def make() -> tuple[Ingest, Fleet, Metrics, list[tuple[str, str]]]:
    fleet, metrics, changes = Fleet(), Metrics.create(), []
    ingest = Ingest(
        fleet=fleet,
        metrics=metrics,
        clock=lambda: 100.0,
        on_snapshot=lambda snap, now: None,
        on_change=lambda node, kind: changes.append((node, kind)),
    )
    return ingest, fleet, metrics, changes


def sample(metrics: Metrics, name: str, labels: dict[str, str]) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_packed_and_map_batches_are_applied_alike() -> None:
    ingest, fleet, metrics, changes = make()
    subject = subjects.node_subject("gpu-001", subjects.COUNTERS)
    first, second = counters(seq=1, rx=10), counters(seq=2, rx=20)
    assert ingest.handle(subject, encode_map(first))
    assert fleet.get("gpu-001").counters == first  # type: ignore[union-attr]
    assert ingest.handle(subject, encode(second))
    assert fleet.get("gpu-001").counters == second  # type: ignore[union-attr]
    assert changes == [("gpu-001", "counters")] * 2
    accepted = {"kind": "counters"}
    assert sample(metrics, "nicfleet_ingest_messages_total", accepted) == 2


def test_cached_subjects_still_reject_every_bad_message() -> None:
    ingest, fleet, metrics, _ = make()
    good = subjects.node_subject("gpu-001", subjects.COUNTERS)
    other = encode(msgspec.structs.replace(counters(seq=3), node="gpu-002"))
    for _ in range(3):
        assert not ingest.handle("nicfleet.v1.node.gpu-001.bogus", b"")
        assert not ingest.handle(good, other)  # node-mismatch, subject already cached
        assert not ingest.handle(good, b"\x93garbage")
    rejected = "nicfleet_ingest_rejected_total"
    assert sample(metrics, rejected, {"kind": "unknown", "reason": "subject"}) == 3
    assert sample(metrics, rejected, {"kind": "counters", "reason": "node-mismatch"}) == 3
    assert sample(metrics, rejected, {"kind": "counters", "reason": "decode"}) == 3
    assert fleet.get("gpu-001") is None and fleet.get("gpu-002") is None
    assert ingest.handle(good, encode(counters(seq=4)))  # and it keeps serving
