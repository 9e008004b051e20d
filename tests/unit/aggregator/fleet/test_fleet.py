"""Fleet state: ordering rule, restarts, live port state from events, staleness, bounds."""

from __future__ import annotations

import msgspec
import pytest

from aggregator.fleet import ordering
from aggregator.fleet.state import MAX_EVENTS, Fleet, NodeRecord
from aggregator.fleet.views import describe, node_state, summarize
from proto.compact import inventory_only
from proto.inventory import NodeSnapshot
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus, ResourceStatus
from tests.support.builders import T0, counters, device, port, port_event, snapshot


def port_of(
    snap: NodeSnapshot | None, name: str = "mlx5_0", number: int = 1
) -> tuple[str, str | None]:
    assert snap is not None
    a = next(a for a in snap.devices if a.name == name)
    p = next(p for p in a.ports if p.port == number)
    return p.state, p.phys_state


@pytest.mark.parametrize(
    ("stored", "incoming", "accepted"),
    [
        pytest.param((5, T0), (6, T0 + 1), True, id="next-in-order"),
        pytest.param((5, T0), (4, T0 - 1), False, id="late-older"),
        pytest.param((5, T0), (5, T0), False, id="exact-redelivery"),
        pytest.param((500, T0), (1, T0 + 60), True, id="agent-restarted-seq-1"),
        pytest.param((5, T0), (6, T0 - 5), True, id="clock-stepped-back-same-process"),
        pytest.param((5, T0), (5, T0 + 1), True, id="same-seq-newer-collection"),
    ],
)
def test_legacy_order(
    stored: tuple[int, float], incoming: tuple[int, float], accepted: bool
) -> None:
    # Agents older than epochs (epoch 0): a higher seq or a later collection, as before.
    order = ordering.order_seq(
        incoming[0], incoming[1], T0 + 100, stored[0], stored[1], T0 + 100, legacy=True
    )
    assert (order is ordering.Order.NEWER) is accepted


@pytest.mark.parametrize(
    ("order", "kept_seq", "ignored"),
    [
        pytest.param([(1, T0), (2, T0 + 1), (3, T0 + 2)], 3, 0, id="in-order"),
        pytest.param([(3, T0 + 2), (1, T0), (2, T0 + 1)], 3, 2, id="reversed-delivery"),
        pytest.param([(2, T0 + 1), (2, T0 + 1)], 2, 1, id="duplicate"),
        pytest.param([(900, T0), (1, T0 + 30), (2, T0 + 31)], 2, 0, id="restart"),
    ],
)
def test_snapshot_apply_order(order: list[tuple[int, float]], kept_seq: int, ignored: int) -> None:
    fleet = Fleet()
    for i, (seq, at) in enumerate(order):
        fleet.apply_snapshot(snapshot(seq=seq, collected_at=at), received_at=T0 + 100 + i)
    record = fleet.get("gpu-001")
    assert record is not None
    assert record.snapshot is not None
    assert record.snapshot.seq == kept_seq
    assert fleet.ignored == ignored


def test_accepted_snapshot_is_stored_as_its_inventory_and_rejected_one_is_not() -> None:
    # The contract: the stored object is `inventory_only(snap)` (a new object, equal to
    # `snap` but for per-port counters); a rejected snapshot leaves that object in place.
    fleet = Fleet()
    first = snapshot(seq=2, collected_at=T0)
    stored = fleet.apply_snapshot(first, T0).record.snapshot
    assert stored == inventory_only(first)
    stale = snapshot(seq=1, collected_at=T0 - 1)
    record = fleet.apply_snapshot(stale, T0 + 5).record
    assert record.snapshot is stored
    assert record.last_seen == T0  # an ignored message is no sign of life
    assert record.snapshot_received_at == T0


def test_counters_follow_the_same_rule_and_keep_the_snapshot() -> None:
    fleet = Fleet()
    snap = fleet.apply_snapshot(snapshot(), T0).record.snapshot
    fleet.apply_counters(counters(seq=10, collected_at=T0 + 10, rx=100), T0 + 10)
    fleet.apply_counters(counters(seq=9, collected_at=T0 + 9, rx=90), T0 + 11)
    fleet.apply_counters(counters(seq=1, collected_at=T0 + 20, rx=5), T0 + 20)  # restart
    record = fleet.get("gpu-001")
    assert record is not None
    assert record.counters is not None
    assert record.counters.ports[0].counters["port_rcv_data"] == 5
    assert record.snapshot is snap
    assert (record.counters_received_at, record.last_seen, record.first_seen) == (T0 + 20,) * 2 + (
        T0,
    )


def test_counters_or_events_first_create_a_node_without_snapshot() -> None:
    fleet = Fleet()
    fleet.apply_counters(counters(node="gpu-002"), T0)
    fleet.apply_event(port_event(node="gpu-003"), T0)
    assert fleet.names() == ["gpu-002", "gpu-003"]
    for record in fleet.records():
        assert node_state(record, T0, 30) == "no-snapshot"


