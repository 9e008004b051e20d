"""Packed CounterBatch encoding: decodes to exactly the batch that was packed (full,
delta, property-tested), the map form of older agents still decodes, a checked-in packed
payload keeps decoding, and bad packed input is one CodecError naming the field."""

from __future__ import annotations

import contextlib
import math
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proto.codec import CodecError, decode, decode_counters, encode, encode_map, field_path
from proto.inventory import ReadError
from proto.messages.counters import CounterBatch, PortCounters
from proto.packedcounters import (
    CleanPackedCounterBatch,
    CleanPackedPort,
    PackedCounterBatch,
    PackedPort,
    pack,
    unpack,
)
from tests.support.paths import REPO

DATA = REPO / "tests" / "data"
PACKED_V1 = DATA / "counters-v1-packed.msgpack"


def port(device: str = "mlx5_0", number: int = 1, **changes: Any) -> PortCounters:
    values: dict[str, Any] = {
        "counters": {"port_rcv_data": 10, "symbol_error": 0},
        "counters_ext": {"port_rcv_data_64": 2**64 - 1},
        "hw_counters": {"out_of_buffer": 3, "np_cnp_sent": 0},
        "rx_bytes": 40,
        "tx_bytes": 80,
        "rates": {"counters/port_rcv_data": 2.5, "hw_counters/np_cnp_sent": 0.0, "rx_bytes": 8.0},
        "saturated": ("counters/symbol_error",),
        "resets": ("hw_counters/out_of_buffer",),
    }
    values.update(changes)
    return PortCounters(device=device, port=number, **values)


def batch(**changes: Any) -> CounterBatch:
    values: dict[str, Any] = {
        "node": "gpu-01",
        "seq": 7,
        "collected_at": 1.5,
        "interval_s": 1.0,
        "ports": (port(), port(number=2), port("mlx5_1", 1, counters_ext={})),
        "errors": (ReadError(path="/sys/x", error="EIO"),),
    }
    values.update(changes)
    return CounterBatch(**values)


DELTA = batch(
    seq=9,
    base_seq=7,
    ports=(
        port(
            counters={"port_rcv_data": 99},
            counters_ext={},
            hw_counters={},
            rx_bytes=None,
            rates={"counters/port_rcv_data": 89.0},
            saturated=(),
            resets=(),
            removed=("hw_counters/np_cnp_sent", "rates/rx_bytes", "tx_bytes"),
        ),
    ),
)


@pytest.mark.parametrize(
    "message",
    [batch(), DELTA, batch(ports=()), batch(ports=(PortCounters(device="d", port=1),))],
    ids=["full", "delta", "no-ports", "empty-port"],
)
def test_packed_and_map_forms_decode_to_the_same_batch(message: CounterBatch) -> None:
    assert decode(packed(message), CounterBatch) == message
    assert decode(encode_map(message), CounterBatch) == message
    assert decode(encode(message), CounterBatch) == message
    assert unpack(pack(message)) == message


def packed(message: CounterBatch) -> bytes:
    return encode(pack(message))


def test_full_batches_and_deltas_go_out_packed() -> None:
    assert msgspec.msgpack.decode(encode(batch()))[0] == "nicfleet.v1.PackedCounterBatch"
    assert msgspec.msgpack.decode(encode(DELTA))[0] == "nicfleet.v1.PackedCounterBatch"


def test_the_ingest_takes_a_packed_batch_checked_and_packed() -> None:
    for message in (DELTA, batch()):
        held = decode_counters(encode(message))
        assert isinstance(held, PackedCounterBatch) and unpack(held) == message
    assert decode_counters(encode_map(DELTA)) == DELTA  # an older agent's map


def test_packed_is_an_array_and_much_smaller() -> None:
    many = batch(ports=tuple(port(number=n) for n in range(1, 17)))
    assert msgspec.msgpack.decode(encode(many))[0] == "nicfleet.v1.PackedCounterBatch"
    assert len(encode(many)) * 3 < len(encode_map(many))


def test_ports_of_one_kind_share_one_layout_and_names_are_sent_once() -> None:
    packed = pack(batch(ports=tuple(port(number=n) for n in range(1, 17))))
    assert len(packed.layouts) == 1
    assert len(packed.names) == len(set(packed.names))


