"""The compact wire form of a CounterBatch: msgpack arrays instead of maps, every counter
key sent once per message in a name table and referred to by index (docs/wire.md,
"Packed counter batches"). `pack`/`unpack` convert to and from the `CounterBatch` the
code uses; unpacking builds each dict with C-level zips, once per distinct key list.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence
from itertools import chain
from operator import attrgetter
from typing import Annotated, Final, TypeVar

import msgspec

from proto.errors import ProtoError
from proto.inventory import Base, ReadError
from proto.messages import MESSAGES_VERSION
from proto.messages.counters import CounterBatch, PortCounters

PACKED_TAG: Final = "nicfleet.v1.PackedCounterBatch"
# The counter groups of PortCounters; a name-table entry of a counter is "<group>/<name>".
GROUPS: Final = ("counters", "counters_ext", "hw_counters")

Index = Annotated[int, msgspec.Meta(ge=0)]
_T = TypeVar("_T", int, float)
_intern = sys.intern


class PackedLayout(Base, frozen=True, kw_only=True, array_like=True):
    """Which counters a port carries, in order: indexes into `PackedCounterBatch.names`.

    Ports of the same kind share one layout, so a full batch names its keys once."""

    counters: tuple[Index, ...] = ()
    counters_ext: tuple[Index, ...] = ()
    hw_counters: tuple[Index, ...] = ()
    rates: tuple[Index, ...] = ()  # rate keys: "<group>/<name>", "rx_bytes", "tx_bytes"


class PackedPort(Base, frozen=True, kw_only=True, array_like=True):
    """One PortCounters: its values in the order of its layout; whole-number rates may be
    sent as ints. `saturated`, `resets`, `removed` index the name table too."""

    device: str
    port: int
    layout: Index = 0
    counter_values: tuple[int, ...] = ()
    counters_ext_values: tuple[int, ...] = ()
    hw_counters_values: tuple[int, ...] = ()
    rx_bytes: int | None = None
    tx_bytes: int | None = None
    rate_values: tuple[float, ...] = ()
    saturated: tuple[Index, ...] = ()
    resets: tuple[Index, ...] = ()
    removed: tuple[Index, ...] = ()


class PackedCounterBatch(
    Base, frozen=True, kw_only=True, array_like=True, tag_field="schema", tag=PACKED_TAG
):
    """A CounterBatch as an array: [schema, version, node, seq, ...]; fields added later
    go at the end with defaults (older decoders ignore extra trailing elements)."""

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    collected_at: float
    interval_s: float | None = None
    base_seq: int | None = None
    names: tuple[str, ...] = ()
    layouts: tuple[PackedLayout, ...] = ()
    ports: tuple[PackedPort, ...] = ()
    errors: tuple[ReadError, ...] = ()
    epoch: int = 0  # CounterBatch.epoch


# What data-quality finds nothing wrong with (aggregator/rules/dataquality.py): a counter of
# the `counters` group >= 0, a rate finite and >= 0 (NaN fails `ge`, infinity fails `le`),
# no counter flagged as saturated, reset or removed.
Count = Annotated[int, msgspec.Meta(ge=0)]
Rate = Annotated[float, msgspec.Meta(ge=0, le=sys.float_info.max)]
NoFlags = Annotated[tuple[Index, ...], msgspec.Meta(max_length=0)]


class CleanPackedPort(PackedPort, frozen=True, kw_only=True, array_like=True):
    """A PackedPort whose values msgspec verified clean while decoding (same wire form)."""

    counter_values: tuple[Count, ...] = ()
    rate_values: tuple[Rate, ...] = ()
    saturated: NoFlags = ()
    resets: NoFlags = ()
    removed: NoFlags = ()


class CleanPackedCounterBatch(
    PackedCounterBatch, frozen=True, kw_only=True, array_like=True, tag=PACKED_TAG
):
    """A PackedCounterBatch every port of which decoded as a CleanPackedPort: the same
    bytes, decoded by a stricter type, so that the ingest learns "no port has a value
    data-quality would list" inside msgspec's C decoder instead of scanning the arrays
    again (proto.codec.decode_counters tries it first). Its read errors are not
    constrained: `errors` may be non-empty."""

    ports: tuple[CleanPackedPort, ...] = ()


class PackError(ProtoError, ValueError):
    """A packed batch whose indexes do not fit its name table; `path` names the field."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"{reason} - at `{path}`")


