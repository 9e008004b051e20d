"""Ordering across agent restarts and skewed clocks (aggregator.fleet.ordering, docs/wire.md
"Ordering"): which agent process a node follows, seq within it, and the issue-19 scenario —
a clock 600 s ahead, then a restart with seq 1 and a correct clock."""

from __future__ import annotations

from typing import TypeVar

import msgspec
import pytest

from aggregator.fleet import ordering
from aggregator.fleet.ordering import Instance, Order, OrderingSettings, Verdict
from aggregator.fleet.state import Fleet, Ignored, NodeRecord
from aggregator.fleet.store import StoredNode
from proto.codec import decode, encode
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus
from tests.support.builders import T0, counters, plugin_status, port_event, snapshot

NS = 1_000_000_000
M = TypeVar("M", bound=msgspec.Struct)
SETTINGS = OrderingSettings(future_tolerance_s=5.0, takeover_s=30.0)


def epoch(at: float) -> int:
    return round(at * NS)


def followed(began: float, *, first_heard: float, heard_at: float | None = None) -> Instance:
    """The instance a node follows after its first message of `began` at `first_heard`."""
    inst = ordering.start(epoch(began), first_heard)
    return ordering.heard(inst, first_heard if heard_at is None else heard_at)


@pytest.mark.parametrize(
    ("current", "incoming", "received_at", "verdict"),
    [
        pytest.param(None, epoch(T0), T0, Verdict.LATER, id="first-message"),
        pytest.param(followed(T0, first_heard=T0 + 1), epoch(T0), T0 + 9, Verdict.SAME,
                     id="same-process"),
        pytest.param(followed(T0, first_heard=T0 + 1), epoch(T0 + 100), T0 + 101, Verdict.LATER,
                     id="restart-correct-clock"),
        pytest.param(followed(T0 + 100, first_heard=T0 + 101), epoch(T0), T0 + 110,
                     Verdict.EARLIER, id="late-message-of-the-process-before"),
        # The issue: a process whose clock ran 600 s ahead, then a restart with a correct
        # clock. Its epoch (T0 + 600) counts only as "no later than first heard" (T0 + 1).
        pytest.param(followed(T0 + 600, first_heard=T0 + 1, heard_at=T0 + 40), epoch(T0 + 50),
                     T0 + 51, Verdict.LATER, id="restart-after-clock-600s-ahead"),
        # ... and a late message of that dead process, still ahead at arrival, never wins.
        pytest.param(followed(T0 + 50, first_heard=T0 + 51), epoch(T0 + 600), T0 + 55,
                     Verdict.EARLIER, id="late-message-of-a-process-from-the-future"),
        # Both processes on a clock running ahead: the same clock, compared as is.
        pytest.param(followed(T0 + 600, first_heard=T0 + 1), epoch(T0 + 650), T0 + 51,
                     Verdict.LATER, id="restart-clock-still-ahead"),
        pytest.param(followed(T0 + 650, first_heard=T0 + 51), epoch(T0 + 600), T0 + 52,
                     Verdict.EARLIER, id="late-message-both-ahead"),
        # An epoch ahead of a followed process that was not: cannot be ordered, waits.
        pytest.param(followed(T0, first_heard=T0 + 1, heard_at=T0 + 20), epoch(T0 + 700),
                     T0 + 30, Verdict.EARLIER, id="future-epoch-followed-alive"),
        pytest.param(followed(T0, first_heard=T0 + 1, heard_at=T0 + 20), epoch(T0 + 700),
                     T0 + 50, Verdict.LATER, id="future-epoch-followed-silent-30s"),
        pytest.param(followed(T0 + 100, first_heard=T0 + 101, heard_at=T0 + 101), epoch(T0),
                     T0 + 131, Verdict.LATER, id="earlier-but-followed-silent-30s"),
        pytest.param(followed(T0, first_heard=T0 + 1), epoch(T0 + 4), T0 + 1.5, Verdict.LATER,
                     id="ahead-within-tolerance-is-a-time"),
        pytest.param(ordering.start(0, T0), epoch(T0 + 10), T0 + 11, Verdict.LATER,
                     id="upgrade-from-an-agent-without-epoch"),
        pytest.param(followed(T0, first_heard=T0 + 1), 0, T0 + 2, Verdict.EARLIER,
                     id="downgrade-waits-for-silence"),
        pytest.param(ordering.start(0, T0), 0, T0 + 2, Verdict.SAME, id="both-without-epoch"),
    ],
)  # fmt: skip
def test_judge(
    current: Instance | None, incoming: int, received_at: float, verdict: Verdict
) -> None:
    assert ordering.judge(current, incoming, received_at, SETTINGS) is verdict


