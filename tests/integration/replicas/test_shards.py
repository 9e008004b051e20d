"""Sharded aggregators on a 3-server NATS cluster (docs/scaling.md): nats-server's
partition mapping agrees with `aggregator.replicas.partitions.partition_of` and is applied after the
publish permission check; 3 replicas hold every node exactly once and find what one
process finds; a replica that dies is taken over: no finding is lost, its nodes' alerts
stay firing exactly once, and the leader's desired config still reaches its nodes."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import msgspec
import nats
import pytest
import yaml
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError

from aggregator.api.shards import SERVED_BY
from aggregator.bus.keys import new_user_seed, public_key
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.permissions import Identity, Role, render_mappings_config, render_server_config
from aggregator.cluster import NO_CLUSTER
from aggregator.fleet.state import Fleet
from aggregator.replicas.partitions import partition_of
from aggregator.rules.engine.registry import evaluate
from proto import subjects
from proto.codec import decode, encode
from proto.inventory import NodeSnapshot
from proto.messages.alerts import Alert
from proto.messages.config import DesiredConfig
from proto.messages.control import ResyncRequest
from proto.policy import Policy, load_policies
from proto.runtime.natsflush import flush_in_order
from tests.support.faults import AggregatorProcess
from tests.support.jscluster import js_cluster
from tests.support.rules_cases import adapter, node
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration

PARTS = 12
NODES = tuple(f"gpu-{i:03d}" for i in range(24))
ODD = "gpu-007"  # its firmware differs from the model's majority: fw-skew
Fingerprints = set[tuple[str, str | None, str]]


def lab_snapshot(name: str) -> NodeSnapshot:
    fw = "28.39.1002" if name == ODD else "28.41.1000"
    return node(name, adapter(fw=fw), collected_at=time.time(), seq=1)


def policy_doc(hca_max: int) -> dict[str, object]:
    """Desired config for every node, no expectations (no findings of its own)."""
    return {
        "apiVersion": "nicfleet.io/v1alpha1", "kind": "NicFleetPolicy",
        "metadata": {"name": "shared"},
        "spec": {"rdmaSharedDevicePlugin": {"configList": [
            {"resourceName": "roce", "rdmaHcaMax": hca_max,
             "selectors": {"linkTypes": ["ether"]}}]}},
    }  # fmt: skip


def write_policy(path: Path, hca_max: int) -> tuple[Policy, ...]:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump(policy_doc(hca_max)))
    tmp.replace(path)
    return load_policies(path.read_text(), source=str(path))


def expected_findings(policies: tuple[Policy, ...] = ()) -> Fingerprints:
    """What one process over every node finds (agent-stale depends on the clock)."""
    fleet = Fleet()
    for name in NODES:
        fleet.apply_snapshot(lab_snapshot(name), time.time())
    found = evaluate(fleet.view(), policies, NO_CLUSTER, time.time())
    return {f.fingerprint for f in found if f.rule != "agent-stale"}


async def partitions_seen(
    nc: NatsClient, publisher: NatsClient, tokens: list[str]
) -> dict[str, int]:
    seen: dict[str, int] = {}

    async def got(msg: Msg) -> None:
        parts = msg.subject.split(".")
        seen[parts[5]] = int(parts[3])

    sub = await nc.subscribe(subjects.PARTITION_WILDCARD, cb=got)
    await flush_in_order(nc)
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
            await flush_in_order(agg)
            # Another node's subject is refused, mapped or not (permissions are checked
            # on the mapped subject; the agent may publish its own partition subjects).
            await agent.publish(subjects.node_subject("gpu-002", "snapshot"), b"x")
            await agent.publish(subjects.partition_subject(0, "gpu-002", "snapshot"), b"x")
            await agent.publish(subjects.node_subject("gpu-001", "status"), b"x")
            await agent.flush()
            own = subjects.partition_subject(partition_of("gpu-001", PARTS), "gpu-001", "status")
            await wait_until(lambda: got == [own] and len(errors) >= 2, timeout=60,
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

    from aggregator.bus.natsserver import find_nats_server

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


class ShardReplica(AggregatorProcess):
    """`nicfleet-aggregator run --partitions` as a child process; `kill()` is SIGKILL."""

    def __init__(
        self,
        nats_url: str,
        work: Path,
        name: str,
        partitions: int = PARTS,
        policy: Path | None = None,
    ) -> None:
        super().__init__(nats_url, work, name)
        self.name = name
        self._args += ["--partitions", str(partitions), "--identity", name]
        if policy is not None:
            self._args += ["--policy", str(policy)]

    async def firing(self) -> list[dict[str, Any]] | None:
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                reply = await client.get(f"{self.api_url}/api/v1/alerts?status=firing")
        except httpx.HTTPError:
            return None
        return list(reply.json()["items"]) if reply.status_code == 200 else None

    async def view(self) -> dict[str, Any] | None:
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                reply = await client.get(f"{self.api_url}/api/v1/shards")
        except httpx.HTTPError:
            return None
        return dict(reply.json()) if reply.status_code == 200 else None


@contextmanager
def replica_processes(
    urls: list[str], work: Path, partitions: int = PARTS, policy: Path | None = None
) -> Iterator[list[ShardReplica]]:
    started = [
        ShardReplica(url, work, f"r{i}", partitions, policy) for i, url in enumerate(urls, 1)
    ]
    for replica in started:
        replica.start()
    try:
        yield started
    finally:
        for replica in started:
            replica.stop()


@asynccontextmanager
async def simulated_agents(urls: list[str], requests: list[ResyncRequest]) -> AsyncIterator[None]:
    """Every node's snapshot, published through the 3 servers at start and again on each
    resync request that names its partition, or every partition (what real agents do,
    agent.bus.republish); the requests are recorded. Like a real agent, each answer is a
    fresh collection: the next seq, stamped now (a replayed stamp reads as a clock behind)."""
    snapshots = {name: lab_snapshot(name) for name in NODES}
    agents = [await nats.connect(url) for url in urls]

    async def publish(names: list[str]) -> None:
        for i, name in enumerate(names):
            old = snapshots[name]
            snapshots[name] = fresh = msgspec.structs.replace(
                old, seq=old.seq + 1, collected_at=time.time()
            )
            await agents[i % 3].publish(subjects.node_subject(name, subjects.SNAPSHOT),
                                        encode(fresh))  # fmt: skip

    async def answer(msg: Msg) -> None:
        request = decode(msg.data, ResyncRequest)
        requests.append(request)
        count, wanted = request.partition_count, set(request.partitions)
        await publish([n for n in NODES if not count or partition_of(n, count) in wanted])

    try:
        await agents[0].subscribe(subjects.CONTROL_RESYNC, cb=answer)
        await publish(list(NODES))
        yield
    finally:
        for nc in agents:
            await nc.close()


class Fleetwide:
    """The replicas' `/api/v1/shards` views, refreshed by `poll` (a wait_until predicate)."""

    def __init__(self, replicas: list[ShardReplica]) -> None:
        self.replicas = replicas
        self.views: list[dict[str, Any]] = []

    async def poll(self) -> bool:
        views = [await r.view() for r in self.replicas]
        self.views = [v for v in views if v is not None]
        return len(self.views) == len(self.replicas)

    def held_once(self) -> bool:
        """Every partition held by exactly one replica, all seeing the same live set."""
        held = sorted(p for v in self.views for p in v["held"])
        live = {tuple(v["live"]) for v in self.views}
        return held == list(range(PARTS)) and live == {tuple(r.name for r in self.replicas)}

    def nodes_once(self) -> bool:
        return sorted(n for v in self.views for n in v["node_names"]) == sorted(NODES)

    def findings(self) -> Fingerprints:
        return {
            (f["rule"], f["node"], f["subject"])
            for v in self.views
            for f in v["findings"]
            if f["rule"] != "agent-stale"
        }


