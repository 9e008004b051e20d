"""Pure change detection: which link events turn one observation into the next.

No I/O and no clock: the caller passes both observations and the time.
"""

from __future__ import annotations

from proto.inventory import PortStateName
from proto.messages import LinkEvent

# (adapter, port number) -> (state name, physical state name)
PortStates = dict[tuple[str, int], tuple[PortStateName, str | None]]


def diff_port_states(
    old: PortStates, new: PortStates, *, node: str, now: float, seq: int
) -> list[LinkEvent]:
    """Pure: the link events that turn `old` port states into `new` ones."""
    events: list[LinkEvent] = []
    old_adapters = {adapter for adapter, _ in old}
    new_adapters = {adapter for adapter, _ in new}
    for adapter in sorted(new_adapters - old_adapters):
        seq += 1
        events.append(
            LinkEvent(node=node, seq=seq, kind="device-added", adapter=adapter, observed_at=now)
        )
    for adapter in sorted(old_adapters - new_adapters):
        seq += 1
        events.append(
            LinkEvent(node=node, seq=seq, kind="device-removed", adapter=adapter, observed_at=now)
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
                adapter=key[0],
                port=key[1],
                old_state=old_state,
                new_state=new_state,
                phys_state=new_phys,
                observed_at=now,
            )
        )
    return events
