"""HTTP routes for findings and alerts: `/api/v1/findings`, `/api/v1/alerts` and the
Server-Sent Events stream `/api/v1/alerts/stream` (resume with `Last-Event-ID`).

Reads the engine's current findings and alert states, never changes them; bad query
parameters become the API's JSON 400 naming the parameter.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from bisect import bisect_left
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import msgspec
from aiohttp import web

from aggregator.alerts.delivery import Event, StreamClient
from aggregator.alerts.engine import AlertEngine
from aggregator.alerts.lifecycle import FLEET_NODE, listed
from aggregator.api.errors import BadParameter, json_response
from aggregator.api.limits import HttpLimits
from aggregator.api.paging import (
    Key,
    PageLimits,
    PagingError,
    decode_continue,
    encode_continue,
    parse_limit,
    query_digest,
    window,
)
from aggregator.rules.finding import Finding
from proto.codec import to_json
from proto.messages.alerts import Alert
from proto.subjects import InvalidNodeName, validate_node_name

SEVERITIES: Final = ("critical", "warning", "info")
STATUSES: Final = ("firing", "resolved")
FINDING_PARAMS: Final = ("node", "rule", "severity")
FINDING_LIST_PARAMS: Final = (*FINDING_PARAMS, "limit", "continue")
FINDING_KEY: Final = (int, str, str, str)  # severity rank, node ("" fleet-wide), rule, subject
ALERT_PARAMS: Final = ("node", "rule", "severity", "status")
_RULE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")  # fullmatch: `$` would let "x\n" through


@dataclass(frozen=True, kw_only=True)
class StreamSettings:
    heartbeat_s: float = 15.0
    retry_ms: int = 2000  # the reconnect delay suggested to EventSource clients


class Filters(msgspec.Struct, frozen=True, kw_only=True):
    node: str | None = None
    rule: str | None = None
    severity: str | None = None
    status: str | None = None

    def keep(self, rule: str, severity: str, node: str | None, status: str | None) -> bool:
        node_value = node if node is not None else FLEET_NODE
        return (
            (self.node is None or self.node == node_value)
            and (self.rule is None or self.rule == rule)
            and (self.severity is None or self.severity == severity)
            and (self.status is None or self.status == status)
        )

    def alert(self, alert: Alert) -> bool:
        return self.keep(alert.rule, alert.severity, alert.node, alert.state)


def parse_filters(query: web.BaseRequest, allowed: tuple[str, ...]) -> Filters:
    params = query.query
    for key in params:
        if key not in allowed:
            raise BadParameter(
                key, f"unknown query parameter {key!r}; expected one of {list(allowed)}"
            )
        if len(params.getall(key)) > 1:
            raise BadParameter(key, f"query parameter {key!r} given more than once")
    node = params.get("node")
    if node is not None and node != FLEET_NODE:
        try:
            validate_node_name(node)
        except InvalidNodeName as exc:
            raise BadParameter("node", str(exc)) from exc
    rule = params.get("rule")
    if rule is not None and not _RULE.fullmatch(rule):
        raise BadParameter("rule", f"rule must be a rule id like 'port-down', got {rule!r}")
    severity = params.get("severity")
    if severity is not None and severity not in SEVERITIES:
        raise BadParameter(
            "severity", f"severity must be one of {list(SEVERITIES)}, got {severity!r}"
        )
    status = params.get("status")
    if status is not None and status not in STATUSES:
        raise BadParameter("status", f"status must be one of {list(STATUSES)}, got {status!r}")
    return Filters(node=node, rule=rule, severity=severity, status=status)


def _sorted_alerts(alerts: Iterable[Alert]) -> list[Alert]:
    rank = {s: i for i, s in enumerate(SEVERITIES)}
    return sorted(
        alerts, key=lambda a: (a.state != "firing", rank[a.severity], a.node, a.rule, a.subject)
    )


def _finding_key(finding: Finding, rank: dict[str, int]) -> Key:
    return (rank[finding.severity], finding.node or "", finding.rule, finding.subject)


class _SortedFindings:
    """One evaluation's findings sorted by key, sorted again only when the engine replaces
    its findings tuple (once per rule evaluation, not per request)."""

    def __init__(self) -> None:
        self.source: tuple[Finding, ...] | None = None
        self.keys: list[Key] = []
        self.items: list[Finding] = []

    def of(self, findings: tuple[Finding, ...]) -> _SortedFindings:
        if findings is not self.source:
            rank = {s: i for i, s in enumerate(SEVERITIES)}
            pairs = sorted(((_finding_key(f, rank), f) for f in findings), key=lambda p: p[0])
            self.keys = [k for k, _ in pairs]
            self.items = [f for _, f in pairs]
            self.source = findings
        return self


class _AlertApi:
    def __init__(
        self, engine: AlertEngine, settings: StreamSettings, limits: HttpLimits | None
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.limits = limits
        self.page_limits = PageLimits()
        self.sorted = _SortedFindings()

    async def findings(self, request: web.Request) -> web.Response:
        filters = parse_filters(request, FINDING_LIST_PARAMS)
        digest = query_digest(
            "findings", {"node": filters.node, "rule": filters.rule, "severity": filters.severity}
        )
        try:
            limit = parse_limit(request.query.get("limit"), self.page_limits)
            token = request.query.get("continue")
            after = None if token is None else decode_continue(token, digest, FINDING_KEY)
        except PagingError as exc:
            raise BadParameter(exc.field, exc.message) from exc
        found = self.sorted.of(self.engine.findings)
        keys, items = found.keys, found.items
        if filters.node is None and filters.rule is None and filters.severity is not None:
            rank = SEVERITIES.index(filters.severity)  # sorted by rank first: one slice
            lo, hi = bisect_left(keys, (rank,)), bisect_left(keys, (rank + 1,))
            keys, items = keys[lo:hi], items[lo:hi]
        elif filters.node is not None or filters.rule is not None or filters.severity is not None:
            kept = [
                i for i, f in enumerate(items) if filters.keep(f.rule, f.severity, f.node, None)
            ]
            keys, items = [keys[i] for i in kept], [items[i] for i in kept]
        page = window(keys, after, limit)
        shown = items[page.start : page.end]
        body: dict[str, object] = {
            "items": shown,
            "count": len(shown),
            "total": page.total,
            "evaluated_at": self.engine.evaluated_at,
        }
        if page.after is not None:
            body["continue"] = encode_continue(page.after, digest)
        return json_response(body)

    async def alerts(self, request: web.Request) -> web.Response:
        filters = parse_filters(request, ALERT_PARAMS)
        items = [a for a in _sorted_alerts(listed(self.engine.states)) if filters.alert(a)]
        body = {"items": items, "count": len(items), "last_event_id": self.engine.broker.last_id}
        return json_response(body)

    async def stream(self, request: web.Request) -> web.StreamResponse:
        filters = parse_filters(request, FINDING_PARAMS)
        last_id = _last_event_id(request)
        if self.limits is None:
            return await self._stream(request, filters, last_id)
        refused = self.limits.open_stream()  # each subscriber holds a connection for good
        if refused is not None:
            return refused
        try:
            return await self._stream(request, filters, last_id)
        finally:
            self.limits.close_stream()

    async def _stream(
        self, request: web.Request, filters: Filters, last_id: int | None
    ) -> web.StreamResponse:
        broker = self.engine.broker
        client, backlog = broker.subscribe(last_id)
        self.engine.metrics.stream_clients.inc()
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )
        try:
            await response.prepare(request)
            await response.write(f"retry: {self.settings.retry_ms}\n\n".encode())
            if backlog is None:
                firing = [a for a in _sorted_alerts(self.engine.firing()) if filters.alert(a)]
                payload = to_json({"alerts": firing, "last_event_id": broker.last_id})
                await response.write(_frame(broker.last_id, "resync", payload))
            else:
                for event in backlog:
                    if filters.alert(event.alert):
                        await response.write(_event_frame(event))
            await self._follow(response, client, filters)
        except ConnectionResetError:
            pass  # the client went away
        finally:
            broker.unsubscribe(client)
            self.engine.metrics.stream_clients.dec()
        return response

    async def _follow(
        self, response: web.StreamResponse, client: StreamClient, filters: Filters
    ) -> None:
        closed = self.engine.broker.closed
        while not closed.is_set() and not client.dropped:
            if client.queue.empty():
                client.wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(client.wake.wait(), self.settings.heartbeat_s)
                if client.queue.empty() and not closed.is_set() and not client.dropped:
                    await response.write(b": keepalive\n\n")
                continue
            while not client.queue.empty() and not client.dropped:
                event = client.queue.get_nowait()
                if filters.alert(event.alert):
                    await response.write(_event_frame(event))


def _frame(event_id: int, kind: str, data: bytes) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event_id, kind.encode(), data)


def _event_frame(event: Event) -> bytes:
    return _frame(event.id, "alert", to_json(event.alert))


def _last_event_id(request: web.Request) -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None or raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 18:
        raise BadParameter(
            "Last-Event-ID", f"Last-Event-ID must be an event id (digits), got {raw!r}"
        )
    return int(raw)


def add_alert_routes(
    app: web.Application,
    *,
    engine: AlertEngine,
    settings: StreamSettings | None = None,
    limits: HttpLimits | None = None,  # the SSE subscriber bound; None: unbounded
) -> None:
    api = _AlertApi(engine, settings or StreamSettings(), limits)
    app.router.add_get("/api/v1/findings", api.findings)
    app.router.add_get("/api/v1/alerts", api.alerts)
    app.router.add_get("/api/v1/alerts/stream", api.stream)
