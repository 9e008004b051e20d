"""`GET /api/v1/dra/slices`: the ResourceSlices (resource.k8s.io/v1) each node with a
snapshot would publish as the rdma.nicfleet.io DRA driver, built by proto.draslices —
what `nicfleetctl claim explain` evaluates claims against without `--slices`.

Read-only over the fleet's view. The aggregator does not know each node's sharing
settings or rails, so every pool is built with the default (exclusive) SliceSettings;
on a sharded aggregator a replica answers for the nodes it holds.
"""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from aggregator.api.errors import BadParameter, json_response
from aggregator.fleet.state import Fleet
from proto.draslices import SliceSettings, build_slices

SLICES_PATH: Final = "/api/v1/dra/slices"


def fleet_slices(fleet: Fleet, settings: SliceSettings) -> list[dict[str, Any]]:
    """Every node's slices, nodes in name order; a node without a snapshot has none."""
    view = fleet.view()
    out: list[dict[str, Any]] = []
    for name in sorted(view):
        snapshot = view[name].snapshot
        if snapshot is not None:
            # The snapshot's port states: link events since it are not applied here.
            out.extend(build_slices(snapshot, {}, settings))
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