class _Table:
    """Interns the keys and layouts of one batch while packing."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.layouts: dict[PackedLayout, int] = {}

    def refs(self, keys: Iterable[str]) -> tuple[int, ...]:
        index = self.index
        return tuple(index.setdefault(key, len(index)) for key in keys)

    def group(self, group: str, values: Mapping[str, int]) -> tuple[int, ...]:
        return self.refs(f"{group}/{name}" for name in values)

    def layout(self, port: PortCounters) -> int:
        layout = PackedLayout(
            counters=self.group("counters", port.counters),
            counters_ext=self.group("counters_ext", port.counters_ext),
            hw_counters=self.group("hw_counters", port.hw_counters),
            rates=self.refs(port.rates),
        )
        return self.layouts.setdefault(layout, len(self.layouts))


def _compact_rate(rate: float) -> float:
    # msgpack sends an int in 1-9 bytes, a float always in 9; float fields accept ints.
    return int(rate) if rate.is_integer() and abs(rate) < 2**63 else rate


def pack(batch: CounterBatch) -> PackedCounterBatch:
    """The packed form of `batch` (a full batch or a delta alike)."""
    table = _Table()
    ports = [
        PackedPort(
            device=p.device,
            port=p.port,
            layout=table.layout(p),
            counter_values=tuple(p.counters.values()),
            counters_ext_values=tuple(p.counters_ext.values()),
            hw_counters_values=tuple(p.hw_counters.values()),
            rx_bytes=p.rx_bytes,
            tx_bytes=p.tx_bytes,
            rate_values=tuple(_compact_rate(r) for r in p.rates.values()),
            saturated=table.refs(p.saturated),
            resets=table.refs(p.resets),
            removed=table.refs(p.removed),
        )
        for p in batch.ports
    ]
    return PackedCounterBatch(
        version=batch.version,
        node=batch.node,
        seq=batch.seq,
        collected_at=batch.collected_at,
        interval_s=batch.interval_s,
        base_seq=batch.base_seq,
        names=tuple(table.index),
        layouts=tuple(table.layouts),
        ports=tuple(ports),
        errors=batch.errors,
        epoch=batch.epoch,
    )


_Keys = tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]


class _Misfiled(ProtoError):
    """A layout lists a name under another group than the name's own."""


def _resolve(names: tuple[str, ...], layouts: Sequence[PackedLayout]) -> list[_Keys]:
    """Each layout's key names (C-level maps, no loop per key); PackError names the field."""
    split = [key.partition("/") for key in names]
    group_of = [part[0] for part in split].__getitem__
    bare = [_intern(part[2]) for part in split].__getitem__
    full = names.__getitem__
    resolved: list[_Keys] = []
    try:
        for layout in layouts:
            counters, ext, hw = layout.counters, layout.counters_ext, layout.hw_counters
            if (
                (counters and set(map(group_of, counters)) != _ONLY[0])
                or (ext and set(map(group_of, ext)) != _ONLY[1])
                or (hw and set(map(group_of, hw)) != _ONLY[2])
            ):
                raise _Misfiled
            resolved.append(
                (
                    tuple(map(bare, counters)),
                    tuple(map(bare, ext)),
                    tuple(map(bare, hw)),
                    tuple(map(full, layout.rates)),
                )
            )
    except (IndexError, _Misfiled):
        raise _layout_error(names, layouts[len(resolved)], len(resolved)) from None
    return resolved


_ONLY: Final = tuple({group} for group in GROUPS)


def _layout_error(names: tuple[str, ...], layout: PackedLayout, n: int) -> PackError:
    """Why layout `n` did not resolve (the slow path, only for bad input)."""
    for group in (*GROUPS, "rates"):
        refs: tuple[int, ...] = getattr(layout, group)
        path = f"$.layouts[{n}].{group}"
        _check_refs(refs, len(names), path)
        wrong = [
            names[i] for i in refs if group != "rates" and not names[i].startswith(group + "/")
        ]
        if wrong:
            return PackError(path, f"name {wrong[0]!r} is not in group {group!r}")
    return PackError(f"$.layouts[{n}]", "does not resolve")


def _check_refs(refs: tuple[int, ...], size: int, path: str) -> None:
    if refs and max(refs) >= size:
        raise PackError(path, f"index {max(refs)} is beyond the {size} names")


def unpack(packed: PackedCounterBatch) -> CounterBatch:
    """The CounterBatch that `packed` stands for; PackError when an index is off."""
    # Interned: a node holds its last full batch for long, and all nodes share the names.
    names = tuple(map(_intern, packed.names))
    layouts = _resolve(names, packed.layouts)
    ports = []
    # The loop below is the whole decode cost of a batch: C-level zips, nothing per key.
    new_port, get = PortCounters, names.__getitem__
    try:
        for p in packed.ports:
            counters, ext, hw, rates = layouts[p.layout]
            ports.append(
                new_port(
                    device=_intern(p.device),
                    port=p.port,
                    counters=_zipped(counters, p.counter_values),
                    counters_ext=_zipped(ext, p.counters_ext_values),
                    hw_counters=_zipped(hw, p.hw_counters_values),
                    rx_bytes=p.rx_bytes,
                    tx_bytes=p.tx_bytes,
                    rates=_zipped(rates, _shared_rates(p.rate_values)),
                    saturated=tuple(map(get, p.saturated)) if p.saturated else (),
                    resets=tuple(map(get, p.resets)) if p.resets else (),
                    removed=tuple(map(get, p.removed)) if p.removed else (),
                )
            )
    except (IndexError, ValueError):
        raise _port_error(packed, layouts, len(ports)) from None
    return CounterBatch(
        version=packed.version,
        node=packed.node,
        seq=packed.seq,
        collected_at=packed.collected_at,
        interval_s=packed.interval_s,
        ports=tuple(ports),
        errors=packed.errors,
        base_seq=packed.base_seq,
        epoch=packed.epoch,
    )


