"""The aggregator's fleet view: one immutable `NodeRecord` per node, replaced per message.

Pure: no I/O, no clock reads, no logging — callers pass `received_at`/`now`. Owns the
ordering rule for snapshots and counter batches, keeps live port state in step with
`port-state` events, and derives the summaries and detail views the API serves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Final, cast, get_args

import msgspec
from msgspec.structs import replace

from aggregator.fleet.heldcounters import (
    CounterBase,
    HeldCounters,
    Shapes,
    flagged,
    packed_values_clean,
    values_clean,
)
from aggregator.fleet.heldcounters import merge_counter_delta as merge_counter_delta  # re-exported
from proto.compact import inventory_only
from proto.http import NODE_STATES, EventView, NodeDetail, NodeState, NodeSummary
from proto.ibta import ACTIVE_STATES, PHYS_STATES, PORT_STATES
from proto.inventory import NodeSnapshot, Port, PortStateName
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

    @property
    def counters(self) -> CounterBatch | None:
        """The latest counter batch, a delta merged onto its base (built on first read)."""
        held = self.counters_held
        return None if held is None else held.batch


def is_newer(seq: int, collected_at: float, stored_seq: int, stored_collected_at: float) -> bool:
    """Whether a snapshot/counter batch should replace the stored one.

    `seq` orders messages of one agent process, but a restarted agent starts again at 1,
    so a message is accepted when its seq is higher *or* it was collected later. Exact
    redeliveries (same seq, same time) and late older messages are ignored. A message
    delayed across an agent restart may slip through; the next publish corrects it.
    """
    return seq > stored_seq or collected_at > stored_collected_at


class Fleet:
    """Mapping node name -> NodeRecord. Each update replaces one record (O(1))."""

    def __init__(self, records: Iterable[NodeRecord] = ()) -> None:
        self._records: dict[str, NodeRecord] = {}
        self.ignored = 0  # out-of-order or duplicate messages dropped
        # The last full counter batch per node: what counter deltas are relative to.
        self._counter_bases: dict[str, CounterBase] = {}
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
        return self._records.pop(name, None)

    def load(self, record: NodeRecord) -> None:
        """Install a record as-is (rebuilding from KV on start); replaces any existing one."""
        self._records[record.name] = record

    def apply_snapshot(self, snap: NodeSnapshot, received_at: float) -> NodeRecord:
        """Store `snap`'s inventory (`proto.compact.inventory_only`: no per-port counters)
        unless is_newer rejects it; accepted iff `result.snapshot` is not the previously
        stored object.

        A port-state event observed after `snap` was collected but received before it is
        replayed onto it: the agent re-reads its inventory after every port event, so a
        snapshot collected just before a repair can arrive after the repair's event — the
        later event must win over the older snapshot.
        """
        old = self._records.get(snap.node)
        stored = old.snapshot if old is not None else None
        if old is not None and stored is not None and not _newer(snap, stored):
            self.ignored += 1
            return old
        record = old or _new_record(snap.node, received_at)
        live = inventory_only(snap)  # counters belong to counter batches (docs/wire.md)
        for seen in record.events:
            if _supersedes(seen.event, live, record.events):
                live = _patch(live, seen.event)
        return self._store(
            replace(
                record,
                snapshot=live,
                snapshot_received_at=received_at,
                last_seen=max(record.last_seen, received_at),
            )
        )

    def apply_counters(
        self,
        batch: CounterBatch | PackedCounterBatch,
        received_at: float,
        wire: bytes | None = None,
    ) -> NodeRecord:
        """Store `batch` unless is_newer rejects it; accepted iff `result.counters_held` is
        not the previously stored object. `wire`: the bytes `batch` was decoded from, held
        instead of the decoded batch (aggregator.fleet.heldcounters). A packed batch must have
        passed `proto.packedcounters.check` (`proto.codec.decode_counters` does).

        A full batch is stored as is and becomes the node's delta base. A delta
        (`base_seq` set) is stored with that base and merged when read — the full batch
        the agent would have sent — when the base held is the one it names and has every
        port it lists; otherwise it is ignored (counted in `unmatched_deltas`, the node
        kept fresh) until the next full batch.
        """
        old = self._records.get(batch.node)
        stored = old.counters_held if old is not None else None
        if (
            old is not None
            and stored is not None
            and not is_newer(batch.seq, batch.collected_at, stored.seq, stored.collected_at)
        ):
            self.ignored += 1
            return old
        record = old or _new_record(batch.node, received_at)
        hold = self._hold(batch, wire)
        if hold is None:  # the node is alive all the same
            self.ignored += 1
            self.unmatched_deltas += 1
            return self._store(replace(record, last_seen=max(record.last_seen, received_at)))
        held, base_seq, changed = hold
        return self._store(
            replace(
                record,
                counters_held=held,
                counters_received_at=received_at,
                last_seen=max(record.last_seen, received_at),
                counters_base_seq=base_seq,
                counters_delta=changed,
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
            clean = full.clean and not errors
            decoded = batch if isinstance(batch, CounterBatch) else None
            held = HeldCounters(base=full, delta=None, seq=seq, collected_at=at, clean=clean,
                                batch=decoded)  # fmt: skip
            return held, seq, _NOTHING
        base = self._counter_bases.get(batch.node)
        listed = self._shapes.ports(ports)
        if base is None or base.seq != batch.base_seq or not listed <= base.ports:
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

    def apply_status(self, status: DevicePluginStatus, received_at: float) -> NodeRecord:
        """Store the device plugin's status unless an equal-or-newer one is stored."""
        old = self._records.get(status.node)
        record = old or _new_record(status.node, received_at)
        stored = record.device_plugin
        if stored is not None and status.observed_at <= stored.observed_at:
            self.ignored += 1
            return record
        return self._store(
            replace(
                record,
                device_plugin=status,
                device_plugin_received_at=received_at,
                last_seen=max(record.last_seen, received_at),
            )
        )

    def apply_event(self, event: LinkEvent, received_at: float) -> NodeRecord:
        """Append to the bounded history; a port-state event also updates the live port.

        The stored snapshot's port changes only when the event was observed after the
        snapshot was collected and no newer event for that port has been seen already.
        An exact redelivery of an event still in the history is ignored.
        """
        record = self._records.get(event.node) or _new_record(event.node, received_at)
        if any(seen.event == event for seen in record.events):
            self.ignored += 1
            return record
        snapshot = record.snapshot
        if snapshot is not None and _supersedes(event, snapshot, record.events):
            snapshot = _patch(snapshot, event)
        events = (
            *record.events[-(MAX_EVENTS - 1) :],
            ReceivedEvent(event=event, received_at=received_at),
        )
        return self._store(
            replace(
                record,
                snapshot=snapshot,
                events=events,
                last_seen=max(record.last_seen, received_at),
            )
        )

    def _store(self, record: NodeRecord) -> NodeRecord:
        self._records[record.name] = record
        return record


