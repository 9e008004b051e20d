"""Whether a node's device plugin makes a resource usable there: the one definition that
the resource-zero rule (aggregator.rules.fleetpolicy) and the resources view's ZERO and
UNHEALTHY nodes (aggregator.trace.resources, `nicfleetctl resources`) share. Pure.
"""

from __future__ import annotations

from typing import Literal

from proto.messages.status import DevicePluginStatus

Unusable = Literal["not-served", "advertises-0", "no-healthy"]


def unusable(status: DevicePluginStatus | None, name: str) -> Unusable | None:
    """Why resource `name` is not usable on the node whose plugin reported `status`, or None:
    usable, or not judged here — no status reported yet (the offline check), or an entry
    the agent leaves out as invalid (the resource-config-invalid rule's)."""
    if status is None:
        return None
    served = next((r for r in status.resources if r.name == name), None)
    if served is None:
        return "not-served"
    if served.advertised > 0 and served.healthy > 0:
        return None
    if served.config_error is not None:
        return None
    return "advertises-0" if served.advertised <= 0 else "no-healthy"
