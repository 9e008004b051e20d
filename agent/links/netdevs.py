"""Pure netdev bookkeeping: netlink observations, the table of known netdevs, and the
link events that turn one table into the next.

No I/O, clock or pyroute2 (`agent.links.netlink` decodes into these observations). Events
are emitted only for netdevs of RDMA devices: a GPU node's pod veths would flood them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Literal

from proto.inventory import NodeSnapshot
from proto.messages.events import LinkEvent

# netdev name -> (RDMA device, port number or None when the kernel does not say)
NetdevPorts = Mapping[str, tuple[str, int | None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkObservation:
    """One RTM_NEWLINK / RTM_DELLINK, decoded. `operstate` is lowercase as in sysfs."""

    index: int
    name: str
    operstate: str | None = None
    carrier: bool | None = None
    mtu: int | None = None
    address: str | None = None  # link-layer address
    removed: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class AddressObservation:
    """One RTM_NEWADDR / RTM_DELADDR, decoded; `address` is "192.0.2.1/24"."""

    index: int
    address: str
    removed: bool = False


Observation = LinkObservation | AddressObservation


@dataclass(frozen=True, slots=True, kw_only=True)
class Netdev:
    """What the agent knows about one netdev (by ifindex)."""

    name: str
    operstate: str | None = None
    carrier: bool | None = None
    mtu: int | None = None
    address: str | None = None
    ips: frozenset[str] = frozenset()


Netdevs = dict[int, Netdev]


@dataclass(frozen=True, slots=True)
class NetdevChanges:
    """Events to publish, and whether an RDMA netdev changed at all (a carrier flip or a
    rename publishes nothing, but its ports and the snapshot must still be re-read)."""

    events: list[LinkEvent]
    reread: bool


def netdev_ports(snapshot: NodeSnapshot) -> dict[str, tuple[str, int | None]]:
    """Pure: netdev name -> (RDMA device, port) from a snapshot's devices."""
    ports: dict[str, tuple[str, int | None]] = {}
    for device in snapshot.devices:
        for name in device.netdevs:
            ports[name] = (device.name, None)
        for interface in device.interfaces:
            ports[interface.name] = (device.name, interface.port)
    return ports


def update_netdevs(netdevs: Mapping[int, Netdev], observation: Observation) -> Netdevs:
    """Pure: the table after one observation (the input is not modified)."""
    table = dict(netdevs)
    known = table.get(observation.index)
    if isinstance(observation, LinkObservation):
        if observation.removed:
            table.pop(observation.index, None)
            return table
        table[observation.index] = Netdev(
            name=observation.name,
            operstate=observation.operstate,
            carrier=observation.carrier,
            mtu=observation.mtu,
            address=observation.address,
            ips=known.ips if known is not None else frozenset(),
        )
        return table
    if known is None:
        # An address for a link we have not seen: the link message follows (or the
        # link is already gone); nothing to attach the address to.
        return table
    if observation.removed:
        ips = known.ips - {observation.address}
    else:
        ips = known.ips | {observation.address}
    if ips != known.ips:
        table[observation.index] = replace(known, ips=ips)
    return table


def netdevs_from_dump(observations: Iterable[Observation]) -> Netdevs:
    """Pure: the table described by a full link + address dump."""
    table: Netdevs = {}
    for observation in observations:
        table = update_netdevs(table, observation)
    return table


def diff_netdevs(
    old: Mapping[int, Netdev],
    new: Mapping[int, Netdev],
    *,
    ports: NetdevPorts,
    node: str,
    now: float,
    seq: int,
) -> NetdevChanges:
    """Pure: the events (numbered from `seq + 1`) that turn table `old` into `new`.

    Only netdevs found in `ports` (under their new or old name) publish events: state
    (operstate; a vanished netdev has new_state None), MTU, link-layer address, and IP
    addresses (one event per address added or removed).
    """
    events: list[LinkEvent] = []
    reread = False
    for index in sorted(old.keys() | new.keys()):
        before, after = old.get(index), new.get(index)
        if before == after:
            continue
        names = [n.name for n in (after, before) if n is not None]
        mapped = next((ports[name] for name in names if name in ports), None)
        if mapped is None:
            continue
        reread = True
        for kind, old_value, new_value in _netdev_changes(before, after):
            seq += 1
            events.append(
                LinkEvent(
                    node=node,
                    seq=seq,
                    kind=kind,
                    device=mapped[0],
                    port=mapped[1],
                    netdev=names[0],
                    old_state=old_value,
                    new_state=new_value,
                    observed_at=now,
                )
            )
    return NetdevChanges(events=events, reread=reread)


NetdevEventKind = Literal["netdev-state", "netdev-mtu", "netdev-address"]
_Change = tuple[NetdevEventKind, str | None, str | None]


def _netdev_changes(before: Netdev | None, after: Netdev | None) -> list[_Change]:
    changes: list[_Change] = []
    old_state = before.operstate if before is not None else None
    new_state = after.operstate if after is not None else None
    if old_state != new_state or before is None or after is None:
        changes.append(("netdev-state", old_state, new_state))
    if before is None or after is None:
        return changes
    if before.mtu != after.mtu:
        changes.append(("netdev-mtu", _text(before.mtu), _text(after.mtu)))
    if before.address != after.address:
        changes.append(("netdev-address", before.address, after.address))
    for ip in sorted(before.ips - after.ips):
        changes.append(("netdev-address", ip, None))
    for ip in sorted(after.ips - before.ips):
        changes.append(("netdev-address", None, ip))
    return changes


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)
