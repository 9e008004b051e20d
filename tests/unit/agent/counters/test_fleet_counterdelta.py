"""Fleet.apply_counters with counter deltas: table tests of the merge and a property test
that full+deltas give exactly the fleet view of the equivalent full batches."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.counters.deltas import DeltaEncoder, delta_against
from agent.counters.rates import with_rates
from aggregator.fleet.state import Fleet, merge_counter_delta
from proto.codec import CodecError, decode, encode, encode_map
from proto.messages.counters import CounterBatch, PortCounters
from tests.support.paths import REPO

T0 = 1_800_000_000.0
NODE = "gpu-001"
DATA = REPO / "tests" / "data"


def port(device: str = "mlx5_0", rx: int = 0, errors: int = 0) -> PortCounters:
    return PortCounters(
        device=device,
        port=1,
        counters={"port_rcv_data": rx, "symbol_error": errors},
        rx_bytes=rx * 4,
    )


def full(seq: int, *ports: PortCounters, at: float | None = None) -> CounterBatch:
    return CounterBatch(
        node=NODE, seq=seq, collected_at=T0 + seq if at is None else at, ports=ports
    )


def delta(base: CounterBatch, current: CounterBatch) -> CounterBatch:
    made = delta_against(base, current)
    assert made is not None
    return made


F1 = full(1, port("mlx5_0", rx=10), port("mlx5_1", rx=5))
F2 = full(2, port("mlx5_0", rx=20), port("mlx5_1", rx=5))
F3 = full(3, port("mlx5_0", rx=30), port("mlx5_1", rx=6, errors=1))


def counters_after(*messages: CounterBatch) -> tuple[CounterBatch | None, Fleet]:
    fleet = Fleet()
    for n, message in enumerate(messages):
        fleet.apply_counters(message, received_at=T0 + 100 + n)
    record = fleet.get(NODE)
    return (record.counters if record is not None else None), fleet


def test_a_delta_on_its_full_batch_stores_the_full_batch_it_stands_for() -> None:
    stored, fleet = counters_after(F1, delta(F1, F2), delta(F1, F3))
    assert stored == F3 and stored is not None and stored.base_seq is None
    assert fleet.ignored == 0


def test_unchanged_ports_keep_the_base_objects() -> None:
    stored, _ = counters_after(F1, delta(F1, F2))
    assert stored is not None and stored.ports[1] is F1.ports[1]


@pytest.mark.parametrize(
    ("messages", "expected", "unmatched"),
    [
        pytest.param((delta(F1, F2),), None, 1, id="no-base-yet"),
        pytest.param((F1, delta(F2, F3)), F1, 1, id="gap-base-not-held"),
        pytest.param((F1, delta(F1, F3), delta(F1, F2)), F3, 0, id="out-of-order-older-delta"),
        pytest.param((F1, delta(F1, F2), F3), F3, 0, id="full-replaces"),
        pytest.param((F2, F1, delta(F1, F3)), F2, 1, id="late-full-is-not-a-base"),
        pytest.param((F1, delta(F1, F2), delta(F1, F2)), F2, 0, id="redelivery"),
    ],
)
def test_apply_order(
    messages: tuple[CounterBatch, ...], expected: CounterBatch | None, unmatched: int
) -> None:
    stored, fleet = counters_after(*messages)
    assert stored == expected
    assert fleet.unmatched_deltas == unmatched


def test_an_unmatched_delta_keeps_the_node_fresh_but_stores_nothing() -> None:
    fleet = Fleet()
    fleet.apply_counters(F1, received_at=T0)
    before = fleet.get(NODE)
    record = fleet.apply_counters(delta(F2, F3), received_at=T0 + 50).record
    assert before is not None and record.counters is before.counters
    assert record.last_seen == T0 + 50 and record.counters_received_at == T0


def test_after_an_agent_restart_deltas_of_the_old_process_find_no_base() -> None:
    old = [full(seq, port("mlx5_0", rx=seq), port("mlx5_1")) for seq in (40, 41)]
    restarted = full(1, port("mlx5_0", rx=1), port("mlx5_1"), at=T0 + 500)
    stored, fleet = counters_after(old[0], restarted, delta(old[0], old[1]))
    assert stored == restarted and fleet.unmatched_deltas == 1


@pytest.mark.parametrize(
    ("base", "change"),
    [
        pytest.param(None, delta(F1, F2), id="no-base"),
        pytest.param(F2, delta(F1, F3), id="other-seq"),
        pytest.param(
            F1,
            msgspec.structs.replace(delta(F1, F2), ports=(port("mlx5_9"),)),
            id="unknown-port",
        ),
        pytest.param(delta(F1, F2), delta(F1, F3), id="base-is-a-delta"),
    ],
)
def test_merge_refuses(base: CounterBatch | None, change: CounterBatch) -> None:
    assert merge_counter_delta(base, change) is None


def test_removed_entries_leave_the_merged_port() -> None:
    gone = full(2, port("mlx5_0", rx=20), msgspec.structs.replace(port("mlx5_1"), counters={}))
    gone = msgspec.structs.replace(
        gone, ports=(gone.ports[0], msgspec.structs.replace(gone.ports[1], rx_bytes=None))
    )
    assert merge_counter_delta(F1, delta(F1, gone)) == gone


def test_v1_payload_without_delta_fields_is_a_full_batch() -> None:
    batch = decode((DATA / "counters-v1-minimal.msgpack").read_bytes(), CounterBatch)
    assert batch.base_seq is None and all(p.removed == () for p in batch.ports)
    stored, _ = counters_after(msgspec.structs.replace(batch, node=NODE))
    assert stored is not None and stored.ports == batch.ports


# --- property: full+deltas == the equivalent full batches --------------------------------

DEVICES = ("mlx5_0", "mlx5_1", "mlx5_2")
NAMES = ("port_rcv_data", "port_xmit_data", "symbol_error", "link_downed")
HW = ("out_of_buffer", "rx_write_requests")
# Small values so that counters repeat (idle), saturate (symbol_error, link_downed) and go
# backwards (resets, 32-bit hw wrap) often.
VALUES = st.sampled_from([0, 1, 2, 255, 65535, 2**32 - 1, 2**32 + 5])


@st.composite
def rounds(draw: st.DrawFn) -> list[CounterBatch]:
    """Raw counter batches as the reader gives them: most values repeat round to round."""
    batches: list[CounterBatch] = []
    previous: dict[str, PortCounters] = {}
    devices = list(DEVICES[: draw(st.integers(1, 3))])
    at = T0
    for seq in range(1, draw(st.integers(2, 14)) + 1):
        if draw(st.integers(0, 9)) == 0:  # a device comes or goes
            devices = draw(st.lists(st.sampled_from(DEVICES), min_size=1, max_size=3, unique=True))
        ports = []
        for device in devices:
            old = previous.get(device)
            groups = []
            for group, names in (("counters", NAMES), ("hw_counters", HW)):
                values = dict(getattr(old, group)) if old is not None else {}
                for name in names:
                    move = draw(st.integers(0, 5))
                    if move == 0:
                        values.pop(name, None)  # unreadable this round
                    elif move == 1 or name not in values:
                        values[name] = draw(VALUES)
                groups.append(values)
            rx = groups[0].get("port_rcv_data")
            ports.append(
                PortCounters(
                    device=device,
                    port=1,
                    counters=groups[0],
                    hw_counters=groups[1],
                    rx_bytes=None if rx is None else rx * 4,
                )
            )
        previous = {p.device: p for p in ports}
        at += draw(st.sampled_from([1.0, 0.999, 1.25, -0.5, 0.0]))  # clock steps too
        batches.append(CounterBatch(node=NODE, seq=seq, collected_at=at, ports=tuple(ports)))
    return batches


@settings(max_examples=200, deadline=None)
@given(
    raw=rounds(),
    full_every=st.integers(1, 6),
    lost=st.sets(st.integers(1, 14)),
    rebase=st.sets(st.integers(1, 14)),
)
def test_full_plus_deltas_equal_the_full_batches(
    raw: list[CounterBatch], full_every: int, lost: set[int], rebase: set[int]
) -> None:
    encoder = DeltaEncoder(full_every=full_every)
    deltas, fulls = Fleet(), Fleet()
    previous: CounterBatch | None = None
    delivered: set[int] = set()
    for n, sample in enumerate(raw):
        previous = batch = with_rates(previous, sample)
        if batch.seq in rebase:
            encoder.rebase()
        message = encoder.encode(batch)
        encoder.sent(message, True)  # the agent cannot tell that core NATS lost it
        if batch.seq in lost:
            continue
        delivered.add(batch.seq)
        before = deltas.get(NODE)
        received = decode(encode(message), CounterBatch)
        stored = deltas.apply_counters(received, T0 + n).record.counters
        expected = fulls.apply_counters(batch, T0 + n).record.counters
        if message.base_seq is None or message.base_seq in delivered:
            assert stored == expected
        else:
            assert stored is (before.counters if before is not None else None)


@pytest.mark.parametrize(
    ("field", "value", "path"),
    [
        pytest.param("base_seq", "7", "$.base_seq", id="base-seq-not-int"),
        pytest.param("removed", "rx_bytes", "$.ports[0].removed", id="removed-not-a-list"),
        pytest.param("removed", [1], "$.ports[0].removed[0]", id="removed-not-strings"),
    ],
)
def test_bad_delta_fields_are_named(field: str, value: object, path: str) -> None:
    raw = msgspec.msgpack.decode(encode_map(delta(F1, F3)))  # the map form (older agents)
    if field == "base_seq":
        raw[field] = value
    else:
        raw["ports"][0][field] = value
    with pytest.raises(CodecError) as caught:
        decode(msgspec.msgpack.encode(raw), CounterBatch)
    assert caught.value.path == path


def test_nonsense_removed_keys_change_nothing_else() -> None:
    change = delta(F1, F2)
    odd = ("bogus", "counters", "rates/", "/port_rcv_data", "counters/not_there")
    change = msgspec.structs.replace(
        change, ports=(msgspec.structs.replace(change.ports[0], removed=odd),)
    )
    assert merge_counter_delta(F1, change) == F2
