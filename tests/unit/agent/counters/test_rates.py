"""Table and property tests of agent.counters.rates: deltas, saturation, 32-bit wrap, resets."""

from __future__ import annotations

import math

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.counters.rates import COUNTER_WIDTHS, counter_delta, saturation_value, with_rates
from proto.inventory import ReadError
from proto.messages.counters import CounterBatch, PortCounters

T0 = 1_800_000_000.0
U32 = 2**32
U64_MAX = 2**64 - 1


def port(
    device: str = "mlx5_0",
    number: int = 1,
    *,
    counters: dict[str, int] | None = None,
    ext: dict[str, int] | None = None,
    hw: dict[str, int] | None = None,
    rx_bytes: int | None = None,
    tx_bytes: int | None = None,
) -> PortCounters:
    return PortCounters(
        device=device,
        port=number,
        counters=counters or {},
        counters_ext=ext or {},
        hw_counters=hw or {},
        rx_bytes=rx_bytes,
        tx_bytes=tx_bytes,
    )


def batch(*ports: PortCounters, at: float = T0, seq: int = 1) -> CounterBatch:
    return CounterBatch(node="gpu-01", seq=seq, collected_at=at, ports=ports)


def rated(before: PortCounters, after: PortCounters, *, interval: float = 1.0) -> PortCounters:
    result = with_rates(batch(before), batch(after, at=T0 + interval, seq=2))
    (only,) = result.ports
    return only


