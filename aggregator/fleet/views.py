"""What the API and the loops read off a `NodeRecord`: its state (ready, stale,
no-snapshot), the node summary and detail views, nodes counted by state. Pure: no I/O,
`now` passed in; nothing here changes the fleet.
"""

from __future__ import annotations

from aggregator.fleet.state import Fleet, NodeRecord, ReceivedEvent
from proto.http import NODE_STATES, EventView, NodeDetail, NodeState, NodeSummary
from proto.ibta import ACTIVE_STATES
from proto.inventory import NodeSnapshot


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
