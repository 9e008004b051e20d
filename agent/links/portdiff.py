"""Pure change detection for RDMA ports: which link events turn one poll into the next.

No I/O and no clock: the caller passes both observations and the time. Netdev changes
(from netlink) are `agent.links.netdevs`.
"""

from __future__ import annotations

from proto.inventory import PortStateName
from proto.messages.events import LinkEvent

# (RDMA device, port number) -> (state name, physical state name)
PortStates = dict[tuple[str, int], tuple[PortStateName, str | None]]


def diff_port_states(
    old: PortStates, new: PortStates, *, node: str, now: float, seq: int
) -> list[LinkEvent]:
    """Pure: the link events that turn `old` port states into `new` ones."""
    events: list[LinkEvent] = []
    old_devices = {device for device, _ in old}
    new_devices = {device for device, _ in new}
    for device in sorted(new_devices - old_devices):
        seq += 1
        events.append(
            LinkEvent(node=node, seq=seq, kind="device-added", device=device, observed_at=now)
        )
    for device in sorted(old_devices - new_devices):
        seq += 1
        events.append(
            LinkEvent(node=node, seq=seq, kind="device-removed", device=device, observed_at=now)
        )
    for key in sorted(new.keys() & old.keys()):
        (old_state, old_phys), (new_state, new_phys) = old[key], new[key]
        if (old_state, old_phys) == (new_state, new_phys):
            continue
        seq += 1
        events.append(
            LinkEvent(
                node=node,
                seq=seq,
                kind="port-state",
                device=key[0],
                port=key[1],
                old_state=old_state,
                new_state=new_state,
                phys_state=new_phys,
                observed_at=now,
            )
        )
    return events
