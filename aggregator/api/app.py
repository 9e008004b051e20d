"""The aggregator's HTTP API (aiohttp): health, readiness, metrics and the node views.

Handlers read the `Fleet` and never change it; the clock, readiness check and metrics
registry are passed in. Every error — bad parameter, unknown node, unknown route or
method, unexpected exception — is answered with the JSON shape from `httperrors`.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

import msgspec
from aiohttp import web
from multidict import MultiMapping
from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from aggregator import __version__
from aggregator.api.auth import ApiAuth, auth_middleware, same_origin_middleware
from aggregator.api.chain import add_chain_routes
from aggregator.api.dra import add_dra_routes
from aggregator.api.errors import BadParameter, error_response, json_response
from aggregator.api.labelselect import Requirement, parse_selector, selected
from aggregator.api.limits import HttpLimits
from aggregator.api.openapi import openapi_document
from aggregator.api.openapiops import OPENAPI_PATH
from aggregator.api.openapischemas import NODE_NAME_FILTER
from aggregator.api.paging import (
    Key,
    NameIndex,
    PageLimits,
    PagingError,
    decode_continue,
    encode_continue,
    parse_limit,
    query_digest,
    select_names,
    window,
)
from aggregator.api.tokenreview import TokenReviewer
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.state import Fleet
from aggregator.fleet.summaries import SummaryCache
from aggregator.fleet.views import describe, node_state
from aggregator.reconcile.loop import ReconcileReport
from aggregator.rules.gpudirect import gpudirect_of
from proto.codec import to_json
from proto.http import NODE_STATES, NodeState, NodeSummary, ValidationRecord
from proto.policy import Policy
from proto.subjects import InvalidNodeName, validate_node_name

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
NODE_LIST_PARAMS: Final = ("state", "name", "label", "limit", "continue", "offset")
MAX_SUGGESTIONS: Final = 3
CLIENT_GONE: Final = 499
_NAME_FILTER: Final = re.compile(NODE_NAME_FILTER["pattern"][1:-1])
# Any token is a valid HTTP method; only these become metric label values.
_KNOWN_METHODS: Final = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class ApiSettings(msgspec.Struct, frozen=True, kw_only=True):
    stale_after: float = 30.0  # seconds without any message before a node is "stale"


class NodeList(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    items: tuple[NodeSummary, ...]
    count: int  # items in this page
    total: int  # nodes matching the filter, before limit/offset
    offset: int
    limit: int
    # Absent on the last page; else pass it back as `continue` (same filters) for the next.
    continue_: str | None = msgspec.field(default=None, name="continue")


class NodeQuery(msgspec.Struct, frozen=True, kw_only=True):
    state: NodeState | None
    name: str | None  # a prefix, or a glob with * ? [...]
    label: tuple[Requirement, ...] | None  # a label selector on the cluster view's labels
    limit: int
    offset: int
    after: Key | None  # from `continue`
    digest: str  # what a `continue` token of this query is bound to


class _Api:
    def __init__(
        self,
        fleet: Fleet,
        settings: ApiSettings,
        readiness: Callable[[], tuple[bool, str]],
        clock: Callable[[], float],
        registry: CollectorRegistry,
        policies: tuple[Policy, ...],
    ) -> None:
        self.fleet = fleet
        self.policies = policies
        self.policy_source: Callable[[], tuple[Policy, ...]] | None = None
        self.policy_report: Callable[[], ReconcileReport] | None = None
        self.cluster_source: Callable[[], ClusterView] = lambda: NO_CLUSTER
        self.settings = settings
        self.readiness = readiness
        self.clock = clock
        self.registry = registry
        self.page_limits = PageLimits()
        self.node_index = NameIndex()  # sorted names, re-sorted when the fleet's names change
        self.summaries = SummaryCache()  # one summarize per node snapshot, not per request
        self.requests = Counter(
            "nicfleet_api_requests",
            "HTTP API requests answered, by route template and status code.",
            ("method", "route", "status"),
            registry=registry,
        )

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            response = await handler(request)
        except BadParameter as exc:
            response = error_response(400, "bad_request", exc.message, field=exc.field)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise  # redirects and the like pass through untouched
            response = _from_http_exception(request, exc)
        except ConnectionError:
            # The client went away mid-request (a body cut off): no one to answer, nothing
            # to log. The response is never sent; 499 (nginx's "client closed") counts it.
            response = error_response(CLIENT_GONE, "http_error", "the client went away")
        except Exception:
            log.exception("unhandled error serving %s %s", request.method, request.path)
            response = error_response(500, "internal", "internal server error")
        method = request.method if request.method in _KNOWN_METHODS else "other"
        self.requests.labels(method, _route_label(request), str(response.status)).inc()
        return response

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        ready, reason = self.readiness()
        if not ready:
            return error_response(503, "not_ready", reason or "not ready")
        return json_response({"status": "ready", "reason": reason})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    async def list_nodes(self, request: web.Request) -> web.Response:
        query = _node_list_query(request, self.page_limits)
        now, stale_after = self.clock(), self.settings.stale_after
        view = self.fleet.view()
        keys: Sequence[Key] = self.node_index.keys(view)
        if query.name is not None:
            keys = select_names(keys, query.name)
        if query.label is not None:
            keys = _labelled(keys, query.label, self.cluster_source())
        if query.state is not None:
            wanted = query.state
            keys = [k for k in keys if node_state(view[str(k[0])], now, stale_after) == wanted]
        page = window(keys, query.after, query.limit, query.offset)
        items = tuple(
            self.summaries.summary(view[str(k[0])], now, stale_after)
            for k in keys[page.start : page.end]
        )
        self.summaries.retain(view)
        token = None if page.after is None else encode_continue(page.after, query.digest)
        body = NodeList(
            items=items,
            count=len(items),
            total=page.total,
            offset=query.offset,
            limit=query.limit,
            continue_=token,
        )
        return json_response(body)

    async def get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["node"]
        try:
            validate_node_name(name)
        except InvalidNodeName as exc:
            raise BadParameter("node", str(exc)) from exc
        record = self.fleet.get(name)
        if record is None:
            close = difflib.get_close_matches(name, self.fleet.names(), n=MAX_SUGGESTIONS)
            return error_response(
                404,
                "not_found",
                f"node {name!r} not found",
                field="node",
                suggestions=tuple(close),
            )
        detail = describe(record, self.clock(), self.settings.stale_after)
        if detail.snapshot is not None:  # computed here: rules sit above fleet's views
            detail = msgspec.structs.replace(detail, gpudirect=gpudirect_of(detail.snapshot))
        return json_response(detail)

    async def get_policy(self, request: web.Request) -> web.Response:
        """Effective policies; with a reconciler also its per-node plan, state and errors."""
        if self.policy_report is not None:
            report = self.policy_report()
            return json_response(
                {
                    "items": report.policies,
                    "count": len(report.policies),
                    "leader": report.leader,
                    "reconciled_at": report.at,
                    "statuses": report.statuses,
                    "nodes": report.nodes,
                    "conflicts": report.conflicts,
                    "errors": report.errors,
                }
            )
        policies = self.policy_source() if self.policy_source is not None else self.policies
        return json_response({"items": policies, "count": len(policies)})


def build_app(
    *,
    fleet: Fleet,
    settings: ApiSettings,
    readiness: Callable[[], tuple[bool, str]],
    clock: Callable[[], float],
    metrics: CollectorRegistry | None = None,
    policies: tuple[Policy, ...] = (),
    cluster_source: Callable[[], ClusterView] | None = None,  # default: no cluster
    policy_source: Callable[[], tuple[Policy, ...]] | None = None,  # default: `policies`
    policy_report: Callable[[], ReconcileReport] | None = None,  # the reconciler's latest
    auth: ApiAuth | None = None,  # bearer tokens (aggregator.api.auth); None: API open
    token_review: TokenReviewer | None = None,  # tokens not in `auth` go to TokenReview
    # (node, resource) -> newest finished validation (aggregator.validations.runner), for the trace
    latest_validation: Callable[[str, str], ValidationRecord | None] | None = None,
    # Connection, in-flight and stream bounds (aggregator.api.limits); None: unbounded
    limits: HttpLimits | None = None,
) -> web.Application:
    """The API application. Registers its request counter in `metrics` (once per registry)."""
    api = _Api(fleet, settings, readiness, clock, metrics or CollectorRegistry(), policies)
    api.policy_source = policy_source
    api.policy_report = policy_report
    api.cluster_source = cluster_source or (lambda: NO_CLUSTER)
    # The auth middleware runs inside the error middleware, so 401/403 are counted too.
    if auth is None and token_review is not None:
        auth = ApiAuth(tokens=())  # TokenReview only
    # The in-flight bound runs first, before any auth work (a TokenReview call) is spent.
    # Without tokens, state-changing requests must be same-origin JSON (CSRF).
    middlewares = (
        ([limits.middleware()] if limits is not None else [])
        + [api.middleware]
        + [
            auth_middleware(auth, review=token_review, registry=api.registry)
            if auth
            else same_origin_middleware()
        ]
    )
    app = web.Application(middlewares=middlewares)
    app.router.add_get("/healthz", api.healthz)
    app.router.add_get("/readyz", api.readyz)
    app.router.add_get("/metrics", api.metrics)
    app.router.add_get("/api/v1/nodes", api.list_nodes)
    app.router.add_get("/api/v1/nodes/{node}", api.get_node)
    app.router.add_get("/api/v1/policy", api.get_policy)
    add_chain_routes(
        app,
        fleet=fleet,
        cluster=cluster_source or (lambda: NO_CLUSTER),
        policies=policy_source or (lambda: policies),
        clock=clock,
        stale_after=settings.stale_after,
        latest_validation=latest_validation,
    )
    add_dra_routes(app, fleet=fleet)
    app.router.add_get(OPENAPI_PATH, _openapi_handler(auth, reviewed=token_review is not None))
    return app


def _node_list_query(request: web.Request, limits: PageLimits) -> NodeQuery:
    query = request.query
    for key in query:
        if key not in NODE_LIST_PARAMS:
            raise BadParameter(
                key, f"unknown query parameter {key!r}; expected one of {list(NODE_LIST_PARAMS)}"
            )
        if len(query.getall(key)) > 1:
            raise BadParameter(key, f"query parameter {key!r} given more than once")
    state: NodeState | None = None
    if "state" in query:
        raw = query["state"]
        matches = [s for s in NODE_STATES if s == raw]
        if not matches:
            raise BadParameter("state", f"state must be one of {list(NODE_STATES)}, got {raw!r}")
        state = matches[0]
    name = query.get("name")
    if name is not None and not _NAME_FILTER.fullmatch(name):
        raise BadParameter(
            "name", f"name must be a node name prefix or a glob (* ? [...]), got {name!r}"
        )
    label = query.get("label")
    try:
        selector = None if label is None else parse_selector(label)
    except ValueError as exc:
        raise BadParameter("label", str(exc)) from exc
    digest = query_digest("nodes", {"state": state, "name": name, "label": label})
    try:
        limit = parse_limit(query.get("limit"), limits)
        token = query.get("continue")
        after = None if token is None else decode_continue(token, digest, (str,))
    except PagingError as exc:
        raise BadParameter(exc.field, exc.message) from exc
    offset = _non_negative_int(query, "offset") or 0
    return NodeQuery(
        state=state,
        name=name,
        label=selector,
        limit=limit,
        offset=offset,
        after=after,
        digest=digest,
    )


def _labelled(
    keys: Sequence[Key], selector: tuple[Requirement, ...], cluster: ClusterView
) -> list[Key]:
    """Name keys whose node's labels (none for a node the cluster view lacks) match."""
    nodes = cluster.nodes
    kept = []
    for key in keys:
        node = nodes.get(str(key[0]))
        if selected(selector, node.labels if node is not None else {}):
            kept.append(key)
    return kept