@pytest.mark.parametrize(
    ("event_observed", "expected"),
    [
        pytest.param(T0 + 1, ("DOWN", "Disabled"), id="after-snapshot-applies"),
        pytest.param(T0 - 1, ("ACTIVE", "LinkUp"), id="before-snapshot-ignored"),
    ],
)
def test_port_event_updates_live_port_state(
    event_observed: float, expected: tuple[str, str]
) -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snapshot(collected_at=T0), T0)
    record = fleet.apply_event(port_event(observed_at=event_observed), T0 + 2).record
    assert port_of(record.snapshot) == expected
    assert len(record.events) == 1  # recorded either way


def test_port_event_out_of_order_does_not_undo_newer_state() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snapshot(collected_at=T0), T0)
    fleet.apply_event(
        port_event(new="ACTIVE", old="DOWN", phys="LinkUp", observed_at=T0 + 5, seq=2), T0 + 5
    )
    record = fleet.apply_event(port_event(new="DOWN", observed_at=T0 + 3, seq=1), T0 + 6).record
    assert port_of(record.snapshot) == ("ACTIVE", "LinkUp")


def test_port_event_touches_only_its_port_and_updates_state_code() -> None:
    two = device("mlx5_1", ports=(port(1), port(2)))
    fleet = Fleet()
    fleet.apply_snapshot(snapshot(devices=(device(), two)), T0)
    record = fleet.apply_event(port_event(device="mlx5_1", port=2, phys=None), T0 + 1).record
    assert port_of(record.snapshot, "mlx5_1", 2) == ("DOWN", "LinkUp")  # phys unknown: kept
    assert port_of(record.snapshot, "mlx5_1", 1) == ("ACTIVE", "LinkUp")
    assert port_of(record.snapshot, "mlx5_0", 1) == ("ACTIVE", "LinkUp")
    assert record.snapshot is not None
    assert record.snapshot.devices[1].ports[1].state_id == 1
    summary = summarize(record, T0 + 1, 30)
    assert summary.ports_down == ("mlx5_1/2",)
    assert (summary.ports_active, summary.ports_total) == (2, 3)


def test_event_for_unknown_port_keeps_snapshot_object() -> None:
    fleet = Fleet()
    snap = fleet.apply_snapshot(snapshot(), T0).record.snapshot
    record = fleet.apply_event(port_event(device="mlx5_9"), T0 + 1).record
    assert record.snapshot is snap


def test_redelivered_event_is_ignored() -> None:
    fleet = Fleet()
    event = port_event()
    fleet.apply_event(event, T0 + 1)
    record = fleet.apply_event(event, T0 + 2).record
    assert len(record.events) == 1
    assert fleet.ignored == 1


def test_events_are_bounded_newest_last() -> None:
    fleet = Fleet()
    for i in range(MAX_EVENTS + 7):
        fleet.apply_event(port_event(seq=i, observed_at=T0 + i), T0 + i)
    record = fleet.get("gpu-001")
    assert record is not None
    assert len(record.events) == MAX_EVENTS
    assert record.events[-1].event.seq == MAX_EVENTS + 6
    assert record.events[0].event.seq == 7


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        pytest.param(T0 + 10, "ready", id="fresh"),
        pytest.param(T0 + 30, "ready", id="at-threshold"),
        pytest.param(T0 + 30.5, "stale", id="past-threshold"),
    ],
)
def test_stale_after(now: float, expected: str) -> None:
    fleet = Fleet()
    record = fleet.apply_snapshot(snapshot(), T0).record
    assert node_state(record, now, stale_after=30) == expected


def test_any_message_keeps_a_node_fresh() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snapshot(), T0)
    record = fleet.apply_counters(counters(seq=2, collected_at=T0 + 50), T0 + 50).record
    assert node_state(record, T0 + 60, stale_after=30) == "ready"


def test_summary_fields() -> None:
    ib = device("mlx5_0", ports=(port(1, rate=400.0),), fw="28.39.1002")
    eth = device(
        "mlx5_1", ports=(port(1, "DOWN", rate=200.0, link_layer="Ethernet"),), fw="22.36.1010"
    )
    nofw = device("mlx5_2", ports=(), fw=None)
    fleet = Fleet()
    record = fleet.apply_snapshot(snapshot(devices=(ib, eth, nofw), gpus=4), T0).record
    s = summarize(record, T0 + 12, 30)
    assert (s.name, s.state, s.devices, s.gpus) == ("gpu-001", "ready", 3, 4)
    assert (s.ports_total, s.ports_active, s.ports_down) == (2, 1, ("mlx5_1/1",))
    assert s.link_layers == ("Ethernet", "InfiniBand")
    assert s.max_rate_gbps == 400.0
    assert s.firmware == ("22.36.1010", "28.39.1002")
    assert (s.last_seen, s.age_s, s.agent_version, s.errors) == (T0, 12.0, "0.1.0", 0)


