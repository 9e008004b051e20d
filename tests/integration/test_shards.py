"""Sharded aggregators on a 3-server NATS cluster (docs/scaling.md): nats-server's
partition mapping agrees with `aggregator.shards.partition_of` and is applied after the
publish permission check; 3 replicas hold every node exactly once and find what one
process finds; a replica that dies is taken over and no finding is lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from aggregator.alerts.engine import EngineSettings
from aggregator.alerts.setup import AlertWiring
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet import Fleet
from aggregator.natsauth import Identity, Role, render_mappings_config, render_server_config
from aggregator.natskeys import new_user_seed, public_key
from aggregator.natsserver import NatsServer, NatsServerSettings
from aggregator.rules.registry import evaluate
from aggregator.service import AggregatorService, AggregatorSettings
from aggregator.shards import ShardSettings, partition_of
from proto import subjects
from proto.codec import encode
from proto.inventory import NodeSnapshot
from tests.conftest import wait_until
from tests.integration.jscluster import js_cluster
from tests.unit.rules_cases import adapter, node

pytestmark = pytest.mark.integration

PARTS = 12
NODES = tuple(f"gpu-{i:03d}" for i in range(24))
ODD = "gpu-007"  # its firmware differs from the model's majority: fw-skew
Fingerprints = set[tuple[str, str | None, str]]


def lab_snapshot(name: str) -> NodeSnapshot:
    fw = "28.39.1002" if name == ODD else "28.41.1000"
    return node(name, adapter(fw=fw), collected_at=time.time(), seq=1)


def expected_findings() -> Fingerprints:
    """What one process over every node finds (agent-stale depends on the clock)."""
    fleet = Fleet()
    for name in NODES:
        fleet.apply_snapshot(lab_snapshot(name), time.time())
    found = evaluate(fleet.view(), (), NO_CLUSTER, time.time())
    return {f.fingerprint for f in found if f.rule != "agent-stale"}


async def partitions_seen(
    nc: NatsClient, publisher: NatsClient, tokens: list[str]
) -> dict[str, int]:
    seen: dict[str, int] = {}

    async def got(msg: Msg) -> None:
        parts = msg.subject.split(".")
        seen[parts[5]] = int(parts[3])

    sub = await nc.subscribe(subjects.PARTITION_WILDCARD, cb=got)
    await nc.flush()
    for token in tokens:
        await publisher.publish(f"{subjects.PREFIX}.node.{token}.snapshot", b"x")
    await publisher.flush()
    await wait_until(lambda: len(seen) == len(tokens), timeout=5, what="mapped subjects")
    await sub.unsubscribe()
    return seen


async def test_server_mapping_matches_partition_of_and_keeps_publish_permissions(
    tmp_path: Path,
) -> None:
    agent_seed, aggregator_seed = new_user_seed(), new_user_seed()
    config = tmp_path / "auth.conf"
    config.write_text(
        render_server_config(
            (
                Identity(Role.AGENT, public_key(agent_seed), "gpu-001"),
                Identity(Role.AGGREGATOR, public_key(aggregator_seed)),
            ),
            partitions=PARTS,
        )
    )
    seeds = {}
    for who, seed in (("agent", agent_seed), ("aggregator", aggregator_seed)):
        seeds[who] = tmp_path / f"{who}.nk"
        seeds[who].write_bytes(seed)
    with NatsServer(NatsServerSettings(store_dir=tmp_path / "s", config_file=config)) as server:
        errors: list[Exception] = []

        async def on_error(exc: Exception) -> None:
            errors.append(exc)

        agg = await nats.connect(server.url, nkeys_seed=str(seeds["aggregator"]), error_cb=on_error)
        agent = await nats.connect(server.url, nkeys_seed=str(seeds["agent"]), error_cb=on_error)
        try:
            seen = await partitions_seen(agg, agent, ["gpu-001"])
            assert seen == {"gpu-001": partition_of("gpu-001", PARTS)}
            got: list[str] = []

            async def record(msg: Msg) -> None:
                got.append(msg.subject)

            await agg.subscribe(subjects.PARTITION_WILDCARD, cb=record)
            await agg.flush()
            # Another node's subject is refused, mapped or not (permissions are checked
            # on the mapped subject; the agent may publish its own partition subjects).
            await agent.publish(subjects.node_subject("gpu-002", "snapshot"), b"x")
            await agent.publish(subjects.partition_subject(0, "gpu-002", "snapshot"), b"x")
            await agent.publish(subjects.node_subject("gpu-001", "status"), b"x")
            await agent.flush()
            own = subjects.partition_subject(partition_of("gpu-001", PARTS), "gpu-001", "status")
            await wait_until(lambda: got == [own] and len(errors) >= 2, timeout=5,
                             what="own subject delivered, others refused")  # fmt: skip
            assert all("permissions violation" in str(e).lower() for e in errors)
            errors.clear()  # the aggregator never publishes node subjects, mapped or not
            await agg.publish(subjects.partition_subject(1, "gpu-001", "status"), b"x")
            await agg.flush()
            await wait_until(lambda: len(errors) == 1, timeout=5, what="aggregator refused")
            assert got == [own]
        finally:
            await agent.close()
            await agg.close()


def test_mapping_config_is_accepted_by_nats_server(tmp_path: Path) -> None:
    import subprocess

    from aggregator.natsserver import find_nats_server

    config = tmp_path / "m.conf"
    config.write_text(render_mappings_config(30))
    done = subprocess.run(
        [str(find_nats_server()), "-t", "-c", str(config)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


async def jetstream_ready(url: str) -> None:
    """The cluster's meta leader is elected a few seconds after start."""
    nc = await nats.connect(url)
    try:

        async def created() -> bool:
            try:
                await nc.jetstream().create_key_value(bucket="ready-probe", history=1)
            except (NatsError, TimeoutError):
                return False
            return True

        await wait_until(created, timeout=30, interval=0.2, what="JetStream cluster ready")
    finally:
        await nc.close()


