"""`GET /api/v1/dra/slices`: the ResourceSlices (resource.k8s.io/v1) each node with a
snapshot would publish as the rdma.nicfleet.io DRA driver, built by proto.draslices —
what `nicfleetctl claim explain` evaluates claims against without `--slices`.

Read-only over the fleet's view. Each node's pool is built with the sharing and rails its
agent reported (`DraPluginStatus.slices`, aggregator.dra.nodedevices), the default
(exclusive, no rails) for a node whose agent reported none; the `ownerReferences` the
publisher adds are not shown. On a sharded aggregator a replica answers for the nodes it
holds.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from aggregator.api.errors import BadParameter, json_response
from aggregator.dra.nodedevices import node_slice_settings
from aggregator.fleet.state import Fleet
from proto.draslices import SliceSettings, build_slices

SLICES_PATH: Final = "/api/v1/dra/slices"


def fleet_slices(fleet: Fleet, base: SliceSettings) -> list[dict[str, Any]]:
    """Every node's slices, nodes in name order; a node without a snapshot has none."""
    view = fleet.view()
    out: list[dict[str, Any]] = []
    for name in sorted(view):
        record = view[name]
        if record.snapshot is not None:
            # The snapshot's port states: link events since it are not applied here.
            settings = node_slice_settings(record.device_plugin, base)
            out.extend(build_slices(record.snapshot, {}, settings))
    return out


def add_dra_routes(app: web.Application, *, fleet: Fleet) -> None:
    settings = SliceSettings()

    async def list_slices(request: web.Request) -> web.Response:
        for key in request.query:
            raise BadParameter(key, f"unknown query parameter {key!r}; expected none")
        items = fleet_slices(fleet, settings)
        return json_response(
            {"apiVersion": "v1", "kind": "List", "items": items, "count": len(items)}
        )

    app.router.add_get(SLICES_PATH, list_slices)
