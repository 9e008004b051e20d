"""The JSON Schemas of the OpenAPI document: the API's own shapes (node names, pages, the
list envelopes, query parameters) written out here, and the component schemas of the
msgspec Structs the handlers encode. Pure data and small builders; no operations (see
openapiops.py) and no route table (see openapi.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from aggregator.api.alerts import SEVERITIES
from aggregator.api.chain import MAX_POD_NAME_LENGTH, MAX_RESOURCE_LENGTH, ResourceList
from aggregator.api.errors import ErrorBody
from aggregator.api.paging import MAX_TOKEN_LENGTH, PageLimits
from aggregator.reconcile.loop import ReconcileReport
from aggregator.rules.finding import Finding
from proto.http import NodeDetail, NodeSummary, PodTrace, Trace, ValidationRecord
from proto.messages.alerts import Alert
from proto.policy import Policy

Schema = dict[str, Any]
JSON: Final = "application/json"
_STRUCTS: Final = (
    NodeSummary, NodeDetail, ResourceList, Trace, Finding, Alert, ErrorBody, ValidationRecord,
    ReconcileReport, Policy, PodTrace,
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
VALIDATION_ID: Final[Schema] = {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$"}
DNS_LABEL: Final = "[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
POD_NAMESPACE: Final[Schema] = {"type": "string", "pattern": rf"^{DNS_LABEL}$"}
POD_NAME: Final[Schema] = {
    "type": "string",
    "maxLength": MAX_POD_NAME_LENGTH,
    "pattern": rf"^{DNS_LABEL}(\.{DNS_LABEL})*$",
    "examples": ["worker-0"],
}


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def array(items: Schema) -> Schema:
    return {"type": "array", "items": items}


def obj(required: Iterable[str], **properties: Schema) -> Schema:
    return {"type": "object", "required": list(required), "properties": properties}


def json_response(description: str, schema: Schema) -> Schema:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def error_response(description: str) -> Schema:
    return json_response(description, ref("ErrorBody"))


def query(name: str, schema: Schema, description: str, *, required: bool = False) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": required,
        "schema": schema,
        "description": description,
    }


def components() -> dict[str, Schema]:
    """The component schemas of every Struct the API encodes, sorted by name."""
    _, found = msgspec.json.schema_components(_STRUCTS, ref_template="#/components/schemas/{name}")
    return dict(sorted(found.items()))


INT: Final[Schema] = {"type": "integer"}
NUMBER: Final[Schema] = {"type": "number"}
STRING: Final[Schema] = {"type": "string"}
ALERT_NODE = query(
    "node", {"anyOf": [{"const": "_fleet"}, NODE_NAME]}, "Node name; `_fleet` for fleet-wide."
)
ALERT_RULE = query("rule", {"type": "string", "pattern": "^[a-z0-9][a-z0-9-]{0,62}$"}, "Rule id.")
ALERT_SEVERITY = query("severity", {"enum": list(SEVERITIES)}, "Severity.")
PAGE: Final = PageLimits()
CONTINUE_TOKEN: Final[Schema] = {
    "type": "string",
    "pattern": f"^[A-Za-z0-9_-]{{1,{MAX_TOKEN_LENGTH}}}$",
    "description": "Opaque. Absent on the last page.",
}
PAGE_LIMIT = query(
    "limit",
    {**INT, "minimum": 1, "maximum": PAGE.maximum, "default": PAGE.default},
    "Page size.",
)
PAGE_CONTINUE = query(
    "continue",
    CONTINUE_TOKEN,
    "The `continue` of the previous page, with the same filters: the page after it.",
)
NODE_LIST: Final = obj(
    ("items", "count", "total", "offset", "limit"),
    items=array(ref("NodeSummary")),
    count=INT,
    total=INT,
    offset=INT,
    limit=INT,
    **{"continue": CONTINUE_TOKEN},
)
POLICY_VIEW: Final = obj(
    ("items", "count"),
    items=array(ref("Policy")),
    count=INT,
    leader={"type": "boolean"},
    reconciled_at=NUMBER,
    statuses=array(ref("PolicyStatus")),
    nodes=array(ref("NodePlan")),
    conflicts=array(ref("Conflict")),
    errors=array(STRING),
)
FINDINGS: Final = obj(
    ("items", "count", "total", "evaluated_at"),
    items=array(ref("Finding")),
    count=INT,
    total=INT,
    evaluated_at={"anyOf": [NUMBER, {"type": "null"}]},
    **{"continue": CONTINUE_TOKEN},
)
SHARD_MAP: Final = obj(
    ("replica", "partitions", "held", "nodes", "live", "owners", "summaries", "takeovers"),
    replica=STRING,
    partitions=INT,
    held=array(INT),
    nodes=INT,
    live=array(STRING),
    owners={"type": "object", "additionalProperties": STRING},
    summaries={"type": "object", "additionalProperties": INT},
    takeovers=INT,
    api_urls={"type": "object", "additionalProperties": STRING},
    node_names=array(STRING),
    findings=array(obj(("rule", "node", "subject"), rule=STRING,
                       node={"anyOf": [STRING, {"type": "null"}]}, subject=STRING)),
)  # fmt: skip
ALERTS: Final = obj(
    ("items", "count", "last_event_id"),
    items=array(ref("Alert")),
    count=INT,
    last_event_id=INT,
)