@pytest.mark.parametrize(
    ("stored", "incoming", "legacy", "order"),
    [
        pytest.param((5, T0, T0), (6, T0 + 1, T0 + 1), False, Order.NEWER, id="next-seq"),
        pytest.param((5, T0, T0), (4, T0 - 1, T0 + 2), False, Order.OLDER, id="late-older"),
        pytest.param((5, T0, T0), (5, T0, T0 + 3), False, Order.DUPLICATE, id="redelivery"),
        # Within one process seq decides: a clock stepped back (or forward) is no matter.
        pytest.param((5, T0 + 600, T0), (6, T0 + 1, T0 + 1), False, Order.NEWER,
                     id="clock-corrected-same-process"),
        pytest.param((5, T0, T0), (4, T0 + 900, T0 + 1), False, Order.OLDER,
                     id="future-time-lower-seq"),
        # Legacy (epoch 0): seq or a later collection, each trusted only up to its arrival.
        pytest.param((500, T0 + 600, T0), (1, T0 + 50, T0 + 51), True, Order.NEWER,
                     id="legacy-restart-after-clock-ahead"),
        pytest.param((500, T0, T0), (1, T0 + 900, T0 + 1), True, Order.NEWER,
                     id="legacy-future-time-trusted-as-arrival"),
        pytest.param((500, T0 + 10, T0 + 10), (1, T0 + 900, T0 + 5), True, Order.OLDER,
                     id="legacy-future-time-arrived-earlier"),
    ],
)  # fmt: skip
def test_order_seq(
    stored: tuple[int, float, float], incoming: tuple[int, float, float], legacy: bool, order: Order
) -> None:
    seq, at, received = incoming
    assert ordering.order_seq(seq, at, received, *stored, legacy=legacy) is order


@pytest.mark.parametrize(
    ("stored", "incoming", "order"),
    [
        pytest.param((T0, T0), (T0 + 1, T0 + 1), Order.NEWER, id="later"),
        pytest.param((T0, T0), (T0, T0 + 5), Order.DUPLICATE, id="redelivery"),
        pytest.param((T0, T0), (T0 - 1, T0 + 5), Order.OLDER, id="older"),
        pytest.param((T0 + 600, T0), (T0 + 2, T0 + 2), Order.NEWER, id="clock-corrected"),
        pytest.param((T0, T0), (T0 + 600, T0), Order.NEWER, id="ahead-same-instant"),
    ],
)
def test_order_observed(
    stored: tuple[float, float], incoming: tuple[float, float], order: Order
) -> None:
    assert ordering.order_observed(*incoming, *stored) is order


# -- the scenario through the fleet -------------------------------------------------

AHEAD = 600.0
A = epoch(T0 + AHEAD)  # the first process: its clock 600 s ahead
B = epoch(T0 + 100)  # restarted at T0 + 100 with the clock corrected


def of(message: M, epoch_: int) -> M:
    return msgspec.structs.replace(message, epoch=epoch_)


def snap(seq: int, at: float, epoch_: int, state: str = "ACTIVE") -> NodeSnapshot:
    base = snapshot(seq=seq, collected_at=at)
    dev = base.devices[0]
    ports = tuple(msgspec.structs.replace(p, state=state) for p in dev.ports)
    devices = (msgspec.structs.replace(dev, ports=ports),)
    return msgspec.structs.replace(base, devices=devices, epoch=epoch_)


def down(at: float, epoch_: int, seq: int = 1) -> LinkEvent:
    return msgspec.structs.replace(port_event(observed_at=at, seq=seq), epoch=epoch_)