# --- one counter, one step --------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "after", "interval", "rates", "saturated", "resets"),
    [
        pytest.param(
            port(counters={"symbol_error": 10}),
            port(counters={"symbol_error": 15}),
            2.0,
            {"counters/symbol_error": 2.5},
            (),
            (),
            id="normal-delta",
        ),
        pytest.param(
            port(counters={"link_downed": 3}),
            port(counters={"link_downed": 3}),
            1.0,
            {"counters/link_downed": 0.0},
            (),
            (),
            id="unchanged-is-zero-rate",
        ),
        pytest.param(
            port(hw={"out_of_buffer": 100}),
            port(hw={"out_of_buffer": 400}),
            0.5,
            {"hw_counters/out_of_buffer": 600.0},
            (),
            (),
            id="hw-counter-delta",
        ),
        pytest.param(
            port(ext={"port_rcv_packets_64": 1_000}),
            port(ext={"port_rcv_packets_64": 3_000}),
            1.0,
            {"counters_ext/port_rcv_packets_64": 2_000.0},
            (),
            (),
            id="counters-ext-delta",
        ),
        pytest.param(
            port(counters={"symbol_error": 65_000}),
            port(counters={"symbol_error": 65_535}),
            1.0,
            {},
            ("counters/symbol_error",),
            (),
            id="saturation-16bit-not-a-delta",
        ),
        pytest.param(
            port(counters={"symbol_error": 65_535}),
            port(counters={"symbol_error": 65_535}),
            1.0,
            {},
            ("counters/symbol_error",),
            (),
            id="saturation-stays",
        ),
        pytest.param(
            port(counters={"link_error_recovery": 254, "link_downed": 200}),
            port(counters={"link_error_recovery": 255, "link_downed": 255}),
            1.0,
            {},
            ("counters/link_downed", "counters/link_error_recovery"),
            (),
            id="saturation-8bit",
        ),
        pytest.param(
            port(
                counters={"local_link_integrity_errors": 14, "excessive_buffer_overrun_errors": 0}
            ),
            port(
                counters={"local_link_integrity_errors": 15, "excessive_buffer_overrun_errors": 15}
            ),
            1.0,
            {},
            (
                "counters/excessive_buffer_overrun_errors",
                "counters/local_link_integrity_errors",
            ),
            (),
            id="saturation-4bit",
        ),
        pytest.param(
            port(counters={"port_xmit_wait": 4_294_967_000}),
            port(counters={"port_xmit_wait": 4_294_967_295}),
            1.0,
            {},
            ("counters/port_xmit_wait",),
            (),
            id="saturation-32bit-xmit-wait",
        ),
        pytest.param(
            port(counters={"port_xmit_data": 4_294_967_000}),
            port(counters={"port_xmit_data": 4_294_967_295}),
            1.0,
            {},
            ("counters/port_xmit_data",),
            (),
            id="saturation-32bit-data-not-extended",
        ),
        pytest.param(
            port(counters={"port_xmit_data": 4_294_967_000}),
            port(counters={"port_xmit_data": 4_294_967_400}),
            1.0,
            {"counters/port_xmit_data": 400.0},
            (),
            (),
            id="extended-data-passes-32bit",
        ),
        pytest.param(
            port(counters={"port_rcv_packets": 5 * U32}),
            port(counters={"port_rcv_packets": U32 - 1}),
            1.0,
            {},
            (),
            ("counters/port_rcv_packets",),
            id="extended-data-drops-to-32bit-max-is-reset",
        ),
        pytest.param(
            port(counters={"symbol_error": 70_000}),
            port(counters={"symbol_error": 70_010}),
            1.0,
            {"counters/symbol_error": 10.0},
            (),
            (),
            id="wider-than-table-counts",
        ),
        pytest.param(
            port(counters={"symbol_error": 65_535}),
            port(counters={"symbol_error": 3}),
            1.0,
            {},
            (),
            ("counters/symbol_error",),
            id="cleared-after-saturation-is-reset",
        ),
        pytest.param(
            port(counters={"port_rcv_errors": 10}),
            port(counters={"port_rcv_errors": 0}),
            1.0,
            {},
            (),
            ("counters/port_rcv_errors",),
            id="pma-decrease-is-reset-not-wrap",
        ),
        pytest.param(
            port(hw={"out_of_sequence": U32 - 6}),
            port(hw={"out_of_sequence": 5}),
            1.0,
            {"hw_counters/out_of_sequence": 11.0},
            (),
            (),
            id="hw-wrap-modulo-2-32",
        ),
        pytest.param(
            port(hw={"rx_write_requests": 3 * U32}),
            port(hw={"rx_write_requests": 7}),
            1.0,
            {},
            (),
            ("hw_counters/rx_write_requests",),
            id="hw-wider-than-32bit-decrease-is-reset",
        ),
        pytest.param(
            port(hw={"out_of_buffer": U32 - 1}),
            port(hw={"out_of_buffer": U32 - 1}),
            1.0,
            {"hw_counters/out_of_buffer": 0.0},
            (),
            (),
            id="hw-at-32bit-max-is-not-saturated",
        ),
        pytest.param(
            port(ext={"port_xmit_data_64": 10**15}),
            port(ext={"port_xmit_data_64": 12}),
            1.0,
            {},
            (),
            ("counters_ext/port_xmit_data_64",),
            id="64bit-decrease-is-reset",
        ),
        pytest.param(
            port(counters={"unicast_rcv_packets": 900}),
            port(counters={"unicast_rcv_packets": 100}),
            1.0,
            {},
            (),
            ("counters/unicast_rcv_packets",),
            id="64bit-pma-decrease-is-reset",
        ),
        pytest.param(
            port(counters={"vendor_specific": 65_534}),
            port(counters={"vendor_specific": 65_535}),
            1.0,
            {"counters/vendor_specific": 1.0},
            (),
            (),
            id="unknown-width-has-no-ceiling",
        ),
        pytest.param(
            port(counters={"symbol_error": 1}),
            port(counters={"symbol_error": 1, "link_downed": 1}),
            1.0,
            {"counters/symbol_error": 0.0},
            (),
            (),
            id="new-counter-no-rate",
        ),
        pytest.param(
            port(counters={"symbol_error": 1, "link_downed": 1}),
            port(counters={"symbol_error": 2}),
            1.0,
            {"counters/symbol_error": 1.0},
            (),
            (),
            id="vanished-counter-ignored",
        ),
        pytest.param(
            port(hw={"lifespan": 10}),
            port(hw={"lifespan": 20}),
            1.0,
            {},
            (),
            (),
            id="lifespan-is-a-setting",
        ),
        pytest.param(
            port(counters={"port_rcv_data": 100}, rx_bytes=400),
            port(counters={"port_rcv_data": 350}, rx_bytes=1_400),
            0.5,
            {"counters/port_rcv_data": 500.0, "rx_bytes": 2_000.0},
            (),
            (),
            id="rx-bytes-from-4-octet-units",
        ),
        pytest.param(
            port(ext={"port_xmit_data_64": 10}, tx_bytes=40),
            port(ext={"port_xmit_data_64": 35}, tx_bytes=140),
            1.0,
            {"counters_ext/port_xmit_data_64": 25.0, "tx_bytes": 100.0},
            (),
            (),
            id="tx-bytes-from-counters-ext",
        ),
        pytest.param(
            port(counters={"port_xmit_data": U32 - 1}, ext={"port_xmit_data_64": 10}, tx_bytes=40),
            port(counters={"port_xmit_data": U32 - 1}, ext={"port_xmit_data_64": 35}, tx_bytes=140),
            1.0,
            {"counters_ext/port_xmit_data_64": 25.0, "tx_bytes": 100.0},
            ("counters/port_xmit_data",),
            (),
            id="tx-bytes-follow-their-source-not-the-saturated-one",
        ),
        pytest.param(
            port(counters={"port_rcv_data": U32 - 100}, rx_bytes=4 * (U32 - 100)),
            port(counters={"port_rcv_data": U32 - 1}, rx_bytes=4 * (U32 - 1)),
            1.0,
            {},
            ("counters/port_rcv_data",),
            (),
            id="rx-bytes-source-saturated",
        ),
        pytest.param(
            port(counters={"port_rcv_data": 1_000}, rx_bytes=4_000),
            port(counters={"port_rcv_data": 10}, rx_bytes=40),
            1.0,
            {},
            (),
            ("counters/port_rcv_data",),
            id="rx-bytes-source-reset",
        ),
        pytest.param(
            port(rx_bytes=1_000, tx_bytes=5_000),
            port(rx_bytes=3_000, tx_bytes=1_000),
            1.0,
            {"rx_bytes": 2_000.0},
            (),
            ("tx_bytes",),
            id="bytes-without-source-are-64bit",
        ),
    ],
)
def test_rates_one_step(
    before: PortCounters,
    after: PortCounters,
    interval: float,
    rates: dict[str, float],
    saturated: tuple[str, ...],
    resets: tuple[str, ...],
) -> None:
    result = rated(before, after, interval=interval)
    assert result.rates == pytest.approx(rates)
    assert result.rates.keys() == rates.keys()
    assert result.saturated == saturated
    assert result.resets == resets
    # Rates are added; cumulative values stay the kernel's raw numbers.
    assert result.counters == after.counters
    assert result.hw_counters == after.hw_counters
    assert (result.rx_bytes, result.tx_bytes) == (after.rx_bytes, after.tx_bytes)


