"""A pair-validation request: the POST body parsed (errors name the field) and checked
against the fleet and cluster views — known, distinct nodes that both advertise the
resource, a known network — before any pod exists.

Pure: no I/O, no clock, no logging; `aggregator.api.validations` turns errors into HTTP.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from typing import Final

import msgspec

from aggregator.cluster import ClusterView
from aggregator.errors import AggregatorError
from aggregator.fleet.state import NodeRecord
from aggregator.trace.resources import allocatable_count
from proto.subjects import InvalidNodeName, validate_node_name

REQUEST_FIELDS: Final = ("nodes", "resource", "network")
MAX_SUGGESTIONS: Final = 3
_RESOURCE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
    r"/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"
)
_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_NETWORK = re.compile(rf"({_LABEL}/)?{_LABEL}")


class ValidationRequest(msgspec.Struct, frozen=True, kw_only=True):
    nodes: tuple[str, str]  # (server, client)
    resource: str
    network: str | None = None  # NetworkAttachmentDefinition, "name" or "namespace/name"


class InvalidValidationRequest(AggregatorError, ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


class UnknownValidationNode(AggregatorError, LookupError):
    def __init__(self, field: str, node: str, suggestions: tuple[str, ...]) -> None:
        super().__init__(f"node {node!r} not found")
        self.field, self.node, self.suggestions = field, node, suggestions


class ResourceNotAdvertised(AggregatorError, LookupError):
    """A selected node does not advertise the resource: its pod could never be scheduled."""

    def __init__(self, resource: str, nodes: tuple[str, ...], elsewhere: tuple[str, ...]) -> None:
        where = f"; advertised on: {', '.join(elsewhere)}" if elsewhere else ""
        super().__init__(f"{resource} is not advertised on {', '.join(nodes)}{where}")
        self.resource, self.nodes, self.suggestions = resource, nodes, elsewhere


def parse_request(body: object) -> ValidationRequest:
    """The POST body as a request; InvalidValidationRequest names the field."""
    if not isinstance(body, dict):
        raise InvalidValidationRequest("body", "the body must be a JSON object")
    for key in body:
        if key not in REQUEST_FIELDS:
            raise InvalidValidationRequest(
                str(key), f"unknown field {key!r}; expected {list(REQUEST_FIELDS)}"
            )
    nodes = body.get("nodes")
    if not isinstance(nodes, list) or len(nodes) != 2:
        raise InvalidValidationRequest("nodes", "nodes must be a list of exactly two node names")
    for i, node in enumerate(nodes):
        if not isinstance(node, str):
            raise InvalidValidationRequest(f"nodes[{i}]", f"nodes[{i}] must be a string")
        try:
            validate_node_name(node)
        except InvalidNodeName as exc:
            raise InvalidValidationRequest(f"nodes[{i}]", f"nodes[{i}]: {exc}") from exc
    if nodes[0] == nodes[1]:
        raise InvalidValidationRequest(
            "nodes", f"nodes must be two different nodes, got {nodes[0]!r} twice"
        )
    resource = body.get("resource")
    if not isinstance(resource, str) or len(resource) > 317 or not _RESOURCE.fullmatch(resource):
        raise InvalidValidationRequest(
            "resource", f"resource must be a full name such as rdma/hca_shared, got {resource!r}"
        )
    network = body.get("network")
    if network is not None and (not isinstance(network, str) or not _NETWORK.fullmatch(network)):
        raise InvalidValidationRequest(
            "network", f"network must be a NetworkAttachmentDefinition [namespace/]name, "
            f"got {network!r}"
        )  # fmt: skip
    return ValidationRequest(nodes=(nodes[0], nodes[1]), resource=resource, network=network)


def advertises(record: NodeRecord | None, cluster: ClusterView, node: str, resource: str) -> bool:
    """The agent serves `resource` with a device, or the kubelet lists it as allocatable."""
    plugin = record.device_plugin if record is not None else None
    if plugin is not None and any(
        r.name == resource and r.advertised > 0 for r in plugin.resources
    ):
        return True
    cluster_node = cluster.nodes.get(node) if cluster.present else None
    raw = cluster_node.allocatable.get(resource) if cluster_node is not None else None
    return (allocatable_count(raw) or 0) > 0


def check_request(
    request: ValidationRequest, *, fleet: Mapping[str, NodeRecord], cluster: ClusterView
) -> None:
    """Unknown nodes (UnknownValidationNode), a resource a node does not advertise
    (ResourceNotAdvertised) or an unknown network (InvalidValidationRequest) stop it before
    any pod."""
    known = sorted({*fleet, *cluster.nodes})
    for i, node in enumerate(request.nodes):
        if node not in fleet and node not in cluster.nodes:
            close = difflib.get_close_matches(node, known, n=MAX_SUGGESTIONS)
            raise UnknownValidationNode(f"nodes[{i}]", node, tuple(close))
    res = request.resource
    lacking = tuple(n for n in request.nodes if not advertises(fleet.get(n), cluster, n, res))
    if lacking:
        elsewhere = tuple(n for n in known if advertises(fleet.get(n), cluster, n, res))
        raise ResourceNotAdvertised(res, lacking, elsewhere[:MAX_SUGGESTIONS])
    if request.network is not None and cluster.present and cluster.attachments:
        names = {f"{a.namespace}/{a.name}" for a in cluster.attachments}
        names |= {a.name for a in cluster.attachments}
        if request.network not in names:
            raise InvalidValidationRequest(
                "network", f"no NetworkAttachmentDefinition {request.network!r} in the cluster"
            )