def test_summary_without_snapshot() -> None:
    record = NodeRecord(name="gpu-009", first_seen=T0, last_seen=T0)
    s = summarize(record, T0, 30)
    assert (s.state, s.devices, s.ports_total, s.max_rate_gbps, s.agent_version) == (
        "no-snapshot", 0, 0, None, None,
    )  # fmt: skip


def test_describe_reports_event_latency() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snapshot(), T0)
    record = fleet.apply_event(port_event(observed_at=T0 + 1), T0 + 1.25).record
    detail = describe(record, T0 + 2, 30)
    (event,) = detail.events
    assert (event.observed_at, event.received_at) == (T0 + 1, T0 + 1.25)
    assert event.latency_ms == pytest.approx(250.0)
    assert detail.summary.ports_down == ("mlx5_0/1",)


def test_load_replaces_and_updates_are_per_node() -> None:
    fleet = Fleet()
    fleet.apply_snapshot(snapshot("gpu-002"), T0)
    other = fleet.apply_snapshot(snapshot("gpu-001"), T0).record
    loaded = NodeRecord(name="gpu-002", first_seen=T0 - 100, last_seen=T0 - 100)
    fleet.load(loaded)
    assert fleet.get("gpu-002") is loaded
    assert fleet.get("gpu-001") is other
    assert len(fleet) == 2
    assert "gpu-001" in fleet
    assert [r.name for r in fleet.records()] == ["gpu-001", "gpu-002"]
    assert Fleet([loaded]).get("gpu-002") is loaded


def test_device_plugin_status_is_kept_newest_first() -> None:
    fleet = Fleet()
    first = DevicePluginStatus(
        node="gpu-001",
        config_generation=1,
        registered=True,
        resources=(ResourceStatus(name="rdma/ib", advertised=8, healthy=8),),
        observed_at=T0,
    )
    record = fleet.apply_status(first, T0).record
    assert record.device_plugin is first
    older = msgspec.structs.replace(first, observed_at=T0 - 1, config_generation=0)
    assert fleet.apply_status(older, T0 + 1).record.device_plugin is first
    assert fleet.ignored == 1
    newer = msgspec.structs.replace(first, observed_at=T0 + 2, registered=False)
    assert fleet.apply_status(newer, T0 + 2).record.device_plugin is newer
    detail = describe(fleet.get("gpu-001") or record, T0 + 3, 30.0)
    assert detail.device_plugin is newer


def test_a_later_event_wins_over_an_older_snapshot_that_arrives_after_it() -> None:
    # The agent re-reads its inventory after every port event: a snapshot collected
    # while the port was down can arrive after the event of its repair.
    fleet = Fleet()
    fleet.apply_snapshot(snapshot(seq=1, collected_at=T0), T0)
    fleet.apply_event(port_event(new="DOWN", old="ACTIVE", observed_at=T0 + 1, seq=1), T0 + 1)
    fleet.apply_event(
        port_event(new="ACTIVE", old="DOWN", phys="LinkUp", observed_at=T0 + 3, seq=2), T0 + 3
    )
    stale = snapshot(seq=2, collected_at=T0 + 2, devices=(device(ports=(port(1, "DOWN"),)),))
    record = fleet.apply_snapshot(stale, T0 + 4).record
    assert record.snapshot is not None and record.snapshot.seq == 2
    assert port_of(record.snapshot, "mlx5_0", 1) == ("ACTIVE", "LinkUp")
    # An event older than the snapshot is not replayed onto it.
    fresh = snapshot(seq=3, collected_at=T0 + 5, devices=(device(ports=(port(1, "DOWN"),)),))
    record = fleet.apply_snapshot(fresh, T0 + 6).record
    assert record.snapshot is not None
    assert port_of(record.snapshot, "mlx5_0", 1)[0] == "DOWN"


def test_netdev_state_events_update_the_live_interface() -> None:
    fleet = Fleet()
    roce = device(ports=(port(1, link_layer="Ethernet"),), netdev="enp26s0f0np0")
    fleet.apply_snapshot(snapshot(devices=(roce,)), T0)
    down = LinkEvent(
        node="gpu-001",
        seq=1,
        kind="netdev-state",
        device="mlx5_0",
        port=1,
        netdev="enp26s0f0np0",
        old_state="up",
        new_state="down",
        observed_at=T0 + 1,
    )
    record = fleet.apply_event(down, T0 + 1).record
    assert record.snapshot is not None
    assert record.snapshot.devices[0].interfaces[0].operstate == "down"
    # A snapshot collected before the event does not bring the old state back.
    record = fleet.apply_snapshot(
        snapshot(seq=2, collected_at=T0 + 0.5, devices=(roce,)), T0 + 2
    ).record
    assert record.snapshot is not None
    assert record.snapshot.devices[0].interfaces[0].operstate == "down"
