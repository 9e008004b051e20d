"""The aggregator's fleet view: one immutable `NodeRecord` per node, replaced per message.

Pure: no I/O, no clock reads, no logging — callers pass `received_at`/`now`. Applies the
ordering rule (aggregator.fleet.ordering: which agent process a node follows, then seq) to
every message kind, estimates each agent's clock offset and keeps live port state in step with
`port-state` events (aggregator.fleet.portevents); each `apply_*` says what it did
(`Outcome`). The views the API serves are in aggregator.fleet.views.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec
from msgspec.structs import replace

from aggregator.fleet import adapterhistory, clockoffset, ordering, portevents
from aggregator.fleet.adapterhistory import AdapterHistory
from aggregator.fleet.clockoffset import ClockOffset
from aggregator.fleet.heldcounters import (
    CounterBase,
    HeldCounters,
    Shapes,
    flagged,
    packed_values_clean,
    values_clean,
)
from aggregator.fleet.heldcounters import merge_counter_delta as merge_counter_delta  # re-exported
from aggregator.fleet.ordering import DEFAULT_ORDERING, Instance, Order, OrderingSettings, Verdict
from proto.compact import inventory_only
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus
from proto.packedcounters import CleanPackedCounterBatch, PackedCounterBatch

MAX_EVENTS: Final = 50
_NOTHING: Final[frozenset[str]] = frozenset()


class ReceivedEvent(msgspec.Struct, frozen=True, kw_only=True):
    event: LinkEvent
    received_at: float


class NodeRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Everything the aggregator holds for one node; replaced, never mutated."""

    name: str
    snapshot: NodeSnapshot | None = None
    # The latest counter batch as held (aggregator.fleet.heldcounters): `counters` reads it.
    counters_held: HeldCounters | None = None
    events: tuple[ReceivedEvent, ...] = ()  # oldest first, at most MAX_EVENTS
    first_seen: float
    last_seen: float
    snapshot_received_at: float | None = None
    counters_received_at: float | None = None
    device_plugin: DevicePluginStatus | None = None
    device_plugin_received_at: float | None = None
    # What `counters` was merged from: the seq of the full batch (the delta base) and the
    # keys the delta changed over it, in rate-key spelling ("counters/<name>",
    # "counters_ext/<name>", "hw_counters/<name>", "rx_bytes", "tx_bytes"), over all ports.
    # A full batch: its own seq and frozenset(). None: not known (anything may differ).
    counters_base_seq: int | None = None
    counters_delta: frozenset[str] | None = None
    # Ordering (aggregator.fleet.ordering, docs/wire.md "Ordering"): the agent process the
    # record follows (None: derived from the snapshot, e.g. a record rebuilt from KV), the
    # epoch of the held counters, and that process's clock offset (the clock-skew rule).
    instance: Instance | None = None
    counters_epoch: int = 0
    clock: ClockOffset | None = None
    # The adapters and advertised peaks the followed agent process has shown this process
    # (aggregator.fleet.adapterhistory); None: nothing heard live yet (e.g. loaded from KV).
    adapters: AdapterHistory | None = None

    @property
    def counters(self) -> CounterBatch | None:
        """The latest counter batch, a delta merged onto its base (built on first read)."""
        held = self.counters_held
        return None if held is None else held.batch


class Ignored(enum.StrEnum):
    """Why a `Fleet.apply_*` left a message out; the value is the `reason` label of
    `nicfleet_ingest_ignored_total`."""

    # Of the followed agent process and not after the stored one (seq; a status:
    # observed_at), or of an earlier process than the followed one (ordering.judge).
    OLDER = "older"
    # The stored one again (same seq and time, same observed_at), or an event still held.
    DUPLICATE = "duplicate"
    # A counter delta whose full batch is not held; the node still counts as seen.
    UNMATCHED_DELTA = "unmatched-delta"


class Outcome(msgspec.Struct, frozen=True):
    """What a `Fleet.apply_*` did with one message. `record`: the node's record afterwards
    (the one stored, either way); `ignored`: None when the message was applied."""

    record: NodeRecord
    ignored: Ignored | None = None

    @property
    def applied(self) -> bool:
        return self.ignored is None


_IGNORED: Final = {Order.OLDER: Ignored.OLDER, Order.DUPLICATE: Ignored.DUPLICATE}


