"""Counter batches held as received (aggregator.fleet.heldcounters): a delta is stored as its
wire bytes and merged only when read; the ingest's `clean` verdict never hides a problem
data-quality would list."""

from __future__ import annotations

import gc
import math

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.counters.deltas import delta_against
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.heldcounters import (
    CounterBase,
    HeldCounters,
    Shapes,
    ports_clean,
    values_clean,
)
from aggregator.fleet.state import Fleet
from aggregator.rules.counterbase import quiet
from aggregator.rules.dataquality import check_data_quality
from aggregator.rules.descriptor import RuleInput
from aggregator.rules.engine.incremental import IncrementalRules
from aggregator.rules.engine.registry import COUNTER_KEYS
from aggregator.rules.thresholds import DEFAULT_THRESHOLDS
from proto.codec import decode_counters, encode, encode_map
from proto.messages.counters import CounterBatch, PortCounters
from proto.packedcounters import PackedCounterBatch
from tests.support.rules_cases import T0

NODE = "gpu-001"


def port(device: str, rx: int, *, rate: float = 0.0, errors: int = 0) -> PortCounters:
    return PortCounters(
        device=device,
        port=1,
        counters={"port_rcv_data": rx, "symbol_error": errors},
        rx_bytes=rx * 4,
        rates={"counters/port_rcv_data": rate, "rx_bytes": rate * 4},
    )


def full(seq: int, *ports: PortCounters) -> CounterBatch:
    return CounterBatch(node=NODE, seq=seq, collected_at=T0 + seq, interval_s=1.0, ports=ports)


F1 = full(1, port("mlx5_0", 10), port("mlx5_1", 5))
F2 = full(2, port("mlx5_0", 20, rate=10.0), port("mlx5_1", 5))


def delta(base: CounterBatch, current: CounterBatch) -> CounterBatch:
    made = delta_against(base, current)
    assert made is not None
    return made


def test_a_delta_is_held_as_its_bytes_and_merged_on_first_read() -> None:
    fleet = Fleet()
    fleet.apply_counters(F1, T0, encode(F1))
    d2 = delta(F1, F2)
    record = fleet.apply_counters(d2, T0 + 1, encode(d2)).record
    held = record.counters_held
    assert held is not None and not held.is_full
    assert isinstance(held.delta, bytes) and isinstance(held.base.wire, bytes)
    assert held.seq == 2 and held.clean
    assert record.counters_delta == frozenset({"counters/port_rcv_data", "rx_bytes"})
    assert record.counters == F2
    assert record.counters is record.counters  # merged once, then kept


def test_the_decoded_base_is_not_kept_once_a_delta_arrived() -> None:
    fleet = Fleet()
    fleet.apply_counters(F1, T0, encode(F1))
    first = fleet.get(NODE)
    assert first is not None and first.counters is F1  # a full batch reads as decoded
    d2 = delta(F1, F2)
    fleet.apply_counters(d2, T0 + 1, encode(d2))
    del first
    gc.collect()
    assert not any(o is F1 for o in gc.get_referrers(*F1.ports))  # nothing holds it


def test_a_delta_listing_a_port_its_base_lacks_is_ignored_and_counted() -> None:
    fleet = Fleet()
    fleet.apply_counters(F1, T0)
    stray = msgspec.structs.replace(delta(F1, F2), ports=(port("mlx5_9", 1),))
    record = fleet.apply_counters(stray, T0 + 1).record
    assert record.counters == F1 and fleet.unmatched_deltas == 1
    assert record.last_seen == T0 + 1  # alive all the same


def test_a_packed_delta_is_held_like_its_map_form() -> None:
    """Same key set, same verdict, same merged batch, whichever form the delta came in."""
    d2 = delta(F1, F2)
    records = []
    for wire in (encode(d2), encode_map(d2)):
        fleet = Fleet()
        fleet.apply_counters(F1, T0, encode(F1))
        message = decode_counters(wire)
        assert isinstance(message, PackedCounterBatch) == (wire[0] >= 0x90)
        records.append(fleet.apply_counters(message, T0 + 1, wire).record)
    packed, mapped = records
    assert (
        packed.counters_delta
        == mapped.counters_delta
        == frozenset({"counters/port_rcv_data", "rx_bytes"})
    )
    assert packed.counters_held is not None and mapped.counters_held is not None
    assert packed.counters_held.clean and mapped.counters_held.clean
    assert packed.counters == mapped.counters == F2


