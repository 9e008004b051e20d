"""Immediate events: an RDMA port's or a netdev's state changed, a device came or went."""

from __future__ import annotations

from typing import Literal

from proto.inventory import Base
from proto.messages import MESSAGES_VERSION

# port-state: an RDMA port's state/phys_state changed (sysfs);
# netdev-state / netdev-mtu / netdev-address: a netdev changed (netlink);
# device-added / device-removed: an RDMA device appeared or vanished.
EventKind = Literal[
    "port-state", "netdev-state", "netdev-mtu", "netdev-address", "device-added", "device-removed"
]


class LinkEvent(Base, frozen=True, kw_only=True, tag_field="schema", tag="nicfleet.v1.LinkEvent"):
    """An immediate change the agent saw (port state, netdev, device add/remove)."""

    version: int = MESSAGES_VERSION
    node: str
    seq: int
    kind: EventKind
    device: str | None = None  # RDMA device, when the change maps to one
    port: int | None = None
    netdev: str | None = None
    old_state: str | None = None  # port: PortStateName; netdev: operstate; mtu: number
    new_state: str | None = None
    phys_state: str | None = None
    observed_at: float  # unix seconds, when the agent saw the change
    # The agent process that sent it (docs/wire.md, "Ordering"): its start in unix ns by
    # its own clock, the same in every message of one process; 0: an agent older than epochs.
    epoch: int = 0
