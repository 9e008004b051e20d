"""What the fleet keeps compact: snapshots without per-port counters (negative values
kept for data-quality), interned strings, and the delta key sets of NodeRecord."""

from __future__ import annotations

import math
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.counters.deltas import delta_against
from aggregator.cluster import ClusterView
from aggregator.fleet.state import Fleet
from aggregator.rules.dataquality import check_data_quality
from aggregator.rules.descriptor import RuleInput
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from proto.codec import decode, encode
from proto.compact import inventory_only
from proto.inventory import NodeSnapshot, ReadError
from proto.messages.counters import CounterBatch, PortCounters
from tests.support.builders import T0, device, snapshot

NODE = "gpu-001"
rep = msgspec.structs.replace


def pc(device: str = "mlx5_0", rx: int = 0, err: int = 0, **extra: object) -> PortCounters:
    return PortCounters(
        device=device,
        port=1,
        counters={"port_rcv_data": rx, "symbol_error": err},
        hw_counters={"out_of_sequence": 0},
        rx_bytes=rx * 4,
        rates={"counters/port_rcv_data": float(rx), "rx_bytes": rx * 4.0},
        **extra,  # type: ignore[arg-type]
    )


def full(seq: int, *ports: PortCounters) -> CounterBatch:
    return CounterBatch(node=NODE, seq=seq, collected_at=T0 + seq, ports=ports)


def delta(base: CounterBatch, current: CounterBatch) -> CounterBatch:
    made = delta_against(base, current)
    assert made is not None
    return made


def with_counters(snap: NodeSnapshot, **values: dict[str, int]) -> NodeSnapshot:
    devices = tuple(
        rep(d, ports=tuple(rep(p, rx_bytes=8, tx_bytes=9, **values) for p in d.ports))
        for d in snap.devices
    )
    return rep(snap, devices=devices)


def test_stored_snapshot_drops_port_counters_and_keeps_the_inventory() -> None:
    snap = with_counters(
        snapshot(devices=(device(), device("mlx5_1"))),
        counters={"port_rcv_data": 5},
        hw_counters={"out_of_sequence": 1},
    )
    stored = Fleet().apply_snapshot(snap, T0).record.snapshot
    assert stored is not None and stored.devices
    for d in stored.devices:
        for p in d.ports:
            assert (p.counters, p.counters_ext, p.hw_counters) == ({}, {}, {})
            assert (p.rx_bytes, p.tx_bytes) == (None, None)
    no_counters = with_counters(snap, counters={}, hw_counters={})
    assert stored == rep(no_counters, devices=tuple(
        rep(d, ports=tuple(rep(p, rx_bytes=None, tx_bytes=None) for p in d.ports))
        for d in no_counters.devices
    ))  # fmt: skip


def test_inventory_only_interns_shared_strings_and_is_idempotent() -> None:
    a = decode(encode(snapshot(node="n-1", devices=(device(),))), NodeSnapshot)
    b = decode(encode(snapshot(node="n-2", devices=(device(),))), NodeSnapshot)
    assert a.devices[0].name is not b.devices[0].name  # decoded apart: two copies
    sa, sb = inventory_only(a), inventory_only(b)
    assert sa.devices[0].name is sb.devices[0].name
    assert sa.agent_version is sb.agent_version
    assert inventory_only(sa) == sa


def test_negative_snapshot_counters_are_kept_for_data_quality() -> None:
    bad = with_counters(
        snapshot(), counters={"port_rcv_data": 5, "symbol_error": -3}, hw_counters={"x": -1}
    )
    fleet = Fleet()
    stored = fleet.apply_snapshot(bad, T0).record.snapshot
    assert stored is not None
    kept = stored.devices[0].ports[0]
    assert (kept.counters, kept.hw_counters) == ({"symbol_error": -3}, {"x": -1})
    found = check_data_quality(RuleInput(fleet.view(), (), ClusterView(), T0, DEFAULT_THRESHOLDS))
    text = " ".join(f.message for f in found)
    assert "counters/symbol_error is negative (-3)" in text
    assert "hw_counters/x is negative (-1)" in text


def test_restart_from_kv_stores_the_same_compact_snapshot() -> None:
    snap = with_counters(snapshot(), counters={"port_rcv_data": 5})
    first = Fleet().apply_snapshot(snap, T0).record.snapshot
    assert first is not None
    again = Fleet().apply_snapshot(decode(encode(first), NodeSnapshot), T0).record.snapshot
    assert again == first


F1 = full(1, pc("mlx5_0", rx=10), pc("mlx5_1", rx=5))


def keys_of(*messages: CounterBatch) -> tuple[int | None, frozenset[str] | None]:
    fleet = Fleet()
    for n, message in enumerate(messages):
        fleet.apply_counters(message, received_at=T0 + 100 + n)
    record = fleet.get(NODE)
    assert record is not None
    return record.counters_base_seq, record.counters_delta


def test_a_full_batch_is_its_own_base_with_no_delta() -> None:
    assert keys_of(F1) == (1, frozenset())


