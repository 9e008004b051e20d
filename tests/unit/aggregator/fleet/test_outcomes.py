"""Fleet.apply_*: each says what it did with a message (aggregator.fleet.state.Outcome) —
applied, or ignored with the reason — and an ignored one leaves the stored record alone
(but for an unmatched delta's sign of life)."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.fleet.state import Fleet, Ignored, Outcome
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus
from tests.support.builders import T0, counters, plugin_status, port_event, snapshot

Message = NodeSnapshot | CounterBatch | LinkEvent | DevicePluginStatus


def offer(fleet: Fleet, message: Message, received_at: float) -> Outcome:
    if isinstance(message, NodeSnapshot):
        return fleet.apply_snapshot(message, received_at)
    if isinstance(message, CounterBatch):
        return fleet.apply_counters(message, received_at)
    if isinstance(message, LinkEvent):
        return fleet.apply_event(message, received_at)
    return fleet.apply_status(message, received_at)


def delta(base_seq: int, seq: int) -> CounterBatch:
    """A delta over full batch `base_seq`, listing the one port `counters()` has."""
    batch = counters(seq=seq, collected_at=T0 + seq, rx=seq)
    return msgspec.structs.replace(batch, base_seq=base_seq)


@pytest.mark.parametrize(
    ("stored", "message", "ignored"),
    [
        pytest.param((), snapshot(seq=5), None, id="snapshot-first"),
        pytest.param((snapshot(seq=5),), snapshot(seq=6, collected_at=T0 + 1), None,
                     id="snapshot-newer"),
        pytest.param((snapshot(seq=500),), snapshot(seq=1, collected_at=T0 + 60), None,
                     id="snapshot-agent-restarted"),
        pytest.param((snapshot(seq=5),), snapshot(seq=5), Ignored.DUPLICATE,
                     id="snapshot-redelivered"),
        pytest.param((snapshot(seq=5),), snapshot(seq=4, collected_at=T0 - 1), Ignored.OLDER,
                     id="snapshot-late-older"),
        pytest.param((snapshot(seq=5),), snapshot(seq=5, collected_at=T0 - 1), Ignored.OLDER,
                     id="snapshot-same-seq-collected-earlier"),
        pytest.param((), counters(seq=3), None, id="counters-first"),
        pytest.param((counters(seq=3),), counters(seq=4, collected_at=T0 + 1), None,
                     id="counters-newer"),
        pytest.param((counters(seq=3),), counters(seq=3), Ignored.DUPLICATE,
                     id="counters-redelivered"),
        pytest.param((counters(seq=3),), counters(seq=2, collected_at=T0 - 1), Ignored.OLDER,
                     id="counters-late-older"),
        pytest.param((counters(seq=1),), delta(1, 2), None, id="delta-onto-its-base"),
        pytest.param((), delta(1, 2), Ignored.UNMATCHED_DELTA, id="delta-no-base-held"),
        pytest.param((counters(seq=1),), delta(7, 8), Ignored.UNMATCHED_DELTA,
                     id="delta-names-another-base"),
        pytest.param((), port_event(), None, id="event-first"),
        pytest.param((port_event(seq=1),), port_event(seq=2, observed_at=T0 + 2), None,
                     id="event-another"),
        pytest.param((port_event(),), port_event(), Ignored.DUPLICATE, id="event-redelivered"),
        pytest.param((), plugin_status(), None, id="status-first"),
        pytest.param((plugin_status(),), plugin_status(observed_at=T0 + 1), None,
                     id="status-newer"),
        pytest.param((plugin_status(),), plugin_status(), Ignored.DUPLICATE,
                     id="status-redelivered"),
        pytest.param((plugin_status(),), plugin_status(observed_at=T0 - 1), Ignored.OLDER,
                     id="status-older"),
    ],
)  # fmt: skip
def test_apply_outcome(
    stored: tuple[Message, ...], message: Message, ignored: Ignored | None
) -> None:
    fleet = Fleet()
    for n, earlier in enumerate(stored):
        assert offer(fleet, earlier, T0 + n).applied
    before = fleet.get("gpu-001")
    outcome = offer(fleet, message, T0 + 10)
    assert outcome.ignored is ignored
    assert outcome.applied is (ignored is None)
    assert outcome.record is fleet.get("gpu-001")  # the record stored afterwards, either way
    assert fleet.ignored == (ignored is not None)
    if ignored is None:
        assert outcome.record is not before and outcome.record.last_seen == T0 + 10
    elif ignored is Ignored.UNMATCHED_DELTA:  # nothing stored but a sign of life
        assert fleet.unmatched_deltas == 1 and outcome.record.last_seen == T0 + 10
        assert before is None or outcome.record.counters_held is before.counters_held
    else:
        assert outcome.record is before


def test_reasons_are_the_metric_labels() -> None:
    assert [r.value for r in Ignored] == ["older", "duplicate", "unmatched-delta"]
    assert f"{Ignored.UNMATCHED_DELTA}" == "unmatched-delta"
