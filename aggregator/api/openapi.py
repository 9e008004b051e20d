"""The OpenAPI 3.1 document of the aggregator's HTTP API, built from its route table.

Pure: `openapi_document` maps each registered `(method, path)` to its description in
`OPERATIONS`; response schemas come from the msgspec Structs the handlers encode, plus the
API's own JSON shapes written out here. No I/O; the route table is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import msgspec

from aggregator.api.alerts import SEVERITIES, STATUSES
from aggregator.api.auth import METRICS_PATH, OPEN_PATHS, is_ui_path
from aggregator.api.chain import MAX_RESOURCE_LENGTH, ResourceList
from aggregator.api.errors import ErrorBody
from aggregator.api.labelselect import MAX_SELECTOR_LENGTH, SELECTOR_PATTERN
from aggregator.api.paging import MAX_TOKEN_LENGTH, PageLimits
from aggregator.reconcile.loop import ReconcileReport
from aggregator.rules.finding import Finding
from proto.http import NODE_STATES, NodeDetail, NodeSummary, Trace, ValidationRecord
from proto.messages.alerts import Alert
from proto.policy import Policy

Schema = dict[str, Any]
OPENAPI_PATH: Final = "/api/v1/openapi.json"
JSON: Final = "application/json"
METRICS_TYPE: Final = "text/plain; version=0.0.4"
SSE_TYPE: Final = "text/event-stream"
MAX_LINE: Final = 8190  # aiohttp's default max_line_size and max_field_size
_STRUCTS: Final = (
    NodeSummary, NodeDetail, ResourceList, Trace, Finding, Alert, ErrorBody, ValidationRecord,
)  # fmt: skip
# RFC 1123 subdomain (proto.subjects.validate_node_name) and the resource-name format.
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
NODE_NAME: Final[Schema] = {
    "type": "string",
    "minLength": 1,
    "maxLength": 253,
    "pattern": rf"^{_LABEL}(\.{_LABEL})*$",
}
# /api/v1/nodes?name=: a prefix of node names, or a glob (fnmatch: * ? [...] [!...]).
NODE_NAME_FILTER: Final[Schema] = {"type": "string", "pattern": r"^[a-z0-9.*?\[\]!-]{1,253}$"}
RESOURCE_NAME: Final[Schema] = {
    "type": "string",
    "minLength": 3,
    "maxLength": MAX_RESOURCE_LENGTH,
    "pattern": rf"^{_LABEL}(\.{_LABEL})*/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    "examples": ["rdma/ib"],
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def _object(required: Iterable[str], **properties: Schema) -> Schema:
    return {"type": "object", "required": list(required), "properties": properties}


def _json(description: str, schema: Schema) -> Schema:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def _error(description: str) -> Schema:
    return _json(description, _ref("ErrorBody"))


def _query(name: str, schema: Schema, description: str, *, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


INT: Final[Schema] = {"type": "integer"}
NUMBER: Final[Schema] = {"type": "number"}
STRING: Final[Schema] = {"type": "string"}
BAD_QUERY: Final = "A bad, unknown, repeated or (where required) missing query parameter."
ALERT_NODE = _query(
    "node", {"anyOf": [{"const": "_fleet"}, NODE_NAME]}, "Node name; `_fleet` for fleet-wide."
)
ALERT_RULE = _query("rule", {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"}, "Rule id.")
ALERT_SEVERITY = _query("severity", {"enum": list(SEVERITIES)}, "Severity.")
PAGE: Final = PageLimits()
CONTINUE_TOKEN: Final[Schema] = {
    "type": "string",
    "pattern": f"^[A-Za-z0-9_-]{{1,{MAX_TOKEN_LENGTH}}}$",
    "description": "Opaque. Absent on the last page.",
}
PAGE_LIMIT = _query(
    "limit",
    {**INT, "minimum": 1, "maximum": PAGE.maximum, "default": PAGE.default},
    "Page size.",
)
PAGE_CONTINUE = _query(
    "continue",
    CONTINUE_TOKEN,
    "The `continue` of the previous page, with the same filters: the page after it.",
)
NODE_LIST: Final = _object(
    ("items", "count", "total", "offset", "limit"),
    items=_array(_ref("NodeSummary")),
    count=INT,
    total=INT,
    offset=INT,
    limit=INT,
    **{"continue": CONTINUE_TOKEN},
)
POLICY_VIEW: Final = _object(
    ("items", "count"),
    items=_array(_ref("Policy")),
    count=INT,
    leader={"type": "boolean"},
    reconciled_at=NUMBER,
    statuses=_array(_ref("PolicyStatus")),
    nodes=_array(_ref("NodePlan")),
    conflicts=_array(_ref("Conflict")),
    errors=_array(STRING),
)
FINDINGS: Final = _object(
    ("items", "count", "total", "evaluated_at"),
    items=_array(_ref("Finding")),
    count=INT,
    total=INT,
    evaluated_at={"anyOf": [NUMBER, {"type": "null"}]},
    **{"continue": CONTINUE_TOKEN},
)
SHARD_MAP: Final = _object(
    ("replica", "partitions", "held", "nodes", "live", "owners", "summaries", "takeovers"),
    replica=STRING,
    partitions=INT,
    held=_array(INT),
    nodes=INT,
    live=_array(STRING),
    owners={"type": "object", "additionalProperties": STRING},
    summaries={"type": "object", "additionalProperties": INT},
    takeovers=INT,
    api_urls={"type": "object", "additionalProperties": STRING},
    node_names=_array(STRING),
    findings=_array(_object(("rule", "node", "subject"), rule=STRING,
                            node={"anyOf": [STRING, {"type": "null"}]}, subject=STRING)),
)  # fmt: skip
# Sharded (docs/scaling.md): a node request for another replica's node is forwarded to it.
FORWARD_FAILED: Final = "Sharded: the replica holding the node did not answer."
FORWARDED_PATHS: Final = ("/api/v1/nodes/{node}", "/api/v1/resources", "/api/v1/trace")
ALERTS: Final = _object(
    ("items", "count", "last_event_id"),
    items=_array(_ref("Alert")),
    count=INT,
    last_event_id=INT,
)

# Every GET the aggregator may serve, by path template (aiohttp's `canonical`).
OPERATIONS: Final[Mapping[str, Schema]] = {
    "/healthz": {
        "summary": "Liveness probe.",
        "responses": {"200": _json("Alive.", _object(("status",), status={"const": "ok"}))},
    },
    "/readyz": {
        "summary": "Readiness probe: NATS connected, KV bound, initial state loaded.",
        "responses": {
            "200": _json(
                "Ready.",
                _object(("status", "reason"), status={"const": "ready"}, reason=STRING),
            ),
            "503": _error("Not ready; the message says why."),
        },
    },
    METRICS_PATH: {
        "summary": "Prometheus metrics (text exposition format 0.0.4).",
        "responses": {
            "200": {"description": "Metrics.", "content": {METRICS_TYPE: {"schema": STRING}}}
        },
    },
    OPENAPI_PATH: {
        "summary": "This document.",
        "responses": {"200": _json("The OpenAPI document.", {"type": "object"})},
    },
    "/api/v1/nodes": {
        "summary": "Node summaries, sorted by name.",
        "parameters": [
            _query("state", {"enum": list(NODE_STATES)}, "Only nodes in this state."),
            _query("name", NODE_NAME_FILTER, "Only names with this prefix, or matching this glob."),
            _query(
                "label",
                {"type": "string", "maxLength": MAX_SELECTOR_LENGTH, "pattern": SELECTOR_PATTERN},
                "Label selector on the cluster's node labels: k=v, k!=v, k, !k; comma-separated.",
            ),
            PAGE_LIMIT,
            PAGE_CONTINUE,
            _query(
                "offset",
                {**INT, "minimum": 0, "maximum": 999_999_999},
                "Skip this many (after `continue`'s position, if given).",
            ),
        ],
        "responses": {"200": _json("A page of nodes.", NODE_LIST), "400": _error(BAD_QUERY)},
    },
    "/api/v1/nodes/{node}": {
        "summary": "One node: summary, snapshot, counters, device-plugin status, events.",
        "parameters": [
            {
                "name": "node",
                "in": "path",
                "required": True,
                "schema": NODE_NAME,
                "examples": {"node": {"value": "gpu-001"}},
            }
        ],
        "responses": {
            "200": _json("The node.", _ref("NodeDetail")),
            "400": _error("The node name is not a DNS-1123 subdomain."),
            "404": _error("No such node; `suggestions` holds close names."),
        },
    },
    "/api/v1/policy": {
        "summary": "Effective policies; with a reconciler also its per-node plan and errors.",
        "responses": {"200": _json("Policies.", POLICY_VIEW)},
    },
    "/api/v1/findings": {
        "summary": "Current findings of the rule engine, most severe first.",
        "parameters": [ALERT_NODE, ALERT_RULE, ALERT_SEVERITY, PAGE_LIMIT, PAGE_CONTINUE],
        "responses": {"200": _json("Findings.", FINDINGS), "400": _error(BAD_QUERY)},
    },
    "/api/v1/alerts": {
        "summary": "Firing and recently resolved alerts.",
        "parameters": [
            ALERT_NODE,
            ALERT_RULE,
            ALERT_SEVERITY,
            _query("status", {"enum": list(STATUSES)}, "Alert state."),
        ],
        "responses": {"200": _json("Alerts.", ALERTS), "400": _error(BAD_QUERY)},
    },
    "/api/v1/alerts/stream": {
        "summary": "Server-Sent Events: a `resync` event, then one `alert` event per change.",
        "parameters": [
            ALERT_NODE,
            ALERT_RULE,
            ALERT_SEVERITY,
            {
                "name": "Last-Event-ID",
                "in": "header",
                "required": False,
                "schema": {"type": "string", "pattern": "^[0-9]{0,18}$"},
                "description": "Resume after this event id (sent by EventSource clients).",
            },
        ],
        "responses": {
            "200": {
                "description": "An endless event stream (`retry`, `resync`, `alert`, keepalives).",
                "content": {SSE_TYPE: {"schema": STRING}},
            },
            "400": _error(BAD_QUERY),
        },
    },
    "/api/v1/resources": {
        "summary": "Extended resources: advertised, healthy and allocatable per node.",
        "parameters": [
            _query("node", NODE_NAME, "Only this node."),
            _query("name", RESOURCE_NAME, "Only this resource."),
        ],
        "responses": {"200": _json("Resources.", _ref("ResourceList")), "400": _error(BAD_QUERY)},
    },
    "/api/v1/trace": {
        "summary": "The chain adapter → device plugin → kubelet → pods for one resource.",
        "parameters": [
            _query("node", NODE_NAME, "The node.", required=True),
            _query("resource", RESOURCE_NAME, "The extended resource.", required=True),
        ],
        "responses": {
            "200": _json("The trace.", _ref("Trace")),
            "400": _error(BAD_QUERY),
            "404": _error("Unknown node or resource; `suggestions` holds close names."),
        },
    },
}
# The GET of aggregator.api.shards (registered only by a sharded replica, docs/scaling.md).
SHARD_PATH: Final = "/api/v1/shards"
SHARD_OPERATIONS: Final[Mapping[str, Schema]] = {
    SHARD_PATH: {
        "summary": "The shard map as this replica sees it, its nodes and its findings.",
        "responses": {"200": _json("Partitions, holders, this replica's nodes.", SHARD_MAP)},
    },
}

VALIDATION_ID: Final[Schema] = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"}
_DNS_LABEL = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
# The GETs of aggregator.api.validations (registered by the service, with a NATS connection).
VALIDATION_OPERATIONS: Final[Mapping[str, Schema]] = {
    "/api/v1/validations": {
        "summary": "Pair validations, newest first (aggregator.validations.runner).",
        "parameters": [
            _query("node", NODE_NAME, "Only validations with this node on either side."),
            _query("resource", RESOURCE_NAME, "Only validations of this resource."),
            _query("limit", {**INT, "minimum": 1, "maximum": 500}, "At most this many."),
        ],
        "responses": {
            "200": _json(
                "Validations.",
                _object(("items", "count"), items=_array(_ref("ValidationRecord")), count=INT),
            ),
            "400": _error(BAD_QUERY),
        },
    },
    "/api/v1/validations/{id}": {
        "summary": "One pair validation: phase, reason, both sides' results.",
        "parameters": [{"name": "id", "in": "path", "required": True, "schema": VALIDATION_ID}],
        "responses": {
            "200": _json("The validation.", _ref("ValidationRecord")),
            "400": _error("The id is not a validation id."),
            "404": _error("No such validation."),
        },
    },
}
# POST routes (admin scope when tokens are configured), by path template.
POST_OPERATIONS: Final[Mapping[str, Schema]] = {
    "/api/v1/validations": {
        "summary": "Start a pair validation: two pods, a tested RDMA data path between nodes.",
        "requestBody": {
            "required": True,
            "content": {
                JSON: {
                    "schema": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["nodes", "resource"],
                        "properties": {
                            "nodes": {
                                **_array(NODE_NAME),
                                "minItems": 2,
                                "maxItems": 2,
                                "uniqueItems": True,
                                "description": "[server node, client node].",
                            },
                            "resource": RESOURCE_NAME,
                            "network": {
                                "type": "string",
                                "pattern": rf"^({_DNS_LABEL}/)?{_DNS_LABEL}$",
                                "description": "NetworkAttachmentDefinition, [namespace/]name.",
                            },
                        },
                    }
                }
            },
        },
        "responses": {
            "202": _json("Accepted; poll `Location`.", _ref("ValidationRecord")),
            "400": _error("A bad body; `field` names the part."),
            "404": _error("Unknown node; `suggestions` holds close names."),
            "409": _error("A node does not advertise the resource; `suggestions` do."),
            "429": _error("Too many validations waiting; retry later."),
            "503": _error("No Kubernetes API or pod template to run the pods with."),
        },
    },
}


class UndocumentedRoute(LookupError):
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
            operation["responses"] = {**operation["responses"], "502": _error(FORWARD_FAILED)}
        if secured and _is_open(path, metrics_public=metrics_public):
            operation["security"] = []
        elif secured:
            responses = dict(operation["responses"])
            responses["401"] = _error("No bearer token, or an unknown one.")
            if token_review:
                responses["403"] = _error("TokenReview: the identity is in no configured group.")
                responses["503"] = _error("TokenReview could not answer; retry later.")
            if method == "POST":
                responses["403"] = _error("POST needs an admin token.")
            operation["responses"] = responses
        paths.setdefault(path, {})[method.lower()] = operation
    _, components = msgspec.json.schema_components(
        (*_STRUCTS, ReconcileReport, Policy), ref_template="#/components/schemas/{name}"
    )
    components_doc: Schema = {"schemas": dict(sorted(components.items()))}
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


def _is_open(path: str, *, metrics_public: bool) -> bool:
    return path in OPEN_PATHS or (metrics_public and path == METRICS_PATH)


def _operation_id(path: str) -> str:
    words = path.replace("/api/v1/", "").strip("/").replace(".", "-")
    return "get-" + "-".join(w.strip("{}") for w in words.split("/"))
