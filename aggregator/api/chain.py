"""HTTP routes for the resource view and the chain trace: `/api/v1/resources`, `/api/v1/trace`
(`?node=&resource=`) and one pod's own chain, `/api/v1/trace/pods/{namespace}/{name}` (a path
of its own: a query of either node+resource or pod cannot be said in OpenAPI, and a client
checked against the document would send neither).

Handlers validate query parameters (a `BadParameter` becomes the API's JSON 400), then call
the pure `resources`/`trace` modules with the fleet's live view, the current cluster view
and policies (callables, so live sources can be passed) and the injected clock.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Final

import msgspec
from aiohttp import web
from multidict import MultiMapping

from aggregator.api.errors import BadParameter, error_response, json_response
from aggregator.cluster import ClusterView
from aggregator.fleet.state import Fleet
from aggregator.trace.chain import UnknownNode, UnknownResource, trace
from aggregator.trace.pod import UnknownPod, pod_node, trace_pod
from aggregator.trace.resources import summarize_resources
from proto.http import ResourceSummary, ValidationRecord
from proto.policy import Policy
from proto.subjects import InvalidNodeName, validate_node_name

RESOURCE_PARAMS: Final = ("node", "name")
TRACE_PARAMS: Final = ("node", "resource")
POD_TRACE_PATH: Final = "/api/v1/trace/pods/{namespace}/{name}"
# (namespace, name) -> the node the pod is bound to: a sharded replica forwards a pod's trace
# to the holder of that node (aggregator.api.shards), since only it has the node's record.
PodNode = Callable[[str, str], str | None]
POD_NODE: Final[web.AppKey[PodNode]] = web.AppKey("pod-node")
# A namespace is a DNS label, a pod name a DNS subdomain (what the API server allows).
_DNS_LABEL = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NAMESPACE = re.compile(_DNS_LABEL)
_POD_NAME = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*")
MAX_POD_NAME_LENGTH: Final = 253
# <prefix>/<name>: a DNS subdomain, then a qualified name (what the kubelet accepts).
_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
MAX_RESOURCE_LENGTH: Final = 253 + 1 + 63


class ResourceList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[ResourceSummary, ...]
    count: int


def add_chain_routes(
    app: web.Application,
    *,
    fleet: Fleet,
    cluster: Callable[[], ClusterView],
    policies: Callable[[], tuple[Policy, ...]],
    clock: Callable[[], float],
    stale_after: float,
    # The newest finished validation of (node, resource): the trace's tested-data-path link.
    latest_validation: Callable[[str, str], ValidationRecord | None] | None = None,
) -> None:
    """Register GET /api/v1/resources, /api/v1/trace and /api/v1/trace/pods/... on `app`."""

    async def list_resources(request: web.Request) -> web.Response:
        query = _checked_query(request.query, RESOURCE_PARAMS, required=())
        node = query.get("node")
        name = query.get("name")
        if node is not None:
            _check_node(node)
        if name is not None:
            _check_resource("name", name)
        items = summarize_resources(
            fleet=fleet.view(),
            cluster=cluster(),
            policies=policies(),
            now=clock(),
            stale_after=stale_after,
            node=node,
            name=name,
        )
        return json_response(ResourceList(items=items, count=len(items)))

    async def get_trace(request: web.Request) -> web.Response:
        query = _checked_query(request.query, TRACE_PARAMS, required=TRACE_PARAMS)
        node, resource = query["node"], query["resource"]
        _check_node(node)
        _check_resource("resource", resource)
        try:
            result = trace(
                node,
                resource,
                fleet=fleet.view(),
                cluster=cluster(),
                policies=policies(),
                now=clock(),
                stale_after=stale_after,
                validation=latest_validation(node, resource) if latest_validation else None,
            )
        except UnknownNode as exc:
            return error_response(
                404, "not_found", str(exc), field="node", suggestions=exc.suggestions
            )
        except UnknownResource as exc:
            return error_response(
                404, "not_found", str(exc), field="resource", suggestions=exc.suggestions
            )
        return json_response(result)

    async def get_pod_trace(request: web.Request) -> web.Response:
        _checked_query(request.query, (), required=())
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        if not _NAMESPACE.fullmatch(namespace):
            raise BadParameter("namespace", f"namespace must be a DNS label, got {namespace!r}")
        if len(name) > MAX_POD_NAME_LENGTH or not _POD_NAME.fullmatch(name):
            raise BadParameter("name", f"name must be a pod name (DNS subdomain), got {name!r}")
        try:
            # In a worker thread: a pending claim's explanation evaluates CEL over every
            # listed device (aggregator.trace.draalloc), which must not stall the loop that
            # serves agents and other requests. The inputs are immutable views.
            result = await asyncio.to_thread(
                trace_pod,
                namespace,
                name,
                fleet=fleet.view(),
                cluster=cluster(),
                policies=policies(),
                now=clock(),
                stale_after=stale_after,
                validation=latest_validation,
            )
        except UnknownPod as exc:
            return error_response(
                404, "not_found", str(exc), field="name", suggestions=exc.suggestions
            )
        return json_response(result)

    app.router.add_get("/api/v1/resources", list_resources)
    app.router.add_get("/api/v1/trace", get_trace)
    app.router.add_get(POD_TRACE_PATH, get_pod_trace)
    app[POD_NODE] = lambda namespace, name: pod_node(cluster(), namespace, name)


def _checked_query(
    query: MultiMapping[str], allowed: tuple[str, ...], *, required: tuple[str, ...]
) -> dict[str, str]:
    for key in query:
        if key not in allowed:
            raise BadParameter(
                key, f"unknown query parameter {key!r}; expected one of {list(allowed)}"
            )
        if len(query.getall(key)) > 1:
            raise BadParameter(key, f"query parameter {key!r} given more than once")
        if not query[key]:
            raise BadParameter(key, f"query parameter {key!r} is empty")
    for key in required:
        if key not in query:
            raise BadParameter(key, f"query parameter {key!r} is required")
    return {key: query[key] for key in query}


def _check_node(node: str) -> None:
    try:
        validate_node_name(node)
    except InvalidNodeName as exc:
        raise BadParameter("node", str(exc)) from exc


def _check_resource(field: str, value: str) -> None:
    if len(value) > MAX_RESOURCE_LENGTH or not _RESOURCE.fullmatch(value):
        raise BadParameter(
            field, f"{field} must be a full resource name such as rdma/hca_shared, got {value!r}"
        )