def port_state(record: NodeRecord | None) -> str:
    assert record is not None and record.snapshot is not None
    return record.snapshot.devices[0].ports[0].state


def ahead_then_restarted(fleet: Fleet) -> None:
    """Process A (clock +600 s) publishes for 90 s; B (correct clock) starts at T0 + 100."""
    for i in range(1, 91):
        fleet.apply_counters(of(counters(seq=i, collected_at=T0 + AHEAD + i), A), T0 + i)
        if i % 30 == 0:
            fleet.apply_snapshot(snap(i // 30, T0 + AHEAD + i, A), T0 + i)
    fleet.apply_status(of(plugin_status(observed_at=T0 + AHEAD + 5), A), T0 + 5)


def test_a_restart_after_a_clock_600s_ahead_is_followed_at_once() -> None:
    fleet = Fleet(ordering=SETTINGS)
    ahead_then_restarted(fleet)
    first = fleet.apply_snapshot(snap(1, T0 + 100.5, B), T0 + 100.6)
    assert first.applied and first.record.snapshot is not None
    assert first.record.snapshot.epoch == B and first.record.snapshot.seq == 1
    # The real port-down of the new process is applied at once, not 600 s later.
    outcome = fleet.apply_event(down(T0 + 101, B), T0 + 101.1)
    assert outcome.applied
    assert port_state(outcome.record) == "DOWN"
    assert fleet.apply_counters(of(counters(seq=1, collected_at=T0 + 101), B), T0 + 101.2).applied
    status = of(plugin_status(observed_at=T0 + 101), B)
    assert fleet.apply_status(status, T0 + 101.3).applied
    # A late message of the dead process A is ignored, whatever its seq or stamp.
    late = fleet.apply_snapshot(snap(99, T0 + AHEAD + 95, A), T0 + 102)
    assert late.ignored is Ignored.OLDER
    assert fleet.apply_counters(of(counters(seq=91, collected_at=T0 + 691), A), T0 + 102).ignored
    assert port_state(fleet.get("gpu-001")) == "DOWN"


def test_the_port_down_before_the_new_snapshot_is_applied_too() -> None:
    # The event of the new process may arrive before its first snapshot: it still wins over
    # the stored snapshot of the process before, whose collection time is 600 s ahead.
    fleet = Fleet(ordering=SETTINGS)
    ahead_then_restarted(fleet)
    assert port_state(fleet.apply_event(down(T0 + 101, B), T0 + 101.1).record) == "DOWN"
    # B's own snapshot collected before the event is replayed under it.
    assert port_state(fleet.apply_snapshot(snap(1, T0 + 100.5, B), T0 + 101.2).record) == "DOWN"


def test_on_todays_rule_the_same_sequence_hid_the_port_down() -> None:
    # Agents older than epochs keep the old rule (but for trusting no time beyond its
    # arrival): the restart's snapshot is taken, as it would not have been before.
    fleet = Fleet(ordering=SETTINGS)
    fleet.apply_snapshot(snap(9, T0 + AHEAD + 90, 0), T0 + 90)
    assert fleet.apply_snapshot(snap(1, T0 + 100.5, 0), T0 + 100.6).applied


def test_the_restart_is_followed_after_an_aggregator_restart_from_kv() -> None:
    fleet = Fleet(ordering=SETTINGS)
    ahead_then_restarted(fleet)
    record = fleet.get("gpu-001")
    assert record is not None and record.snapshot is not None and record.snapshot_received_at
    # What KV nicfleet-nodes holds, as bytes, and how the aggregator loads it on start.
    kv = encode(StoredNode(snapshot=record.snapshot, received_at=record.snapshot_received_at))
    stored = decode(kv, StoredNode)
    assert stored.snapshot.epoch == A
    rebuilt = Fleet(ordering=SETTINGS)
    rebuilt.apply_snapshot(stored.snapshot, stored.received_at)
    # A late counter batch of A, then B: B is followed at once.
    assert rebuilt.apply_counters(of(counters(seq=95, collected_at=T0 + 695), A), T0 + 99).applied
    assert rebuilt.apply_snapshot(snap(1, T0 + 100.5, B), T0 + 100.6).applied
    assert port_state(rebuilt.apply_event(down(T0 + 101, B), T0 + 101.1).record) == "DOWN"
    assert rebuilt.apply_snapshot(snap(3, T0 + AHEAD + 90, A), T0 + 102).ignored is Ignored.OLDER


def test_a_process_that_cannot_be_ordered_takes_over_once_the_followed_is_silent() -> None:
    # B runs with a correct clock; a message of a process "started" 600 s ahead arrives
    # (dead, delivered late — or a live agent whose clock jumped ahead at a restart).
    fleet = Fleet(ordering=SETTINGS)
    fleet.apply_snapshot(snap(5, T0 + 10, epoch(T0)), T0 + 10)
    future = epoch(T0 + 700)
    assert fleet.apply_snapshot(snap(1, T0 + 711, future), T0 + 20).ignored is Ignored.OLDER
    # B falls silent; 30 s after its last message the other process is followed.
    assert fleet.apply_snapshot(snap(2, T0 + 741, future), T0 + 40.5).applied


def test_events_of_an_earlier_process_never_change_the_port() -> None:
    fleet = Fleet(ordering=SETTINGS)
    fleet.apply_snapshot(snap(1, T0 + 100.5, B), T0 + 100.6)
    early = epoch(T0)
    outcome = fleet.apply_event(down(T0 + 700, early), T0 + 101)  # stamped far ahead, too
    assert outcome.ignored is Ignored.OLDER
    assert port_state(fleet.get("gpu-001")) == "ACTIVE"


def test_a_delta_never_meets_a_base_of_another_process() -> None:
    fleet = Fleet(ordering=SETTINGS)
    fleet.apply_counters(of(counters(seq=1, collected_at=T0 + AHEAD), A), T0)
    # B's first delta names base seq 1 — A's seq 1 — before B's own full batch arrived.
    delta = msgspec.structs.replace(of(counters(seq=2, collected_at=T0 + 101, rx=7), B), base_seq=1)
    assert isinstance(delta, CounterBatch)
    assert fleet.apply_counters(delta, T0 + 101).ignored is Ignored.UNMATCHED_DELTA


def test_a_status_of_the_new_process_replaces_one_observed_600s_ahead() -> None:
    fleet = Fleet(ordering=SETTINGS)
    fleet.apply_status(of(plugin_status(observed_at=T0 + AHEAD), A), T0)
    newer = of(plugin_status(observed_at=T0 + 101, generation=2), B)
    record = fleet.apply_status(newer, T0 + 101).record
    assert isinstance(record.device_plugin, DevicePluginStatus)
    assert record.device_plugin.config_generation == 2


def test_a_late_message_whose_epoch_aged_into_the_past_is_judged_by_its_stamp() -> None:
    # A process 30 s ahead started at T0 + 1 (epoch T0 + 31); its message sent at T0 + 13
    # (stamped T0 + 43) arrives at T0 + 26, after its successor (also 30 s ahead, started at
    # T0 + 14) was followed. By then its epoch no longer looks ahead; its stamp still does.
    current = followed(T0 + 44, first_heard=T0 + 15, heard_at=T0 + 20)
    late = ordering.judge(current, epoch(T0 + 31), T0 + 26, SETTINGS, stamped_at=T0 + 43)
    assert late is Verdict.EARLIER
    unstamped = ordering.judge(current, epoch(T0 + 31), T0 + 26, SETTINGS)
    assert unstamped is Verdict.LATER  # what the stamp prevents


def test_a_followed_clock_known_ahead_orders_a_restart_on_it() -> None:
    # The followed process's epoch looked like a time (its first message arrived 1 s after
    # its start on a clock 6 s ahead), but its clock offset says it runs ahead.
    current = followed(T0 + 7, first_heard=T0 + 2)
    restart = epoch(T0 + 9)
    assert ordering.judge(current, restart, T0 + 3.5, SETTINGS) is Verdict.EARLIER
    ahead = ordering.judge(current, restart, T0 + 3.5, SETTINGS, offset_s=6.0)
    assert ahead is Verdict.LATER