def _non_negative_int(query: MultiMapping[str], key: str) -> int | None:
    raw = query.get(key)
    if raw is None:
        return None
    # int() also accepts " 7", "+7" and "1_000"; a query parameter should be plain digits.
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9:
        raise BadParameter(key, f"{key} must be a non-negative integer, got {raw!r}")
    return int(raw)


def _from_http_exception(request: web.Request, exc: web.HTTPException) -> web.Response:
    if isinstance(exc, web.HTTPNotFound):
        return error_response(404, "not_found", f"no route for {request.method} {request.path}")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = sorted(exc.allowed_methods)
        return error_response(
            405,
            "method_not_allowed",
            f"method {request.method} not allowed on {request.path}; allowed: {allowed}",
            headers={"Allow": ", ".join(allowed)},
        )
    return error_response(exc.status, "http_error", exc.reason)


def _openapi_handler(auth: ApiAuth | None, *, reviewed: bool) -> Handler:
    """The document of the routes registered when first asked (the router is frozen by then)."""
    cache: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        if not cache:
            router = request.app.router
            routes = [(r.method, r.resource.canonical) for r in router.routes() if r.resource]
            doc = openapi_document(
                routes,
                version=__version__,
                secured=auth is not None,
                metrics_public=auth is not None and auth.metrics_public,
                token_review=reviewed,
            )
            cache.append(to_json(doc))
        return web.Response(body=cache[0], content_type="application/json")

    return handler


def _route_label(request: web.Request) -> str:
    # The route template, never the raw path, so node names don't explode label cardinality.
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"