def _followed(record: NodeRecord | None) -> Instance | None:
    """The agent process `record` follows; a record without one (rebuilt from KV, installed
    by `Fleet.load`) follows its snapshot's, as if that had just been received."""
    if record is None:
        return None
    if record.instance is not None or record.snapshot is None:
        return record.instance
    received = record.snapshot_received_at
    return ordering.start(record.snapshot.epoch, record.last_seen if received is None else received)


class Fleet:
    """Mapping node name -> NodeRecord. Each update replaces one record (O(1))."""

    def __init__(
        self, records: Iterable[NodeRecord] = (), *, ordering: OrderingSettings = DEFAULT_ORDERING
    ) -> None:
        self._ordering = ordering
        self._records: dict[str, NodeRecord] = {}
        self.ignored = 0  # out-of-order or duplicate messages dropped
        # The last full counter batch per node: what counter deltas are relative to.
        self._counter_bases: dict[str, CounterBase] = {}
        self._base_epochs: dict[str, int] = {}  # the agent process each base came from
        self.unmatched_deltas = 0  # counter deltas whose full batch is not held (also ignored)
        self._shapes = Shapes()
        for record in records:
            self.load(record)

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def get(self, name: str) -> NodeRecord | None:
        return self._records.get(name)

    def names(self) -> list[str]:
        return sorted(self._records)

    def view(self) -> Mapping[str, NodeRecord]:
        """A read-only live view (no copy) for pure code that runs between two updates."""
        return MappingProxyType(self._records)

    def records(self) -> list[NodeRecord]:
        """All records sorted by node name (a copy; safe to hold across updates)."""
        return [self._records[name] for name in sorted(self._records)]

    def forget(self, name: str) -> NodeRecord | None:
        """Drop a node (a sharded replica releasing its partition, docs/scaling.md)."""
        self._counter_bases.pop(name, None)
        self._base_epochs.pop(name, None)
        return self._records.pop(name, None)

    def load(self, record: NodeRecord) -> None:
        """Install a record as-is (rebuilding from KV on start); replaces any existing one."""
        self._records[record.name] = record

    def apply_snapshot(self, snap: NodeSnapshot, received_at: float) -> Outcome:
        """Store `snap`'s inventory (`proto.compact.inventory_only`: no per-port counters)
        unless the ordering rejects it (Ignored.OLDER or DUPLICATE; the record is untouched).

        A port-state event observed after `snap` was collected but received before it is
        replayed onto it: the agent re-reads its inventory after every port event, so a
        snapshot collected just before a repair can arrive after the repair's event — the
        later event must win over the older snapshot.
        """
        old = self._records.get(snap.node)
        followed = self._process_for(old, snap.epoch, snap.collected_at, received_at)
        if followed is None:
            return self._left_out(old, Ignored.OLDER)
        stored = old.snapshot if old is not None else None
        if old is not None and stored is not None and stored.epoch == snap.epoch:
            stored_at = _or(old.snapshot_received_at, old.last_seen)
            order = ordering.order_seq(
                snap.seq,
                snap.collected_at,
                received_at,
                stored.seq,
                stored.collected_at,
                stored_at,
                legacy=snap.epoch == 0,
            )
            if order is not Order.NEWER:
                return self._left_out(old, _IGNORED[order])
        record = old or _new_record(snap.node, received_at)
        live = inventory_only(snap)  # counters belong to counter batches (docs/wire.md)
        history = tuple(seen.event for seen in record.events)
        for event in history:
            if portevents.supersedes(event, live, history, current=snap.epoch):
                live = portevents.patch(live, event)
        life = self._moved_by(record, followed, snap.collected_at, received_at)
        seen = adapterhistory.observe_snapshot(
            record.adapters, live, epoch=followed.epoch, received_at=received_at
        )
        return self._store(
            replace(record, snapshot=live, snapshot_received_at=received_at, adapters=seen, **life)
        )

    def apply_counters(
        self,
        batch: CounterBatch | PackedCounterBatch,
        received_at: float,
        wire: bytes | None = None,
    ) -> Outcome:
        """Store `batch` unless the ordering rejects it (Ignored.OLDER or DUPLICATE; the
        record is untouched). `wire`: the bytes `batch` was decoded from, held instead of the
        decoded batch (aggregator.fleet.heldcounters). A packed batch must have passed
        `proto.packedcounters.check` (`proto.codec.decode_counters` does).

        A full batch is stored as is and becomes the node's delta base. A delta
        (`base_seq` set) is stored with that base and merged when read — the full batch
        the agent would have sent — when the base held is the one it names (of the same
        agent process) and has every port it lists; otherwise it is ignored
        (Ignored.UNMATCHED_DELTA, counted in `unmatched_deltas`; only the node's last_seen
        moves) until the next full batch.
        """
        old = self._records.get(batch.node)
        followed = self._process_for(old, batch.epoch, batch.collected_at, received_at)
        if followed is None:
            return self._left_out(old, Ignored.OLDER)
        stored = old.counters_held if old is not None else None
        if old is not None and stored is not None and old.counters_epoch == batch.epoch:
            stored_at = _or(old.counters_received_at, old.last_seen)
            order = ordering.order_seq(
                batch.seq,
                batch.collected_at,
                received_at,
                stored.seq,
                stored.collected_at,
                stored_at,
                legacy=batch.epoch == 0,
            )
            if order is not Order.NEWER:
                return self._left_out(old, _IGNORED[order])
        record = old or _new_record(batch.node, received_at)
        life = self._moved_by(record, followed, batch.collected_at, received_at)
        hold = self._hold(batch, wire)
        if hold is None:  # the node is alive all the same
            self.ignored += 1
            self.unmatched_deltas += 1
            alive = replace(record, **life)
            self._records[alive.name] = alive
            return Outcome(alive, Ignored.UNMATCHED_DELTA)
        held, base_seq, changed = hold
        return self._store(
            replace(
                record,
                counters_held=held,
                counters_received_at=received_at,
                counters_base_seq=base_seq,
                counters_delta=changed,
                counters_epoch=batch.epoch,
                **life,
            )
        )

    def _hold(
        self, batch: CounterBatch | PackedCounterBatch, wire: bytes | None
    ) -> tuple[HeldCounters, int | None, frozenset[str] | None] | None:
        """The held form of `batch`, its base's seq and the keys it changed over the base
        (NodeRecord.counters_base_seq/counters_delta); None: a delta that does not fit."""
        seq, at, errors, ports = batch.seq, batch.collected_at, batch.errors, batch.ports
        if batch.base_seq is None:
            # Held as received: a packed one is unpacked only when something reads it.
            full = CounterBase(batch, wire or batch, self._shapes)
            self._counter_bases[batch.node] = full
            self._base_epochs[batch.node] = batch.epoch
            clean = full.clean and not errors
            decoded = batch if isinstance(batch, CounterBatch) else None
            held = HeldCounters(base=full, delta=None, seq=seq, collected_at=at, clean=clean,
                                batch=decoded)  # fmt: skip
            return held, seq, _NOTHING
        base = self._counter_bases.get(batch.node)
        listed = self._shapes.ports(ports)
        if base is None or base.seq != batch.base_seq or not listed <= base.ports:
            return None
        if self._base_epochs.get(batch.node) != batch.epoch:  # another process's seq
            return None
        verified = type(batch) is CleanPackedCounterBatch  # no flag, no value to look at
        odd = not verified and flagged(ports)
        # Only new values over the base: the delta's keys are all that changed.
        plain = not odd and errors == base.errors and base.flagged.isdisjoint(listed)
        maybe_clean = base.clean and not errors and not odd
        keys: frozenset[str] | None = None
        if isinstance(batch, PackedCounterBatch):
            clean = maybe_clean and (verified or packed_values_clean(batch.ports))
            if plain:
                keys = self._shapes.packed_keys(batch)
        else:
            clean = maybe_clean and values_clean(batch.ports)
            if plain:
                keys = self._shapes.keys(batch.ports)
        held = HeldCounters(base=base, delta=wire or batch, seq=seq, collected_at=at, clean=clean)
        return held, batch.base_seq if plain else None, keys

    def apply_status(self, status: DevicePluginStatus, received_at: float) -> Outcome:
        """Store the device plugin's status unless the ordering rejects it: one of the same
        agent process observed at the same time (Ignored.DUPLICATE) or later
        (Ignored.OLDER), or one of an earlier process (Ignored.OLDER)."""
        old = self._records.get(status.node)
        followed = self._process_for(old, status.epoch, status.observed_at, received_at)
        if followed is None:
            return self._left_out(old, Ignored.OLDER)
        record = old or _new_record(status.node, received_at)
        stored = record.device_plugin
        if stored is not None and stored.epoch == status.epoch:
            stored_at = _or(record.device_plugin_received_at, record.last_seen)
            order = ordering.order_observed(
                status.observed_at, received_at, stored.observed_at, stored_at
            )
            if order is not Order.NEWER:
                return self._left_out(record, _IGNORED[order])
        life = self._moved_by(record, followed, status.observed_at, received_at)
        seen = adapterhistory.observe_status(
            record.adapters, status, epoch=followed.epoch, received_at=received_at
        )
        return self._store(
            replace(
                record,
                device_plugin=status,
                device_plugin_received_at=received_at,
                adapters=seen,
                **life,
            )
        )

    def apply_event(self, event: LinkEvent, received_at: float) -> Outcome:
        """Append to the bounded history; a port-state event also updates the live port.

        The stored snapshot's port changes only when the event was observed after the
        snapshot was collected (or the snapshot is of an earlier agent process) and no
        newer event for that port has been seen already. An exact redelivery of an event
        still in the history is Ignored.DUPLICATE; an event of an earlier agent process
        than the followed one is Ignored.OLDER.
        """
        old = self._records.get(event.node)
        followed = self._process_for(old, event.epoch, event.observed_at, received_at)
        if followed is None:
            return self._left_out(old, Ignored.OLDER)
        record = old or _new_record(event.node, received_at)
        if any(seen.event == event for seen in record.events):
            return self._left_out(record, Ignored.DUPLICATE)
        snapshot = record.snapshot
        history = (seen.event for seen in record.events)
        if snapshot is not None and portevents.supersedes(
            event, snapshot, history, current=event.epoch
        ):
            snapshot = portevents.patch(snapshot, event)
        events = (
            *record.events[-(MAX_EVENTS - 1) :],
            ReceivedEvent(event=event, received_at=received_at),
        )
        life = self._moved_by(record, followed, event.observed_at, received_at)
        return self._store(replace(record, snapshot=snapshot, events=events, **life))

    def _process_for(
        self, record: NodeRecord | None, epoch: int, stamped_at: float, received_at: float
    ) -> Instance | None:
        """The agent process the node follows once a message of `epoch`, stamped
        `stamped_at` by the agent, is applied; None: the message is of an earlier process
        than the followed one (ignore it)."""
        current = _followed(record)
        clock = record.clock if record is not None and record.instance is current else None
        offset = None if clock is None else clock.offset_s
        verdict = ordering.judge(current, epoch, received_at, self._ordering,
                                 stamped_at=stamped_at, offset_s=offset)  # fmt: skip
        if verdict is Verdict.EARLIER:
            return None
        if verdict is Verdict.SAME and current is not None:
            return ordering.heard(current, received_at)
        return ordering.start(epoch, received_at)

    @staticmethod
    def _moved_by(
        record: NodeRecord, followed: Instance, stamped_at: float, received_at: float
    ) -> dict[str, Any]:
        """The record fields an applied message moves besides its own: the node's last
        sign of life, the process followed and its clock offset (afresh for a new one)."""
        same = record.instance is not None and record.instance.epoch == followed.epoch
        clock = clockoffset.observe(record.clock if same else None, stamped_at, received_at)
        return {
            "last_seen": max(record.last_seen, received_at),
            "instance": followed,
            "clock": clock,
        }

    def _left_out(self, record: NodeRecord | None, why: Ignored) -> Outcome:
        """Count a message left out; the record stays as it is."""
        assert record is not None, "a node's first message is never ignored"
        self.ignored += 1
        return Outcome(record, why)

    def _store(self, record: NodeRecord) -> Outcome:
        """Store the record an applied message made."""
        self._records[record.name] = record
        return Outcome(record)


def _new_record(name: str, received_at: float) -> NodeRecord:
    return NodeRecord(name=name, first_seen=received_at, last_seen=received_at)


def _or(value: float | None, default: float) -> float:
    return default if value is None else value
