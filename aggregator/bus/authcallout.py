"""NATS auth callout, pure: nats-server's authorization-request JWT → which node the agent's
projected ServiceAccount token speaks for → the signed authorization-response JWT whose user
JWT grants that node's permissions only (`permissions.agent_permissions`).

No I/O, no clock (`now` is a parameter), no logging; `calloutservice` asks TokenReview and
talks NATS. The JWTs are the nats-server 2.x claim formats (ed25519-nkey, checked against
the real server in tests/integration/bus/test_auth_callout.py), encoded here with nkeys:
see docs/security.md for why no JWT library.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Final, Protocol

import nacl.exceptions
import nacl.signing
import nkeys

from aggregator.bus.permissions import Permissions
from aggregator.errors import AggregatorError

REQUEST_AUDIENCE: Final = "nats-authorization-request"
# In config (non-operator) mode the callout's users live in the global account.
GLOBAL_ACCOUNT: Final = "$G"
NODE_NAME_EXTRA: Final = "authentication.kubernetes.io/node-name"
_HEADER: Final = {"typ": "JWT", "alg": "ed25519-nkey"}


class CalloutRequestError(AggregatorError, ValueError):
    """The message on `$SYS.REQ.USER.AUTH` is no authorization request signed by a server."""


class Signer(Protocol):
    """An NKey key pair (nkeys.KeyPair): the account key that signs our answers."""

    def sign(self, data: bytes) -> bytes: ...


class Reason(StrEnum):
    """Why a join is refused: the `reason` label of nicfleet_nats_joins_total."""

    NO_TOKEN = "no_token"
    MALFORMED = "malformed"
    EXPIRED = "expired"
    WRONG_AUDIENCE = "wrong_audience"
    UNAUTHENTICATED = "unauthenticated"  # TokenReview said no (forged, revoked, deleted pod)
    NOT_AGENT = "not_agent"
    NO_NODE = "no_node"
    UNAVAILABLE = "unavailable"  # the review could not be made: refused, never cached


@dataclass(frozen=True, kw_only=True)
class JoinSettings:
    """Which tokens make an agent: audience, ServiceAccount, how long answers are trusted."""

    namespace: str
    service_account: str
    audience: str = "nicfleet"
    positive_ttl_s: float = 600.0  # never beyond the token's own `exp`
    negative_ttl_s: float = 10.0

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"


@dataclass(frozen=True)
class AuthRequest:
    server_id: str  # the server's public key: the `aud` of our answer
    user_nkey: str  # the key the server made up for this connection: our user JWT's `sub`
    token: str
    client_name: str
    client_host: str


@dataclass(frozen=True, kw_only=True)
class TokenClaims:
    """The unverified payload of a ServiceAccount token: only a pre-check and a cache bound;
    the TokenReview is what makes it true."""

    exp: float | None
    audiences: tuple[str, ...]
    node: str | None  # the bound-token claim kubernetes.io.node.name


@dataclass(frozen=True, kw_only=True)
class Reviewed:
    """What the TokenReview said, in this package's terms (runtime adapts kube's result)."""

    authenticated: bool
    username: str = ""
    audiences: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] | None = None
    error: str = ""


@dataclass(frozen=True)
class Admitted:
    node: str
    username: str


@dataclass(frozen=True)
class Refused:
    reason: Reason
    message: str  # names the user or the claim, never the token


Decision = Admitted | Refused


def outcome_labels(decision: Decision) -> tuple[str, str]:
    """(outcome, reason) of the joins metric."""
    if isinstance(decision, Admitted):
        return ("admitted", "")
    return ("refused", str(decision.reason))


def _b64decode(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def _b64encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def _payload(token: str) -> dict[str, Any]:
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    doc = json.loads(_b64decode(parts[1]))
    if not isinstance(doc, dict):
        raise ValueError("JWT payload is not an object")
    return doc


def _raw_public_key(key: str, prefix: int) -> bytes:
    """The Ed25519 key inside an NKey public key (base32: prefix byte, 32 bytes, CRC-16)."""
    try:
        raw = base64.b32decode(key + "=" * (-len(key) % 8))
    except (binascii.Error, ValueError) as exc:
        raise CalloutRequestError(f"{key!r} is not an NKey public key") from exc
    body, crc = raw[:-2], raw[-2:]
    if len(raw) != 35 or raw[0] != prefix or bytes(nkeys.crc16_checksum(body)) != crc:
        raise CalloutRequestError(f"{key!r} is not an NKey public key of the expected kind")
    return bytes(body[1:])


def decode_request(text: str | bytes, *, now: float) -> AuthRequest:
    """The authorization request, its server signature checked; CalloutRequestError if not."""
    token = text.decode(errors="replace") if isinstance(text, bytes) else text
    try:
        header_b64, payload_b64, sig_b64 = token.split(".")
        header = json.loads(_b64decode(header_b64))
        claims = _payload(token)
        signature = _b64decode(sig_b64)
    except ValueError as exc:
        raise CalloutRequestError(f"not an authorization request JWT: {exc}") from exc
    if header.get("alg") != _HEADER["alg"]:
        raise CalloutRequestError(f"unexpected JWT algorithm {header.get('alg')!r}")
    issuer = str(claims.get("iss", ""))
    verify_key = nacl.signing.VerifyKey(_raw_public_key(issuer, nkeys.PREFIX_BYTE_SERVER))
    try:
        verify_key.verify(f"{header_b64}.{payload_b64}".encode(), signature)
    except nacl.exceptions.BadSignatureError as exc:
        raise CalloutRequestError(
            "the authorization request's signature is not its server's"
        ) from exc
    if claims.get("aud") != REQUEST_AUDIENCE:
        raise CalloutRequestError(f"unexpected audience {claims.get('aud')!r}")
    exp = claims.get("exp")
    if isinstance(exp, int | float) and exp < now:
        raise CalloutRequestError("the authorization request has expired")
    nats = claims.get("nats")
    if not isinstance(nats, dict) or nats.get("type") != "authorization_request":
        raise CalloutRequestError("not an authorization_request claim")
    server = nats.get("server_id") or {}
    opts = nats.get("connect_opts") or {}
    client = nats.get("client_info") or {}
    user_nkey = nats.get("user_nkey")
    if not isinstance(user_nkey, str) or not user_nkey.startswith("U"):
        raise CalloutRequestError("the request names no user nkey")
    return AuthRequest(
        server_id=str(server.get("id") or issuer),
        user_nkey=user_nkey,
        token=str(opts.get("auth_token") or ""),
        client_name=str(client.get("name") or opts.get("name") or ""),
        client_host=str(client.get("host") or ""),
    )


def token_claims(token: str) -> TokenClaims | None:
    """The claims of a ServiceAccount token, unverified; None when it is no JWT."""
    try:
        doc = _payload(token)
    except (ValueError, UnicodeDecodeError):
        return None
    exp = doc.get("exp")
    aud = doc.get("aud")
    audiences = (
        (aud,) if isinstance(aud, str) else tuple(a for a in aud or () if isinstance(a, str))
    )
    k8s = doc.get("kubernetes.io")
    node = k8s.get("node") if isinstance(k8s, dict) else None
    name = node.get("name") if isinstance(node, dict) else None
    return TokenClaims(
        exp=float(exp) if isinstance(exp, int | float) else None,
        audiences=audiences,
        node=name if isinstance(name, str) and name else None,
    )


def precheck(claims: TokenClaims | None, settings: JoinSettings, *, now: float) -> Refused | None:
    """Refusals that need no TokenReview (and so cost the API server nothing)."""
    if claims is None:
        return Refused(Reason.MALFORMED, "the token is not a ServiceAccount JWT")
    if claims.exp is None or claims.exp <= now:
        return Refused(Reason.EXPIRED, "the token has expired (or carries no exp)")
    if settings.audience not in claims.audiences:
        return Refused(
            Reason.WRONG_AUDIENCE, f"the token is not issued for audience {settings.audience}"
        )
    return None


def decide(reviewed: Reviewed, claims: TokenClaims, settings: JoinSettings) -> Decision:
    """The node a reviewed token may speak for, or why it may not join."""
    if not reviewed.authenticated or not reviewed.username:
        why = f": {reviewed.error}" if reviewed.error else ""
        return Refused(Reason.UNAUTHENTICATED, f"TokenReview did not authenticate the token{why}")
    # An empty status.audiences means "valid for the API server": not for us when we asked.
    if settings.audience not in reviewed.audiences:
        return Refused(
            Reason.WRONG_AUDIENCE, f"the token is not issued for audience {settings.audience}"
        )
    if reviewed.username != settings.username:
        return Refused(
            Reason.NOT_AGENT,
            f"{reviewed.username} is not the agent ServiceAccount {settings.username}",
        )
    nodes = (reviewed.extra or {}).get(NODE_NAME_EXTRA, ())
    # The claim is the API server's once the review succeeded; `extra` says it since 1.30.
    node = nodes[0] if nodes else claims.node
    if not node:
        return Refused(Reason.NO_NODE, f"{reviewed.username}'s token is bound to no node")
    return Admitted(node, reviewed.username)


def cache_until(
    decision: Decision, claims: TokenClaims | None, settings: JoinSettings, *, now: float
) -> float:
    """When a cached answer for this token stops counting: never after the token's `exp`."""
    ttl = settings.positive_ttl_s if isinstance(decision, Admitted) else settings.negative_ttl_s
    until = now + ttl
    if claims is not None and claims.exp is not None:
        until = min(until, claims.exp)
    return until


