"""The IBTA port states as the kernel prints them in sysfs (drivers/infiniband/core/sysfs.c):
`state` "4: ACTIVE" and `phys_state` "5: LinkUp". One table for the agent's parser, the lab's
renderer and the aggregator's event patches. Pure data.
"""

from __future__ import annotations

from typing import Final

from proto.inventory import PortStateName

# enum ib_port_state: the number before the colon in `state`.
PORT_STATES: Final[dict[str, int]] = {
    "NOP": 0, "DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5,
}  # fmt: skip
# enum ib_port_phys_state: the number before the colon in `phys_state`.
PHYS_STATES: Final[dict[str, int]] = {
    "Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4,
    "LinkUp": 5, "LinkErrorRecovery": 6, "Phy Test": 7,
}  # fmt: skip
# A port that passes traffic: ACTIVE, or ACTIVE_DEFER (active, reporting deferred).
ACTIVE_STATES: Final[frozenset[str]] = frozenset({"ACTIVE", "ACTIVE_DEFER"})
# The names `state` may show; anything else (or out of range) reads as UNKNOWN.
PORT_STATE_NAMES: Final[dict[str, PortStateName]] = {
    "NOP": "NOP", "DOWN": "DOWN", "INIT": "INIT", "ARMED": "ARMED", "ACTIVE": "ACTIVE",
    "ACTIVE_DEFER": "ACTIVE_DEFER", "UNKNOWN": "UNKNOWN",
}  # fmt: skip
