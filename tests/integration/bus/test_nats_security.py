"""NATS authentication, authorization and mutual TLS on a real nats-server started with the
config `nicfleet-aggregator nats-auth` writes: anonymous clients are refused, an agent
cannot speak for another node nor read its config, holds no JetStream API (no consumer
flood, no API answer aimed at another subject), cannot make the aggregator answer into
another inbox, and the whole pipeline still works.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
import trustme
from nats.aio.client import Client as NatsClient
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError

from agent.bus.desired import DesiredConfigWatcher, DesiredSettings
from agent.service import AgentService, AgentSettings
from aggregator.bus.keys import Provisioned, provision
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.permissions import ServerTls
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import decode, encode
from proto.messages.config import DesiredConfig, DesiredUpdate, DevicePluginConfig
from proto.messages.control import ResyncRequest
from proto.runtime.natsconnect import NatsClientSecurity, agent_inbox_prefix, connect_options
from proto.runtime.natsflush import flush_in_order
from tests.integration.agent.test_desired_config import feeding
from tests.integration.agent.test_pipeline import lab_node
from tests.support import builders
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

NODE_A, NODE_B = "sec-a", "sec-b"
CONFIG_STREAM = f"KV_{subjects.KV_CONFIG}"


@pytest.fixture
def keys(tmp_path: Path) -> Provisioned:
    return provision(tmp_path / "auth", (NODE_A, NODE_B), observers=("pager",))


@pytest.fixture
def server(tmp_path: Path, keys: Provisioned) -> Iterator[NatsServer]:
    settings = NatsServerSettings(store_dir=tmp_path / "js", config_file=keys.config)
    with NatsServer(settings) as srv:
        yield srv


def agent_security(keys: Provisioned, node: str, **tls: Any) -> NatsClientSecurity:
    return NatsClientSecurity(nkey_seed_file=keys.agent_seeds[node], **tls)


class Errors:
    """An error callback that keeps what the server told the client."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def callback(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    def has(self, text: str) -> bool:
        return any(text.lower() in s.lower() for s in self.seen)


@asynccontextmanager
async def client(
    url: str, security: NatsClientSecurity, *, node: str | None = None, errors: Errors | None = None
) -> AsyncIterator[NatsClient]:
    options = connect_options(
        security, inbox_prefix=agent_inbox_prefix(node) if node is not None else None
    )
    nc = await nats.connect(
        url,
        allow_reconnect=False,
        error_cb=(errors or Errors()).callback,
        connect_timeout=2,
        **options,
    )
    try:
        yield nc
    finally:
        await nc.close()


async def refused(url: str, security: NatsClientSecurity) -> str:
    """Connect once, expecting the server to refuse; return what the client reported."""
    errors = Errors()
    nc = NatsClient()
    try:
        with pytest.raises((NatsError, OSError)) as caught:
            await nc.connect(
                url,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
                error_cb=errors.callback,
                **connect_options(security),
            )
    finally:
        await nc.close()  # a refused client still holds its socket until closed
    return " | ".join([str(caught.value), *errors.seen])


