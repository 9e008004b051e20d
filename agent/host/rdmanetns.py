"""Pure parsing of the RDMA subsystem's network-namespace mode, as ib_core's `netns_mode`
module parameter shows it (module/ib_core/parameters/netns_mode).

Text in, a mode out; no I/O (agent.host.platform reads the file). Junk raises ParseError.
"""

from __future__ import annotations

from typing import Final

from agent.errors import ParseError
from proto.inventory import RdmaNetnsMode

PARAMETER: Final = "module/ib_core/parameters/netns_mode"
# drivers/infiniband/core/device.c binds the parameter (a bool, 0444) to the very variable
# `rdma system set netns exclusive` changes (rdma_compatdev_set), so the file shows the
# mode in force, not only the boot-time one. param_get_bool writes Y or N; 1/0 are taken
# too, for a backport that declares it an int.
_MODES: Final[dict[str, RdmaNetnsMode]] = {
    "Y": "shared",
    "1": "shared",
    "N": "exclusive",
    "0": "exclusive",
}


def parse_netns_mode(text: str) -> RdmaNetnsMode:
    """`Y` (shared: every RDMA device in every netns) or `N` (exclusive)."""
    value = text.strip()
    mode = _MODES.get(value)
    if mode is None:
        raise ParseError("RDMA netns mode", value, "not Y or N")
    return mode
