"""Who may do what on nicfleet's NATS: the permission set of each role, and the
nats-server authorization config that grants them to NKey users.

Pure: takes public keys (never seeds) and returns data or JSON text. An agent may publish
only its own node subjects and its own desired-config and DRA claim requests, hear only its
own inbox, its own desired-config subject and resync requests only the aggregator may send,
and holds no JetStream API at all; the aggregator may never publish node subjects; anonymous clients
are refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from proto import subjects

NODE_SUBJECTS = f"{subjects.PREFIX}.node.>"
MAX_PARTITIONS = 1024


class Role(StrEnum):
    AGENT = "agent"
    AGGREGATOR = "aggregator"
    OBSERVER = "observer"  # reads alerts only, e.g. an alert consumer
    VALIDATOR = "validator"  # a validation pod: publishes its ValidationResult only
    CALLOUT = "callout"  # the auth-callout responder (aggregator.bus.calloutservice)


@dataclass(frozen=True)
class Permissions:
    publish_allow: tuple[str, ...] = ()
    publish_deny: tuple[str, ...] = ()
    subscribe_allow: tuple[str, ...] = ()
    subscribe_deny: tuple[str, ...] = ()

    def as_config(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        for direction, allow, deny in (
            ("publish", self.publish_allow, self.publish_deny),
            ("subscribe", self.subscribe_allow, self.subscribe_deny),
        ):
            part: dict[str, list[str]] = {}
            if allow:
                part["allow"] = list(allow)
            if deny:
                part["deny"] = list(deny)
            doc[direction] = part
        return doc


@dataclass(frozen=True)
class Identity:
    """One NKey user: its role, the node it speaks for (agents only), its public key."""

    role: Role
    public_key: str
    node: str | None = None


def agent_permissions(node: str, *, partitioned: bool = False) -> Permissions:
    """Publish its own node subjects and its desired-config request; hear its own inbox,
    its own desired-config announcements and the aggregator's resync requests (which it
    may not publish).

    No `$JS.>` of any kind: with the JetStream API an agent could create consumers without
    bound and aim an API answer at any subject by choosing the request's reply subject
    (the server sends the answer there). Its config comes over core NATS instead
    (`aggregator.bus.desiredanswer`), and the aggregator answers only into this inbox.
    """
    token = subjects.node_token(node)
    # nats-server checks publish permissions on the *mapped* subject (2.15, tested in
    # tests/integration/replicas/test_shards.py): with partitions, its own node's
    # partition subjects.
    mapped = (subjects.partition_subject("*", token, ">"),) if partitioned else ()
    return Permissions(
        publish_allow=(
            f"{subjects.PREFIX}.node.{token}.>",
            *mapped,
            subjects.desired_get_subject(node),
            # Its DRA plugin's claim requests (`aggregator.bus.claimanswer`): answered
            # with this node's devices only, into this inbox only.
            subjects.draclaims_get_subject(node),
        ),
        subscribe_allow=(
            f"_INBOX.{token}.>",
            subjects.CONTROL_RESYNC,
            subjects.desired_subject(node),
        ),
    )


def aggregator_permissions() -> Permissions:
    """JetStream (KV buckets, leases), alerts, resync requests, desired-config
    announcements, its inbox and answers into inboxes; never an agent's subjects."""
    return Permissions(
        publish_allow=(
            "$JS.API.>",
            "$KV.>",
            "$JS.ACK.>",
            "$JS.FC.>",
            f"{subjects.PREFIX}.alert.>",
            subjects.CONTROL_RESYNC,
            subjects.SHARD_SUMMARY_WILDCARD,
            subjects.DESIRED_WILDCARD,
            # Answers to desired-config requests; which inbox is checked per request
            # (`aggregator.bus.desiredanswer.check_request`).
            "_INBOX.>",
        ),
        publish_deny=(NODE_SUBJECTS, subjects.PARTITION_WILDCARD),
        # Partitioned node subjects (docs/scaling.md) and the replicas' shard summaries.
        subscribe_allow=(
            NODE_SUBJECTS,
            "_INBOX.>",
            subjects.PARTITION_WILDCARD,
            subjects.SHARD_SUMMARY_WILDCARD,
            # The pair-validation pods' results (docs/validation.md).
            subjects.VALIDATION_WILDCARD,
            subjects.DESIRED_GET_WILDCARD,
            subjects.DRACLAIMS_GET_WILDCARD,
        ),
    )