def _newer(message: NodeSnapshot, stored: NodeSnapshot) -> bool:
    return is_newer(message.seq, message.collected_at, stored.seq, stored.collected_at)


def _new_record(name: str, received_at: float) -> NodeRecord:
    return NodeRecord(name=name, first_seen=received_at, last_seen=received_at)


def _supersedes(
    event: LinkEvent, snapshot: NodeSnapshot, history: tuple[ReceivedEvent, ...]
) -> bool:
    """A port-state (or netdev-state) event changes the live port (or netdev) unless it
    predates the snapshot or something newer about the same target already arrived."""
    if event.kind == "port-state":
        if event.port is None or event.new_state is None:
            return False
    elif event.kind != "netdev-state" or event.netdev is None:
        return False
    if event.observed_at < snapshot.collected_at:
        return False
    return not any(
        seen.event.kind == event.kind
        and _target(seen.event) == _target(event)
        and seen.event.observed_at > event.observed_at
        for seen in history
    )


def _target(event: LinkEvent) -> tuple[str | None, int | None, str | None]:
    if event.kind == "netdev-state":
        return (None, None, event.netdev)
    return (event.device, event.port, None)


def _patch(snap: NodeSnapshot, event: LinkEvent) -> NodeSnapshot:
    return _patch_netdev(snap, event) if event.kind == "netdev-state" else _patch_port(snap, event)


