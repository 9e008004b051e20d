"""The OpenAPI 3.1 document of the aggregator's HTTP API, built from its route table.

Pure: `openapi_document` maps each registered `(method, path)` to its description in
openapiops.py (`OPERATIONS` and the sharded, validation and POST tables); response schemas
come from openapischemas.py. No I/O; the route table is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from aggregator.api.auth import METRICS_PATH, OPEN_PATHS, is_ui_path
from aggregator.api.openapiops import (
    FORWARD_FAILED,
    FORWARDED_PATHS,
    OPERATIONS,
    POST_OPERATIONS,
    SHARD_OPERATIONS,
    SHARD_PATH,
    VALIDATION_OPERATIONS,
)
from aggregator.api.openapischemas import STRING, Schema, components, error_response
from aggregator.errors import AggregatorError

MAX_LINE: Final = 8190  # aiohttp's default max_line_size and max_field_size
OVERLOADED: Final = (
    "Over a bound of the server (open connections, requests in flight, alert stream"
    " clients); `Retry-After` says when to retry."
)
CROSS_ORIGIN: Final = "No tokens configured: an `Origin` other than this API's own is refused."
NOT_JSON: Final = "No tokens configured: a body that is not `Content-Type: application/json`."


class UndocumentedRoute(AggregatorError, LookupError):
    """A registered route with no entry in `OPERATIONS`."""


def documented(method: str, path: str) -> bool:
    return _described(method, path) is not None


def _described(method: str, path: str) -> Schema | None:
    if method == "POST":
        return POST_OPERATIONS.get(path)
    if method == "GET":
        return OPERATIONS.get(path) or VALIDATION_OPERATIONS.get(path) or SHARD_OPERATIONS.get(path)
    return None


def openapi_document(
    routes: Iterable[tuple[str, str]],
    *,
    version: str,
    secured: bool,
    metrics_public: bool = False,
    token_review: bool = False,
) -> Schema:
    """The document for `routes` (method, path template); HEAD twins of GETs are implied.

    `secured`: bearer tokens are configured, so every path but the open ones answers 401
    without one; with `token_review` also 403 (no configured group) and 503 (TokenReview
    unavailable). Raises `UndocumentedRoute` for a route `OPERATIONS` does not describe;
    the status page's files under /ui are skipped.
    """
    paths: dict[str, Schema] = {}
    routes = set(routes)
    sharded = ("GET", SHARD_PATH) in routes
    for method, path in sorted(routes):
        if method == "HEAD":
            continue
        if is_ui_path(path):
            continue  # the status page's HTML/JS/CSS (aggregator.api.statuspage): not the JSON API
        if not documented(method, path):
            raise UndocumentedRoute(f"{method} {path} has no OpenAPI description")
        described = _described(method, path) or {}
        operation_id = _operation_id(path).replace("get-", f"{method.lower()}-", 1)
        operation: Schema = {"operationId": operation_id, **described}
        operation["responses"] = _with_protocol_error(operation["responses"])
        if sharded and path in FORWARDED_PATHS:
            operation["responses"] = {
                **operation["responses"],
                "502": error_response(FORWARD_FAILED),
            }
        if secured and _is_open(path, metrics_public=metrics_public):
            operation["security"] = []
        elif secured:
            responses = dict(operation["responses"])
            responses["401"] = error_response("No bearer token, or an unknown one.")
            if token_review:
                responses["403"] = error_response(
                    "TokenReview: the identity is in no configured group."
                )
                responses["503"] = error_response("TokenReview could not answer; retry later.")
            if method == "POST":
                responses["403"] = error_response("POST needs an admin token.")
            operation["responses"] = responses
        elif method == "POST":  # no tokens: aggregator.api.auth.same_origin_middleware
            operation["responses"] = {
                **operation["responses"],
                "403": error_response(CROSS_ORIGIN),
                "415": error_response(NOT_JSON),
            }
        operation["responses"] = _with_overload(operation["responses"])
        paths.setdefault(path, {})[method.lower()] = operation
    components_doc: Schema = {"schemas": components()}
    doc: Schema = {
        "openapi": "3.1.0",
        "info": {
            "title": "nicfleet aggregator API",
            "version": version,
            "description": "Errors are `{error: {code, message, field?, suggestions?}}`.",
        },
        "paths": paths,
        "components": components_doc,
    }
    if secured:
        components_doc["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A read or admin token from the aggregator's token file.",
            }
        }
        doc["security"] = [{"bearer": []}]
    return doc


def _with_protocol_error(responses: Schema) -> Schema:
    """aiohttp's HTTP layer refuses an oversize request line or header before any handler."""
    declared = responses.get("400", {"description": "", "content": {}})
    description = (declared["description"] + " " if declared["description"] else "") + (
        f"A request line or header over {MAX_LINE} bytes is refused as plain text."
    )
    content = {**declared["content"], "text/plain": {"schema": STRING}}
    return {**responses, "400": {"description": description, "content": content}}


def _with_overload(responses: Schema) -> Schema:
    """Any route may meet a bound of aggregator.api.limits (503 + Retry-After)."""
    declared = responses.get("503")
    if declared is None:
        return {**responses, "503": error_response(OVERLOADED)}
    return {
        **responses,
        "503": {**declared, "description": f"{declared['description']} {OVERLOADED}"},
    }


def _is_open(path: str, *, metrics_public: bool) -> bool:
    return path in OPEN_PATHS or (metrics_public and path == METRICS_PATH)


def _operation_id(path: str) -> str:
    words = path.replace("/api/v1/", "").strip("/").replace(".", "-")
    return "get-" + "-".join(w.strip("{}") for w in words.split("/"))