def observer_permissions() -> Permissions:
    return Permissions(publish_deny=(">",), subscribe_allow=(subjects.ALERT_WILDCARD,))


def validator_permissions() -> Permissions:
    """`nicfleet-agent verify` in a validation pod: publish results, read nothing."""
    return Permissions(publish_allow=(subjects.VALIDATION_WILDCARD,), subscribe_deny=(">",))


def callout_permissions() -> Permissions:
    """Hear nats-server's join requests and answer them: the server's reply subjects are
    `$SYS._INBOX.<server>.<id>` (2.15, tests/integration/bus/test_auth_callout.py)."""
    return Permissions(publish_allow=("$SYS._INBOX.>",), subscribe_allow=("$SYS.REQ.USER.AUTH",))


def permissions_for(identity: Identity, *, partitioned: bool = False) -> Permissions:
    if identity.role is Role.AGENT:
        if identity.node is None:
            raise ValueError("an agent identity needs its node")
        return agent_permissions(identity.node, partitioned=partitioned)
    if identity.role is Role.AGGREGATOR:
        return aggregator_permissions()
    if identity.role is Role.VALIDATOR:
        return validator_permissions()
    if identity.role is Role.CALLOUT:
        return callout_permissions()
    return observer_permissions()


@dataclass(frozen=True, kw_only=True)
class ServerTls:
    """Server side of TLS; `verify` requires every client to present a certificate."""

    cert_file: Path
    key_file: Path
    ca_file: Path | None = None
    verify: bool = True


def partition_mappings(partitions: int) -> dict[str, str]:
    """Server subject mapping spreading node subjects over `partitions` partitions by node
    token (docs/scaling.md); {} for 0. Permissions are checked on the original subject."""
    if not 0 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be in [0, {MAX_PARTITIONS}], got {partitions}")
    if not partitions:
        return {}
    part = "{{partition(" + str(partitions) + ",1)}}"
    target = subjects.partition_subject(part, "{{wildcard(1)}}", "{{wildcard(2)}}")
    return {subjects.NODE_WILDCARD: target}


def render_mappings_config(partitions: int) -> str:
    """A nats-server config (JSON syntax) holding only the partition mapping."""
    return json.dumps({"mappings": partition_mappings(partitions)}, indent=2) + "\n"


def render_server_config(
    identities: tuple[Identity, ...],
    *,
    tls: ServerTls | None = None,
    partitions: int = 0,
    callout_issuer: str | None = None,
) -> str:
    """A nats-server config (JSON syntax) with one NKey user per identity.

    There is no `no_auth_user`, so a client without valid credentials is refused.
    With `partitions`, node subjects are mapped to partition subjects (docs/scaling.md).
    With `callout_issuer` (an account public key), a client that is none of these users is
    asked about on `$SYS.REQ.USER.AUTH` (agents joining by token, docs/security.md); the
    listed users bypass the callout.
    """
    if not identities:
        raise ValueError("no identities: the server would refuse everybody")
    keys = [i.public_key for i in identities]
    if len(set(keys)) != len(keys):
        raise ValueError("the same public key is listed twice")
    for identity in identities:
        if not (identity.public_key.startswith("U") and len(identity.public_key) == 56):
            raise ValueError(f"{identity.public_key!r} is not an NKey user public key")
    users = [
        {
            "nkey": i.public_key,
            "permissions": permissions_for(i, partitioned=partitions > 0).as_config(),
        }
        for i in sorted(identities, key=lambda i: (i.role, i.node or "", i.public_key))
    ]
    doc: dict[str, Any] = {"authorization": {"users": users}}
    if callout_issuer is not None:
        if not (callout_issuer.startswith("A") and len(callout_issuer) == 56):
            raise ValueError(f"{callout_issuer!r} is not an NKey account public key")
        if not any(i.role is Role.CALLOUT for i in identities):
            raise ValueError("an auth callout needs a callout identity to answer it")
        doc["authorization"]["auth_callout"] = {
            "issuer": callout_issuer,
            "auth_users": sorted(keys),
        }
    if partitions:
        doc["mappings"] = partition_mappings(partitions)
    if tls is not None:
        block: dict[str, Any] = {"cert_file": str(tls.cert_file), "key_file": str(tls.key_file)}
        if tls.ca_file is not None:
            block["ca_file"] = str(tls.ca_file)
        block["verify"] = tls.verify
        block["timeout"] = 2
        doc["tls"] = block
    return json.dumps(doc, indent=2) + "\n"