class AlertLog:
    """Every alert transition published on NATS (`nicfleet.v1.alert.>`), by fingerprint."""

    def __init__(self) -> None:
        self.firings: Counter[tuple[str, str, str]] = Counter()
        self.resolved: Counter[tuple[str, str, str]] = Counter()

    async def got(self, msg: Msg) -> None:
        alert = decode(msg.data, Alert)
        key = (alert.rule, alert.node, alert.subject)
        (self.firings if alert.state == "firing" else self.resolved)[key] += 1


async def answers_for_every_node(asked: ShardReplica, fleet: Fleetwide) -> None:
    """One replica answers for every node: its own, and the others' forwarded to their
    holder (named in `X-Nicfleet-Served-By`); an unknown node is still a 404."""
    holders = {n: v["replica"] for v in fleet.views for n in v["node_names"]}

    async def knows_every_api() -> bool:  # the URLs come with the next heartbeats
        view = await asked.view()
        return view is not None and len(view["api_urls"]) == len(fleet.views)

    await wait_until(knows_every_api, timeout=10, interval=0.2, what="replicas' API URLs")
    async with httpx.AsyncClient(timeout=10, base_url=asked.api_url) as client:
        for name in NODES:
            reply = await client.get(f"/api/v1/nodes/{name}")
            assert reply.status_code == 200, (name, reply.text)
            assert reply.json()["summary"]["name"] == name
            assert reply.headers[SERVED_BY] == holders[name], name
        assert (await client.get("/api/v1/nodes/gpu-999")).status_code == 404
        assert (await client.get("/api/v1/nodes/Bad_Name")).status_code == 400