def test_whole_number_rates_travel_as_ints_and_decode_as_floats() -> None:
    decoded = decode(encode(batch()), CounterBatch)
    rates = decoded.ports[0].rates
    assert rates == {"counters/port_rcv_data": 2.5, "hw_counters/np_cnp_sent": 0.0, "rx_bytes": 8.0}
    assert all(type(r) is float for r in rates.values())
    raw = msgspec.msgpack.decode(encode(batch()))
    assert 0 in raw[9][0][8]  # ports[0].rate_values holds int 0 for 0.0


def test_checked_in_packed_payload_still_decodes() -> None:
    # Written once by `pack(batch())` of the first packed format; must keep decoding.
    assert decode(PACKED_V1.read_bytes(), CounterBatch) == batch()


def test_extra_trailing_elements_of_a_newer_agent_are_ignored() -> None:
    raw = msgspec.msgpack.decode(encode(batch()))
    raw[9][0].append("future port field")
    raw[8][0].append([1, 2])  # a future layout field
    raw.append({"future": "batch field"})
    assert decode(msgspec.msgpack.encode(raw), CounterBatch) == batch()


def _mutated(*path_and_value: Any) -> bytes:
    *path, value = path_and_value
    raw = msgspec.msgpack.decode(encode(batch()))
    target = raw
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return msgspec.msgpack.encode(raw)


# Positions in the packed arrays (schema first): batch 7 names, 8 layouts, 9 ports, 10 errors;
# layout 0 counters, 1 counters_ext, 2 hw_counters, 3 rates; port 2 layout, 3 counter_values,
# 5 hw_counters_values, 8 rate_values, 9 saturated.
@pytest.mark.parametrize(
    ("payload", "path"),
    [
        pytest.param(_mutated(3, "seven"), "$.seq", id="wrong-type-top"),
        pytest.param(_mutated(0, "nicfleet.v1.Alert"), "$.schema", id="other-schema"),
        pytest.param(_mutated(9, 0, 3, 1, "x"), "$.ports[0].counter_values[1]", id="value-type"),
        pytest.param(_mutated(8, 0, 0, 1, -1), "$.layouts[0].counters[1]", id="negative-index"),
        pytest.param(_mutated(8, 0, 0, 1, 99), "$.layouts[0].counters", id="index-beyond"),
        pytest.param(_mutated(8, 0, 2, 0, 0), "$.layouts[0].hw_counters", id="misfiled-name"),
        pytest.param(_mutated(8, 0, 3, 0, 99), "$.layouts[0].rates", id="rate-beyond"),
        pytest.param(_mutated(9, 1, 2, 7), "$.ports[1].layout", id="no-such-layout"),
        pytest.param(_mutated(9, 0, 5, [1]), "$.ports[0].hw_counters_values", id="short-values"),
        pytest.param(_mutated(9, 2, 8, [1.0]), "$.ports[2].rate_values", id="short-rates"),
        pytest.param(_mutated(9, 0, 9, [99]), "$.ports[0].saturated", id="saturated-beyond"),
        pytest.param(_mutated(10, 0, "path", 5), "$.errors[0].path", id="map-inside-array"),
        pytest.param(_mutated(7, 0, 5), "$.names[0]", id="name-not-string"),
        pytest.param(encode(batch())[:-9], "$", id="truncated"),
        pytest.param(
            msgspec.msgpack.encode(["nicfleet.v1.PackedCounterBatch", 1]), "$", id="short"
        ),
    ],
)
def test_bad_packed_payloads_name_the_field(payload: bytes, path: str) -> None:
    with pytest.raises(CodecError) as info:
        decode(payload, CounterBatch)
    assert info.value.type_name == "CounterBatch"
    assert info.value.path == path
    assert path in str(info.value)
    as_delta = payload
    with contextlib.suppress(msgspec.DecodeError):
        raw = msgspec.msgpack.decode(payload)
        if len(raw) > 6:
            raw[6] = 1  # base_seq: a delta, which the ingest checks without unpacking
            as_delta = msgspec.msgpack.encode(raw)
    with pytest.raises(CodecError) as checked:
        decode_counters(as_delta)
    assert checked.value.path == path


