"""NATS subject names, KV bucket names and the node-name rule that guards them.

Every subject nicfleet publishes or subscribes to is built here, so the wire layout is
written down once. Node names become subject tokens and KV keys, so they are validated
(DNS-1123 subdomain, the rule Kubernetes applies to node names) before use.
"""

from __future__ import annotations

import re
from typing import Final

from proto.errors import ProtoError

PREFIX: Final = "nicfleet.v1"

# KV buckets (JetStream)
KV_NODES: Final = "nicfleet-nodes"
KV_CONFIG: Final = "nicfleet-config"
KV_ALERTS: Final = "nicfleet-alerts"

# Subject leaf per node message kind
SNAPSHOT: Final = "snapshot"
COUNTERS: Final = "counters"
EVENT: Final = "event"
STATUS: Final = "status"
NODE_KINDS: Final = (SNAPSHOT, COUNTERS, EVENT, STATUS)

# All node traffic: nicfleet.v1.node.<node>.<kind>
NODE_WILDCARD: Final = f"{PREFIX}.node.*.*"
ALERT_WILDCARD: Final = f"{PREFIX}.alert.>"
# Validation results: nicfleet.v1.validation.<validation id>
VALIDATION_WILDCARD: Final = f"{PREFIX}.validation.*"
# The aggregator asks every agent to re-publish its state (docs/wire.md, "Resync").
CONTROL_RESYNC: Final = f"{PREFIX}.control.resync"
# Sharded aggregators (docs/scaling.md): nats-server maps node subjects to
# nicfleet.v1.part.<partition>.node.<node>.<kind>; replicas publish per-shard summaries.
PARTITION_WILDCARD: Final = f"{PREFIX}.part.>"
SHARD_SUMMARY_WILDCARD: Final = f"{PREFIX}.shard.*.summary"
# Desired device-plugin config over core NATS (docs/wire.md, "Desired config"): the
# aggregator announces a node's on nicfleet.v1.desired.<node>; an agent asks for it on
# nicfleet.v1.desired.<node>.get (one token more, so neither wildcard matches the other).
DESIRED_WILDCARD: Final = f"{PREFIX}.desired.*"
DESIRED_GET_WILDCARD: Final = f"{PREFIX}.desired.*.get"
# A DRA kubelet plugin asks for a ResourceClaim's allocation on its node (docs/wire.md,
# "DRA claims"): nicfleet.v1.draclaims.<node>.get, answered into the agent's inbox.
DRACLAIMS_GET_WILDCARD: Final = f"{PREFIX}.draclaims.*.get"


def partition_subject(partition: int | str, token: str = "*", kind: str = "*") -> str:
    """`nicfleet.v1.part.<partition>.node.<token>.<kind>` (wildcards by default)."""
    return f"{PREFIX}.part.{partition}.node.{token}.{kind}"


def partition_of(token: str, partitions: int) -> int:
    """The partition nats-server's `{{partition(P,1)}}` gives a node token: FNV-1a 32 mod P."""
    h = 2166136261
    for byte in token.encode():
        h = ((h ^ byte) * 16777619) & 0xFFFFFFFF
    return h % partitions


def shard_summary_subject(replica: str) -> str:
    """`nicfleet.v1.shard.<replica>.summary`; the replica id must be one subject token."""
    if not replica or any(c in replica for c in ".*> \t"):
        raise ValueError(f"replica id {replica!r} is not a single subject token")
    return f"{PREFIX}.shard.{replica}.summary"


_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
MAX_NODE_NAME = 253


class InvalidNodeName(ProtoError, ValueError):
    """A node name that cannot be a Kubernetes node name (and so no subject token)."""


def validate_node_name(name: str) -> str:
    """Return `name` if it is a DNS-1123 subdomain; raise InvalidNodeName otherwise."""
    if not name:
        raise InvalidNodeName("node name is empty")
    if len(name) > MAX_NODE_NAME:
        raise InvalidNodeName(f"node name is longer than {MAX_NODE_NAME} characters")
    if not _DNS1123_SUBDOMAIN.fullmatch(name):
        raise InvalidNodeName(
            f"node name {name!r} is not a DNS-1123 subdomain "
            "(lowercase letters, digits, '-' and '.', starting and ending alphanumeric)"
        )
    return name


