"""JSON error bodies for the aggregator's HTTP API, one shape for every failure.

`{"error": {"code", "message", "field"?, "suggestions"?}}` — built here so handlers and
the error middleware cannot drift apart. No routing, no state.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec
from aiohttp import web

from aggregator.errors import AggregatorError
from proto.codec import to_json

ErrorCode = Literal[
    "bad_request",
    "not_found",
    "method_not_allowed",
    "not_ready",
    "internal",
    "http_error",
    "unauthorized",  # aggregator.api.auth: no or unknown bearer token
    "forbidden",  # aggregator.api.auth: read token on an admin method
    "auth_unavailable",  # aggregator.api.auth: TokenReview could not be made (503)
    "conflict",  # aggregator.api.validations: a node does not advertise the resource (409)
    "too_many_requests",  # aggregator.api.validations: the validation queue is full (429)
    "unavailable",  # aggregator.api.validations: no Kubernetes API to run pods in (503)
    "overloaded",  # aggregator.api.limits: over a connection/in-flight/stream bound (503)
    "unsupported_media_type",  # aggregator.api.auth: no-token POST that is not JSON (415)
    "cross_origin",  # aggregator.api.auth: no-token POST from another Origin (403)
    "request_timeout",  # aggregator.api.validations: the body did not arrive in time (408)
]
JSON_TYPE: Final = "application/json"


class ErrorDetail(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    code: ErrorCode
    message: str
    field: str | None = None
    suggestions: tuple[str, ...] = ()


class ErrorBody(msgspec.Struct, frozen=True, kw_only=True):
    error: ErrorDetail


def json_response(body: object, *, status: int = 200) -> web.Response:
    return web.Response(body=to_json(body), status=status, content_type=JSON_TYPE)


def error_response(
    status: int,
    code: ErrorCode,
    message: str,
    *,
    field: str | None = None,
    suggestions: tuple[str, ...] = (),
    headers: dict[str, str] | None = None,
) -> web.Response:
    detail = ErrorDetail(code=code, message=message, field=field, suggestions=suggestions)
    response = json_response(ErrorBody(error=detail), status=status)
    if headers:
        response.headers.update(headers)
    return response


class BadParameter(AggregatorError):
    """A request parameter (query or path) that fails validation; becomes a 400."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
