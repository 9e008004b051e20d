"""How the fleet holds a node's latest counter batch: the full batch a delta builds on and
the delta itself, each as received on the wire, merged into the batch the agent would have
sent only when something reads it (docs/performance.md, "Counter batches held as
received").

Pure. A packed batch is stored without building a single dict: its wire bytes, its seq
and time, and whether the merged batch would be free of data-quality problems (`clean`,
decided at ingest with C-level scans of its arrays). Readers (the counter rules when a delta
touches their keys, the node detail API) pay the decode and merge once per held batch.
Messages applied without their bytes (tests, in-process callers) are held decoded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import partial
from itertools import chain, compress
from operator import attrgetter, is_not, lt
from typing import Final, TypeVar

from msgspec.structs import replace

from proto.codec import decode
from proto.messages.counters import CounterBatch, PortCounters
from proto.packedcounters import CleanPackedCounterBatch, PackedCounterBatch, PackedPort, unpack

PortKey = tuple[str, int]  # (device, port)
_K = TypeVar("_K")
_V = TypeVar("_V", int, float)
_T = TypeVar("_T")
# Decoded, checked but packed (proto.codec.decode_counters), or the encoded message
# exactly as received.
Wire = CounterBatch | PackedCounterBatch | bytes


class CounterBase:
    """A full counter batch held as a delta base: its wire form and what a delta needs to
    know of it without decoding it again."""

    __slots__ = ("clean", "errors", "flagged", "moving", "ports", "seq", "wire")

    def __init__(
        self,
        batch: CounterBatch | PackedCounterBatch,
        wire: Wire,
        shapes: Shapes,
        *,
        facts: bool = True,
    ) -> None:
        self.seq = batch.seq
        self.wire = wire
        self.errors = batch.errors
        self.ports = shapes.ports(batch.ports)  # which ports a delta may list
        # Ports whose counters saturated or went backwards this round: a delta over them
        # is not plain new values (NodeRecord.counters_delta is then unknown).
        self.flagged = shapes.ports([p for p in batch.ports if p.saturated or p.resets])
        # What readers may skip on: no value data-quality lists (`ports_clean`), and the
        # rate keys with a rate > 0 on some port (a rule that fires only on a rate above a
        # limit >= 0 finds nothing under other keys). facts=False: not known (None).
        self.clean: bool
        self.moving: frozenset[str] | None = None
        if isinstance(batch, PackedCounterBatch):  # checked: read from its arrays
            self.clean = facts and packed_clean(batch)
            if facts:
                self.moving = shapes.packed_moving(batch)
        else:
            self.clean = facts and ports_clean(batch.ports)
            if facts:
                self.moving = shapes.moving(batch.ports)


class HeldCounters:
    """A node's latest accepted counter batch: a full one (its own base) or a delta on
    `base`. `batch` is the merged CounterBatch, built on first read and then kept."""

    __slots__ = ("_batch", "base", "clean", "collected_at", "delta", "seq")

    def __init__(
        self,
        *,
        base: CounterBase,
        delta: Wire | None,
        seq: int,
        collected_at: float,
        clean: bool,
        batch: CounterBatch | None = None,
    ) -> None:
        self.base = base
        self.delta = delta  # None: this is the full batch `base`
        self.seq = seq
        self.collected_at = collected_at
        # True: the merged batch has no counter problem data-quality reports (no read
        # errors, no saturated/reset/removed counter, no negative counter, every rate
        # finite and >= 0). False: not known without reading it.
        self.clean = clean
        self._batch = batch

    @classmethod
    def of(cls, batch: CounterBatch, *, clean: bool = False) -> HeldCounters:
        """`batch` held decoded, as its own base, without the ingest's bookkeeping: with
        `clean` False, readers look at every value (tests, a record built by hand)."""
        base = CounterBase(batch, batch, Shapes(), facts=False)
        return cls(base=base, delta=None, seq=batch.seq, collected_at=batch.collected_at,
                   clean=clean, batch=batch)  # fmt: skip

    @property
    def merged(self) -> bool:
        """Whether `batch` has been built (and is kept) for this held batch."""
        return self._batch is not None

    @property
    def is_full(self) -> bool:
        return self.delta is None

    @property
    def batch(self) -> CounterBatch:
        batch = self._batch
        if batch is None:
            base = _decoded(self.base.wire)
            if self.delta is None:
                batch = base
            else:
                merged = merge_counter_delta(base, _decoded(self.delta))
                # Held only after the same checks passed at ingest (Fleet.apply_counters).
                assert merged is not None, "a held delta does not fit its base"
                batch = merged
            self._batch = batch
        return batch

    def __eq__(self, other: object) -> bool:
        """Equal when they stand for the same batch (reads both; records compare so)."""
        if not isinstance(other, HeldCounters):
            return NotImplemented
        return self is other or (self.seq == other.seq and self.batch == other.batch)

    def __hash__(self) -> int:
        return hash((self.seq, self.collected_at))

    def __repr__(self) -> str:
        kind = "full" if self.delta is None else f"delta on {self.base.seq}"
        return f"HeldCounters(seq={self.seq}, {kind}, clean={self.clean})"


def _decoded(wire: Wire) -> CounterBatch:
    if isinstance(wire, CounterBatch):
        return wire
    return unpack(wire) if isinstance(wire, PackedCounterBatch) else decode(wire, CounterBatch)


class Shapes:
    """Port sets and delta key sets shared between nodes (most nodes have the same ports
    and their deltas change the same keys): one frozenset per distinct value. Bounded:
    cleared when full."""

    MAX: Final = 4096

    def __init__(self) -> None:
        self._ports: dict[frozenset[PortKey], frozenset[PortKey]] = {}
        self._keys: dict[frozenset[str], frozenset[str]] = {}
        # Lookups by what a message carries, cheaper than building the sets (per delta:
        # two tuples and one hash instead of 16 pairs and a set).
        self._listed: dict[tuple[tuple[str, ...], tuple[int, ...]], frozenset[PortKey]] = {}
        self._named: dict[tuple[tuple[str, ...], bool, bool], frozenset[str]] = {}

    def ports(self, ports: Sequence[PortCounters | PackedPort]) -> frozenset[PortKey]:
        """The (device, port) pairs `ports` list."""
        listed = (tuple(map(_DEVICE, ports)), tuple(map(_PORT, ports)))
        found = self._listed.get(listed)
        if found is None:
            found = _put(self._listed, listed, _shared(self._ports, port_keys(ports)))
        return found

    def keys(self, ports: tuple[PortCounters, ...]) -> frozenset[str]:
        """The keys `ports` carry, in rate-key spelling ("counters/<name>",
        "counters_ext/<name>", "hw_counters/<name>", "rx_bytes", "tx_bytes", rate keys)."""
        # Unions in C over every port; the per-key Python work is per distinct name.
        keys: set[str] = set().union(*map(_RATES, ports))
        for prefix, get in _GROUPS:
            names: set[str] = set().union(*map(get, ports))
            if names:
                keys.update(map(prefix.__add__, names))
        if {*map(_RX, ports)} - _NONE:
            keys.add("rx_bytes")
        if {*map(_TX, ports)} - _NONE:
            keys.add("tx_bytes")
        return _shared(self._keys, frozenset(keys))

    def moving(self, ports: tuple[PortCounters, ...]) -> frozenset[str]:
        """The rate keys with a rate > 0 (NaN is not, an infinite rate is) on some port."""
        positive = {k for port in ports for k, rate in port.rates.items() if rate > 0}
        return _shared(self._keys, frozenset(positive))

    def packed_moving(self, packed: PackedCounterBatch) -> frozenset[str]:
        """`moving` of a checked packed batch, from its arrays (C-level per port)."""
        names = packed.names
        rate_keys = [tuple(map(names.__getitem__, layout.rates)) for layout in packed.layouts]
        positive: set[str] = set()
        for port in packed.ports:
            positive.update(compress(rate_keys[port.layout], map(_POSITIVE, port.rate_values)))
        return _shared(self._keys, frozenset(positive))

    def packed_keys(self, packed: PackedCounterBatch) -> frozenset[str]:
        """`keys` of a packed batch: its name table (rate keys and "<group>/<name>" are
        spelled alike; a name the ports do not use only makes the set larger, never
        smaller) and the byte counts it carries."""
        ports = packed.ports
        rx = any(map(_NOT_NONE, map(_RX, ports)))
        tx = any(map(_NOT_NONE, map(_TX, ports)))
        named = (packed.names, rx, tx)
        found = self._named.get(named)
        if found is None:
            keys = frozenset(packed.names)
            if rx or tx:
                keys |= _BYTES[rx, tx]
            found = _put(self._named, named, _shared(self._keys, keys))
        return found


def port_keys(ports: Sequence[PortCounters | PackedPort]) -> frozenset[PortKey]:
    return frozenset(zip(map(_DEVICE, ports), map(_PORT, ports), strict=True))


def _shared(cache: dict[frozenset[_K], frozenset[_K]], value: frozenset[_K]) -> frozenset[_K]:
    found = cache.get(value)
    if found is None:
        if len(cache) >= Shapes.MAX:
            cache.clear()
        found = cache[value] = value
    return found


def _put(cache: dict[_K, _T], key: _K, value: _T) -> _T:
    if len(cache) >= Shapes.MAX:
        cache.clear()
    cache[key] = value
    return value


def flagged(ports: Sequence[PortCounters | PackedPort]) -> bool:
    """Whether some port flags a counter (saturated, reset, removed)."""
    return any(p.saturated or p.resets or p.removed for p in ports)


def ports_clean(ports: tuple[PortCounters, ...] | list[PortCounters]) -> bool:
    """No port flags a counter and `values_clean`."""
    return not flagged(ports) and values_clean(ports)


def values_clean(ports: tuple[PortCounters, ...] | list[PortCounters]) -> bool:
    """No counter of the `counters` group is negative and every rate is finite and >= 0
    (what data-quality's per-port check looks for): scans in C, no loop per key."""
    rates = chain.from_iterable(map(dict.values, map(_RATES, ports)))
    return _fine(rates, chain.from_iterable(map(dict.values, map(_COUNTERS, ports))))


def packed_values_clean(ports: tuple[PackedPort, ...]) -> bool:
    """`values_clean` of packed ports (the `counters` group's values, the rates)."""
    rates = chain.from_iterable(map(_RATE_VALUES, ports))
    return _fine(rates, chain.from_iterable(map(_COUNTER_VALUES, ports)))


def packed_clean(packed: PackedCounterBatch) -> bool:
    """`ports_clean` of a checked packed batch: known from its decoded type when msgspec
    verified it (CleanPackedCounterBatch), else scanned."""
    if type(packed) is CleanPackedCounterBatch:
        return True
    return not flagged(packed.ports) and packed_values_clean(packed.ports)


def _fine(rates: Iterable[float], counters: Iterable[int]) -> bool:
    values = list(rates)
    # NaN fails `min` silently but makes the sum NaN; an infinite sum only means "look".
    if values and not (min(values) >= 0 and math.isfinite(sum(values))):
        return False
    values = list(counters)
    return not values or min(values) >= 0


def merge_counter_delta(base: CounterBatch | None, delta: CounterBatch) -> CounterBatch | None:
    """Pure: the full batch that `delta` stands for, or None when `base` is not the full
    batch it names (missing, another seq or agent process) or `delta` lists a port that
    `base` lacks.
    """
    if base is None or base.base_seq is not None or base.seq != delta.base_seq:
        return None
    if base.epoch != delta.epoch:
        return None
    changes = {(p.device, p.port): p for p in delta.ports}
    ports = []
    for port in base.ports:
        change = changes.pop((port.device, port.port), None)
        ports.append(port if change is None else _merge_port(port, change))
    if changes:
        return None
    return replace(delta, ports=tuple(ports), base_seq=None)


def _merge_port(base: PortCounters, change: PortCounters) -> PortCounters:
    if change.removed:
        return _merge_port_removing(base, change)
    c, e, h, r = change.counters, change.counters_ext, change.hw_counters, change.rates
    rx, tx = change.rx_bytes, change.tx_bytes
    return replace(
        change,
        counters=base.counters | c if c else base.counters,
        counters_ext=base.counters_ext | e if e else base.counters_ext,
        hw_counters=base.hw_counters | h if h else base.hw_counters,
        rx_bytes=base.rx_bytes if rx is None else rx,
        tx_bytes=base.tx_bytes if tx is None else tx,
        rates=base.rates | r if r else base.rates,
    )


def _merge_port_removing(base: PortCounters, change: PortCounters) -> PortCounters:
    gone: dict[str, set[str]] = {}
    for key in change.removed:
        group, _, name = key.partition("/")
        gone.setdefault(group, set()).add(name)
    return replace(
        change,
        counters=_merged(base.counters, change.counters, gone.get("counters")),
        counters_ext=_merged(base.counters_ext, change.counters_ext, gone.get("counters_ext")),
        hw_counters=_merged(base.hw_counters, change.hw_counters, gone.get("hw_counters")),
        rx_bytes=None if "rx_bytes" in gone else _or(change.rx_bytes, base.rx_bytes),
        tx_bytes=None if "tx_bytes" in gone else _or(change.tx_bytes, base.tx_bytes),
        rates=_merged(base.rates, change.rates, gone.get("rates")),
        removed=(),
    )


def _merged(base: dict[str, _V], change: dict[str, _V], gone: set[str] | None) -> dict[str, _V]:
    if not change and not gone:
        return base  # shared, like unchanged ports: held batches are never mutated
    merged = base | change
    for name in gone or ():
        merged.pop(name, None)
    return merged


def _or(value: int | None, fallback: int | None) -> int | None:
    return fallback if value is None else value


_DEVICE: Final = attrgetter("device")
_PORT: Final = attrgetter("port")
_RATES: Final = attrgetter("rates")
_COUNTERS: Final = attrgetter("counters")
_RX: Final = attrgetter("rx_bytes")
_TX: Final = attrgetter("tx_bytes")
_NONE: Final = frozenset({None})
_NOT_NONE: Final = partial(is_not, None)
_POSITIVE: Final = partial(lt, 0)  # 0 < rate: False for NaN, True for inf
_RATE_VALUES: Final = attrgetter("rate_values")
_COUNTER_VALUES: Final = attrgetter("counter_values")
_BYTES: Final = {
    (True, False): frozenset({"rx_bytes"}),
    (False, True): frozenset({"tx_bytes"}),
    (True, True): frozenset({"rx_bytes", "tx_bytes"}),
}
_GROUPS: Final = (
    ("counters/", attrgetter("counters")),
    ("counters_ext/", attrgetter("counters_ext")),
    ("hw_counters/", attrgetter("hw_counters")),
)
