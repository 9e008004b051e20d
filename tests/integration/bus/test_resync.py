"""Nothing is lost when the aggregator misses messages: after its start and after nats-server
cut it off as a slow consumer it asks the agents to resync, and a change published while
it was away reaches the fleet, the API and the alerts — long before the agent's periodic
snapshot (an hour here), on a real nats-server.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from nats.js.errors import KeyNotFoundError

from agent.bus.republishpacing import RepublishPolicy
from agent.lab.faults import port_down
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.resyncrequest import ResyncRequestSettings
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import encode
from proto.messages.control import ResyncRequest
from tests.integration.agent.test_pipeline import lab_node
from tests.integration.alerts.test_alerts import subscriber
from tests.integration.faults.test_faults_slow_consumer import SERVER_CONF, monitor, named
from tests.support.faults import AggregatorProcess, free_port
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

# Answers come fast and are not rate limited here, so each test sees every request.
FAST = RepublishPolicy(jitter_s=0.2, min_interval_s=0.0)


@asynccontextmanager
async def agent(
    url: str, root: Path, node: str, policy: RepublishPolicy = FAST
) -> AsyncIterator[AgentService]:
    """An agent that would not publish a periodic snapshot nor a full counter batch for an
    hour: whatever the aggregator learns after a miss comes from a republish."""
    service = AgentService(
        AgentSettings(
            node_name=node,
            sysfs_root=root,
            nats_url=url,
            counter_interval=0.2,
            counter_full_every=100_000,
            inventory_interval=3600.0,
            netlink=False,
            republish=policy,
        )
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            yield service
        finally:
            stop.set()


@asynccontextmanager
async def aggregator(url: str) -> AsyncIterator[AggregatorService]:
    service = AggregatorService(
        AggregatorSettings(nats_url=url, listen_port=0, resync=ResyncRequestSettings(min_gap_s=0.2))
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        await asyncio.wait_for(service.ready.wait(), timeout=15)
        try:
            yield service
        finally:
            stop.set()


def port_state(service: AggregatorService, node: str) -> str | None:
    record = service.fleet.get(node)
    if record is None or record.snapshot is None:
        return None
    return record.snapshot.devices[0].ports[0].state


def published(service: AgentService, kind: str) -> int:
    return service.publish_stats.published.get(kind, 0)


async def test_change_while_the_aggregator_was_down_arrives_at_its_start(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "resync-restart-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    alert = f"nicfleet.v1.alert.critical.port-down.{subjects.node_token(node)}"
    async with (
        subscriber(own_nats.url, alert) as (nc, (inbox,)),
        agent(own_nats.url, root, node) as running,
    ):
        async with aggregator(own_nats.url) as first:
            await wait_until(lambda: port_state(first, node) == "ACTIVE", what="node in fleet")
            kv = await nc.jetstream().key_value(subjects.KV_NODES)

            async def stored() -> bool:
                try:  # the store's writes are coalesced: the key may not be there yet
                    return bool(await kv.get(subjects.node_token(node)))
                except KeyNotFoundError:
                    return False

            await wait_until(stored, what="snapshot in KV")
            control = running.control
            await wait_until(
                lambda: control.stats.requests == 1 and not control.pending,
                what="the first aggregator's request answered",
            )
        snapshots = published(running, subjects.SNAPSHOT)
        answered = running.control.stats.answered
        port_down(root, "mlx5_0", 1)
        # The agent saw it and published event and snapshot — to nobody.
        await wait_until(
            lambda: published(running, subjects.SNAPSHOT) == snapshots + 1, what="DOWN sent"
        )
        async with aggregator(own_nats.url) as second:
            await wait_until(lambda: port_state(second, node) == "DOWN", what="DOWN after resync")
            await wait_until(lambda: bool(inbox.about(node, "mlx5_0/1")), what="port-down alert")
            assert [a.state for a in inbox.about(node, "mlx5_0/1")] == ["firing"]
            # Deltas alone cannot be merged by a new process: this is the republish's full batch.
            await wait_until(
                lambda: (
                    (record := second.fleet.get(node)) is not None and record.counters is not None
                ),
                what="a full counter batch",
            )
            assert second.resync is not None and second.resync.sent == {"start": 1}
            assert running.control.stats.answered == answered + 1
        assert running.publish_stats.reconnects == 0  # the agent never lost NATS


async def test_many_requests_cause_one_answer_per_agent(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    node = "resync-dedup-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    policy = RepublishPolicy(jitter_s=2.0, min_interval_s=600.0)
    nc = await nats.connect(nats_server.url)
    try:
        async with agent(nats_server.url, root, node, policy) as running:
            await wait_until(lambda: published(running, subjects.SNAPSHOT) == 1, what="start")
            request = encode(ResyncRequest(reason="reconnect", requested_at=0.0))
            for _ in range(50):
                await nc.publish(subjects.CONTROL_RESYNC, request)
            await nc.publish(subjects.CONTROL_RESYNC, b"not a request")
            await nc.flush()
            stats = running.control.stats
            await wait_until(lambda: stats.requests == 50 and stats.rejected == 1, what="heard")
            await wait_until(lambda: stats.answered == 1, what="one answer")
            await wait_until(lambda: published(running, subjects.SNAPSHOT) == 2, what="resync")
            # Requests after the answer (a slow machine) wait for the rate limit instead.
            assert stats.coalesced + running.control.pending == 49
    finally:
        await nc.close()


@pytest.fixture
def slow_nats(tmp_path: Path) -> Iterator[tuple[NatsServer, str]]:
    """nats-server that cuts a client after 1 MiB pending / a write stalled for 1 s."""
    conf = tmp_path / "slow.conf"
    conf.write_text(SERVER_CONF)
    port = free_port()
    settings = NatsServerSettings(
        store_dir=tmp_path / "nats-store", extra_args=("-c", str(conf), "-m", str(port))
    )
    with NatsServer(settings) as server:
        yield server, f"http://127.0.0.1:{port}"


async def api_port_state(api: httpx.AsyncClient, node: str) -> str | None:
    try:
        response = await api.get(f"/api/v1/nodes/{node}")
    except (httpx.RemoteProtocolError, httpx.ReadError):  # a kept-alive connection reset
        return None
    if response.status_code != 200:
        return None
    snapshot: dict[str, Any] | None = response.json()["snapshot"]
    return None if snapshot is None else str(snapshot["devices"][0]["ports"][0]["state"])


async def test_aggregator_cut_as_slow_consumer_asks_for_resync(
    slow_nats: tuple[NatsServer, str], tmp_path: Path
) -> None:
    server, monitoring = slow_nats
    node = "resync-cut-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    process = AggregatorProcess(server.url, tmp_path, "aggregator")
    nc = await nats.connect(server.url)
    try:
        process.start()
        async with agent(server.url, root, node) as running, httpx.AsyncClient() as mon:
            mon.base_url = httpx.URL(monitoring)
            await wait_until(process.is_ready, timeout=30, what="aggregator ready")
            async with httpx.AsyncClient(base_url=process.api_url) as api:

                async def state_is(wanted: str) -> bool:
                    return await api_port_state(api, node) == wanted

                await wait_until(lambda: state_is("ACTIVE"), what="node in the API")
                await wait_until(lambda: not running.control.pending, what="start answered")
                answered = running.control.stats.answered
                before = named(await monitor(mon, "/connz"), "nicfleet-aggregator")
                assert process.proc is not None
                process.proc.send_signal(signal.SIGSTOP)  # its event loop is "busy"
                try:
                    junk = b"x" * 60_000
                    for _ in range(400):  # 24 MB it cannot read: more than any socket buffer
                        await nc.publish("nicfleet.v1.node.flood.counters", junk)
                    await nc.flush()

                    async def cut() -> bool:
                        connz = await monitor(mon, "/connz")
                        return not named(connz, "nicfleet-aggregator") & before

                    await wait_until(cut, timeout=20, what="aggregator cut off")
                    snapshots = published(running, subjects.SNAPSHOT)
                    port_down(root, "mlx5_0", 1)  # while nobody listens
                    await wait_until(
                        lambda: published(running, subjects.SNAPSHOT) == snapshots + 1,
                        what="DOWN published to nobody",
                    )
                finally:
                    process.proc.send_signal(signal.SIGCONT)
                await wait_until(lambda: state_is("DOWN"), timeout=20, what="DOWN after resync")
            closed = await monitor(mon, "/connz?state=closed")
            reasons = [c.get("reason", "") for c in closed.get("connections") or ()
                       if c.get("name") == "nicfleet-aggregator"]  # fmt: skip
            assert any(r.startswith("Slow Consumer") for r in reasons), reasons
            assert running.control.stats.answered == answered + 1
            assert running.publish_stats.reconnects == 0
            assert process.proc.poll() is None  # still running
    finally:
        process.stop()
        await nc.close()
