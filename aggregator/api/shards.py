"""A sharded replica's HTTP extras (docs/scaling.md, "API"): `GET /api/v1/shards` (the shard
map as this replica sees it) and forwarding of node requests (`/api/v1/nodes/{node}`,
`/api/v1/trace?node=`, `/api/v1/resources?node=`, and a pod's trace,
`/api/v1/trace/pods/{namespace}/{name}`, by the node the pod is bound to) to the replica
holding that node: its URL is in the holder's heartbeat. A forwarded request is never
forwarded again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Final

import aiohttp
from aiohttp import web

from aggregator.api.chain import POD_NODE
from aggregator.api.errors import error_response
from aggregator.api.openapiops import SHARD_PATH
from aggregator.fleet.state import Fleet
from aggregator.replicas.owner import ShardOwner
from aggregator.rules.finding import Finding
from proto.subjects import InvalidNodeName, validate_node_name

FORWARDED_BY: Final = "X-Nicfleet-Forwarded-By"  # set on a forwarded request
SERVED_BY: Final = "X-Nicfleet-Served-By"  # the replica that answered
_NODE_PREFIX: Final = "/api/v1/nodes/"
_NODE_QUERY_PATHS: Final = ("/api/v1/trace", "/api/v1/resources")
_POD_TRACE_PREFIX: Final = "/api/v1/trace/pods/"
_PASSED_HEADERS: Final = ("Authorization", "Accept")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def node_of(request: web.Request) -> str | None:
    """The node a forwardable GET (or HEAD) asks about, else None."""
    if request.method not in ("GET", "HEAD"):
        return None
    path = request.path
    if path.startswith(_NODE_PREFIX) and "/" not in path[len(_NODE_PREFIX) :]:
        return path[len(_NODE_PREFIX) :] or None
    if path in _NODE_QUERY_PATHS:
        return request.query.get("node") or None
    if path.startswith(_POD_TRACE_PREFIX) and POD_NODE in request.app:
        # Every replica lists every pod; only the node's holder has the node's record.
        namespace, _, name = path[len(_POD_TRACE_PREFIX) :].partition("/")
        if namespace and name and "/" not in name:
            return request.app[POD_NODE](namespace, name)
    return None


def add_shard_routes(
    app: web.Application,
    owner: ShardOwner,
    fleet: Fleet,
    findings: Callable[[], Sequence[Finding]],
    *,
    timeout_s: float = 10.0,
) -> None:
    """`GET /api/v1/shards` and the forwarding middleware (added after the app's own)."""

    async def shards(request: web.Request) -> web.Response:
        doc = owner.view()
        doc["node_names"] = owner.node_names()
        doc["findings"] = [
            {"rule": f.rule, "node": f.node, "subject": f.subject} for f in findings()
        ]
        return web.json_response(doc, headers={SERVED_BY: owner.me})

    session: list[aiohttp.ClientSession] = []

    async def client(app: web.Application) -> AsyncIterator[None]:
        session.append(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)))
        yield
        await session.pop().close()

    @web.middleware
    async def forward(request: web.Request, handler: Handler) -> web.StreamResponse:
        name = node_of(request)
        if name is None:
            return await handler(request)
        if name in fleet or request.headers.get(FORWARDED_BY):
            return await _here(request, handler)
        try:
            validate_node_name(name)
        except InvalidNodeName:
            return await handler(request)  # the handler names the bad field
        replica, url = owner.holder_of(name)
        if replica is None or replica == owner.me or url is None:
            return await _here(request, handler)  # ours, not loaded yet, or holder unknown
        headers = {h: request.headers[h] for h in _PASSED_HEADERS if h in request.headers}
        headers[FORWARDED_BY] = owner.me
        try:
            target = url + request.path_qs
            async with session[0].request(request.method, target, headers=headers) as reply:
                body = await reply.read()
                passed = {SERVED_BY: reply.headers.get(SERVED_BY, replica)}
                if "Content-Type" in reply.headers:
                    passed["Content-Type"] = reply.headers["Content-Type"]
                return web.Response(body=body, status=reply.status, headers=passed)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return error_response(
                502, "http_error", f"node {name} is held by replica {replica} ({url}): {exc}"
            )

    async def _here(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        response.headers.setdefault(SERVED_BY, owner.me)
        return response

    app.router.add_get(SHARD_PATH, shards)
    app.cleanup_ctx.append(client)
    app.middlewares.append(forward)
