"""Zero-touch agent join on a real nats-server with the auth callout that `nats-auth
--auth-callout` configures: a ServiceAccount token bound to node A yields exactly A's
permissions; expired, wrong-audience, non-agent and node-less tokens are refused at
connect (a log line and a metric each); the responder stopped refuses new joins but keeps
established agents; the seed users still connect; the agent re-reads a rotated token file.

TokenReview is an injected function answering from a table (`FakeReview`); the tokens are
unsigned JWT-shaped strings, as only the review decides what is true.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from prometheus_client import CollectorRegistry

from aggregator.bus import authcallout
from aggregator.bus.authcallout import JoinSettings, Reviewed
from aggregator.bus.calloutservice import CalloutResponder
from aggregator.bus.keys import Provisioned, provision
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.metrics import JoinMetrics
from proto import subjects
from proto.runtime.natsconnect import NatsClientSecurity, agent_inbox_prefix, connect_options
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE_A, NODE_B = "join-a", "join-b"
SETTINGS = JoinSettings(namespace="nicfleet-system", service_account="nicfleet-agent")
AGENT_USER = SETTINGS.username


def sa_token(
    name: str, *, node: str | None = None, aud: str = "nicfleet", ttl: float = 600.0
) -> str:
    """A JWT-shaped token: header.payload.signature with the claims a projected token has."""
    claims: dict[str, Any] = {"aud": [aud], "exp": int(time.time() + ttl), "sub": name}
    if node is not None:
        claims["kubernetes.io"] = {"node": {"name": node}}
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


class FakeReview:
    """TokenReview by table: token → what the API server would answer."""

    def __init__(self) -> None:
        self.answers: dict[str, Reviewed] = {}
        self.calls = 0

    def agent(self, node: str | None, *, user: str = AGENT_USER, claim: bool = True) -> str:
        token = sa_token(user, node=node if claim else None)
        extra = {authcallout.NODE_NAME_EXTRA: (node,)} if node else {}
        self.answers[token] = Reviewed(
            authenticated=True, username=user, audiences=("nicfleet",), extra=extra
        )
        return token

    async def __call__(self, token: str, audiences: tuple[str, ...]) -> Reviewed:
        self.calls += 1
        return self.answers.get(token, Reviewed(authenticated=False, error="invalid token"))


@pytest.fixture
def keys(tmp_path: Path) -> Provisioned:
    return provision(tmp_path / "auth", ("seeded",), auth_callout=True)


@pytest.fixture
def server(tmp_path: Path, keys: Provisioned) -> Iterator[NatsServer]:
    settings = NatsServerSettings(store_dir=tmp_path / "js", config_file=keys.config)
    with NatsServer(settings) as srv:
        yield srv


class Callout:
    """The responder running on its own connection, stoppable mid-test."""

    def __init__(self, url: str, keys: Provisioned, review: FakeReview) -> None:
        assert keys.callout_issuer_seed is not None and keys.callout_seed is not None
        self.url, self.keys, self.review = url, keys, review
        self.metrics = JoinMetrics.create(CollectorRegistry())
        self.responder = CalloutResponder(
            settings=SETTINGS,
            review=review,
            issuer_seed=keys.callout_issuer_seed.read_text().strip(),
            wall_clock=time.time,
            on_decision=lambda d: self.metrics.record(*authcallout.outcome_labels(d)),
        )

    def count(self, outcome: str, reason: str = "") -> float:
        value = self.metrics.joins.labels(outcome, reason)._value.get()
        return float(value)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        assert self.keys.callout_seed is not None
        security = NatsClientSecurity(nkey_seed_file=self.keys.callout_seed)
        nc = await nats.connect(self.url, reconnect_time_wait=0.05, **connect_options(security))
        self.nc = nc
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(self.responder.serve(nc, stop, ready=ready))
        try:
            await asyncio.wait_for(ready.wait(), timeout=10)
            yield
        finally:
            stop.set()
            await task
            await nc.close()


@pytest.fixture
def review() -> FakeReview:
    return FakeReview()


@pytest.fixture
def callout(server: NatsServer, keys: Provisioned, review: FakeReview) -> Callout:
    return Callout(server.url, keys, review)


async def join(url: str, token: str, node: str, **options: Any) -> NatsClient:
    return await nats.connect(
        url,
        token=token,
        inbox_prefix=agent_inbox_prefix(node),
        allow_reconnect=False,
        connect_timeout=5,
        **options,
    )


async def refused_join(url: str, token: str, node: str) -> str:
    """Join once, expecting the server to refuse; what the client was told."""
    nc = NatsClient()
    try:
        with pytest.raises((NatsError, OSError)) as caught:
            await nc.connect(
                url,
                token=token,
                inbox_prefix=agent_inbox_prefix(node),
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=5,
            )
    finally:
        await nc.close()  # a refused client still holds its socket until closed
    return str(caught.value)


async def seeded(url: str, seed: Path, **options: Any) -> NatsClient:
    return await nats.connect(
        url, **connect_options(NatsClientSecurity(nkey_seed_file=seed)), **options
    )


async def test_token_for_node_a_grants_exactly_node_a(
    server: NatsServer, keys: Provisioned, callout: Callout, review: FakeReview
) -> None:
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    async with callout.running():
        aggregator = await seeded(server.url, keys.aggregator_seed)
        heard = await aggregator.subscribe(f"{subjects.PREFIX}.node.>")
        await aggregator.flush()
        agent = await join(server.url, review.agent(NODE_A), NODE_A, error_cb=on_error)
        own = f"{subjects.PREFIX}.node.{subjects.node_token(NODE_A)}.status"
        other = f"{subjects.PREFIX}.node.{subjects.node_token(NODE_B)}.status"
        await agent.publish(other, b"forged")
        await agent.publish(own, b"mine")
        await agent.flush()
        msg = await heard.next_msg(timeout=5)
        assert (msg.subject, msg.data) == (own, b"mine")  # B's message never arrived first
        await wait_until(lambda: any("permissions violation" in e.lower() for e in errors))
        assert any(other in e for e in errors)
        await agent.subscribe(subjects.desired_subject(NODE_B))  # nor may it hear B's config
        await agent.flush()
        await wait_until(lambda: any("subscription" in e.lower() for e in errors))
        assert callout.count("admitted") == 1
        await agent.close()
        await aggregator.close()


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda r: sa_token(AGENT_USER, node=NODE_A, ttl=-60), "expired", id="expired"),
        pytest.param(
            lambda r: sa_token(AGENT_USER, node=NODE_A, aud="https://kubernetes.default.svc"),
            "wrong_audience",
            id="wrong-audience",
        ),
        pytest.param(
            lambda r: r.agent(NODE_A, user="system:serviceaccount:default:builder"),
            "not_agent",
            id="not-the-agent-serviceaccount",
        ),
        pytest.param(lambda r: r.agent(None), "no_node", id="no-node-claim"),
        pytest.param(
            lambda r: sa_token(AGENT_USER, node=NODE_A),
            "unauthenticated",
            id="forged-review-says-no",
        ),
        pytest.param(lambda r: "not-a-jwt", "malformed", id="not-a-jwt"),
    ],
)
async def test_bad_tokens_are_refused_with_a_log_line_and_a_metric(
    server: NatsServer,
    callout: Callout,
    review: FakeReview,
    caplog: pytest.LogCaptureFixture,
    make: Any,
    reason: str,
) -> None:
    token = make(review)
    async with callout.running():
        with caplog.at_level(logging.WARNING, logger="aggregator.bus.calloutservice"):
            said = await refused_join(server.url, token, NODE_A)
    assert "authorization violation" in said.lower()
    assert callout.count("refused", reason) == 1
    assert callout.count("admitted") == 0
    lines = [r.getMessage() for r in caplog.records if "refused NATS join" in r.getMessage()]
    assert len(lines) == 1 and reason in lines[0]
    assert token not in caplog.text  # the log names the reason, never the token


async def test_callout_down_refuses_new_joins_and_keeps_established_agents(
    server: NatsServer, keys: Provisioned, callout: Callout, review: FakeReview
) -> None:
    aggregator = await seeded(server.url, keys.aggregator_seed)
    heard = await aggregator.subscribe(f"{subjects.PREFIX}.node.>")
    await aggregator.flush()
    async with callout.running():
        agent = await join(server.url, review.agent(NODE_A), NODE_A)
    # The responder is stopped: no one answers $SYS.REQ.USER.AUTH any more.
    said = await refused_join(server.url, review.agent(NODE_B), NODE_B)
    assert "authorization violation" in said.lower()
    own = f"{subjects.PREFIX}.node.{subjects.node_token(NODE_A)}.status"
    await agent.publish(own, b"still here")
    await agent.flush()
    msg = await heard.next_msg(timeout=5)
    assert msg.data == b"still here"
    assert agent.is_connected
    await agent.close()
    await aggregator.close()


async def test_seed_users_bypass_the_callout(
    server: NatsServer, keys: Provisioned, review: FakeReview
) -> None:
    """No responder at all: the aggregator, validator and seed-mode agents still connect."""
    for seed in (keys.aggregator_seed, keys.validation_seed, keys.agent_seeds["seeded"]):
        nc = await seeded(server.url, seed, allow_reconnect=False)
        await nc.flush()
        await nc.close()
    assert review.calls == 0


async def test_agent_rereads_a_rotated_token_file_on_reconnect(
    server: NatsServer, keys: Provisioned, callout: Callout, review: FakeReview, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    first = review.agent(NODE_A)
    token_file.write_text(first)
    options = connect_options(
        NatsClientSecurity(token_file=token_file), inbox_prefix=agent_inbox_prefix(NODE_A)
    )
    async with callout.running():
        agent = await nats.connect(server.url, reconnect_time_wait=0.5, **options)
        second = review.agent(NODE_A) + "x"  # a different token, as the kubelet's next one
        review.answers[second] = review.answers[first]
        del review.answers[first]  # the old token is no longer valid
        rotated = tmp_path / "token.new"
        rotated.write_text(second)
        rotated.replace(token_file)
        before = review.calls
        server.stop()  # every connection must CONNECT again
        await wait_until(lambda: not agent.is_connected and not callout.nc.is_connected)
        server.start()
        # The responder reconnects first (0.05 s against the agent's 0.5 s): an agent
        # arriving before it would be refused and simply try again.
        await wait_until(lambda: agent.is_connected and review.calls > before, timeout=20)
        await agent.flush()
        assert callout.responder.reviews == review.calls
        assert callout.count("admitted") == 2
        await agent.close()
