"""The whole aggregator answering the auth callout (`nats_callout` settings, as
`run --nats-callout-*` builds them): TokenReviews go through `KubeClient.review_token` to
kmock's emulator, whose answers carry `user.extra` authentication.kubernetes.io/node-name;
an agent joining with its token file is admitted with its node's subjects, a token of
another ServiceAccount is refused, and both show in nicfleet_nats_joins_total."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError

from aggregator.bus.authcallout import NODE_NAME_EXTRA, JoinSettings
from aggregator.bus.calloutservice import CalloutSettings
from aggregator.bus.keys import Provisioned, provision
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.kube.client import KubeSettings
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.runtime.natsconnect import NatsClientSecurity, agent_inbox_prefix, connect_options
from tests.integration.api.test_api_tokenreview import TOKENREVIEWS, ApiServer
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE = "callout-node-1"
AGENT_SA = "system:serviceaccount:nicfleet-system:nicfleet-agent"


def sa_token(sub: str) -> str:
    claims = {"aud": ["nicfleet"], "exp": int(time.time() + 600), "sub": sub}
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.c2ln"


AGENT_TOKEN = sa_token("agent")
BUILDER_TOKEN = sa_token("builder")
USERS: dict[str, dict[str, Any]] = {
    AGENT_TOKEN: {"username": AGENT_SA, "extra": {NODE_NAME_EXTRA: [NODE]}},
    BUILDER_TOKEN: {
        "username": "system:serviceaccount:ci:builder",
        "extra": {NODE_NAME_EXTRA: [NODE]},
    },
}


def answer(request: kmock.Request) -> kmock.Response:
    spec = request.data["spec"]
    user = USERS.get(spec["token"])
    status: dict[str, Any] = (
        {"authenticated": True, "user": user, "audiences": spec.get("audiences", [])}
        if user is not None
        else {"authenticated": False, "error": "invalid bearer token"}
    )
    review = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview"}
    return kmock.Response(status=201, payload={**review, "spec": spec, "status": status})


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServer]:
    emu = ApiServer()
    emu["post", TOKENREVIEWS] << answer
    for resource, kind, namespaced in (
        ("v1/nodes", "Node", False),
        ("v1/pods", "Pod", True),
        ("v1/events", "Event", True),
        ("coordination.k8s.io/v1/leases", "Lease", True),
        ("nicfleet.io/v1alpha1/nicfleetpolicies", "NicFleetPolicy", False),
        ("mellanox.com/v1alpha1/nicclusterpolicies", "NicClusterPolicy", False),
    ):
        emu.resources[resource] = kmock.ResourceInfo(kind=kind, namespaced=namespaced)
    async with emu:
        yield emu


@pytest.fixture
def keys(tmp_path: Path) -> Provisioned:
    return provision(tmp_path / "auth", (), auth_callout=True)


@pytest.fixture
def server(tmp_path: Path, keys: Provisioned) -> Iterator[NatsServer]:
    with NatsServer(NatsServerSettings(store_dir=tmp_path / "js", config_file=keys.config)) as srv:
        yield srv


async def test_aggregator_admits_agents_by_token_through_tokenreview(
    apiserver: ApiServer, server: NatsServer, keys: Provisioned, tmp_path: Path
) -> None:
    assert keys.callout_seed is not None and keys.callout_issuer_seed is not None
    callout = CalloutSettings(
        join=JoinSettings(namespace="nicfleet-system", service_account="nicfleet-agent"),
        issuer_seed_file=keys.callout_issuer_seed,
        security=NatsClientSecurity(nkey_seed_file=keys.callout_seed),
    )
    async with kmock.Server(apiserver) as api:
        service = AggregatorService(
            AggregatorSettings(
                nats_url=server.url,
                nats_security=NatsClientSecurity(nkey_seed_file=keys.aggregator_seed),
                listen_port=0,
                kube=KubeSettings(host=str(api.url)),
                identity="callout-test",
                nats_callout=callout,
            )
        )
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), timeout=30)
                token_file = tmp_path / "token"
                token_file.write_text(AGENT_TOKEN)
                options = connect_options(
                    NatsClientSecurity(token_file=token_file),
                    inbox_prefix=agent_inbox_prefix(NODE),
                )
                agent: NatsClient | None = None

                async def joined() -> bool:  # the responder may still be subscribing
                    nonlocal agent
                    nc = NatsClient()
                    try:
                        await nc.connect(
                            server.url, allow_reconnect=False, max_reconnect_attempts=0, **options
                        )
                    except (NatsError, OSError):
                        await nc.close()  # a refused client still holds its socket
                        return False
                    agent = nc
                    return True

                await wait_until(joined, timeout=20, what="the agent admitted")
                assert agent is not None
                await agent.publish(f"{subjects.PREFIX}.node.{subjects.node_token(NODE)}.x", b"")
                await agent.flush()
                await agent.close()
                refused = NatsClient()
                with pytest.raises((NatsError, OSError)):
                    await refused.connect(
                        server.url, token=BUILDER_TOKEN, allow_reconnect=False,
                        max_reconnect_attempts=0, connect_timeout=5,
                    )  # fmt: skip
                await refused.close()
                registry = service.metrics.registry
                assert (
                    registry.get_sample_value(
                        "nicfleet_nats_joins_total", {"outcome": "admitted", "reason": ""}
                    )
                    == 1
                )
                assert (
                    registry.get_sample_value(
                        "nicfleet_nats_joins_total", {"outcome": "refused", "reason": "not_agent"}
                    )
                    == 1
                )
            finally:
                stop.set()
