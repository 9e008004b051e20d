"""HTTP routes for pair validations: `POST /api/v1/validations` (admin scope, by the auth
middleware), `GET /api/v1/validations` (newest first) and `GET /api/v1/validations/{id}`.

Checks the request against the fleet and cluster views before any pod exists (400 naming
the field, 404 unknown node, 409 resource not advertised), then hands it to the runner.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

import msgspec
from aiohttp import StreamReader, web

from aggregator.api.chain import _check_node, _check_resource, _checked_query
from aggregator.api.errors import BadParameter, error_response, json_response
from aggregator.api.jsonbody import BODY_TIMEOUT, MAX_BODY, MAX_DEPTH, BodyError, parse_body
from aggregator.cluster import ClusterView
from aggregator.fleet.state import Fleet
from aggregator.validations.request import (
    InvalidValidationRequest,
    ResourceNotAdvertised,
    UnknownValidationNode,
    check_request,
    parse_request,
)
from aggregator.validations.runner import ValidationBusy, ValidationRunner, ValidationUnavailable
from proto.http import ValidationRecord
from proto.subjects import InvalidValidationId, validate_validation_id

LIST_PARAMS: Final = ("node", "resource", "limit")
DEFAULT_LIMIT: Final = 50
VALIDATIONS_PATH: Final = "/api/v1/validations"


class ValidationList(msgspec.Struct, frozen=True, kw_only=True):
    items: tuple[ValidationRecord, ...]
    count: int


def add_validation_routes(
    app: web.Application,
    *,
    runner: ValidationRunner,
    fleet: Fleet,
    cluster: Callable[[], ClusterView],
) -> None:
    """Register POST/GET /api/v1/validations and GET /api/v1/validations/{id} on `app`."""
    store = runner.store

    async def create(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > MAX_BODY:
            raise BadParameter("body", f"the body must be at most {MAX_BODY} bytes")
        try:
            async with asyncio.timeout(BODY_TIMEOUT):
                raw = await _read_body(request.content, MAX_BODY + 1)
        except TimeoutError:
            return error_response(
                408, "request_timeout", f"the body did not arrive within {BODY_TIMEOUT:g} s"
            )
        try:
            body = parse_body(raw, max_bytes=MAX_BODY, max_depth=MAX_DEPTH)
        except BodyError as exc:
            raise BadParameter("body", str(exc)) from exc
        try:
            wanted = parse_request(body)
            check_request(wanted, fleet=fleet.view(), cluster=cluster())
        except InvalidValidationRequest as exc:
            raise BadParameter(exc.field, exc.message) from exc
        except UnknownValidationNode as exc:
            return error_response(
                404, "not_found", str(exc), field=exc.field, suggestions=exc.suggestions
            )
        except ResourceNotAdvertised as exc:
            return error_response(
                409, "conflict", str(exc), field="resource", suggestions=exc.suggestions
            )
        try:
            record = await runner.submit(wanted)
        except ValidationBusy as exc:
            return error_response(429, "too_many_requests", str(exc), headers={"Retry-After": "10"})
        except ValidationUnavailable as exc:
            return error_response(503, "unavailable", str(exc))
        response = json_response(record, status=202)
        response.headers["Location"] = f"{VALIDATIONS_PATH}/{record.id}"
        return response

    async def list_validations(request: web.Request) -> web.Response:
        query = _checked_query(request.query, LIST_PARAMS, required=())
        node, resource = query.get("node"), query.get("resource")
        if node is not None:
            _check_node(node)
        if resource is not None:
            _check_resource("resource", resource)
        limit = _limit(query.get("limit"), runner.settings.keep)
        items = [
            r
            for r in store.recent(runner.settings.keep)
            if (node is None or node in r.nodes) and (resource is None or r.resource == resource)
        ][:limit]
        return json_response(ValidationList(items=tuple(items), count=len(items)))

    async def get_validation(request: web.Request) -> web.Response:
        validation_id = request.match_info["id"]
        try:
            validate_validation_id(validation_id)
        except InvalidValidationId as exc:
            raise BadParameter("id", str(exc)) from exc
        record = store.get(validation_id)
        if record is None:
            return error_response(
                404, "not_found", f"validation {validation_id!r} not found", field="id"
            )
        return json_response(record)

    app.router.add_post(VALIDATIONS_PATH, create)
    app.router.add_get(VALIDATIONS_PATH, list_validations)
    app.router.add_get(VALIDATIONS_PATH + "/{id}", get_validation)


async def _read_body(content: StreamReader, most: int) -> bytes:
    """Up to `most` bytes, to the end of the body (one read() returns what has arrived)."""
    chunks: list[bytes] = []
    size = 0
    while size < most:
        chunk = await content.read(most - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _limit(raw: str | None, most: int) -> int:
    if raw is None:
        return min(DEFAULT_LIMIT, most)
    if not raw.isascii() or not raw.isdigit() or len(raw) > 9 or not 1 <= int(raw) <= most:
        raise BadParameter("limit", f"limit must be an integer from 1 to {most}, got {raw!r}")
    return int(raw)