def test_a_packed_delta_without_its_bytes_is_held_packed_and_unpacked_on_read() -> None:
    fleet = Fleet()
    fleet.apply_counters(F1, T0)
    message = decode_counters(encode(delta(F1, F2)))
    record = fleet.apply_counters(message, T0 + 1).record
    assert record.counters_held is not None and record.counters_held.delta is message
    assert record.counters == F2


@pytest.mark.parametrize(
    ("edit", "clean"),
    [
        pytest.param({}, True, id="fine"),
        pytest.param({"rates": {"rx_bytes": math.nan}}, False, id="nan-rate"),
        pytest.param({"rates": {"rx_bytes": math.inf}}, False, id="inf-rate"),
        pytest.param({"rates": {"rx_bytes": -1.0}}, False, id="negative-rate"),
        pytest.param({"rates": {"a": 1e308, "b": 1e308}}, False, id="sum-overflows"),
        pytest.param({"counters": {"symbol_error": -3}}, False, id="negative-counter"),
        pytest.param({"hw_counters": {"x": -3}}, True, id="negative-hw-counter-not-judged"),
        pytest.param({"saturated": ("counters/symbol_error",)}, False, id="saturated"),
        pytest.param({"resets": ("counters/symbol_error",)}, False, id="reset"),
        pytest.param({"removed": ("counters/symbol_error",)}, False, id="removed"),
    ],
)
def test_clean_is_false_whenever_a_value_may_be_bad(edit: dict[str, object], clean: bool) -> None:
    ports = [msgspec.structs.replace(port("mlx5_0", 1), **edit), port("mlx5_1", 2)]
    assert ports_clean(ports) is clean
    if not any(k in edit for k in ("saturated", "resets", "removed")):
        assert values_clean(ports) is clean


RATES = st.sampled_from((0.0, 1.0, 1e6, -1.0, math.nan, math.inf, -math.inf))
COUNTS = st.sampled_from((0, 1, 2**40, -1))


@settings(max_examples=150, deadline=None)
@given(
    base=st.lists(st.tuples(COUNTS, RATES), min_size=2, max_size=2),
    new=st.lists(st.tuples(COUNTS, RATES), min_size=2, max_size=2),
    wire=st.booleans(),
)
def test_clean_batches_have_no_data_quality_finding(
    base: list[tuple[int, float]], new: list[tuple[int, float]], wire: bool
) -> None:
    """Whatever the values, a batch held `clean` gives data-quality nothing to list."""

    def batch(seq: int, values: list[tuple[int, float]]) -> CounterBatch:
        return full(seq, *(port(f"mlx5_{i}", 1, rate=r, errors=c) for i, (c, r) in
                           enumerate(values)))  # fmt: skip

    b1, b2 = batch(1, base), batch(2, new)
    fleet = Fleet()
    if wire:  # both as the ingest applies them: checked, still packed, with their bytes
        fleet.apply_counters(decode_counters(encode(b1)), T0, encode(b1))
    else:
        fleet.apply_counters(b1, T0)
    d2 = delta(b1, b2)
    if wire:  # as the ingest applies it: checked, still packed, with its bytes
        record = fleet.apply_counters(decode_counters(encode(d2)), T0 + 1, encode(d2)).record
    else:
        record = fleet.apply_counters(d2, T0 + 1).record
    held = record.counters_held
    assert held is not None and record.counters is not None
    assert encode(record.counters) == encode(b2)  # bytes: NaN != NaN
    unjudged = {NODE: msgspec.structs.replace(record, counters_held=HeldCounters.of(b2))}
    found = check_data_quality(RuleInput(unjudged, (), NO_CLUSTER, T0, DEFAULT_THRESHOLDS))
    counters_found = [f for f in found if f.subject != "snapshot"]
    if held.clean:
        assert counters_found == []
    judged = check_data_quality(RuleInput(fleet.view(), (), NO_CLUSTER, T0, DEFAULT_THRESHOLDS))
    assert [f for f in judged if f.subject != "snapshot"] == counters_found