def check(packed: PackedCounterBatch) -> None:
    """What `unpack` verifies, without building its dicts: every layout resolves, every
    port's value lists fit its layout, every flag indexes the name table. PackError names
    the field. A checked batch unpacks without error (the aggregator holds checked deltas
    as bytes and unpacks them only when read)."""
    names, ports = packed.names, packed.ports
    shape = (names, packed.layouts)  # the same for every delta of a kind of node
    sizes = _SIZES.get(shape)
    if sizes is None:
        sizes = [tuple(map(len, keys)) for keys in _resolve(names, packed.layouts)]
        if len(_SIZES) >= _MAX_SIZES:
            _SIZES.clear()
        _SIZES[shape] = sizes
    if not ports:
        return
    try:  # C-level maps; a Python loop only on the error path
        wanted = [sizes[i] for i in map(_LAYOUT, ports)]
    except IndexError:
        wanted = []
    got = list(
        zip(
            map(len, map(_COUNTER_VALUES, ports)),
            map(len, map(_EXT_VALUES, ports)),
            map(len, map(_HW_VALUES, ports)),
            map(len, map(_RATE_VALUES, ports)),
            strict=True,
        )
    )
    # A clean batch's ports carry no flags (CleanPackedPort).
    flags = (
        []
        if type(packed) is CleanPackedCounterBatch
        else list(chain.from_iterable(map(_flags, ports)))
    )
    if wanted != got or (flags and max(flags) >= len(names)):
        layouts = _resolve(names, packed.layouts)
        for n in range(len(ports)):
            error = _port_error(packed, layouts, n)
            if error.reason != "does not unpack":
                raise error
        raise PackError("$.ports", "does not unpack")  # pragma: no cover - not reached


# Value-list lengths per layout of a (name table, layouts): checked deltas of one kind of
# node share them. Bounded: cleared when full.
_SIZES: Final[dict[tuple[tuple[str, ...], tuple[PackedLayout, ...]], list[tuple[int, ...]]]] = {}
_MAX_SIZES: Final = 1024
_LAYOUT: Final = attrgetter("layout")
_COUNTER_VALUES: Final = attrgetter("counter_values")
_EXT_VALUES: Final = attrgetter("counters_ext_values")
_HW_VALUES: Final = attrgetter("hw_counters_values")
_RATE_VALUES: Final = attrgetter("rate_values")


def _flags(port: PackedPort) -> tuple[int, ...]:
    return port.saturated + port.resets + port.removed


# Whole-number rates arrive as ints and decode as new floats; most are 0 (idle counters).
_FLOATS: Final[dict[float, float]] = {float(n): float(n) for n in range(256)}


def _shared_rates(values: tuple[float, ...]) -> tuple[float, ...]:
    """`values` with whole numbers 0-255 as shared float objects (C-level map, no loop
    in Python): a held batch keeps one object per distinct value, not one per counter."""
    return tuple(map(_FLOATS.get, values, values)) if values else values


def _zipped(keys: tuple[str, ...], values: tuple[_T, ...]) -> dict[str, _T]:
    """ValueError when the lengths differ; an empty group costs no zip."""
    return dict(zip(keys, values, strict=True)) if keys or values else {}


def _port_error(packed: PackedCounterBatch, layouts: list[_Keys], n: int) -> PackError:
    """Why port `n` did not unpack (the slow path, only for bad input)."""
    p, at = packed.ports[n], f"$.ports[{n}]."
    if p.layout >= len(layouts):
        return PackError(at + "layout", f"layout {p.layout} of {len(layouts)} does not exist")
    values = (p.counter_values, p.counters_ext_values, p.hw_counters_values, p.rate_values)
    fields = ("counter_values", "counters_ext_values", "hw_counters_values", "rate_values")
    for keys, vals, field in zip(layouts[p.layout], values, fields, strict=True):
        if len(keys) != len(vals):
            return PackError(at + field, f"{len(vals)} values for a layout of {len(keys)}")
    for field in ("saturated", "resets", "removed"):
        _check_refs(getattr(p, field), len(packed.names), at + field)
    return PackError(at.rstrip("."), "does not unpack")