async def firing_everywhere(replicas: list[ShardReplica]) -> Counter[tuple[str, str, str]] | None:
    """(rule, node, subject) -> on how many replicas it is firing (None: one did not answer)."""
    seen: Counter[tuple[str, str, str]] = Counter()
    for replica in replicas:
        items = await replica.firing()
        if items is None:
            return None
        seen.update((a["rule"], a["node"], a["subject"]) for a in items)
    return seen


async def desired_hca_max(nc: NatsClient, node: str) -> int | None:
    kv = await nc.jetstream().key_value(subjects.KV_CONFIG)
    try:
        entry = await kv.get(subjects.node_token(node))
    except (NatsError, TimeoutError):
        return None
    if entry.value is None:
        return None
    config = decode(entry.value, DesiredConfig)
    return config.device_plugin.config_list[0].rdma_hca_max


@pytest.mark.slow
async def test_three_replicas_share_the_fleet_and_survive_a_sigkill(tmp_path: Path) -> None:
    config = tmp_path / "mappings.conf"
    config.write_text(render_mappings_config(PARTS))
    policy = tmp_path / "policy.yaml"
    expected = expected_findings(write_policy(policy, 4))
    assert ("fw-skew", ODD, "mlx5_0") in expected
    with js_cluster(tmp_path, config=config, name="shards") as servers:
        urls = [s.url for s in servers.values()]
        await jetstream_ready(urls[0])  # else a replica's first KV call may fail: it exits
        watcher = await nats.connect(urls[0])
        alerts = AlertLog()
        await watcher.subscribe(subjects.ALERT_WILDCARD, cb=alerts.got)
        try:
            with replica_processes(urls, tmp_path, policy=policy) as replicas:
                victim_nodes = await run_and_kill(urls, replicas, expected, alerts)
                survivors = [r for r in replicas if r.proc and r.proc.poll() is None]
                await check_writes_after_kill(watcher, survivors, victim_nodes, alerts, policy)
                await check_leader_kill(watcher, survivors, alerts, policy)
        finally:
            await watcher.close()


async def check_writes_after_kill(
    nc: NatsClient,
    survivors: list[ShardReplica],
    victim_nodes: list[str],
    alerts: AlertLog,
    policy: Path,
) -> None:
    """The killed replica's alerts are firing once (on one survivor, never re-sent) and a
    policy change still reaches its nodes' desired config (written by the leader)."""
    odd = ("fw-skew", ODD, "mlx5_0")

    async def alerts_kept() -> bool:
        seen = await firing_everywhere(survivors)
        return seen is not None and seen[odd] == 1 and max(seen.values()) == 1

    await wait_until(alerts_kept, timeout=30, interval=0.5,
                     what="the killed replica's alerts firing on exactly one survivor")  # fmt: skip
    stable = {k for k in alerts.firings if k[1] in victim_nodes and k[0] != "agent-stale"}
    assert odd in stable
    assert all(alerts.firings[k] == 1 for k in stable), alerts.firings
    assert not any(alerts.resolved[k] for k in stable), alerts.resolved
    seen = await firing_everywhere(survivors)
    assert seen is not None and all(seen[k] == 1 for k in stable), seen

    write_policy(policy, 8)
    node = victim_nodes[0]

    async def reached() -> bool:
        return await desired_hca_max(nc, node) == 8

    await wait_until(reached, timeout=45, interval=0.5,
                     what=f"new desired config for {node} of the killed shard")  # fmt: skip


