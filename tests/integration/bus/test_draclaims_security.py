"""DRA claim requests on a real nats-server with nicfleet's permissions: an agent may ask
only on its own subject, is told nothing of another node's claim, and cannot make the
aggregator answer into another inbox or onto another subject."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from nats.errors import Error as NatsError
from prometheus_client import CollectorRegistry

from agent.lab.kubeletdra import claim_object
from aggregator.bus.claimanswer import ClaimFeed
from aggregator.bus.keys import Provisioned, provision
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.dra.claims import ClaimIndex
from proto import subjects
from proto.codec import decode, encode
from proto.messages.draclaims import ClaimStatus, DraClaimAnswer, DraClaimRequest
from proto.runtime.natsconnect import NatsClientSecurity, agent_inbox_prefix
from proto.runtime.natsflush import flush_in_order
from tests.integration.bus.test_nats_security import (
    NODE_A,
    NODE_B,
    Errors,
    agent_security,
    aggregator_security,
    client,
    only_the_barrier,
)
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

DRIVER = "rdma.nicfleet.io"
UID_A = "0b5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"
UID_B = "1c5e7f1c-2a3d-4e5f-8a9b-0c1d2e3f4a5b"


@pytest.fixture
def keys(tmp_path: Path) -> Provisioned:
    return provision(tmp_path / "auth", (NODE_A, NODE_B), observers=("pager",))


@pytest.fixture
def server(tmp_path: Path, keys: Provisioned) -> Iterator[NatsServer]:
    settings = NatsServerSettings(store_dir=tmp_path / "js", config_file=keys.config)
    with NatsServer(settings) as srv:
        yield srv


def request(uid: str, name: str) -> bytes:
    return encode(DraClaimRequest(namespace="ml", name=name, uid=uid))


@asynccontextmanager
async def answering(url: str, keys: Provisioned) -> AsyncIterator[CollectorRegistry]:
    """A ClaimFeed with the aggregator's credential, over an index holding A's and B's claim."""
    index = ClaimIndex()
    index.replace(
        [
            claim_object(("ml", UID_A, "nic-a"), [("nic", DRIVER, NODE_A, "mlx5-0")]),
            claim_object(("ml", UID_B, "nic-b"), [("nic", DRIVER, NODE_B, "mlx5-0")]),
        ]
    )
    registry = CollectorRegistry()
    async with client(url, aggregator_security(keys)) as nc:
        feed = ClaimFeed(nc, index, registry=registry)
        await feed.open()
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(feed.run(stop))
            try:
                yield registry
            finally:
                stop.set()
        await feed.close()


def refused(registry: CollectorRegistry, reason: str) -> float:
    value = registry.get_sample_value(
        "nicfleet_draclaims_requests_refused_total", {"reason": reason}
    )
    return value or 0.0


async def test_agent_is_told_only_its_own_claims(server: NatsServer, keys: Provisioned) -> None:
    errors = Errors()
    async with (
        answering(server.url, keys),
        client(server.url, agent_security(keys, NODE_A), node=NODE_A, errors=errors) as nc,
    ):
        own = subjects.draclaims_get_subject(NODE_A)
        mine = decode((await nc.request(own, request(UID_A, "nic-a"), timeout=5)).data,
                      DraClaimAnswer)  # fmt: skip
        assert mine.status is ClaimStatus.ALLOCATED
        assert [(r.pool, r.device) for r in mine.results] == [(NODE_A, "mlx5-0")]
        # B's claim asked for on A's own subject: refused, no device named.
        theirs = decode((await nc.request(own, request(UID_B, "nic-b"), timeout=5)).data,
                        DraClaimAnswer)  # fmt: skip
        assert theirs.status is ClaimStatus.OTHER_NODE and theirs.results == ()
        # Asking as B: the server refuses the publish, and nobody answers.
        with pytest.raises((NatsError, TimeoutError)):  # no responders, or a timeout
            await nc.request(subjects.draclaims_get_subject(NODE_B), request(UID_B, "nic-b"),
                             timeout=1)  # fmt: skip
        await wait_until(
            lambda: errors.has(f'publish to "{subjects.draclaims_get_subject(NODE_B)}"'),
            what="B's subject refused to A",
        )
        assert nc.is_connected


async def test_forged_reply_subjects_are_refused(server: NatsServer, keys: Provisioned) -> None:
    observer = NatsClientSecurity(nkey_seed_file=keys.observer_seeds["pager"])
    alert = subjects.alert_subject("critical", "port-down", NODE_A)
    b_inbox = f"{agent_inbox_prefix(NODE_B)}.stolen.1"
    async with (
        answering(server.url, keys) as registry,
        client(server.url, aggregator_security(keys)) as admin,
        client(server.url, observer) as pager,
        client(server.url, agent_security(keys, NODE_B), node=NODE_B) as agent_b,
        client(server.url, agent_security(keys, NODE_A), node=NODE_A) as nc,
    ):
        targets = {
            b_inbox: await agent_b.subscribe(b_inbox),
            alert: await pager.subscribe(alert),
            subjects.CONTROL_RESYNC: await agent_b.subscribe(subjects.CONTROL_RESYNC),
        }
        for conn in (pager, agent_b):
            await flush_in_order(conn)
        own = subjects.draclaims_get_subject(NODE_A)
        for target in targets:  # the server lets these through: A may ask on its own subject
            await nc.publish(own, request(UID_B, "nic-b"), reply=target)
        await nc.publish(own, b"\x00garbage", reply=nc.new_inbox())
        await flush_in_order(nc)
        await wait_until(lambda: refused(registry, "reply") == len(targets), what="replies refused")
        await wait_until(lambda: refused(registry, "request") == 1, what="garbage refused")
        await admin.publish(b_inbox, b"barrier")
        await admin.publish(alert, b"barrier")
        await admin.publish(subjects.CONTROL_RESYNC, b"barrier")
        for sub in targets.values():
            await only_the_barrier(sub, b"barrier")
