"""Live port and netdev state from `port-state`/`netdev-state` events, patched onto a
stored snapshot. Pure: no I/O, no clock; `Fleet.apply_event`/`apply_snapshot` decide when,
and which agent process is followed (aggregator.fleet.ordering).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast, get_args

from msgspec.structs import replace

from proto.ibta import PHYS_STATES, PORT_STATES
from proto.inventory import NodeSnapshot, Port, PortStateName
from proto.messages.events import LinkEvent


def supersedes(
    event: LinkEvent, snapshot: NodeSnapshot, history: Iterable[LinkEvent], *, current: int
) -> bool:
    """A port-state (or netdev-state) event changes the live port (or netdev) unless it
    predates the snapshot or something newer about the same target already arrived.

    Times are compared only within one agent process (`epoch`): another process's clock may
    be off. An event of the followed process (`current`, aggregator.fleet.ordering) is newer
    than a snapshot of an earlier one; an event of an earlier one never changes the port.
    """
    if event.kind == "port-state":
        if event.port is None or event.new_state is None:
            return False
    elif event.kind != "netdev-state" or event.netdev is None:
        return False
    if event.epoch != current:
        return False
    if event.epoch == snapshot.epoch and event.observed_at < snapshot.collected_at:
        return False
    return not any(
        seen.epoch == event.epoch
        and seen.kind == event.kind
        and _target(seen) == _target(event)
        and seen.observed_at > event.observed_at
        for seen in history
    )


def patch(snap: NodeSnapshot, event: LinkEvent) -> NodeSnapshot:
    """`snap` with the event's new state on its port or netdev (`snap` itself if absent)."""
    return _patch_netdev(snap, event) if event.kind == "netdev-state" else _patch_port(snap, event)


def _target(event: LinkEvent) -> tuple[str | None, int | None, str | None]:
    if event.kind == "netdev-state":
        return (None, None, event.netdev)
    return (event.device, event.port, None)


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