def node_token(node: str) -> str:
    """The single subject token (and KV key) standing for a node.

    Node names may contain dots, which NATS reads as token separators; a DNS-1123 name
    never contains '_', so mapping '.' to '_' is reversible and keeps one token per node
    (wildcards, per-node permissions and partitioning all rely on that).
    """
    return validate_node_name(node).replace(".", "_")


def node_from_token(token: str) -> str:
    """Inverse of node_token; raises InvalidNodeName for a token no node maps to."""
    return validate_node_name(token.replace("_", "."))


def node_subject(node: str, kind: str) -> str:
    """`nicfleet.v1.node.<node-token>.<kind>` for a validated node name."""
    if kind not in NODE_KINDS:
        raise ValueError(f"unknown node message kind {kind!r}; expected one of {NODE_KINDS}")
    return f"{PREFIX}.node.{node_token(node)}.{kind}"


def parse_node_subject(subject: str) -> tuple[str, str]:
    """Split a node subject into (node, kind); raise ValueError when it is not one."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:3]) != f"{PREFIX}.node":
        raise ValueError(f"subject {subject!r} is not {PREFIX}.node.<node>.<kind>")
    if parts[4] not in NODE_KINDS:
        raise ValueError(f"subject {subject!r} has unknown kind {parts[4]!r}")
    return node_from_token(parts[3]), parts[4]


class InvalidValidationId(ProtoError, ValueError):
    """A validation id that cannot be a subject token (or a Pod name suffix)."""


_VALIDATION_ID = re.compile(rf"^{_DNS1123_LABEL}$")
MAX_VALIDATION_ID = 40  # leaves room for a "nicfleet-validate-" Pod name prefix (63)


def validate_validation_id(validation_id: str) -> str:
    """Return the id if it is a DNS-1123 label of at most 40 characters; raise otherwise."""
    if not validation_id:
        raise InvalidValidationId("validation id is empty")
    if len(validation_id) > MAX_VALIDATION_ID:
        raise InvalidValidationId(f"validation id is longer than {MAX_VALIDATION_ID} characters")
    if not _VALIDATION_ID.fullmatch(validation_id):
        raise InvalidValidationId(
            f"validation id {validation_id!r} is not a DNS-1123 label "
            "(lowercase letters, digits and '-', starting and ending alphanumeric)"
        )
    return validation_id


def validation_subject(validation_id: str) -> str:
    """`nicfleet.v1.validation.<id>`: where both pods of a validation publish their result."""
    return f"{PREFIX}.validation.{validate_validation_id(validation_id)}"


def parse_validation_subject(subject: str) -> str:
    """The validation id of a validation subject; raise ValueError when it is not one."""
    parts = subject.split(".")
    if len(parts) != 4 or ".".join(parts[:3]) != f"{PREFIX}.validation":
        raise ValueError(f"subject {subject!r} is not {PREFIX}.validation.<id>")
    return validate_validation_id(parts[3])


def desired_subject(node: str) -> str:
    """`nicfleet.v1.desired.<node-token>`: the aggregator's announcements for one node."""
    return f"{PREFIX}.desired.{node_token(node)}"


def desired_get_subject(node: str) -> str:
    """`nicfleet.v1.desired.<node-token>.get`: where that node's agent asks for its config."""
    return f"{desired_subject(node)}.get"


def parse_desired_get_subject(subject: str) -> str:
    """The node a desired-config request is for; raise ValueError when it is not one."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:3]) != f"{PREFIX}.desired" or parts[4] != "get":
        raise ValueError(f"subject {subject!r} is not {PREFIX}.desired.<node>.get")
    return node_from_token(parts[3])


def draclaims_get_subject(node: str) -> str:
    """`nicfleet.v1.draclaims.<node-token>.get`: where that node's agent asks for claims."""
    return f"{PREFIX}.draclaims.{node_token(node)}.get"


def parse_draclaims_get_subject(subject: str) -> str:
    """The node a claim request is for; raise ValueError when it is not one."""
    parts = subject.split(".")
    if len(parts) != 5 or ".".join(parts[:3]) != f"{PREFIX}.draclaims" or parts[4] != "get":
        raise ValueError(f"subject {subject!r} is not {PREFIX}.draclaims.<node>.get")
    return node_from_token(parts[3])


def alert_subject(severity: str, rule: str, node: str) -> str:
    """`nicfleet.v1.alert.<severity>.<rule>.<node-token>`."""
    return f"{PREFIX}.alert.{severity}.{rule}.{node_token(node)}"