@asynccontextmanager
async def replicas(
    urls: list[str],
) -> AsyncIterator[dict[str, tuple[AggregatorService, asyncio.Task[None]]]]:
    running: dict[str, tuple[AggregatorService, asyncio.Task[None]]] = {}
    stop = asyncio.Event()
    try:
        for i, url in enumerate(urls, start=1):
            service = AggregatorService(
                AggregatorSettings(
                    nats_url=url,
                    listen_port=0,
                    identity=f"r{i}",
                    shards=ShardSettings(partitions=PARTS, heartbeat_s=0.5, ttl_s=3.0),
                    alerts=AlertWiring(engine=EngineSettings(tick_s=0.5)),
                )
            )
            task = asyncio.create_task(service.run(stop))
            running[f"r{i}"] = (service, task)
            await asyncio.wait_for(service.ready.wait(), timeout=30)
        yield running
    finally:
        stop.set()
        for _, task in running.values():
            if not task.done():
                await asyncio.wait_for(task, timeout=30)


def alive(
    running: dict[str, tuple[AggregatorService, asyncio.Task[None]]],
) -> list[AggregatorService]:
    return [s for s, task in running.values() if not task.done()]


def held_once(services: list[AggregatorService], count: int) -> bool:
    """Every partition held by exactly one of `count` replicas that see each other."""
    shards = [s.shard for s in services if s.shard is not None]
    held = [p for shard in shards for p in shard.held]
    return (
        len(shards) == count
        and all(len(shard.live) == count for shard in shards)
        and sorted(held) == list(range(PARTS))
    )


def nodes_once(services: list[AggregatorService]) -> bool:
    names = [n for s in services for n in s.fleet.names()]
    return sorted(names) == sorted(NODES)


def findings(services: list[AggregatorService]) -> Fingerprints:
    return {
        f.fingerprint
        for s in services
        if s.alerts is not None
        for f in s.alerts.findings
        if f.rule != "agent-stale"
    }


@asynccontextmanager
async def simulated_agents(urls: list[str]) -> AsyncIterator[None]:
    """Every node's snapshot, published through the 3 servers at start and again on each
    resync request (what real agents do, agent.control)."""
    snapshots = {name: encode(lab_snapshot(name)) for name in NODES}
    agents = [await nats.connect(url) for url in urls]

    async def publish_all(msg: Msg | None = None) -> None:
        for i, name in enumerate(NODES):
            await agents[i % 3].publish(subjects.node_subject(name, subjects.SNAPSHOT),
                                        snapshots[name])  # fmt: skip

    try:
        await agents[0].subscribe(subjects.CONTROL_RESYNC, cb=publish_all)
        await publish_all()
        yield
    finally:
        for nc in agents:
            await nc.close()


@pytest.mark.slow
async def test_three_replicas_share_the_fleet_and_survive_a_crash(tmp_path: Path) -> None:
    config = tmp_path / "mappings.conf"
    config.write_text(render_mappings_config(PARTS))
    with js_cluster(tmp_path, config=config, name="shards") as servers:
        urls = [s.url for s in servers.values()]
        await jetstream_ready(urls[0])
        async with replicas(urls) as running, AsyncExitStack() as stack:
            await wait_until(lambda: held_once(alive(running), 3), timeout=20,
                             what="3 replicas hold all partitions")  # fmt: skip
            await stack.enter_async_context(simulated_agents(urls))
            await wait_until(lambda: nodes_once(alive(running)), timeout=20,
                             what="every node held by exactly one replica")  # fmt: skip
            assert all(len(s.fleet) < len(NODES) for s in alive(running))  # really shared
            expected = expected_findings()
            assert ("fw-skew", ODD, "mlx5_0") in expected
            await wait_until(lambda: findings(alive(running)) == expected, timeout=20,
                             what="sharded findings equal one process's")  # fmt: skip

            # The replica holding the odd node dies without a goodbye (heartbeat left to
            # expire, connection dropped): the survivors take its partitions over.
            victim = next(r for r, (s, _) in running.items() if ODD in s.fleet)
            running[victim][1].cancel()
            await asyncio.gather(running[victim][1], return_exceptions=True)
            survivors = alive(running)
            await wait_until(lambda: held_once(survivors, 2) and nodes_once(survivors),
                             timeout=15, what="survivors hold every node again")  # fmt: skip
            await wait_until(lambda: findings(survivors) == expected, timeout=15,
                             what="no finding lost")  # fmt: skip
            assert sum(s.shard.takeovers for s in survivors if s.shard is not None) > 0