def encode_jwt(claims: Mapping[str, Any], signer: Signer) -> str:
    """An ed25519-nkey JWT; `jti` is the SHA-256 of the claims, as the NATS jwt library does."""
    body = dict(claims)
    body["jti"] = ""
    body["jti"] = base64.b32encode(hashlib.sha256(json.dumps(body).encode()).digest()).decode()
    body["jti"] = body["jti"].rstrip("=")
    signing_input = (
        f"{_b64encode(json.dumps(_HEADER).encode())}.{_b64encode(json.dumps(body).encode())}"
    )
    return f"{signing_input}.{_b64encode(bytes(signer.sign(signing_input.encode())))}"


def user_jwt(
    request: AuthRequest,
    node: str,
    permissions: Permissions,
    *,
    issuer: str,
    signer: Signer,
    now: float,
) -> str:
    """The connection's user JWT: this node's permissions in the global account.

    No `exp`: the server would cut the connection at it, and an established agent must
    outlive a callout outage (docs/security.md); the token is checked at every connect.
    """
    doc = permissions.as_config()
    nats: dict[str, Any] = {"type": "user", "version": 2}
    for direction, key in (("publish", "pub"), ("subscribe", "sub")):
        nats[key] = doc.get(direction) or {}
    claims = {
        "iat": int(now),
        "iss": issuer,
        "sub": request.user_nkey,
        "aud": GLOBAL_ACCOUNT,
        "name": f"agent:{node}",
        "nats": nats,
    }
    return encode_jwt(claims, signer)


def response_jwt(
    request: AuthRequest,
    *,
    issuer: str,
    signer: Signer,
    now: float,
    user: str | None = None,
    error: str | None = None,
) -> str:
    """The authorization response: the user JWT, or an error (the server refuses then)."""
    if (user is None) == (error is None):
        raise ValueError("an authorization response carries a user JWT or an error")
    nats: dict[str, Any] = {"type": "authorization_response", "version": 2}
    if user is not None:
        nats["jwt"] = user
    else:
        nats["error"] = error
    claims = {
        "iat": int(now),
        "iss": issuer,
        "sub": request.user_nkey,
        "aud": request.server_id,
        "nats": nats,
    }
    return encode_jwt(claims, signer)


def issuer_public_key(seed: str) -> str:
    """The account public key (A...) of an account seed (SA...); ValueError if it is not one."""
    if not seed.startswith("SA"):
        raise ValueError("is not a NATS account seed (expected 'SA...')")
    try:
        return str(nkeys.from_seed(bytearray(seed.encode())).public_key.decode())
    except Exception as exc:  # nkeys raises its own unrelated error types
        raise ValueError(f"is not a valid NKey seed: {exc}") from exc