# --- batches: intervals, ports appearing and disappearing -------------------------------


@pytest.mark.parametrize(
    ("previous_at", "current_at", "interval_s"),
    [
        pytest.param(T0, T0 + 2.0, 2.0, id="positive"),
        pytest.param(T0, T0, None, id="zero-interval"),
        pytest.param(T0, T0 - 1.0, None, id="clock-stepped-back"),
        pytest.param(math.nan, T0, None, id="nan-timestamp"),
        pytest.param(-math.inf, T0, None, id="infinite-interval"),
    ],
)
def test_interval(previous_at: float, current_at: float, interval_s: float | None) -> None:
    before = port(counters={"symbol_error": 1, "link_downed": 255}, hw={"out_of_buffer": 9})
    after = port(counters={"symbol_error": 3, "link_downed": 255}, hw={"out_of_buffer": 1})
    result = with_rates(batch(before, at=previous_at), batch(after, at=current_at))
    assert result.interval_s == interval_s
    (only,) = result.ports
    if interval_s is None:
        assert only.rates == {}
    else:
        assert only.rates == {
            "counters/symbol_error": 1.0,
            "hw_counters/out_of_buffer": (U32 - 8) / 2,
        }
    # Saturation needs no interval: it is a property of the value itself.
    assert only.saturated == ("counters/link_downed",)


def test_first_sample_has_no_rates_but_reports_saturation() -> None:
    first = batch(port(counters={"symbol_error": 65_535, "link_downed": 2}, rx_bytes=8))
    result = with_rates(None, first)
    assert result.interval_s is None
    (only,) = result.ports
    assert only.rates == {}
    assert only.saturated == ("counters/symbol_error",)
    assert only.resets == ()


def test_new_port_gets_no_rates_removed_port_is_dropped() -> None:
    previous = batch(
        port("mlx5_0", 1, counters={"symbol_error": 1}),
        port("mlx5_1", 1, counters={"symbol_error": 1}),
    )
    current = batch(
        port("mlx5_0", 1, counters={"symbol_error": 4}),
        port("mlx5_0", 2, counters={"symbol_error": 9}),  # new port of a known device
        port("mlx5_2", 1, counters={"symbol_error": 9}),  # new device
        at=T0 + 1,
    )
    result = with_rates(previous, current)
    assert [(p.device, p.port, p.rates) for p in result.ports] == [
        ("mlx5_0", 1, {"counters/symbol_error": 3.0}),
        ("mlx5_0", 2, {}),
        ("mlx5_2", 1, {}),
    ]


def test_batch_fields_are_kept_and_stale_rates_replaced() -> None:
    errors = (ReadError(path="/class/infiniband/mlx5_0/ports/1/counters/x", error="EIO"),)
    stale = msgspec.structs.replace(
        port(counters={"symbol_error": 5}), rates={"counters/bogus": 1.0}, resets=("x",)
    )
    current = CounterBatch(node="gpu-01", seq=7, collected_at=T0 + 1, ports=(stale,), errors=errors)
    result = with_rates(batch(port(counters={"symbol_error": 4})), current)
    assert (result.node, result.seq, result.collected_at, result.errors) == (
        "gpu-01",
        7,
        T0 + 1,
        errors,
    )
    assert result.ports[0].rates == {"counters/symbol_error": 1.0}
    assert result.ports[0].resets == ()


