"""A node's rdma.nicfleet.io DRA devices as the aggregator sees them: the slice settings
the node's agent asked for (`DraPluginStatus.slices`: sharing, share count, rails) and
each device's health by the contract's rule (`portState` ACTIVE, docs/dra.md), for the
trace, the DRA rules, the publisher and `GET /api/v1/dra/slices` — one definition.

Pure: a function of a node's snapshot, its device-plugin status (the DRA part) and the
staleness verdict passed in (the caller's clock).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from proto.draslices import InvalidSliceSettings, SliceSettings, build_slices
from proto.inventory import NodeSnapshot
from proto.messages.status import DevicePluginStatus

PORT_STATE: Final = "portState"  # unqualified in our own slices
STALE: Final = "the node's agent is silent: port state not known"


def node_slice_settings(status: DevicePluginStatus | None, base: SliceSettings) -> SliceSettings:
    """`base` with the sharing and rails the node's agent reported (its `--dra-share`,
    `--dra-consumable`, `--dra-rail`); `base` unchanged when it reported none or bad ones."""
    dra = status.dra if status is not None else None
    if dra is None:
        return base
    wanted = dra.slices
    sharing = wanted.sharing if wanted.sharing in ("exclusive", "copies", "consumable") else None
    if sharing is None:
        return base
    try:
        return replace(
            base,
            sharing=sharing,  # type: ignore[arg-type]  # checked against the Literal above
            share=wanted.share,
            rails=dict(wanted.rails) or dict(base.rails),
        )
    except InvalidSliceSettings:
        return base


def node_devices(snapshot: NodeSnapshot, settings: SliceSettings) -> dict[str, Mapping[str, Any]]:
    """DRA device name -> its slice entry (attributes, capacity), as the node publishes."""
    return {
        str(d["name"]): d
        for s in build_slices(snapshot, {}, settings)
        for d in s["spec"]["devices"]
    }


def status_devices(
    snapshot: NodeSnapshot, status: DevicePluginStatus | None, base: SliceSettings
) -> dict[str, Mapping[str, Any]]:
    """`node_devices` with the settings the node's agent reported over `base`: what the
    node publishes, for the trace and the rules."""
    return node_devices(snapshot, node_slice_settings(status, base))


def device_problem(entry: Mapping[str, Any] | None, *, stale: bool) -> str | None:
    """None when the device is allocatable; else why not: not published (gone from the
    node), the node silent, or its port not ACTIVE."""
    if entry is None:
        return "not on the node (no such RDMA device in its latest snapshot)"
    if stale:
        return STALE
    state = entry.get("attributes", {}).get(PORT_STATE, {}).get("string")
    if state is None or state == "ACTIVE":
        return None
    return f"port {state}"
