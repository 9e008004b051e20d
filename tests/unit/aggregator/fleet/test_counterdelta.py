"""Table tests of agent.counters.deltas: what a delta carries and when a full batch goes out."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agent.counters.deltas import DeltaEncoder, delta_against, port_delta
from aggregator.fleet.state import merge_counter_delta
from proto.codec import decode, encode
from proto.messages.counters import CounterBatch, PortCounters

T0 = 1_800_000_000.0
IDLE = PortCounters(
    device="mlx5_0",
    port=1,
    counters={"port_rcv_data": 100, "symbol_error": 0},
    hw_counters={"out_of_buffer": 3},
    rx_bytes=400,
    tx_bytes=0,
    rates={"counters/port_rcv_data": 0.0, "counters/symbol_error": 0.0, "rx_bytes": 0.0},
)


def batch(
    *ports: PortCounters, seq: int = 1, at: float = T0, base: int | None = None
) -> CounterBatch:
    return CounterBatch(
        node="gpu-001", seq=seq, collected_at=at, interval_s=1.0, ports=ports, base_seq=base
    )


def with_(base: PortCounters, **changes: Any) -> PortCounters:
    return msgspec.structs.replace(base, **changes)


def change(**fields: Any) -> PortCounters:
    return PortCounters(device="mlx5_0", port=1, **fields)


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        pytest.param(IDLE, None, id="unchanged"),
        pytest.param(
            with_(IDLE, counters={"port_rcv_data": 150, "symbol_error": 0}, rx_bytes=600),
            change(counters={"port_rcv_data": 150}, rx_bytes=600),
            id="counter-and-bytes-moved",
        ),
        pytest.param(
            with_(IDLE, rates=IDLE.rates | {"counters/port_rcv_data": 50.0}),
            change(rates={"counters/port_rcv_data": 50.0}),
            id="rate-changed",
        ),
        pytest.param(
            with_(IDLE, hw_counters={"out_of_buffer": 3, "rx_write_requests": 7}),
            change(hw_counters={"rx_write_requests": 7}),
            id="counter-appeared",
        ),
        pytest.param(
            with_(IDLE, counters={"port_rcv_data": 100}, rates={"rx_bytes": 0.0}),
            change(
                removed=(
                    "counters/symbol_error",
                    "rates/counters/port_rcv_data",
                    "rates/counters/symbol_error",
                ),
            ),
            id="counter-and-rates-gone",
        ),
        pytest.param(with_(IDLE, rx_bytes=None), change(removed=("rx_bytes",)), id="bytes-gone"),
        pytest.param(
            with_(IDLE, saturated=("counters/symbol_error",)),
            change(saturated=("counters/symbol_error",)),
            id="saturation-is-sent-whole",
        ),
        pytest.param(
            with_(IDLE, resets=("rx_bytes",), rates={}),
            change(
                resets=("rx_bytes",),
                removed=(
                    "rates/counters/port_rcv_data",
                    "rates/counters/symbol_error",
                    "rates/rx_bytes",
                ),
            ),
            id="reset-drops-rates",
        ),
    ],
)
def test_port_delta(current: PortCounters, expected: PortCounters | None) -> None:
    assert port_delta(IDLE, current) == expected


def test_resets_clearing_lists_the_port_with_empty_tuples() -> None:
    reset = with_(IDLE, resets=("rx_bytes",))
    assert port_delta(reset, IDLE) == change(resets=())


def test_delta_lists_only_changed_ports_and_keeps_batch_fields() -> None:
    busy = with_(IDLE, device="mlx5_1")
    full = batch(IDLE, busy, seq=5)
    moved = with_(busy, counters={"port_rcv_data": 999, "symbol_error": 0})
    current = CounterBatch(
        node="gpu-001", seq=6, collected_at=T0 + 1, interval_s=0.98, ports=(IDLE, moved)
    )
    delta = delta_against(full, current)
    assert delta is not None
    assert delta.base_seq == 5 and delta.seq == 6 and delta.interval_s == 0.98
    assert delta.ports == (PortCounters(device="mlx5_1", port=1, counters={"port_rcv_data": 999}),)
    assert merge_counter_delta(full, delta) == current


@pytest.mark.parametrize(
    "ports",
    [
        pytest.param((IDLE, with_(IDLE, port=2)), id="port-added"),
        pytest.param((), id="port-removed"),
        pytest.param((with_(IDLE, device="mlx5_1"),), id="port-replaced"),
    ],
)
def test_a_changed_port_set_needs_a_full_batch(ports: tuple[PortCounters, ...]) -> None:
    assert delta_against(batch(IDLE), batch(*ports, seq=2, at=T0 + 1)) is None


def test_deltas_are_taken_between_full_batches_only() -> None:
    with pytest.raises(ValueError, match="full batches"):
        delta_against(batch(IDLE, base=0), batch(IDLE, seq=2))


def test_an_idle_node_sends_an_empty_delta_that_still_decodes() -> None:
    delta = delta_against(batch(IDLE), batch(IDLE, seq=2, at=T0 + 1))
    assert delta is not None and delta.ports == ()
    assert decode(encode(delta), CounterBatch) == delta
    assert len(encode(delta)) < len(encode(batch(IDLE)))


def kinds(encoder: DeltaEncoder, rounds: int, fail: set[int], rebase_at: set[int]) -> str:
    """'F' or 'd' per round, publishing fails in rounds `fail`, rebase before `rebase_at`."""
    out = ""
    for n in range(1, rounds + 1):
        if n in rebase_at:
            encoder.rebase()
        message = encoder.encode(batch(IDLE, seq=n, at=T0 + n))
        encoder.sent(message, n not in fail)
        out += "F" if message.base_seq is None else "d"
        if message.base_seq is not None:
            assert message.base_seq < n
    return out


@pytest.mark.parametrize(
    ("full_every", "fail", "rebase_at", "expected"),
    [
        pytest.param(4, set(), set(), "FdddFdddFd", id="periodic"),
        pytest.param(1, set(), set(), "FFFFFFFFFF", id="deltas-off"),
        pytest.param(4, {1, 2}, set(), "FFFdddFddd", id="unsent-full-is-no-base"),
        pytest.param(4, {2, 3}, set(), "FdddFdddFd", id="unsent-delta-changes-nothing"),
        pytest.param(4, set(), {3, 8}, "FdFdddFFdd", id="rebase-on-reconnect"),
    ],
)
def test_encoder_schedule(
    full_every: int, fail: set[int], rebase_at: set[int], expected: str
) -> None:
    assert kinds(DeltaEncoder(full_every=full_every), 10, fail, rebase_at) == expected


def test_deltas_name_the_last_full_batch_sent() -> None:
    encoder = DeltaEncoder(full_every=3)
    names = []
    for n in range(1, 8):
        message = encoder.encode(batch(IDLE, seq=n, at=T0 + n))
        encoder.sent(message, True)
        names.append(message.base_seq)
    assert names == [None, 1, 1, None, 4, 4, None]


def test_rebase_during_a_full_publish_still_forces_the_next_full() -> None:
    encoder = DeltaEncoder(full_every=30)
    message = encoder.encode(batch(IDLE))
    encoder.rebase()  # the reconnect callback ran while the full batch was being sent
    encoder.sent(message, True)
    assert encoder.encode(batch(IDLE, seq=2, at=T0 + 1)).base_seq is None


def test_a_port_set_change_sends_a_full_batch_and_rebases() -> None:
    encoder = DeltaEncoder(full_every=30)
    rounds = [batch(IDLE), batch(IDLE, with_(IDLE, port=2), seq=2, at=T0 + 1),
              batch(IDLE, with_(IDLE, port=2), seq=3, at=T0 + 2)]  # fmt: skip
    sent = []
    for current in rounds:
        message = encoder.encode(current)
        encoder.sent(message, True)
        sent.append(message.base_seq)
    assert sent == [None, None, 2]


@pytest.mark.parametrize("full_every", [0, -1])
def test_full_every_must_be_positive(full_every: int) -> None:
    with pytest.raises(ValueError, match="full_every"):
        DeltaEncoder(full_every=full_every)


def test_a_base_without_rates_is_replaced_by_the_first_batch_with_rates() -> None:
    encoder = DeltaEncoder(full_every=30)
    first = msgspec.structs.replace(batch(IDLE), interval_s=None, ports=(with_(IDLE, rates={}),))
    sent = []
    for message_in in (first, batch(IDLE, seq=2, at=T0 + 1), batch(IDLE, seq=3, at=T0 + 2)):
        message = encoder.encode(message_in)
        encoder.sent(message, True)
        sent.append(message.base_seq)
    assert sent == [None, None, 2]


def test_a_delta_not_smaller_than_the_full_batch_is_sent_full() -> None:
    """Busy ports change every value: the packed full batch is then the cheaper message."""
    sizes = {"full": 100, "delta": 100}

    def size(message: CounterBatch) -> int:
        return sizes["delta" if message.base_seq is not None else "full"]

    encoder = DeltaEncoder(full_every=30, size=size)
    sent = []
    for n, delta_size in enumerate((0, 99, 100, 150, 10), start=1):
        sizes["delta"] = delta_size
        message = encoder.encode(batch(IDLE, seq=n, at=T0 + n))
        encoder.sent(message, True)
        sent.append(message.base_seq)
    # 99 < 100: a delta on 1; 100 and 150 are not smaller: full (each a new base); 10: delta.
    assert sent == [None, 1, None, None, 4]
