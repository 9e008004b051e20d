"""Per-second rates between two counter samples: saturation, 32-bit wrap and resets.

Pure: no I/O, no clock, no logging. `with_rates(previous, current)` returns `current` with
`interval_s` and each port's `rates`, `saturated` and `resets` filled; `counter_delta`
decides for one counter and `COUNTER_WIDTHS` holds the IBTA PMA field widths it relies on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, Literal

import msgspec

from proto.messages.counters import CounterBatch, PortCounters

Group = Literal["counters", "counters_ext", "hw_counters"]
GROUPS: Final[tuple[Group, ...]] = ("counters", "counters_ext", "hw_counters")

# IBTA PortCounters field widths in bits, as the kernel decodes the PMA reply
# (PORT_PMA_ATTR in drivers/infiniband/core/sysfs.c). These counters saturate at
# 2**width - 1 and stay there until cleared; they never wrap.
COUNTER_WIDTHS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "symbol_error": 16,
        "link_error_recovery": 8,
        "link_downed": 8,
        "port_rcv_errors": 16,
        "port_rcv_remote_physical_errors": 16,
        "port_rcv_switch_relay_errors": 16,
        "port_xmit_discards": 16,
        "port_xmit_constraint_errors": 8,
        "port_rcv_constraint_errors": 8,
        "local_link_integrity_errors": 4,
        "excessive_buffer_overrun_errors": 4,
        "VL15_dropped": 16,
        "port_xmit_wait": 32,
        # 32-bit in PortCounters, but a device with the extended set (mlx5) shows the
        # 64-bit PortCountersExtended value in the same file. The file cannot say which:
        # exactly 2**32 - 1 is taken as saturated (a 64-bit counter sitting on that very
        # value loses one rate; a saturated one never yields a false delta), and a
        # previous value above it proves 64 bits.
        "port_xmit_data": 32,
        "port_rcv_data": 32,
        "port_xmit_packets": 32,
        "port_rcv_packets": 32,
        # Only ever read from PortCountersExtended.
        "unicast_xmit_packets": 64,
        "unicast_rcv_packets": 64,
        "multicast_xmit_packets": 64,
        "multicast_rcv_packets": 64,
    }
)
# mlx5 hw_counters (queue counters) are 32-bit in hardware; the driver reports them modulo
# 2**32. A value above that proves a wider counter, where a decrease is a reset.
HW_COUNTER_BITS: Final = 32
# hw_counters/lifespan is the driver's read-cache period in ms: a setting, not a counter.
NOT_COUNTERS: Final = frozenset({"hw_counters/lifespan"})
# rx_bytes/tx_bytes come from these data counters (4-octet units), preferred first.
BYTES_SOURCES: Final[Mapping[str, tuple[tuple[Group, str], ...]]] = MappingProxyType(
    {
        "rx_bytes": (("counters", "port_rcv_data"), ("counters_ext", "port_rcv_data_64")),
        "tx_bytes": (("counters", "port_xmit_data"), ("counters_ext", "port_xmit_data_64")),
    }
)
DATA_UNIT_BYTES: Final = 4

_CEILINGS: Final = {name: (1 << bits) - 1 for name, bits in COUNTER_WIDTHS.items() if bits < 64}
_HW_MODULUS: Final = 1 << HW_COUNTER_BITS

Verdict = Literal["saturated", "reset"]
SATURATED: Final[Verdict] = "saturated"
RESET: Final[Verdict] = "reset"


def saturation_value(name: str) -> int | None:
    """The value at which `counters/<name>` stops counting, or None when it does not.

    Names outside the PMA table (a driver's own) have no known width, hence no ceiling.
    """
    return _CEILINGS.get(name)


def counter_delta(
    group: str, name: str, previous: int | None, current: int
) -> int | Verdict | None:
    """How far one counter moved: a non-negative delta, "saturated", "reset" or None.

    None means there is no previous value to compare with. Saturation is judged on
    `current` (reported on a first sample too) unless `previous` was above the ceiling,
    which proves a wider counter (an extended data counter). `counters/` never wraps, so
    a decrease there is a clear; `hw_counters/` wraps at 2**32; other groups are 64-bit.
    """
    ceiling = _CEILINGS.get(name) if group == "counters" else None
    if current == ceiling and (previous is None or previous <= current):
        return SATURATED
    if previous is None:
        return None
    if current >= previous:
        return current - previous
    if group == "hw_counters" and previous < _HW_MODULUS:
        return (current - previous) % _HW_MODULUS
    return RESET


def interval_between(previous: CounterBatch | None, current: CounterBatch) -> float | None:
    """Seconds between two samples, or None when rates cannot be computed from them."""
    if previous is None:
        return None
    interval = current.collected_at - previous.collected_at
    return interval if interval > 0 and math.isfinite(interval) else None


def with_rates(previous: CounterBatch | None, current: CounterBatch) -> CounterBatch:
    """`current` with `interval_s` and every port's rates, saturated and resets filled.

    Ports are matched on (device, port); a port or counter missing from `previous` gets
    no rate. Without a usable interval (first sample, clock stepped back, equal
    timestamps) `interval_s` is None and no port has rates, but saturation and resets
    are still reported.
    """
    interval = interval_between(previous, current)
    before: dict[tuple[str, int], PortCounters] = {}
    if previous is not None:
        before = {(p.device, p.port): p for p in previous.ports}
    ports = tuple(
        _port_rates(before.get((port.device, port.port)), port, interval) for port in current.ports
    )
    return msgspec.structs.replace(current, interval_s=interval, ports=ports)


def _port_rates(
    previous: PortCounters | None, current: PortCounters, interval: float | None
) -> PortCounters:
    rates: dict[str, float] = {}
    saturated: list[str] = []
    resets: list[str] = []
    for group in GROUPS:
        values = _group(current, group)
        old = _group(previous, group) if previous is not None else {}
        prefix = group + "/"
        for name, value in values.items():
            verdict = counter_delta(group, name, old.get(name), value)
            if verdict is None:
                continue
            key = prefix + name
            if key in NOT_COUNTERS:
                continue
            if isinstance(verdict, int):
                if interval is not None:
                    rates[key] = verdict / interval
            elif verdict == SATURATED:
                saturated.append(key)
            else:
                resets.append(key)
    for field in BYTES_SOURCES:
        delta = _bytes_delta(field, previous, current)
        if delta == RESET:
            resets.append(field)
        elif isinstance(delta, int) and interval is not None:
            rates[field] = delta / interval
    return msgspec.structs.replace(
        current, rates=rates, saturated=tuple(sorted(saturated)), resets=tuple(sorted(resets))
    )


def _bytes_delta(
    field: str, previous: PortCounters | None, current: PortCounters
) -> int | Verdict | None:
    """Bytes moved in rx_bytes or tx_bytes, "reset", or None (no rate this round).

    The delta follows the data counter the byte count was derived from, so saturation and
    resets of that counter carry over (and are reported under its own name); a byte count
    with no matching source (a reader that fills it some other way) is treated as a
    64-bit counter of its own.
    """
    now = current.rx_bytes if field == "rx_bytes" else current.tx_bytes
    if now is None:
        return None
    for group, name in BYTES_SOURCES[field]:
        units = _group(current, group).get(name)
        if units is not None and units * DATA_UNIT_BYTES == now:
            before = _group(previous, group).get(name) if previous is not None else None
            delta = counter_delta(group, name, before, units)
            return delta * DATA_UNIT_BYTES if isinstance(delta, int) else None
    then = None
    if previous is not None:
        then = previous.rx_bytes if field == "rx_bytes" else previous.tx_bytes
    return counter_delta("bytes", field, then, now)


def _group(port: PortCounters, group: Group) -> dict[str, int]:
    if group == "counters":
        return port.counters
    if group == "counters_ext":
        return port.counters_ext
    return port.hw_counters