def test_field_path_names_array_like_fields() -> None:
    assert field_path("$[9][0][3][1]", PackedCounterBatch) == "$.ports[0].counter_values[1]"
    assert field_path("$[0]", PackedCounterBatch) == "$.schema"
    assert field_path("$[10][2].error", PackedCounterBatch) == "$.errors[2].error"
    assert field_path("$[42][1]", PackedCounterBatch) == "$[42][1]"  # beyond: left as is


names = st.text(st.sampled_from("abcdefghijklmnopqrstuvwxyz_0123456789"), min_size=1, max_size=12)
u64 = st.integers(min_value=0, max_value=2**64 - 1)
rates = st.floats(allow_nan=False, width=64) | st.integers(-(2**60), 2**60).map(float)
rate_keys = st.sampled_from(["rx_bytes", "tx_bytes"]) | st.builds(
    "{}/{}".format, st.sampled_from(["counters", "counters_ext", "hw_counters"]), names
)
ports = st.builds(
    PortCounters,
    device=st.sampled_from(["mlx5_0", "mlx5_1"]),
    port=st.integers(1, 2),
    counters=st.dictionaries(names, u64, max_size=6),
    counters_ext=st.dictionaries(names, u64, max_size=3),
    hw_counters=st.dictionaries(names, u64, max_size=6),
    rx_bytes=st.none() | u64,
    tx_bytes=st.none() | u64,
    rates=st.dictionaries(rate_keys, rates, max_size=6),
    saturated=st.lists(rate_keys, max_size=2).map(tuple),
    resets=st.lists(rate_keys, max_size=2).map(tuple),
    removed=st.lists(st.sampled_from(["rx_bytes", "rates/rx_bytes"]) | rate_keys, max_size=2).map(
        tuple
    ),
)
batches = st.builds(
    CounterBatch,
    node=names,
    seq=st.integers(0, 2**40),
    collected_at=st.floats(0, 2e9),
    interval_s=st.none() | st.floats(0.001, 100),
    ports=st.lists(ports, max_size=5).map(tuple),
    base_seq=st.none() | st.integers(0, 2**40),
)


@settings(max_examples=300, deadline=None)
@given(batches)
def test_any_batch_round_trips_packed(message: CounterBatch) -> None:
    assert decode(packed(message), CounterBatch) == message
    assert decode(encode(message), CounterBatch) == message
    ingested = decode_counters(encode(message))
    assert (unpack(ingested) if isinstance(ingested, PackedCounterBatch) else ingested) == message


@settings(max_examples=300, deadline=None)
@given(batches, st.lists(st.tuples(st.integers(0, 40), st.integers(-3, 60)), max_size=4))
def test_corrupted_indexes_give_a_codec_error_or_a_batch(
    message: CounterBatch, edits: list[tuple[int, int]]
) -> None:
    """Overwrite ints anywhere in the packed arrays: never anything but CodecError."""
    raw = msgspec.msgpack.decode(packed(message))
    slots: list[tuple[list[Any], int]] = []

    def collect(node: Any) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                if isinstance(item, int) and not isinstance(item, bool):
                    slots.append((node, i))
                collect(item)

    collect(raw)
    for where, value in edits:
        if slots:
            target, i = slots[where % len(slots)]
            target[i] = value
    with contextlib.suppress(CodecError):
        assert isinstance(decode(msgspec.msgpack.encode(raw), CounterBatch), CounterBatch)
    with contextlib.suppress(CodecError):  # checked, not unpacked: it must unpack later
        ingested = decode_counters(msgspec.msgpack.encode(raw))
        if isinstance(ingested, PackedCounterBatch):
            assert isinstance(unpack(ingested), CounterBatch)