def _patch_netdev(snap: NodeSnapshot, event: LinkEvent) -> NodeSnapshot:
    """The netdev's operstate as netlink reported it (None: the netdev vanished)."""
    devices = []
    changed = False
    for device in snap.devices:
        interfaces = tuple(
            replace(i, operstate=event.new_state) if i.name == event.netdev else i
            for i in device.interfaces
        )
        if interfaces != device.interfaces:
            device = replace(device, interfaces=interfaces)
            changed = True
        devices.append(device)
    return replace(snap, devices=tuple(devices)) if changed else snap


def _patch_port(snap: NodeSnapshot, event: LinkEvent) -> NodeSnapshot:
    state: PortStateName = _as_state(event.new_state)
    devices = []
    changed = False
    for device in snap.devices:
        if device.name == event.device:
            ports = []
            for port in device.ports:
                if port.port == event.port:
                    port = _port_with_state(port, state, event.phys_state)
                    changed = True
                ports.append(port)
            device = replace(device, ports=tuple(ports))
        devices.append(device)
    return replace(snap, devices=tuple(devices)) if changed else snap


def _as_state(value: str | None) -> PortStateName:
    for name in get_args(PortStateName):
        if name == value:
            return cast(PortStateName, name)
    return "UNKNOWN"


def _port_with_state(port: Port, state: PortStateName, phys: str | None) -> Port:
    if phys is None:
        return replace(port, state=state, state_id=PORT_STATES.get(state))
    return replace(
        port,
        state=state,
        state_id=PORT_STATES.get(state),
        phys_state=phys,
        phys_state_id=PHYS_STATES.get(phys),
    )


def node_state(record: NodeRecord, now: float, stale_after: float) -> NodeState:
    """`no-snapshot` until an inventory arrives; `stale` when silent beyond stale_after."""
    if record.snapshot is None:
        return "no-snapshot"
    if now - record.last_seen > stale_after:
        return "stale"
    return "ready"


def summarize(record: NodeRecord, now: float, stale_after: float) -> NodeSummary:
    snap = record.snapshot
    devices = snap.devices if snap is not None else ()
    ports = [(d.name, p) for d in devices for p in d.ports]
    rates = [p.rate_gbps for _, p in ports if p.rate_gbps is not None]
    return NodeSummary(
        name=record.name,
        state=node_state(record, now, stale_after),
        devices=len(devices),
        ports_total=len(ports),
        ports_active=sum(p.state in ACTIVE_STATES for _, p in ports),
        ports_down=tuple(f"{d}/{p.port}" for d, p in ports if p.state not in ACTIVE_STATES),
        link_layers=tuple(sorted({p.link_layer for _, p in ports})),
        max_rate_gbps=max(rates, default=None),
        gpus=len(snap.gpus) if snap is not None else 0,
        firmware=tuple(sorted({d.fw_ver for d in devices if d.fw_ver})),
        agent_version=snap.agent_version if snap is not None else None,
        errors=_error_count(snap),
        last_seen=record.last_seen,
        age_s=max(0.0, now - record.last_seen),
    )


def _error_count(snap: NodeSnapshot | None) -> int:
    if snap is None:
        return 0
    return len(snap.errors) + sum(len(d.errors) for d in snap.devices)


def describe(record: NodeRecord, now: float, stale_after: float) -> NodeDetail:
    return NodeDetail(
        summary=summarize(record, now, stale_after),
        first_seen=record.first_seen,
        snapshot=record.snapshot,
        snapshot_received_at=record.snapshot_received_at,
        counters=record.counters,
        counters_received_at=record.counters_received_at,
        device_plugin=record.device_plugin,
        events=tuple(_event_view(r) for r in record.events),
    )


def _event_view(received: ReceivedEvent) -> EventView:
    e = received.event
    return EventView(
        seq=e.seq,
        kind=e.kind,
        device=e.device,
        port=e.port,
        netdev=e.netdev,
        old_state=e.old_state,
        new_state=e.new_state,
        phys_state=e.phys_state,
        observed_at=e.observed_at,
        received_at=received.received_at,
        latency_ms=(received.received_at - e.observed_at) * 1000.0,
    )


def nodes_by_state(fleet: Fleet, now: float, stale_after: float) -> dict[str, int]:
    """Pure: every state present, zero when no node is in it (no vanishing series)."""
    counts: dict[str, int] = dict.fromkeys(NODE_STATES, 0)
    for record in fleet.records():
        counts[node_state(record, now, stale_after)] += 1
    return counts