@asynccontextmanager
async def aggregator(url: str, keys: Provisioned, **tls: Any) -> AsyncIterator[AggregatorService]:
    security = NatsClientSecurity(nkey_seed_file=keys.aggregator_seed, **tls)
    service = AggregatorService(
        AggregatorSettings(nats_url=url, listen_port=0, nats_security=security)
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        await asyncio.wait_for(service.ready.wait(), timeout=15)
        try:
            yield service
        finally:
            stop.set()


def accepted(service: AggregatorService, kind: str) -> float:
    return (
        service.metrics.registry.get_sample_value("nicfleet_ingest_messages_total", {"kind": kind})
        or 0.0
    )


async def test_anonymous_and_unknown_clients_are_refused(
    server: NatsServer, tmp_path: Path
) -> None:
    said = await refused(server.url, NatsClientSecurity())
    assert "authorization violation" in said.lower()
    stranger = tmp_path / "stranger.nk"
    provision(tmp_path / "other", ("sec-a",))  # a seed the server never heard of
    stranger.write_bytes((tmp_path / "other" / "agents" / "sec-a.nk").read_bytes())
    said = await refused(server.url, NatsClientSecurity(nkey_seed_file=stranger))
    assert "authorization violation" in said.lower()


async def test_agent_cannot_publish_as_another_node(server: NatsServer, keys: Provisioned) -> None:
    errors = Errors()
    async with (
        aggregator(server.url, keys) as service,
        client(server.url, agent_security(keys, NODE_A), node=NODE_A, errors=errors) as nc,
    ):
        forged = builders.snapshot(NODE_B)
        await nc.publish(subjects.node_subject(NODE_B, subjects.SNAPSHOT), encode(forged))
        await nc.publish(
            subjects.node_subject(NODE_A, subjects.SNAPSHOT), encode(builders.snapshot(NODE_A))
        )
        await nc.flush()
        # A's own message came after the forged one on the same connection: once it is in,
        # the forged one would have been too.
        await wait_until(lambda: service.fleet.get(NODE_A) is not None, what="A's snapshot")
        await wait_until(lambda: errors.has("Permissions Violation for Publish"), what="refusal")
        assert f'"nicfleet.v1.node.{NODE_B}.snapshot"' in " ".join(errors.seen)
        assert service.fleet.get(NODE_B) is None
        assert accepted(service, subjects.SNAPSHOT) == 1.0
        assert nc.is_connected  # a refused publish does not cost the agent its connection


async def test_aggregator_cannot_forge_agent_data(server: NatsServer, keys: Provisioned) -> None:
    errors = Errors()
    security = NatsClientSecurity(nkey_seed_file=keys.aggregator_seed)
    async with client(server.url, security, errors=errors) as nc:
        await nc.publish(subjects.node_subject(NODE_A, subjects.SNAPSHOT), b"x")
        await nc.flush()
        await wait_until(lambda: errors.has("Permissions Violation for Publish"), what="refusal")


async def test_observer_reads_alerts_and_nothing_else(
    server: NatsServer, keys: Provisioned
) -> None:
    errors = Errors()
    observer = NatsClientSecurity(nkey_seed_file=keys.observer_seeds["pager"])
    aggregator_id = NatsClientSecurity(nkey_seed_file=keys.aggregator_seed)
    async with (
        client(server.url, observer, errors=errors) as nc,
        client(server.url, aggregator_id) as agg,
    ):
        alerts = await nc.subscribe(subjects.ALERT_WILDCARD)
        await nc.subscribe(subjects.NODE_WILDCARD)
        await nc.publish(subjects.alert_subject("critical", "port-down", NODE_A), b"forged")
        await flush_in_order(nc)
        await agg.publish(subjects.alert_subject("warning", "port-down", NODE_A), b"real")
        await agg.flush()
        msg = await alerts.next_msg(timeout=5)
        assert msg.data == b"real"  # the observer's own publish never arrived first
        await wait_until(lambda: errors.has("violation for subscription"), what="sub refused")
        await wait_until(lambda: errors.has("violation for publish"), what="publish refused")


async def test_agent_hears_resync_requests_and_nothing_else(
    server: NatsServer, keys: Provisioned
) -> None:
    errors = Errors()
    aggregator_id = NatsClientSecurity(nkey_seed_file=keys.aggregator_seed)
    async with (
        client(server.url, agent_security(keys, NODE_A), node=NODE_A, errors=errors) as nc,
        client(server.url, aggregator_id) as agg,
    ):
        control = await nc.subscribe(subjects.CONTROL_RESYNC)
        await nc.subscribe(f"{subjects.PREFIX}.control.>")  # wider than granted
        await nc.subscribe(subjects.NODE_WILDCARD)
        await nc.publish(subjects.CONTROL_RESYNC, b"forged")  # only the aggregator may ask
        await flush_in_order(nc)
        request = ResyncRequest(reason="start", requested_at=1.0)
        await agg.publish(subjects.CONTROL_RESYNC, encode(request))
        await agg.flush()
        msg = await control.next_msg(timeout=5)
        assert decode(msg.data, ResyncRequest) == request  # the forged one never arrived
        await wait_until(
            lambda: (
                errors.has('subscription to "nicfleet.v1.control.>"')
                and errors.has(f'subscription to "{subjects.NODE_WILDCARD}"')
                and errors.has(f'publish to "{subjects.CONTROL_RESYNC}"')
            ),
            what="wider subscriptions and the agent's own request refused",
        )
        assert not errors.has(f'subscription to "{subjects.CONTROL_RESYNC}"')
        assert nc.is_connected


def desired(node: str, generation: int) -> DesiredConfig:
    return DesiredConfig(node=node, generation=generation, device_plugin=DevicePluginConfig())


def aggregator_security(keys: Provisioned) -> NatsClientSecurity:
    return NatsClientSecurity(nkey_seed_file=keys.aggregator_seed)


def refusals(errors: Errors) -> int:
    return sum("permissions violation for publish" in s.lower() for s in errors.seen)


async def only_the_barrier(sub: Subscription, barrier: bytes) -> None:
    """The subscription's next message is `barrier`, sent after the attack: nothing the
    attack caused arrived first."""
    msg = await sub.next_msg(timeout=5)
    assert msg.data == barrier, (msg.subject, msg.data[:200])


async def test_agent_reads_only_its_own_config(server: NatsServer, keys: Provisioned) -> None:
    seen: list[DesiredConfig | None] = []
    watcher = DesiredConfigWatcher(
        node=NODE_A,
        url=server.url,
        on_config=seen.append,
        settings=DesiredSettings(retry_initial=0.05, retry_max=0.2),
        security=agent_security(keys, NODE_A),
    )
    errors = Errors()
    async with (
        feeding(server.url, security=aggregator_security(keys)) as feeder,
        client(server.url, agent_security(keys, NODE_A), node=NODE_A, errors=errors) as nc,
    ):
        await feeder.put(desired(NODE_A, 1))
        await feeder.put(desired(NODE_B, 7))
        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(watcher.run(stop))
            try:
                await wait_until(lambda: seen == [desired(NODE_A, 1)], what="A's own config")
                await feeder.put(desired(NODE_A, 2))
                await feeder.delete(NODE_A)
                await wait_until(lambda: len(seen) == 3, what="update and delete")
                assert seen[1:] == [desired(NODE_A, 2), None]
            finally:
                stop.set()

        # A, as a plain client of its own credential, trying for B's config.
        b_pushes = await nc.subscribe(subjects.desired_subject(NODE_B))
        every = await nc.subscribe(subjects.DESIRED_WILDCARD)
        own = await nc.subscribe(subjects.desired_subject(NODE_A))
        await nc.publish(subjects.desired_get_subject(NODE_B), b"", reply=nc.new_inbox())
        forged = DesiredUpdate(node=NODE_B, revision=10**9, config=encode(desired(NODE_B, 99)))
        await nc.publish(subjects.desired_subject(NODE_B), encode(forged))  # only the aggregator
        with pytest.raises((TimeoutError, NatsError)):
            await (await nc.jetstream(timeout=1.0).key_value(subjects.KV_CONFIG)).get(
                subjects.node_token(NODE_B)
            )
        await flush_in_order(nc)
        await feeder.put(desired(NODE_B, 8))  # announced on B's subject
        await feeder.put(desired(NODE_A, 3))  # then on A's: the barrier
        barrier = await own.next_msg(timeout=5)
        assert decode(barrier.data, DesiredUpdate).node == NODE_A
        for sub in (b_pushes, every):
            with pytest.raises(TimeoutError):
                await sub.next_msg(timeout=0.01)  # B's announcement came before the barrier
        await wait_until(
            lambda: (
                errors.has(f'subscription to "{subjects.desired_subject(NODE_B)}"')
                and errors.has(f'subscription to "{subjects.DESIRED_WILDCARD}"')
                and errors.has(f'publish to "{subjects.desired_get_subject(NODE_B)}"')
                and errors.has(f'publish to "{subjects.desired_subject(NODE_B)}"')
                and errors.has('publish to "$JS.API.')
            ),
            what="B's subject, every node's subject, B's request and JetStream all refused",
        )
        assert feeder.count("nicfleet_desired_requests_refused_total", reason="reply") == 0
        assert nc.is_connected


async def test_agent_cannot_create_jetstream_consumers(
    server: NatsServer, keys: Provisioned
) -> None:
    errors = Errors()
    async with (
        client(server.url, aggregator_security(keys)) as admin,
        client(server.url, agent_security(keys, NODE_A), node=NODE_A, errors=errors) as nc,
    ):
        js = admin.jetstream()
        await js.create_key_value(bucket=subjects.KV_CONFIG, history=1)
        await js.create_key_value(bucket=subjects.KV_NODES, history=1)
        before = (await js.account_info()).consumers
        own_key = f"$KV.{subjects.KV_CONFIG}.{subjects.node_token(NODE_A)}"
        config = {"ack_policy": "none", "deliver_subject": nc.new_inbox(), "mem_storage": True}
        attempts: list[tuple[str, dict[str, Any]]] = [
            # The named create filtered on its own key: what agents were granted before.
            (f"$JS.API.CONSUMER.CREATE.{CONFIG_STREAM}.flood-{i}.{own_key}",
             {"name": f"flood-{i}", "filter_subject": own_key, **config})
            for i in range(FLOOD)
        ]  # fmt: skip
        attempts += [
            (f"$JS.API.CONSUMER.DURABLE.CREATE.{CONFIG_STREAM}.stay", {"durable_name": "stay"}),
            (f"$JS.API.CONSUMER.CREATE.{CONFIG_STREAM}", config),  # unnamed
            (f"$JS.API.CONSUMER.CREATE.KV_{subjects.KV_NODES}.x", {"name": "x", **config}),
            ("$JS.API.STREAM.CREATE.MINE", {"name": "MINE", "subjects": ["mine.>"]}),
        ]
        for subject, body in attempts:
            stream = subject.split(".")[4]
            payload = {"stream_name": stream, "config": {"deliver_policy": "all", **body}}
            await nc.publish(subject, json.dumps(payload).encode(), reply=nc.new_inbox())
        await flush_in_order(nc)
        await wait_until(lambda: refusals(errors) >= len(attempts), what="every create refused")
        assert refusals(errors) == len(attempts)
        info = await js.account_info()
        assert info.consumers == before
        assert info.streams == 2
        assert nc.is_connected


FLOOD = 200


async def test_agent_cannot_aim_jetstream_answers_at_other_subjects(
    server: NatsServer, keys: Provisioned
) -> None:
    errors = Errors()
    observer = NatsClientSecurity(nkey_seed_file=keys.observer_seeds["pager"])
    alert = subjects.alert_subject("critical", "port-down", NODE_B)
    b_snapshot = subjects.node_subject(NODE_B, subjects.SNAPSHOT)
    async with (
        client(server.url, aggregator_security(keys)) as admin,
        client(server.url, observer) as pager,
        client(server.url, agent_security(keys, NODE_B), node=NODE_B) as agent_b,
        client(server.url, agent_security(keys, NODE_A), node=NODE_A, errors=errors) as nc,
    ):
        await admin.jetstream().create_key_value(bucket=subjects.KV_CONFIG, history=1)
        targets = {
            b_snapshot: await admin.subscribe(b_snapshot),
            alert: await pager.subscribe(alert),
            subjects.CONTROL_RESYNC: await agent_b.subscribe(subjects.CONTROL_RESYNC),
        }
        for conn in (admin, pager, agent_b):
            await flush_in_order(conn)
        api = ("$JS.API.INFO", f"$JS.API.STREAM.INFO.{CONFIG_STREAM}", "$JS.API.STREAM.NAMES")
        for target in targets:
            for subject in api:
                await nc.publish(subject, b"", reply=target)
        await flush_in_order(nc)
        await wait_until(lambda: refusals(errors) >= len(targets) * len(api), what="refusals")
        await agent_b.publish(b_snapshot, b"barrier")
        await admin.publish(alert, b"barrier")
        await admin.publish(subjects.CONTROL_RESYNC, b"barrier")
        for sub in targets.values():
            await only_the_barrier(sub, b"barrier")
        assert nc.is_connected


async def test_aggregator_answers_desired_requests_only_into_the_askers_inbox(
    server: NatsServer, keys: Provisioned
) -> None:
    observer = NatsClientSecurity(nkey_seed_file=keys.observer_seeds["pager"])
    alert = subjects.alert_subject("critical", "port-down", NODE_A)
    b_inbox = f"{agent_inbox_prefix(NODE_B)}.stolen.1"
    async with (
        aggregator(server.url, keys) as service,
        client(server.url, aggregator_security(keys)) as admin,
        client(server.url, observer) as pager,
        client(server.url, agent_security(keys, NODE_B), node=NODE_B) as agent_b,
        client(server.url, agent_security(keys, NODE_A), node=NODE_A) as nc,
    ):
        kv = await admin.jetstream().key_value(subjects.KV_CONFIG)  # the service made it
        await kv.put(subjects.node_token(NODE_A), encode(desired(NODE_A, 1)))
        targets = {
            b_inbox: await agent_b.subscribe(b_inbox),
            alert: await pager.subscribe(alert),
            subjects.CONTROL_RESYNC: await agent_b.subscribe(subjects.CONTROL_RESYNC),
        }
        for conn in (pager, agent_b):
            await flush_in_order(conn)
        for target in targets:  # the server lets these through: A may ask for its own
            await nc.publish(subjects.desired_get_subject(NODE_A), b"", reply=target)
        honest = await nc.request(subjects.desired_get_subject(NODE_A), b"", timeout=5)
        update = decode(honest.data, DesiredUpdate)
        assert update.node == NODE_A and update.config is not None
        assert decode(update.config, DesiredConfig) == desired(NODE_A, 1)

        def refused() -> float:
            sample = service.metrics.registry.get_sample_value(
                "nicfleet_desired_requests_refused_total", {"reason": "reply"}
            )
            return sample or 0.0

        await wait_until(lambda: refused() == len(targets), what="forged replies refused")
        await admin.publish(b_inbox, b"barrier")
        await admin.publish(alert, b"barrier")
        await admin.publish(subjects.CONTROL_RESYNC, b"barrier")
        for sub in targets.values():
            await only_the_barrier(sub, b"barrier")
        assert refused() == len(targets)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA for the server and agents, and a second CA nobody trusts."""
    root = tmp_path_factory.mktemp("pki")
    ca, rogue = trustme.CA(), trustme.CA()
    files: dict[str, Path] = {}
    for name, blob in (("ca", ca.cert_pem), ("rogue-ca", rogue.cert_pem)):
        files[name] = root / f"{name}.pem"
        blob.write_to_path(str(files[name]))
    for name, issuer, identity in (
        ("server", ca, "127.0.0.1"),
        ("agent", ca, NODE_A),
        ("aggregator", ca, "nicfleet-aggregator"),
        ("rogue", rogue, NODE_A),
    ):
        leaf = issuer.issue_cert(identity)
        files[f"{name}-cert"] = root / f"{name}-cert.pem"
        files[f"{name}-key"] = root / f"{name}-key.pem"
        leaf.cert_chain_pems[0].write_to_path(str(files[f"{name}-cert"]))
        leaf.private_key_pem.write_to_path(str(files[f"{name}-key"]))
    return files


@pytest.fixture
def tls_server(tmp_path: Path, pki: dict[str, Path]) -> Iterator[tuple[NatsServer, Provisioned]]:
    tls = ServerTls(cert_file=pki["server-cert"], key_file=pki["server-key"], ca_file=pki["ca"])
    keys = provision(tmp_path / "auth", (NODE_A, NODE_B), tls=tls)
    settings = NatsServerSettings(store_dir=tmp_path / "js", config_file=keys.config)
    with NatsServer(settings) as srv:
        yield srv, keys


def assert_tls_refusal(error: str, reason: str) -> None:
    """In TLS 1.3 the server judges the client certificate after the client's handshake
    finished, so its alert ("certificate required", "unknown ca") races the client's first
    write: on a busy machine the client sees the closed socket instead. Either way the
    connection was refused (`refused` asserts it never connected)."""
    text = error.lower()
    assert reason in text or "broken pipe" in text or "connection reset" in text, error


def client_tls(pki: dict[str, Path], who: str) -> dict[str, Any]:
    return {"tls_ca": pki["ca"], "tls_cert": pki[f"{who}-cert"], "tls_key": pki[f"{who}-key"]}


async def test_mutual_tls_refuses_clients_without_a_trusted_certificate(
    tls_server: tuple[NatsServer, Provisioned], pki: dict[str, Path]
) -> None:
    server, keys = tls_server
    seed = keys.agent_seeds[NODE_A]
    no_cert = NatsClientSecurity(nkey_seed_file=seed, tls_ca=pki["ca"])
    assert_tls_refusal(await refused(server.url, no_cert), "certificate required")
    other_ca = NatsClientSecurity(nkey_seed_file=seed, **client_tls(pki, "rogue"))
    assert_tls_refusal(await refused(server.url, other_ca), "unknown ca")
    good = NatsClientSecurity(nkey_seed_file=seed, **client_tls(pki, "agent"))
    async with client(server.url, good, node=NODE_A) as nc:
        assert nc.is_connected


@pytest.mark.parametrize("mtls", [False, True], ids=["nkeys", "nkeys+mtls"])
async def test_pipeline_under_auth(
    mtls: bool, tmp_path: Path, pki: dict[str, Path], keys: Provisioned
) -> None:
    tls = ServerTls(cert_file=pki["server-cert"], key_file=pki["server-key"], ca_file=pki["ca"])
    if mtls:
        keys = provision(keys.config.parent, (), tls=tls)  # the same seeds, now with TLS
    agent_tls = client_tls(pki, "agent") if mtls else {}
    aggregator_tls = client_tls(pki, "aggregator") if mtls else {}
    root = lab_node(tmp_path, "roce-cx6dx", NODE_A)
    settings = NatsServerSettings(store_dir=tmp_path / "js", config_file=keys.config)
    with NatsServer(settings) as server:
        async with aggregator(server.url, keys, **aggregator_tls) as service:
            agent = AgentService(
                AgentSettings(
                    node_name=NODE_A,
                    sysfs_root=root,
                    nats_url=server.url,
                    counter_interval=0.2,
                    netlink=False,
                    nats_security=agent_security(keys, NODE_A, **agent_tls),
                )
            )
            stop = asyncio.Event()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(agent.run(stop))
                try:
                    await wait_until(
                        lambda: (
                            accepted(service, subjects.COUNTERS) >= 2
                            and accepted(service, subjects.SNAPSHOT) >= 1
                        ),
                        what="snapshot and counters through an authenticated server",
                    )
                finally:
                    stop.set()
            record = service.fleet.get(NODE_A)
            assert record is not None and record.snapshot is not None
