"""Ingest.handle: packed and map counter batches are applied alike, the subject cache
changes nothing about what is rejected or counted (every bad message counted, each time),
each kind reaches its Fleet.apply_* through the route table, and a message the fleet
ignores is counted by reason but neither counted as ingested nor announced as a change."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.fleet.ingest import ROUTES, Ingest
from aggregator.fleet.state import Fleet
from aggregator.metrics import Metrics
from proto import subjects
from proto.codec import encode, encode_map
from proto.inventory import NodeSnapshot
from tests.support.builders import T0, counters, plugin_status, port_event, snapshot


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


class Rig:
    """An Ingest over a fresh fleet, recording what it persisted and what changed."""

    def __init__(self) -> None:
        self.fleet, self.metrics = Fleet(), Metrics.create()
        self.persisted: list[NodeSnapshot] = []
        self.changes: list[tuple[str, str]] = []
        self.ingest = Ingest(
            fleet=self.fleet,
            metrics=self.metrics,
            clock=lambda: T0,
            on_snapshot=lambda snap, now: self.persisted.append(snap),
            on_change=lambda node, kind: self.changes.append((node, kind)),
        )

    def send(self, message: msgspec.Struct, kind: str, node: str = "gpu-001") -> bool:
        return self.ingest.handle(subjects.node_subject(node, kind), encode(message))

    def count(self, name: str, **labels: str) -> float:
        return sample(self.metrics, name, labels)

    def total(self, name: str) -> float:
        return sum(
            s.value
            for family in self.metrics.registry.collect()
            for s in family.samples
            if s.name == name
        )


MESSAGES = "nicfleet_ingest_messages_total"
IGNORED = "nicfleet_ingest_ignored_total"
REJECTED = "nicfleet_ingest_rejected_total"


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        pytest.param(subjects.SNAPSHOT, snapshot(), id="snapshot"),
        pytest.param(subjects.COUNTERS, counters(), id="counters"),
        pytest.param(subjects.EVENT, port_event(), id="event"),
        pytest.param(subjects.STATUS, plugin_status(), id="status"),
    ],
)
def test_every_kind_is_routed_to_its_apply(kind: str, message: msgspec.Struct) -> None:
    assert tuple(ROUTES) == subjects.NODE_KINDS
    rig = Rig()
    assert rig.send(message, kind)
    assert rig.count(MESSAGES, kind=kind) == 1 and rig.total(MESSAGES) == 1
    assert rig.changes == [("gpu-001", kind)]
    assert rig.fleet.get("gpu-001") is not None
    assert len(rig.persisted) == (kind == subjects.SNAPSHOT)


@pytest.mark.parametrize(
    ("kind", "first", "again", "reason"),
    [
        pytest.param(subjects.SNAPSHOT, snapshot(seq=2), snapshot(seq=2), "duplicate",
                     id="snapshot-redelivered"),
        pytest.param(subjects.SNAPSHOT, snapshot(seq=2), snapshot(seq=1, collected_at=T0 - 1),
                     "older", id="snapshot-older"),
        pytest.param(subjects.COUNTERS, counters(seq=2), counters(seq=2), "duplicate",
                     id="counters-redelivered"),
        pytest.param(subjects.COUNTERS, counters(seq=2),
                     msgspec.structs.replace(counters(seq=3, collected_at=T0 + 3), base_seq=1),
                     "unmatched-delta", id="counters-unmatched-delta"),
        pytest.param(subjects.EVENT, port_event(), port_event(), "duplicate",
                     id="event-redelivered"),
        pytest.param(subjects.STATUS, plugin_status(), plugin_status(observed_at=T0 - 5),
                     "older", id="status-older"),
    ],
)  # fmt: skip
def test_an_ignored_message_is_counted_apart_and_changes_nothing_downstream(
    kind: str, first: msgspec.Struct, again: msgspec.Struct, reason: str
) -> None:
    rig = Rig()
    assert rig.send(first, kind)
    persisted, changes = list(rig.persisted), list(rig.changes)
    assert rig.send(again, kind)  # not rejected: the fleet saw it and left it out
    assert rig.count(MESSAGES, kind=kind) == 1  # only the applied one
    assert rig.count(IGNORED, kind=kind, reason=reason) == 1 and rig.total(IGNORED) == 1
    assert rig.total(REJECTED) == 0
    assert rig.changes == changes  # the change feed did not fire
    assert rig.persisted == persisted  # nothing re-persisted


def test_each_message_is_counted_once_applied_ignored_or_rejected() -> None:
    rig = Rig()
    sent = [
        (snapshot(seq=1), subjects.SNAPSHOT, "gpu-001"),
        (snapshot(seq=1), subjects.SNAPSHOT, "gpu-001"),  # ignored
        (snapshot(seq=1), subjects.SNAPSHOT, "gpu-002"),  # rejected: node-mismatch
        (counters(seq=1), subjects.COUNTERS, "gpu-001"),
    ]
    results = [rig.send(message, kind, node) for message, kind, node in sent]
    assert not rig.ingest.handle("nicfleet.v1.node.gpu-001.nonsense", b"")  # rejected: subject
    assert results == [True, True, False, True]
    assert (rig.total(MESSAGES), rig.total(IGNORED), rig.total(REJECTED)) == (2, 1, 2)
    assert rig.count(REJECTED, kind="unknown", reason="subject") == 1