def test_clean_types_are_the_same_wire_form() -> None:
    """The stricter types decode the same arrays: same fields in the same order, same tag."""
    pairs: list[tuple[Any, Any]] = [
        (CleanPackedPort, PackedPort),
        (CleanPackedCounterBatch, PackedCounterBatch),
    ]
    for strict, lenient in pairs:
        assert [f.name for f in msgspec.structs.fields(strict)] == [
            f.name for f in msgspec.structs.fields(lenient)
        ]
    message = batch(ports=(port(saturated=(), resets=()),), errors=())
    ingested = decode_counters(encode(message))
    assert type(ingested) is CleanPackedCounterBatch
    plain = msgspec.msgpack.decode(encode(message), type=PackedCounterBatch)
    assert msgspec.msgpack.encode(ingested) == msgspec.msgpack.encode(plain)
    assert unpack(ingested) == message


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"rates": {"rx_bytes": math.nan}}, "NaN rate"),
        ({"rates": {"rx_bytes": math.inf}}, "infinite rate"),
        ({"rates": {"rx_bytes": -1.0}}, "negative rate"),
        ({"counters": {"port_rcv_data": -1}}, "negative counter"),
        ({"saturated": ("counters/port_rcv_data",), "resets": ()}, "saturated"),
        ({"resets": ("counters/port_rcv_data",), "saturated": ()}, "reset"),
        ({"removed": ("rx_bytes",), "saturated": (), "resets": ()}, "removed"),
    ],
)
def test_a_value_to_look_at_decodes_as_a_plain_packed_batch(
    changes: dict[str, Any], why: str
) -> None:
    clean = port(saturated=(), resets=())
    message = batch(ports=(clean, msgspec.structs.replace(clean, port=2, **changes)))
    ingested = decode_counters(encode(message))
    assert type(ingested) is PackedCounterBatch, why
    assert encode(unpack(ingested)) == encode(message)


def test_a_bad_payload_names_the_field_whichever_decoder_saw_it_first() -> None:
    raw = msgspec.msgpack.decode(encode(batch(errors=())))
    raw[9][0][3] = ["x"]  # a counter value that is not an int
    with pytest.raises(CodecError) as caught:
        decode_counters(msgspec.msgpack.encode(raw))
    assert caught.value.path == "$.ports[0].counter_values[0]"


signed = st.integers(min_value=-3, max_value=2**64 - 1)
any_rate = st.floats(width=64) | st.sampled_from([0.0, -0.0, 1.0])
looked_at = st.builds(
    PortCounters,
    device=st.sampled_from(["mlx5_0", "mlx5_1"]),
    port=st.integers(1, 2),
    counters=st.dictionaries(names, signed, max_size=4),
    rates=st.dictionaries(rate_keys, any_rate, max_size=4),
    saturated=st.lists(rate_keys, max_size=1).map(tuple),
    resets=st.lists(rate_keys, max_size=1).map(tuple),
    removed=st.lists(rate_keys, max_size=1).map(tuple),
)


def _nothing_to_look_at(port: PortCounters) -> bool:
    return (
        not (port.saturated or port.resets or port.removed)
        and all(v >= 0 for v in port.counters.values())
        and all(math.isfinite(r) and r >= 0 for r in port.rates.values())
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(looked_at, max_size=4).map(tuple))
def test_a_batch_decodes_clean_exactly_when_no_port_has_a_value_to_look_at(
    ports: tuple[PortCounters, ...],
) -> None:
    message = CounterBatch(node="n", seq=1, collected_at=1.0, ports=ports)
    ingested = decode_counters(encode(message))
    assert (type(ingested) is CleanPackedCounterBatch) == all(map(_nothing_to_look_at, ports))
    assert isinstance(ingested, PackedCounterBatch)
    assert encode(unpack(ingested)) == encode(message)


def test_the_epoch_travels_last_and_a_batch_without_it_decodes_as_epoch_0() -> None:
    # docs/wire.md "Ordering": appended after `errors`, so older decoders ignore it.
    stamped = batch(epoch=1_800_000_000_123_456_789)
    raw = msgspec.msgpack.decode(encode(stamped))
    assert raw[-1] == 1_800_000_000_123_456_789
    assert decode(encode(stamped), CounterBatch) == stamped
    assert decode_counters(encode(stamped)).epoch == stamped.epoch
    assert decode(msgspec.msgpack.encode(raw[:-1]), CounterBatch).epoch == 0