def test_a_delta_names_its_base_and_the_keys_it_lists_over_all_ports() -> None:
    f2 = full(2, pc("mlx5_0", rx=20), pc("mlx5_1", rx=5))
    f3 = full(3, pc("mlx5_0", rx=10), pc("mlx5_1", rx=5, err=2))
    assert keys_of(F1, delta(F1, f2)) == (1, frozenset({"counters/port_rcv_data", "rx_bytes"}))
    assert keys_of(F1, delta(F1, f3)) == (1, frozenset({"counters/symbol_error"}))


def test_a_delta_equal_to_its_base_changes_nothing() -> None:
    assert keys_of(F1, delta(F1, rep(F1, seq=2))) == (1, frozenset())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"saturated": ("counters/symbol_error",)}, id="saturated"),
        pytest.param({"resets": ("counters/port_rcv_data",)}, id="resets"),
    ],
)
def test_saturated_or_reset_counters_make_the_delta_unknown(change: dict[str, Any]) -> None:
    f2 = full(2, pc("mlx5_0", rx=20, **change), pc("mlx5_1", rx=5))
    assert keys_of(F1, delta(F1, f2)) == (None, None)


def test_removed_keys_make_the_delta_unknown() -> None:
    gone = rep(F1.ports[0], hw_counters={})
    f2 = full(2, gone, F1.ports[1])
    made = delta(F1, f2)
    assert made.ports[0].removed
    assert keys_of(F1, made) == (None, None)


def test_a_base_port_that_was_saturated_makes_the_delta_unknown() -> None:
    base = full(1, pc("mlx5_0", rx=10, saturated=("counters/symbol_error",)), F1.ports[1])
    f2 = full(2, pc("mlx5_0", rx=20), F1.ports[1])  # no longer saturated
    assert keys_of(base, delta(base, f2)) == (None, None)


def test_other_errors_than_the_base_make_the_delta_unknown() -> None:
    f2 = rep(full(2, pc("mlx5_0", rx=20), F1.ports[1]), errors=(ReadError(path="/x", error="EIO"),))
    assert keys_of(F1, delta(F1, f2)) == (None, None)


def test_equal_key_sets_are_shared_between_nodes() -> None:
    fleet = Fleet()
    sets = []
    for node in ("a", "b"):
        base = rep(F1, node=node)
        f2 = rep(full(2, pc("mlx5_0", rx=20), pc("mlx5_1", rx=9)), node=node)
        fleet.apply_counters(base, T0)
        record = fleet.apply_counters(delta(base, f2), T0 + 1).record
        sets.append(record.counters_delta)
    assert sets[0] is not None and sets[0] is sets[1]
    assert sets[0] == frozenset({"counters/port_rcv_data", "rx_bytes"})


def test_an_unmatched_delta_keeps_the_stored_key_fields() -> None:
    fleet = Fleet()
    fleet.apply_counters(F1, T0)
    stray = rep(delta(F1, full(2, pc("mlx5_0", rx=20), F1.ports[1])), base_seq=7)
    record = fleet.apply_counters(stray, T0 + 1).record
    assert (record.counters_base_seq, record.counters_delta) == (1, frozenset())


VALUES = st.dictionaries(st.sampled_from(("a", "b", "c")), st.sampled_from((0, 7, -2)), max_size=3)
RATES = st.dictionaries(
    st.sampled_from(("counters/a", "hw_counters/b", "rx_bytes")),
    st.sampled_from((0.0, 5.0, -1.0, math.nan)),
    max_size=3,
)
PORT = st.builds(
    lambda c, h, r, rx: PortCounters(
        device="mlx5_0", port=1, counters=c, hw_counters=h, rates=r, rx_bytes=rx
    ),
    VALUES,
    VALUES,
    RATES,
    st.sampled_from((None, 4, 8)),
)


def _values(p: PortCounters) -> dict[str, object]:
    out: dict[str, object] = {f"rates/{k}": v for k, v in p.rates.items()}
    out |= {f"counters/{k}": v for k, v in p.counters.items()}
    out |= {f"hw_counters/{k}": v for k, v in p.hw_counters.items()}
    out |= {"rx_bytes": p.rx_bytes}
    return out


@given(base=PORT, now=st.lists(PORT, min_size=1, max_size=3))
def test_keys_outside_the_delta_hold_the_base_values(
    base: PortCounters, now: list[PortCounters]
) -> None:
    fleet = Fleet()
    first = full(1, base)
    fleet.apply_counters(first, T0)
    for n, current in enumerate(now, start=2):
        record = fleet.apply_counters(delta(first, full(n, current)), T0 + n).record
        assert record.counters is not None
        merged = record.counters.ports[0]
        assert _values(merged).keys() == _values(current).keys()
        if record.counters_delta is None:
            continue
        assert record.counters_base_seq == 1
        before, after = _values(base), _values(merged)
        for key in before.keys() | after.keys():
            plain = key.removeprefix("rates/")
            if plain not in record.counters_delta:
                assert repr(before.get(key)) == repr(after.get(key)), key
