"""The operations of the OpenAPI document: for each path template the aggregator may
register, its summary, parameters and responses (GETs in `OPERATIONS`, the sharded and
validation GETs, the POSTs). Pure data over the shapes of openapischemas.py; the document
is assembled in openapi.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from aggregator.api.alerts import STATUSES
from aggregator.api.auth import METRICS_PATH
from aggregator.api.chain import POD_TRACE_PATH
from aggregator.api.dra import SLICES_PATH
from aggregator.api.jsonbody import BODY_TIMEOUT, MAX_BODY, MAX_DEPTH
from aggregator.api.labelselect import MAX_SELECTOR_LENGTH, SELECTOR_PATTERN
from aggregator.api.openapischemas import (
    ALERT_NODE,
    ALERT_RULE,
    ALERT_SEVERITY,
    ALERTS,
    DNS_LABEL,
    FINDINGS,
    INT,
    JSON,
    NODE_LIST,
    NODE_NAME,
    NODE_NAME_FILTER,
    PAGE_CONTINUE,
    PAGE_LIMIT,
    POD_NAME,
    POD_NAMESPACE,
    POLICY_VIEW,
    RESOURCE_NAME,
    SHARD_MAP,
    STRING,
    VALIDATION_ID,
    Schema,
    array,
    error_response,
    json_response,
    obj,
    query,
    ref,
)
from proto.http import NODE_STATES

OPENAPI_PATH: Final = "/api/v1/openapi.json"
METRICS_TYPE: Final = "text/plain; version=0.0.4"
SSE_TYPE: Final = "text/event-stream"
BAD_QUERY: Final = "A bad, unknown, repeated or (where required) missing query parameter."
# Sharded (docs/scaling.md): a node request for another replica's node is forwarded to it.
FORWARD_FAILED: Final = "Sharded: the replica holding the node did not answer."
FORWARDED_PATHS: Final = ("/api/v1/nodes/{node}", "/api/v1/resources", "/api/v1/trace")

# Every GET the aggregator may serve, by path template (aiohttp's `canonical`).
OPERATIONS: Final[Mapping[str, Schema]] = {
    "/healthz": {
        "summary": "Liveness probe.",
        "responses": {"200": json_response("Alive.", obj(("status",), status={"const": "ok"}))},
    },
    "/readyz": {
        "summary": "Readiness probe: NATS connected, KV bound, initial state loaded.",
        "responses": {
            "200": json_response(
                "Ready.",
                obj(("status", "reason"), status={"const": "ready"}, reason=STRING),
            ),
            "503": error_response("Not ready; the message says why."),
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
        "responses": {"200": json_response("The OpenAPI document.", {"type": "object"})},
    },
    "/api/v1/nodes": {
        "summary": "Node summaries, sorted by name.",
        "parameters": [
            query("state", {"enum": list(NODE_STATES)}, "Only nodes in this state."),
            query("name", NODE_NAME_FILTER, "Only names with this prefix, or matching this glob."),
            query(
                "label",
                {"type": "string", "maxLength": MAX_SELECTOR_LENGTH, "pattern": SELECTOR_PATTERN},
                "Label selector on the cluster's node labels: k=v, k!=v, k, !k; comma-separated.",
            ),
            PAGE_LIMIT,
            PAGE_CONTINUE,
            query(
                "offset",
                {**INT, "minimum": 0, "maximum": 999_999_999},
                "Skip this many (after `continue`'s position, if given).",
            ),
        ],
        "responses": {
            "200": json_response("A page of nodes.", NODE_LIST),
            "400": error_response(BAD_QUERY),
        },
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
            "200": json_response("The node.", ref("NodeDetail")),
            "400": error_response("The node name is not a DNS-1123 subdomain."),
            "404": error_response("No such node; `suggestions` holds close names."),
        },
    },
    "/api/v1/policy": {
        "summary": "Effective policies; with a reconciler also its per-node plan and errors.",
        "responses": {"200": json_response("Policies.", POLICY_VIEW)},
    },
    SLICES_PATH: {
        "summary": "The rdma.nicfleet.io ResourceSlices (resource.k8s.io/v1) of every node "
        "with a snapshot, as a Kubernetes List.",
        "responses": {
            "200": json_response(
                "Slices.",
                obj(
                    ["kind", "items", "count"],
                    kind=STRING,
                    items=array({"type": "object"}),
                    count=INT,
                ),
            ),
            "400": error_response(BAD_QUERY),
        },
    },
    "/api/v1/findings": {
        "summary": "Current findings of the rule engine, most severe first.",
        "parameters": [ALERT_NODE, ALERT_RULE, ALERT_SEVERITY, PAGE_LIMIT, PAGE_CONTINUE],
        "responses": {
            "200": json_response("Findings.", FINDINGS),
            "400": error_response(BAD_QUERY),
        },
    },
    "/api/v1/alerts": {
        "summary": "Firing and recently resolved alerts.",
        "parameters": [
            ALERT_NODE,
            ALERT_RULE,
            ALERT_SEVERITY,
            query("status", {"enum": list(STATUSES)}, "Alert state."),
        ],
        "responses": {"200": json_response("Alerts.", ALERTS), "400": error_response(BAD_QUERY)},
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
            "400": error_response(BAD_QUERY),
        },
    },
    "/api/v1/resources": {
        "summary": "Extended resources: advertised, healthy and allocatable per node.",
        "parameters": [
            query("node", NODE_NAME, "Only this node."),
            query("name", RESOURCE_NAME, "Only this resource."),
        ],
        "responses": {
            "200": json_response("Resources.", ref("ResourceList")),
            "400": error_response(BAD_QUERY),
        },
    },
    "/api/v1/trace": {
        "summary": "The chain adapter → device plugin → kubelet → pods → scheduling for one "
        "resource on a node, with the node's cluster components beside it.",
        "parameters": [
            query("node", NODE_NAME, "The node.", required=True),
            query("resource", RESOURCE_NAME, "The extended resource.", required=True),
        ],
        "responses": {
            "200": json_response("The trace.", ref("Trace")),
            "400": error_response(BAD_QUERY),
            "404": error_response("Unknown node or resource; `suggestions` holds close names."),
        },
    },
    POD_TRACE_PATH: {
        "summary": "One pod's own chain: its node (or why it is not scheduled), the resources "
        "it requests and each one's chain on that node.",
        "parameters": [
            {"name": "namespace", "in": "path", "required": True, "schema": POD_NAMESPACE},
            {"name": "name", "in": "path", "required": True, "schema": POD_NAME},
        ],
        "responses": {
            "200": json_response("The pod's trace.", ref("PodTrace")),
            "400": error_response("A query parameter (none is known), or a bad name."),
            "404": error_response(
                "No pod of that name attaches a network or requests a device-plugin "
                "resource (or no cluster); "
                "`suggestions` holds close NAMESPACE/NAME."
            ),
        },
    },
}
# The GET of aggregator.api.shards (registered only by a sharded replica, docs/scaling.md).
SHARD_PATH: Final = "/api/v1/shards"
SHARD_OPERATIONS: Final[Mapping[str, Schema]] = {
    SHARD_PATH: {
        "summary": "The shard map as this replica sees it, its nodes and its findings.",
        "responses": {
            "200": json_response("Partitions, holders, this replica's nodes.", SHARD_MAP)
        },
    },
}

# The GETs of aggregator.api.validations (registered by the service, with a NATS connection).
VALIDATION_OPERATIONS: Final[Mapping[str, Schema]] = {
    "/api/v1/validations": {
        "summary": "Pair validations, newest first (aggregator.validations.runner).",
        "parameters": [
            query("node", NODE_NAME, "Only validations with this node on either side."),
            query("resource", RESOURCE_NAME, "Only validations of this resource."),
            query("limit", {**INT, "minimum": 1, "maximum": 500}, "At most this many."),
        ],
        "responses": {
            "200": json_response(
                "Validations.",
                obj(("items", "count"), items=array(ref("ValidationRecord")), count=INT),
            ),
            "400": error_response(BAD_QUERY),
        },
    },
    "/api/v1/validations/{id}": {
        "summary": "One pair validation: phase, reason, both sides' results.",
        "parameters": [{"name": "id", "in": "path", "required": True, "schema": VALIDATION_ID}],
        "responses": {
            "200": json_response("The validation.", ref("ValidationRecord")),
            "400": error_response("The id is not a validation id."),
            "404": error_response("No such validation."),
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
                                **array(NODE_NAME),
                                "minItems": 2,
                                "maxItems": 2,
                                "uniqueItems": True,
                                "description": "[server node, client node].",
                            },
                            "resource": RESOURCE_NAME,
                            "network": {
                                "type": "string",
                                "pattern": rf"^({DNS_LABEL}/)?{DNS_LABEL}$",
                                "description": "NetworkAttachmentDefinition, [namespace/]name.",
                            },
                        },
                    }
                }
            },
        },
        "responses": {
            "202": json_response("Accepted; poll `Location`.", ref("ValidationRecord")),
            "400": error_response(
                f"A bad body (over {MAX_BODY} bytes, nested deeper than {MAX_DEPTH} levels,"
                " not JSON, or a bad field); `field` names the part."
            ),
            "404": error_response("Unknown node; `suggestions` holds close names."),
            "408": error_response(f"The body did not arrive within {BODY_TIMEOUT:g} s."),
            "409": error_response("A node does not advertise the resource; `suggestions` do."),
            "429": error_response("Too many validations waiting; retry later."),
            "503": error_response("No Kubernetes API or pod template to run the pods with."),
        },
    },
}