# --- the helpers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        pytest.param("symbol_error", 65_535, id="16bit"),
        pytest.param("link_downed", 255, id="8bit"),
        pytest.param("local_link_integrity_errors", 15, id="4bit"),
        pytest.param("port_xmit_wait", U32 - 1, id="32bit"),
        pytest.param("port_rcv_data", U32 - 1, id="data-unless-proven-extended"),
        pytest.param("multicast_xmit_packets", None, id="64bit-only"),
        pytest.param("driver_private", None, id="unknown"),
    ],
)
def test_saturation_value(name: str, expected: int | None) -> None:
    assert saturation_value(name) == expected


def test_width_table_is_the_pma_layout() -> None:
    # IBTA PortCounters: 12 error counters of 4..16 bits, PortXmitWait and 4 data/packet
    # counters of 32 bits, 4 unicast/multicast counters only in the 64-bit extended set.
    assert sorted(COUNTER_WIDTHS.values()) == [4, 4, 8, 8, 8, 8] + [16] * 6 + [32] * 5 + [64] * 4


# --- properties ---------------------------------------------------------------------------

GROUPS = st.sampled_from(["counters", "counters_ext", "hw_counters"])
NAMES = st.sampled_from(
    [*COUNTER_WIDTHS, "port_rcv_data_64", "out_of_buffer", "lifespan", "vendor_specific"]
)
VALUES = st.one_of(
    st.integers(min_value=0, max_value=U64_MAX),
    st.integers(min_value=0, max_value=U32 + 16),
    st.sampled_from([0, 15, 255, 65_535, U32 - 1, U32]),
)
INTERVALS = st.floats(min_value=1e-3, max_value=3_600.0)


@st.composite
def port_pairs(draw: st.DrawFn) -> tuple[PortCounters, PortCounters]:
    keys = draw(st.lists(st.tuples(GROUPS, NAMES), unique=True, max_size=12))
    sides: list[PortCounters] = []
    for _ in range(2):
        groups: dict[str, dict[str, int]] = {"counters": {}, "counters_ext": {}, "hw_counters": {}}
        for group, name in keys:
            if draw(st.booleans()) or not sides:
                groups[group][name] = draw(VALUES)
        rx = draw(st.one_of(st.none(), VALUES))
        sides.append(
            port(
                counters=groups["counters"],
                ext=groups["counters_ext"],
                hw=groups["hw_counters"],
                rx_bytes=rx,
            )
        )
    return sides[0], sides[1]


@given(pair=port_pairs(), interval=INTERVALS)
def test_rates_are_never_negative_and_verdicts_exclusive(
    pair: tuple[PortCounters, PortCounters], interval: float
) -> None:
    result = rated(*pair, interval=interval)
    assert all(rate >= 0 and math.isfinite(rate) for rate in result.rates.values())
    rates, saturated, resets = set(result.rates), set(result.saturated), set(result.resets)
    assert not (rates & saturated or rates & resets or saturated & resets)
    assert "hw_counters/lifespan" not in rates | saturated | resets


@given(
    before=st.integers(min_value=0, max_value=U32 - 1),
    moved=st.integers(min_value=0, max_value=U32 - 1),
    interval=INTERVALS,
)
def test_wrap_recovers_any_32bit_delta(before: int, moved: int, interval: float) -> None:
    after = (before + moved) % U32
    assert counter_delta("hw_counters", "out_of_sequence", before, after) == moved
    result = rated(port(hw={"out_of_sequence": before}), port(hw={"out_of_sequence": after}))
    assert result.rates == {"hw_counters/out_of_sequence": pytest.approx(moved)}
    scaled = with_rates(
        batch(port(hw={"out_of_sequence": before})),
        batch(port(hw={"out_of_sequence": after}), at=T0 + interval, seq=2),
    )
    # Timestamps near 1.8e9 s are floats: the interval is what they subtract to.
    assert scaled.interval_s is not None
    assert scaled.interval_s == pytest.approx(interval, rel=1e-3, abs=1e-6)
    rate = scaled.ports[0].rates["hw_counters/out_of_sequence"]
    assert rate == pytest.approx(moved / scaled.interval_s)


@given(before=st.integers(min_value=0, max_value=U64_MAX), after=VALUES)
def test_64bit_counters_never_wrap(before: int, after: int) -> None:
    verdict = counter_delta("counters_ext", "port_rcv_data_64", before, after)
    assert verdict == (after - before if after >= before else "reset")


@given(pair=port_pairs(), interval=INTERVALS)
def test_with_rates_is_idempotent(pair: tuple[PortCounters, PortCounters], interval: float) -> None:
    previous = batch(pair[0])
    current = batch(pair[1], at=T0 + interval, seq=2)
    once = with_rates(previous, current)
    assert with_rates(previous, once) == once
