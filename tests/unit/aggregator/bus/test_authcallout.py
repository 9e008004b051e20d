"""The pure auth-callout core: token pre-checks, the decision table, cache deadlines bound
by the token's `exp`, request verification and the signed response/user JWTs."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import nacl.signing
import nkeys
import pytest

from aggregator.bus import authcallout
from aggregator.bus.authcallout import (
    Admitted,
    AuthRequest,
    JoinSettings,
    Reason,
    Refused,
    Reviewed,
    TokenClaims,
)
from aggregator.bus.permissions import agent_permissions
from proto.runtime.natsconnect import NatsClientSecurity, NatsSecurityError, connect_options

NOW = 1_800_000_000.0
SETTINGS = JoinSettings(namespace="nicfleet-system", service_account="nicfleet-agent")
AGENT = SETTINGS.username
CLAIMS = TokenClaims(exp=NOW + 600, audiences=("nicfleet",), node="node-a")


def b64(doc: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(doc).encode()).rstrip(b"=").decode()


def b64d(part: str) -> Any:
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))


def keypair(prefix: int) -> Any:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def reviewed(user: str = AGENT, node: str | None = "node-a", **kw: Any) -> Reviewed:
    extra = {authcallout.NODE_NAME_EXTRA: (node,)} if node else {}
    return Reviewed(authenticated=True, username=user, audiences=("nicfleet",), extra=extra, **kw)


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        pytest.param("opaque", Reason.MALFORMED, id="not-a-jwt"),
        pytest.param(
            f"h.{b64({'aud': 'nicfleet', 'exp': NOW - 1})}.s", Reason.EXPIRED, id="expired"
        ),
        pytest.param(f"h.{b64({'aud': 'nicfleet'})}.s", Reason.EXPIRED, id="no-exp"),
        pytest.param(
            f"h.{b64({'aud': ['api'], 'exp': NOW + 60})}.s",
            Reason.WRONG_AUDIENCE,
            id="wrong-audience",
        ),
        pytest.param(
            f"h.{b64({'aud': ['api', 'nicfleet'], 'exp': NOW + 60})}.s",
            None,
            id="one-of-its-audiences",
        ),
    ],
)
def test_precheck(token: str, reason: Reason | None) -> None:
    refused = authcallout.precheck(authcallout.token_claims(token), SETTINGS, now=NOW)
    assert (refused.reason if refused else None) is reason


def test_token_claims_read_the_bound_node() -> None:
    token = f"h.{b64({'aud': 'nicfleet', 'exp': NOW, 'kubernetes.io': {'node': {'name': 'n1'}}})}.s"
    assert authcallout.token_claims(token) == TokenClaims(
        exp=NOW, audiences=("nicfleet",), node="n1"
    )


@pytest.mark.parametrize(
    ("review", "claims", "expected"),
    [
        pytest.param(reviewed(), CLAIMS, Admitted("node-a", AGENT), id="agent-on-node-a"),
        pytest.param(
            reviewed(node=None), CLAIMS, Admitted("node-a", AGENT), id="claim-when-no-extra"
        ),
        pytest.param(
            reviewed(node="node-b"),
            CLAIMS,
            Admitted("node-b", AGENT),
            id="extra-wins-over-the-claim",
        ),
        pytest.param(
            reviewed(node=None),
            TokenClaims(exp=NOW + 1, audiences=("nicfleet",), node=None),
            Reason.NO_NODE,
            id="no-node",
        ),
        pytest.param(
            Reviewed(authenticated=False, error="expired"),
            CLAIMS,
            Reason.UNAUTHENTICATED,
            id="review-says-no",
        ),
        pytest.param(
            reviewed(user="system:serviceaccount:default:default"),
            CLAIMS,
            Reason.NOT_AGENT,
            id="other-serviceaccount",
        ),
        pytest.param(
            reviewed(user="system:serviceaccount:other-ns:nicfleet-agent"),
            CLAIMS,
            Reason.NOT_AGENT,
            id="same-name-other-namespace",
        ),
        pytest.param(
            Reviewed(authenticated=True, username=AGENT, audiences=()),
            CLAIMS,
            Reason.WRONG_AUDIENCE,
            id="api-server-audience",
        ),
    ],
)
def test_decide(review: Reviewed, claims: TokenClaims, expected: Admitted | Reason) -> None:
    decision = authcallout.decide(review, claims, SETTINGS)
    if isinstance(expected, Admitted):
        assert decision == expected
    else:
        assert isinstance(decision, Refused) and decision.reason is expected


@pytest.mark.parametrize(
    ("decision", "exp", "until"),
    [
        pytest.param(Admitted("n", AGENT), NOW + 60, NOW + 60, id="admitted-bound-by-exp"),
        pytest.param(Admitted("n", AGENT), NOW + 3600, NOW + 600, id="admitted-ttl"),
        pytest.param(Refused(Reason.NOT_AGENT, "x"), NOW + 3600, NOW + 10, id="refused-ttl"),
        pytest.param(Refused(Reason.NOT_AGENT, "x"), NOW + 5, NOW + 5, id="refused-bound-by-exp"),
    ],
)
def test_cache_never_outlives_the_token(decision: Any, exp: float, until: float) -> None:
    claims = TokenClaims(exp=exp, audiences=("nicfleet",), node="n")
    assert authcallout.cache_until(decision, claims, SETTINGS, now=NOW) == until


def signed_request(server: Any, *, exp: float = NOW + 2, **nats: Any) -> str:
    body = {
        "aud": "nats-authorization-request",
        "iss": server.public_key.decode(),
        "exp": int(exp),
        "nats": {
            "type": "authorization_request",
            "server_id": {"id": server.public_key.decode()},
            "user_nkey": "UABC",
            "client_info": {"host": "10.0.0.7", "name": "agent"},
            "connect_opts": {"auth_token": "tok"},
            **nats,
        },
    }
    head = f"{b64({'typ': 'JWT', 'alg': 'ed25519-nkey'})}.{b64(body)}"
    sig = base64.urlsafe_b64encode(server.sign(head.encode())).rstrip(b"=").decode()
    return f"{head}.{sig}"


def test_decode_request_checks_the_server_signature() -> None:
    server = keypair(nkeys.PREFIX_BYTE_SERVER)
    text = signed_request(server)
    request = authcallout.decode_request(text, now=NOW)
    assert request == AuthRequest(server.public_key.decode(), "UABC", "tok", "agent", "10.0.0.7")
    head, body, sig = text.split(".")
    forged = b64d(body)
    forged["nats"]["connect_opts"]["auth_token"] = "other"
    with pytest.raises(authcallout.CalloutRequestError, match="signature"):
        authcallout.decode_request(f"{head}.{b64(forged)}.{sig}", now=NOW)
    with pytest.raises(authcallout.CalloutRequestError, match="expired"):
        authcallout.decode_request(text, now=NOW + 60)
    user = keypair(nkeys.PREFIX_BYTE_USER)  # signed by a client key, not a server's
    with pytest.raises(authcallout.CalloutRequestError, match="expected kind"):
        authcallout.decode_request(signed_request(user), now=NOW)
    with pytest.raises(authcallout.CalloutRequestError):
        authcallout.decode_request(b"garbage", now=NOW)


def verify(text: str, issuer: Any) -> dict[str, Any]:
    head, body, sig = text.split(".")
    raw = base64.urlsafe_b64decode(sig + "=" * (-len(sig) % 4))
    verify_key = nacl.signing.VerifyKey(issuer._keys.verify_key.encode())
    verify_key.verify(f"{head}.{body}".encode(), raw)
    assert b64d(head) == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims: dict[str, Any] = b64d(body)
    return claims


def test_response_embeds_a_user_jwt_with_exactly_the_node_permissions() -> None:
    account = keypair(nkeys.PREFIX_BYTE_ACCOUNT)
    issuer = account.public_key.decode()
    request = AuthRequest("NSERVER", "UCONN", "tok", "agent", "h")
    permissions = agent_permissions("node-a")
    user = authcallout.user_jwt(
        request, "node-a", permissions, issuer=issuer, signer=account, now=NOW
    )
    text = authcallout.response_jwt(request, issuer=issuer, signer=account, now=NOW, user=user)
    response = verify(text, account)
    assert (response["iss"], response["sub"], response["aud"]) == (issuer, "UCONN", "NSERVER")
    assert response["nats"]["type"] == "authorization_response"
    claims = verify(response["nats"]["jwt"], account)
    assert (claims["sub"], claims["aud"], claims["name"]) == ("UCONN", "$G", "agent:node-a")
    assert "exp" not in claims  # the server would cut an established agent at it
    assert claims["nats"]["pub"] == {"allow": list(permissions.publish_allow)}
    assert claims["nats"]["sub"] == {"allow": list(permissions.subscribe_allow)}
    refusal = verify(
        authcallout.response_jwt(request, issuer=issuer, signer=account, now=NOW, error="no"),
        account,
    )
    assert refusal["nats"] == {"type": "authorization_response", "version": 2, "error": "no"}
    with pytest.raises(ValueError, match="user JWT or an error"):
        authcallout.response_jwt(request, issuer=issuer, signer=account, now=NOW)


def test_issuer_public_key_wants_an_account_seed() -> None:
    seed = bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)).decode()
    assert authcallout.issuer_public_key(seed).startswith("A")
    user_seed = bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)).decode()
    with pytest.raises(ValueError, match="account seed"):
        authcallout.issuer_public_key(user_seed)


def test_token_file_is_read_again_at_every_connect(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    token = connect_options(NatsClientSecurity(token_file=path))["token"]
    assert token() == "first"
    path.write_text("second\n")
    assert token() == "second"
    path.unlink()  # mid-rotation: the last token read is sent
    assert token() == "second"
    assert "second" not in repr(token)


@pytest.mark.parametrize(
    ("security", "flag"),
    [
        pytest.param({"token_file": Path("/nonexistent/token")}, "--nats-token-file", id="missing"),
        pytest.param({"token_file": Path("/dev/null")}, "--nats-token-file", id="empty"),
        pytest.param(
            {"token_file": Path("/dev/null"), "user": "u"}, "--nats-token-file", id="with-a-user"
        ),
    ],
)
def test_token_file_errors_name_the_flag(security: dict[str, Any], flag: str) -> None:
    with pytest.raises(NatsSecurityError) as caught:
        connect_options(NatsClientSecurity(**security))
    assert caught.value.flag == flag