def _rated(seq: int, **rates: float) -> CounterBatch:
    ports = [
        msgspec.structs.replace(
            port(f"mlx5_{i}", 1), rates={"counters/port_rcv_data": 5.0, **rates}
        )
        for i in range(2)
    ]
    return full(seq, *ports)


def test_quiet_is_known_from_the_base_and_the_delta_keys_alone() -> None:
    errors = COUNTER_KEYS["counter-errors"]
    fleet = Fleet()
    f1 = _rated(1, **{"counters/symbol_error": 0.0})
    record = fleet.apply_counters(f1, T0, encode(f1)).record
    assert quiet(record, errors)  # zero, NaN or absent rates only
    busy = _rated(2, **{"counters/symbol_error": 0.0})
    busy = msgspec.structs.replace(
        busy, ports=tuple(msgspec.structs.replace(p, rx_bytes=999) for p in busy.ports)
    )
    record = fleet.apply_counters(
        decode_counters(encode(d := delta(f1, busy))), T0 + 1, encode(d)
    ).record
    assert quiet(record, errors) and not record.counters_held.merged  # type: ignore[union-attr]
    erring = _rated(3, **{"counters/symbol_error": 2.0})
    record = fleet.apply_counters(delta(f1, erring), T0 + 2).record
    assert not quiet(record, errors)  # the delta moved a key the rule reads
    assert quiet(record, frozenset({"hw_counters/rp_cnp_ignored"}))
    f4 = _rated(4, **{"counters/symbol_error": math.inf})
    assert not quiet(fleet.apply_counters(f4, T0 + 3).record, errors)  # inf > 0: read it
    f5 = _rated(5, **{"counters/symbol_error": math.nan})
    assert quiet(fleet.apply_counters(f5, T0 + 4).record, errors)  # NaN: no rule fires on it
    by_hand = msgspec.structs.replace(record, counters_held=HeldCounters.of(f1))
    assert not quiet(by_hand, errors)  # no ingest facts: not known


def test_a_full_evaluation_merges_no_quiet_clean_delta() -> None:
    """Rules starting over (new policies/thresholds) read no batch they can skip: the
    merged batches would stay in memory until each node's next message."""
    fleet = Fleet()
    for n in range(20):
        name = f"gpu-{n:03d}"
        base = msgspec.structs.replace(_rated(1), node=name)
        fleet.apply_counters(base, T0, encode(base))
        busy = msgspec.structs.replace(_rated(2, **{"rx_bytes": 7.0}), node=name)
        d = delta(base, busy)
        fleet.apply_counters(decode_counters(encode(d)), T0 + 1, encode(d))
    IncrementalRules().evaluate(fleet.view(), now=T0 + 2)
    held = [r.counters_held for r in fleet.records()]
    assert all(h is not None and not h.is_full and not h.merged for h in held)


@settings(max_examples=150, deadline=None)
@given(
    values=st.lists(st.tuples(COUNTS, RATES, RATES), min_size=1, max_size=3),
    flag=st.sampled_from(("", "saturated", "resets")),
)
def test_a_packed_base_has_the_facts_of_its_decoded_form(
    values: list[tuple[int, float, float]], flag: str
) -> None:
    ports = [
        msgspec.structs.replace(
            port(f"mlx5_{i}", 1, rate=r, errors=c),
            rates={"counters/port_rcv_data": r, "hw_counters/rp_cnp_ignored": r2},
            **({flag: ("counters/symbol_error",)} if flag and i == 0 else {}),
        )
        for i, (c, r, r2) in enumerate(values)
    ]
    batch = full(1, *ports)
    packed = decode_counters(encode(batch))
    assert isinstance(packed, PackedCounterBatch)
    from_arrays = CounterBase(packed, encode(batch), Shapes())
    decoded = CounterBase(batch, batch, Shapes())
    for fact in ("clean", "moving", "ports", "flagged", "errors", "seq"):
        assert getattr(from_arrays, fact) == getattr(decoded, fact), fact
    fleet = Fleet()
    record = fleet.apply_counters(packed, T0, encode(batch)).record
    assert record.counters_held is not None and not record.counters_held.merged
    read = record.counters  # unpacked when read
    assert read is not None and encode(read) == encode(batch)