async def leads(replica: ShardReplica) -> bool:
    async with httpx.AsyncClient(timeout=5) as client:
        reply = await client.get(f"{replica.api_url}/api/v1/policy")
    return reply.status_code == 200 and bool(reply.json().get("leader"))


async def check_leader_kill(
    nc: NatsClient, survivors: list[ShardReplica], alerts: AlertLog, policy: Path
) -> None:
    """SIGKILL the leader too: the last replica takes the lease, its fleet-level alerts
    continue without being re-sent, and it writes desired config for every node."""
    leaders: list[ShardReplica] = []

    async def one_leader() -> bool:
        leaders[:] = [r for r in survivors if await leads(r)]
        return len(leaders) == 1

    await wait_until(one_leader, timeout=30, interval=0.5, what="one leader among survivors")
    fleet_level = {k for k in alerts.firings if k[1] == "_fleet"}
    assert fleet_level, alerts.firings  # the policy selects no adapter: a fleet-level alert
    # agent-stale depends on the clock (the simulated agents publish only when asked)
    before = {k: n for k, n in alerts.firings.items() if k[0] != "agent-stale"}
    leaders[0].kill()
    last = [r for r in survivors if r is not leaders[0]]

    async def took_over() -> bool:
        seen = await firing_everywhere(last)
        return (
            seen is not None
            and all(seen[k] == 1 for k in before)
            and await leads(last[0])
            and [await desired_hca_max(nc, n) for n in NODES] == [12] * len(NODES)
        )

    write_policy(policy, 12)
    await wait_until(took_over, timeout=60, interval=0.5,
                     what="the last replica leads, every alert firing, config written")  # fmt: skip
    assert {k: n for k, n in alerts.firings.items() if k in before} == before  # none re-sent
    assert not any(alerts.resolved[k] for k in before), alerts.resolved


async def run_and_kill(
    urls: list[str], replicas: list[ShardReplica], expected: Fingerprints, alerts: AlertLog
) -> list[str]:
    """Start sharing, check it, SIGKILL one replica, check the takeover; the killed
    replica's nodes."""
    await wait_until(lambda: all(r.is_ready() for r in replicas), timeout=60, interval=0.2,
                     what="3 replicas ready")  # fmt: skip
    fleet = Fleetwide(replicas)

    async def settled() -> bool:
        return await fleet.poll() and fleet.held_once()

    await wait_until(settled, timeout=30, interval=0.2, what="3 replicas hold all partitions")
    requests: list[ResyncRequest] = []
    async with simulated_agents(urls, requests):

        async def shared() -> bool:
            return await fleet.poll() and fleet.nodes_once() and fleet.findings() == expected

        await wait_until(shared, timeout=30, interval=0.2,
                         what="each node held once, findings equal one process's")  # fmt: skip
        assert all(len(v["node_names"]) < len(NODES) for v in fleet.views)  # really shared
        await answers_for_every_node(replicas[0], fleet)

        # SIGKILL the replica holding the odd node (whose fw-skew finding needs the
        # other replicas' votes): the survivors take its partitions over.
        victim, victim_nodes, victim_held = next(
            (r, list(v["node_names"]), set(v["held"]))
            for r, v in zip(replicas, fleet.views, strict=True)
            if ODD in v["node_names"]
        )
        await wait_until(lambda: alerts.firings[("fw-skew", ODD, "mlx5_0")] == 1, timeout=30,
                         what="the odd node's alert fired (by its holder)")  # fmt: skip
        victim.kill()
        asked_before = len(requests)
        survivors = Fleetwide([r for r in replicas if r is not victim])

        async def taken_over() -> bool:
            return (
                await survivors.poll()
                and survivors.held_once()
                and survivors.nodes_once()
                and survivors.findings() == expected
            )

        await wait_until(taken_over, timeout=15, interval=0.2,
                         what="survivors hold every node, no finding lost")  # fmt: skip
        assert sum(v["takeovers"] for v in survivors.views) > 0
        # The takeover asked only the killed replica's partitions' agents (they answered:
        # the simulated agents filter like real ones), never the whole fleet.
        after = requests[asked_before:]
        assert after and all(r.partition_count == PARTS for r in after), after
        assert victim_held <= {p for r in after for p in r.partitions}, after
    return victim_nodes
