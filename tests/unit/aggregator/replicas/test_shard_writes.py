"""Sharded writes and fleet answers (docs/scaling.md): which replica owns which alert key,
the engine's reload on a scope change, the takeover grace, scoped resync requests (agent
filter and aggregator merge), node forwarding and the sharded OpenAPI document."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
import nats
import nats.aio.msg
import pytest
import schemathesis
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request
from prometheus_client import CollectorRegistry

from agent.bus.republish import RepublishControl
from agent.bus.republishpacing import RepublishPolicy
from aggregator import __version__
from aggregator.alerts.engine import EngineSettings
from aggregator.alerts.lifecycle import FLEET_NODE, Tracked, fingerprint
from aggregator.alerts.wiring import AlertWiring
from aggregator.api.app import ApiSettings, build_app
from aggregator.api.openapi import openapi_document
from aggregator.api.openapiops import OPERATIONS, SHARD_PATH
from aggregator.api.shards import SERVED_BY, add_shard_routes, node_of
from aggregator.bus.natsserver import NatsServer
from aggregator.bus.resyncrequest import ResyncRequester, ResyncRequestSettings
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import StoredNode, open_bucket
from aggregator.fleet.views import node_state
from aggregator.replicas.alerts import (
    AlertScope,
    ScopedAlertStore,
    open_sharded_alert_engine,
    read_states,
)
from aggregator.replicas.owner import ShardOwner
from aggregator.replicas.partitions import ShardSettings
from aggregator.replicas.wholefleet import WholeFleet
from aggregator.rules.finding import Finding
from aggregator.runtime.parts import this_host_address
from aggregator.runtime.strategy import advertised_api_url
from proto import subjects
from proto.codec import decode, encode
from proto.messages.alerts import Alert
from proto.messages.control import ResyncRequest
from proto.messages.shards import MAX_STALE_NAMES, ShardSummary
from proto.policy import Policy
from proto.runtime.natsflush import flush_in_order
from tests.support.builders import T0, plugin_status, snapshot
from tests.support.waits import wait_until

P = 12
NODES = [f"gpu-{i:03d}" for i in range(48)]


def part(node: str) -> int:
    return subjects.partition_of(subjects.node_token(node), P)


class Now:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def scope_with(held: set[int], leading: bool, clock: Now | None = None) -> AlertScope:
    return AlertScope(
        P, held=lambda: frozenset(held), leading=lambda: leading, clock=clock or Now()
    )


def finding(node: str | None, rule: str = "fw-skew") -> Finding:
    return Finding(rule=rule, severity="warning", node=node, subject="mlx5_0", message="m")


def firing(node: str, rule: str = "port-down") -> Tracked:
    alert = Alert(rule=rule, severity="critical", state="firing", node=node, subject="mlx5_0/1",
                  message="down", starts_at=1.0, fingerprint=f"{rule}-{node}")  # fmt: skip
    return Tracked(phase="firing", alert=alert)


def test_every_alert_key_has_exactly_one_owner_among_the_replicas() -> None:
    held = [{p for p in range(P) if p % 3 == r} for r in range(3)]
    scopes = [scope_with(h, leading=(r == 1)) for r, h in enumerate(held)]
    for node in [*NODES, FLEET_NODE, None]:
        assert sum(s.owns(node) for s in scopes) == 1, node
    assert scopes[1].owns(None) and scopes[1].owns(FLEET_NODE)
    assert scopes[0].owns("Not_A_Node") is False  # not a node name: fleet-level (leader)
    assert scopes[1].owns("Not_A_Node") is True


async def test_findings_are_filtered_to_the_owned_keys() -> None:
    held = {part("gpu-001")}
    scope = scope_with(held, leading=False)

    def inner(
        fleet: Fleet, policies: tuple[Policy, ...], cluster: ClusterView, now: float
    ) -> Sequence[Finding]:
        return [finding("gpu-001"), finding(None, "selector-matches-nothing"),
                *(finding(n) for n in NODES if part(n) not in held)]  # fmt: skip

    found = await scope.evaluate(inner)(Fleet(), (), NO_CLUSTER, 0.0)
    assert [f.node for f in found] == ["gpu-001"]
    assert len(scope.computed) == len(inner(Fleet(), (), NO_CLUSTER, 0.0))  # all, for /shards


def test_a_scope_change_pauses_the_engine_once_so_it_reloads() -> None:
    held, leading = {1, 2}, [False]
    scope = AlertScope(P, held=lambda: frozenset(held), leading=lambda: leading[0], clock=Now())
    assert scope.engine_may_step() is False  # first cycle: load the scope
    assert scope.engine_may_step() is True
    assert scope.engine_may_step() is True
    held.add(3)  # a takeover
    assert scope.engine_may_step() is False
    assert scope.engine_may_step() is True
    leading[0] = True  # became the leader: fleet-level keys are now ours
    assert scope.engine_may_step() is False
    assert scope.engine_may_step() is True
    assert scope.reloads == 3


async def test_taken_over_alerts_stay_firing_until_the_node_is_heard_from() -> None:
    clock = Now()
    node = "gpu-005"
    held: set[int] = set()
    scope = AlertScope(P, held=lambda: frozenset(held), leading=lambda: False, clock=clock,
                       grace_s=30.0)  # fmt: skip
    scope.engine_may_step()
    held.add(part(node))
    clock.t = 2000.0
    assert scope.engine_may_step() is False  # taken over at 2000
    states = {"k": firing(node), "other": firing("gpu-999")}  # gpu-999: not ours
    scope.states = lambda: states
    fleet = Fleet()
    evaluate = scope.evaluate(lambda *_: ())
    kept = await evaluate(fleet, (), NO_CLUSTER, 2001.0)
    assert [(f.rule, f.node, f.subject) for f in kept] == [("port-down", node, "mlx5_0/1")]
    fleet.apply_snapshot(snapshot(node), 2002.0)  # snapshot only: counters still missing
    assert len(await evaluate(fleet, (), NO_CLUSTER, 2003.0)) == 1
    assert await evaluate(fleet, (), NO_CLUSTER, 2031.0) == []  # grace over: findings decide


def test_agent_answers_only_a_scoped_request_for_its_partition() -> None:
    node = "gpu-007"
    mine, other = part(node), (part(node) + 1) % P
    control = RepublishControl(RepublishPolicy(jitter_s=0.0), node=node, monotonic=Now(),
                            draw=lambda: 0.0)  # fmt: skip

    def scoped(*parts: int) -> bytes:
        return encode(ResyncRequest(reason="shard-takeover", requested_at=1.0,
                                    partition_count=P, partitions=parts))  # fmt: skip

    control.handle(scoped(other))
    assert not control.pending and control.stats.other_partitions == 1
    control.handle(scoped(other, mine))
    assert control.pending


def test_old_agents_and_broadcasts_still_resync() -> None:
    # An agent without a node (or predating the fields) answers a scoped request too.
    control = RepublishControl(RepublishPolicy(jitter_s=0.0), monotonic=Now(), draw=lambda: 0.0)
    control.handle(encode(ResyncRequest(reason="shard-takeover", requested_at=1.0,
                                        partition_count=P, partitions=(0,))))  # fmt: skip
    assert control.pending
    # A request of the old shape (no partition fields) reaches every agent.
    old = msgspec.msgpack.encode(
        {"schema": "nicfleet.v1.ResyncRequest", "version": 1, "reason": "start",
         "spread_s": 0.0, "requested_at": 1.0}
    )  # fmt: skip
    agent = RepublishControl(RepublishPolicy(jitter_s=0.0), node="gpu-001", monotonic=Now(),
                          draw=lambda: 0.0)  # fmt: skip
    agent.handle(old)
    assert agent.pending


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param({"partition_count": -1}, id="negative-count"),
        pytest.param({"partitions": "0,1"}, id="partitions-not-a-list"),
        pytest.param({"partitions": ["a"]}, id="partition-not-an-int"),
    ],
)
def test_bad_scoped_requests_are_rejected_and_the_agent_keeps_serving(
    payload: dict[str, object],
) -> None:
    control = RepublishControl(RepublishPolicy(jitter_s=0.0), node="gpu-001", monotonic=Now(),
                            draw=lambda: 0.0)  # fmt: skip
    bad = {"schema": "nicfleet.v1.ResyncRequest", "requested_at": 1.0, **payload}
    control.handle(msgspec.msgpack.encode(bad))
    assert control.stats.rejected == 1 and not control.pending
    control.handle(encode(ResyncRequest(reason="start", requested_at=1.0)))
    assert control.pending


async def test_takeover_requests_are_merged_and_a_broadcast_wins(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    got: list[ResyncRequest] = []

    async def on(msg: nats.aio.msg.Msg) -> None:
        got.append(decode(msg.data, ResyncRequest))

    await nc.subscribe(subjects.CONTROL_RESYNC, cb=on)
    await flush_in_order(nc)
    requester = ResyncRequester(nc, ResyncRequestSettings(min_gap_s=0.05), nodes=lambda: 10,
                                clock=lambda: 1.0)  # fmt: skip
    stop = asyncio.Event()
    try:
        requester.request_partitions({3}, P)
        requester.request_partitions({5, 3}, P)  # merged into the pending one
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(requester.run(stop))
            await wait_until(lambda: len(got) == 1, timeout=5, what="scoped request")
            assert (got[0].partition_count, got[0].partitions) == (P, (3, 5))
            assert got[0].reason == "shard-takeover"
            requester.request_partitions({1}, P)
            requester.request("reconnect")  # a broadcast covers the scoped one
            await wait_until(lambda: len(got) == 2, timeout=5, what="broadcast")
            assert (got[1].partition_count, got[1].partitions) == (0, ())
            stop.set()
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("method", "path", "node"),
    [
        ("GET", "/api/v1/nodes/gpu-001", "gpu-001"),
        ("GET", "/api/v1/nodes/gpu-001/extra", None),
        ("GET", "/api/v1/nodes", None),
        ("GET", "/api/v1/trace?node=gpu-002&resource=rdma/ib", "gpu-002"),
        ("GET", "/api/v1/resources?node=gpu-003", "gpu-003"),
        ("GET", "/api/v1/resources", None),
        ("POST", "/api/v1/nodes/gpu-001", None),
        ("HEAD", "/api/v1/nodes/gpu-004", "gpu-004"),
        ("GET", "/api/v1/findings?node=gpu-001", None),
    ],
)
def test_which_requests_are_forwarded_to_the_holder(
    method: str, path: str, node: str | None
) -> None:
    assert node_of(make_mocked_request(method, path)) == node


def test_sharded_openapi_document_lists_shards_and_the_forwarding_error() -> None:
    routes = {("GET", p) for p in OPERATIONS}
    plain = openapi_document(routes, version=__version__, secured=False)
    sharded = openapi_document(routes | {("GET", SHARD_PATH)}, version=__version__,
                               secured=False)  # fmt: skip
    assert SHARD_PATH not in plain["paths"]
    assert "502" not in plain["paths"]["/api/v1/nodes/{node}"]["get"]["responses"]
    for path in ("/api/v1/nodes/{node}", "/api/v1/trace", "/api/v1/resources"):
        assert "502" in sharded["paths"][path]["get"]["responses"], path
    schemathesis.openapi.from_dict(sharded).validate()
    assert {k: v for k, v in sharded["paths"].items() if k != SHARD_PATH} != plain["paths"]


async def test_scoped_store_loads_only_the_owned_alert_states(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(bucket="shard-writes-alerts", history=1)
        states = {s.alert.fingerprint: s for s in (firing(n) for n in NODES[:8])}
        fleet_alert = firing(FLEET_NODE, "selector-matches-nothing")
        states[fleet_alert.alert.fingerprint] = fleet_alert
        for key, state in states.items():
            await kv.put(key, encode(state))
        await kv.put("junk", b"\xc1")  # skipped, not fatal
        held = {part(n) for n in NODES[:3]}
        js, bucket = nc.jetstream(), "shard-writes-alerts"
        follower = ScopedAlertStore(js, kv, scope_with(held, leading=False), bucket)
        leader = ScopedAlertStore(js, kv, scope_with(set(range(P)) - held, leading=True), bucket)
        mine, theirs = await follower.load(), await leader.load()
        assert not mine.keys() & theirs.keys()
        assert mine.keys() | theirs.keys() == states.keys()
        assert fleet_alert.alert.fingerprint in theirs
    finally:
        await nc.close()


async def test_leader_fleet_follows_the_nodes_bucket_only_while_leading(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    stop, leading = asyncio.Event(), asyncio.Event()
    own = Fleet()
    own.apply_snapshot(snapshot("gpu-001"), 5.0)
    clock = Now()
    whole = WholeFleet(own, clock, bucket="shard-writes-nodes")
    try:
        kv = await nc.jetstream().create_key_value(bucket="shard-writes-nodes", history=1)
        for name in ("gpu-001", "gpu-002", "gpu-003"):
            stored = StoredNode(snapshot=snapshot(name), received_at=1.0)
            await kv.put(subjects.node_token(name), encode(stored))
        await kv.put("gpu-bad", b"\xc1")  # undecodable: skipped
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(whole.run(stop, leading, kv, nc))
            assert list(whole.view()) == ["gpu-001"] and not whole.synced  # a follower
            leading.set()
            await wait_until(lambda: whole.synced, timeout=10, what="KV read to the end")
            view = whole.view()
            assert sorted(view) == ["gpu-001", "gpu-002", "gpu-003"]
            assert view["gpu-001"] is own.get("gpu-001")  # own nodes as ingested
            assert view["gpu-002"].last_seen == clock.t  # others: judged by their holder
            # Device-plugin status (not in KV) comes from every partition's status messages.
            status = subjects.partition_subject(part("gpu-002"), "gpu-002", subjects.STATUS)
            await nc.publish(status, encode(plugin_status("gpu-002", generation=7)))

            def applied() -> int | None:
                dp = whole.view()["gpu-002"].device_plugin
                return dp.config_generation if dp is not None else None

            await wait_until(lambda: applied() == 7, timeout=10, what="status applied")
            await kv.put("gpu-004", encode(StoredNode(snapshot=snapshot("gpu-004"),
                                                      received_at=2.0)))  # fmt: skip
            await kv.delete("gpu-003")
            await wait_until(lambda: sorted(whole.view()) == ["gpu-001", "gpu-002", "gpu-004"],
                             timeout=10, what="watch applies puts and deletes")  # fmt: skip
            leading.clear()  # no longer the leader: forget the others
            await wait_until(lambda: not whole.synced and list(whole.view()) == ["gpu-001"],
                             timeout=10, what="released on losing the lease")  # fmt: skip
            stop.set()
    finally:
        await nc.close()


async def test_a_new_leader_knows_the_statuses_sent_while_it_followed(
    nats_server: NatsServer,
) -> None:
    """Every replica follows device-plugin statuses: one that wins the lease plans with the
    config generation each agent last applied, without waiting for the agents to send it
    again (was: other shards' nodes ConfigPending until their next status)."""
    nc = await nats.connect(nats_server.url)
    stop, leading = asyncio.Event(), asyncio.Event()
    own = Fleet()
    own.apply_snapshot(snapshot("gpu-001"), 5.0)
    whole = WholeFleet(own, Now(), bucket="shard-statuses-nodes")
    dotted = "gpu-009.rack-1"  # KV keys are tokens: gpu-009_rack-1

    def generation(fleet: Fleet, node: str) -> int | None:
        record = fleet.view().get(node)
        dp = record.device_plugin if record is not None else None
        return dp.config_generation if dp is not None else None

    try:
        kv = await nc.jetstream().create_key_value(bucket="shard-statuses-nodes", history=1)
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(whole.run(stop, leading, kv, nc))
            await wait_until(lambda: whole.following_statuses, what="status subscription")
            for node, gen in (("gpu-002", 5), (dotted, 3)):
                token = subjects.node_token(node)
                status = subjects.partition_subject(part(node), token, subjects.STATUS)
                await nc.publish(status, encode(plugin_status(node, generation=gen)))
            bad = subjects.partition_subject(part("gpu-003"), "gpu-003", subjects.STATUS)
            await nc.publish(bad, b"\xc1")  # undecodable: refused, the rest kept
            await wait_until(lambda: generation(whole.statuses, dotted) == 3,
                             timeout=10, what="statuses followed while not leading")  # fmt: skip
            assert generation(whole.statuses, "gpu-002") == 5
            assert "gpu-003" not in whole.statuses.view()
            assert list(whole.view()) == ["gpu-001"]  # a follower holds only its own nodes
            for name in ("gpu-002", dotted):
                stored = StoredNode(snapshot=snapshot(name), received_at=1.0)
                await kv.put(subjects.node_token(name), encode(stored))
            leading.set()
            await wait_until(lambda: whole.synced, timeout=10, what="KV read to the end")
            assert generation(whole, "gpu-002") == 5 and generation(whole, dotted) == 3
            await kv.delete(subjects.node_token(dotted))
            await wait_until(lambda: dotted not in whole.view(), timeout=10,
                             what="a deleted dotted node forgotten")  # fmt: skip
            assert dotted not in whole.statuses.view()
            leading.clear()
            await wait_until(lambda: list(whole.view()) == ["gpu-001"], timeout=10,
                             what="released on losing the lease")  # fmt: skip
            assert generation(whole.statuses, "gpu-002") == 5  # kept for the next lease
            stop.set()
    finally:
        await nc.close()


def owner_of(name: str, fleet: Fleet, nc: nats.NATS, clock: Now) -> ShardOwner:
    return ShardOwner(
        nc, ShardSettings(partitions=P), identity=name, fleet=fleet,
        nodes_kv=None,  # type: ignore[arg-type]
        handle=lambda _s, _d: True, on_change=lambda _n, _k: None, resync=lambda _p: None,
        clock=clock, stale_after=30.0,
    )  # fmt: skip


async def test_the_leader_counts_the_nodes_other_shards_find_stale(
    nats_server: NatsServer,
) -> None:
    """A holder lists its stale nodes in its summary; the leader's whole fleet keeps those
    nodes' last time heard of (so the policy status counts them Stale) and counts the
    others as seen now. Only the live holder's list counts; an oversized list is refused."""
    clock = Now()
    theirs = Fleet()
    theirs.apply_snapshot(snapshot("gpu-001"), clock.t - 100)  # silent 100 s: stale
    theirs.apply_snapshot(snapshot("gpu-002"), clock.t - 100)
    theirs.apply_status(plugin_status("gpu-002"), clock.t - 1)  # heard of 1 s ago
    a_nc, b_nc = await nats.connect(nats_server.url), await nats.connect(nats_server.url)
    try:
        a = owner_of("a", Fleet(), a_nc, clock)
        b = owner_of("b", theirs, b_nc, clock)
        for owner in (a, b):
            owner.owners, owner.live = dict.fromkeys(range(P), "b"), frozenset({"a", "b"})
        await a_nc.subscribe(subjects.SHARD_SUMMARY_WILDCARD, cb=a._on_summary)
        await flush_in_order(a_nc)
        await b._publish_summary(clock.t)
        await wait_until(lambda: a.stale_elsewhere() == {"gpu-001"}, what="b's stale list")
        bad = ShardSummary(replica="b", sent_at=clock.t, stale=("gpu-001", "Not_A_Node"))
        await b_nc.publish(subjects.shard_summary_subject("b"), encode(bad))
        await flush_in_order(b_nc)
        await wait_until(lambda: "Not_A_Node" in a._summaries["b"].stale, what="bad entry in")
        assert a.stale_elsewhere() == {"gpu-001"}  # a bad name skipped, not raised
        whole = WholeFleet(Fleet(), clock, stale_elsewhere=a.stale_elsewhere)
        for name in ("gpu-001", "gpu-002"):  # the KV copies, persisted long ago
            whole.apply_snapshot(snapshot(name), clock.t - 100)
        states = {n: node_state(r, clock.t, 30.0) for n, r in whole.view().items()}
        assert states == {"gpu-001": "stale", "gpu-002": "ready"}

        a.owners = dict.fromkeys(range(P), "c")  # b no longer holds them
        assert a.stale_elsewhere() == frozenset()
        a.owners, a.live = dict.fromkeys(range(P), "b"), frozenset({"a"})  # b not live
        assert a.stale_elsewhere() == frozenset()
        a.live = frozenset({"a", "b"})

        names = [f"gpu-{i:05d}" for i in range(MAX_STALE_NAMES + 1)]
        oversized = ShardSummary(replica="b", sent_at=clock.t, stale=tuple(names))
        await b_nc.publish(subjects.shard_summary_subject("b"), encode(oversized))
        await flush_in_order(b_nc)
        await wait_until(lambda: a.rejected == 1, what="the oversized summary refused")
        assert a.stale_elsewhere() == {"gpu-001"}  # the last good summary still counts
    finally:
        await a_nc.close()
        await b_nc.close()


async def test_takeover_keeps_the_firing_alert_without_resending_or_resolving(
    own_nats: NatsServer,
) -> None:
    """A real engine: a replica takes over the partition of a node whose alert the dead
    holder persisted as firing; the node is not heard from yet (its finding is absent)."""
    node = "gpu-005"
    clock = Now()
    nc = await nats.connect(own_nats.url)
    sent: list[Alert] = []

    async def on_alert(msg: nats.aio.msg.Msg) -> None:
        sent.append(decode(msg.data, Alert))

    try:
        await nc.subscribe(subjects.ALERT_WILDCARD, cb=on_alert)
        kv = await open_bucket(nc.jetstream(), subjects.KV_ALERTS)
        alert = Alert(rule="port-down", severity="critical", state="firing", node=node,
                      subject="mlx5_0/1", message="down", starts_at=900.0,
                      fingerprint=fingerprint("port-down", node, "mlx5_0/1"))  # fmt: skip
        theirs = firing("gpu-999")  # another replica's node: never loaded here
        await kv.put(alert.fingerprint, encode(Tracked(phase="firing", alert=alert)))
        await kv.put(theirs.alert.fingerprint, encode(theirs))
        held: set[int] = {part("gpu-999") + 1}
        assert part(node) not in held and part("gpu-999") not in held
        scope = AlertScope(P, held=lambda: frozenset(held), leading=lambda: False,
                           clock=clock, grace_s=30.0)  # fmt: skip
        cycles = [0]

        def nothing_found(*_: object) -> Sequence[Finding]:  # the node is not heard from
            cycles[0] += 1
            return ()

        engine = await open_sharded_alert_engine(
            nc=nc, fleet=Fleet(), changes=ChangeFeed().subscribe(), policies=lambda: (),
            cluster=lambda: NO_CLUSTER, registry=CollectorRegistry(), clock=clock,
            wiring=AlertWiring(engine=EngineSettings(tick_s=0.02)), evaluate=nothing_found,
            timings=None, scope=scope,
        )  # fmt: skip

        async def cycles_after(n: int) -> None:
            target = cycles[0] + n
            await wait_until(lambda: cycles[0] >= target, timeout=10, what=f"{n} cycles")

        stop = asyncio.Event()
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(engine.run(stop))
            await cycles_after(3)  # paused, then loaded the (empty) scope
            assert engine.states == {} and scope.reloads == 1
            held.add(part(node))  # the takeover
            await cycles_after(4)  # paused, reloaded (grace judged on what it loads), stepped
            assert scope.reloads == 2
            assert set(engine.states) == {alert.fingerprint}
            assert engine.states[alert.fingerprint].phase == "firing"
            await nc.flush()
            assert sent == []  # neither re-sent nor resolved
            clock.t += 31  # grace over, the node never came back: its alert resolves, once
            await wait_until(lambda: [a.state for a in sent] == ["resolved"], timeout=5,
                             what="one resolved transition")  # fmt: skip
            stop.set()
        assert (await kv.get(theirs.alert.fingerprint)).value == encode(theirs)  # untouched
    finally:
        await nc.close()


def replica(name: str, fleet: Fleet) -> ShardOwner:
    """A ShardOwner that is never started: its plan and peers' URLs are set by the test."""
    return ShardOwner(
        nats.NATS(), ShardSettings(partitions=P), identity=name, fleet=fleet,
        nodes_kv=None,  # type: ignore[arg-type]
        handle=lambda _s, _d: True, on_change=lambda _n, _k: None, resync=lambda _p: None,
        clock=Now(),
    )  # fmt: skip


def replica_app(owner: ShardOwner, fleet: Fleet) -> web.Application:
    app = build_app(fleet=fleet, settings=ApiSettings(), readiness=lambda: (True, "ok"),
                    clock=lambda: T0)  # fmt: skip
    add_shard_routes(app, owner, fleet, lambda: ())
    return app


async def test_a_node_request_is_forwarded_once_to_its_holder() -> None:
    mine, theirs = Fleet(), Fleet()
    theirs.apply_snapshot(snapshot("gpu-001"), T0)
    a, b = replica("a", mine), replica("b", theirs)
    for owner in (a, b):
        owner.owners = dict.fromkeys(range(P), "b")
    async with TestServer(replica_app(b, theirs), host="127.0.0.1") as server_b:
        a.api_urls["b"] = str(server_b.make_url("")).rstrip("/")
        b.owners = dict.fromkeys(range(P), "a")  # b's plan is stale: must not bounce back
        b.api_urls["a"] = "http://127.0.0.1:9"  # never called
        async with TestClient(TestServer(replica_app(a, mine), host="127.0.0.1")) as client:
            reply = await client.get("/api/v1/nodes/gpu-001")
            assert reply.status == 200 and reply.headers[SERVED_BY] == "b"
            assert (await reply.json())["summary"]["name"] == "gpu-001"
            gone = await client.get("/api/v1/nodes/gpu-002")  # b does not have it either
            assert gone.status == 404 and gone.headers[SERVED_BY] == "b"
            bad = await client.get("/api/v1/nodes/Not_A_Node")  # answered here, field named
            assert bad.status == 400 and (await bad.json())["error"]["field"] == "node"
            shards = await client.get(SHARD_PATH)
            assert (await shards.json())["api_urls"] == a.api_urls
    async with TestClient(TestServer(replica_app(a, mine), host="127.0.0.1")) as client:
        down = await client.get("/api/v1/nodes/gpu-001")  # b is gone
        assert down.status == 502
        assert (await down.json())["error"]["code"] == "http_error"
        assert (await client.get("/healthz")).status == 200  # still serving


@pytest.mark.parametrize(
    ("listen", "advertise", "bound", "expected"),
    [
        ("127.0.0.1", None, "http://127.0.0.1:8081", "http://127.0.0.1:8081"),
        ("127.0.0.1", "http://agg-1.agg:8080", "http://127.0.0.1:8081", "http://agg-1.agg:8080"),
        ("0.0.0.0", None, "http://0.0.0.0:8080", None),  # this host's address, never 0.0.0.0
    ],
)
def test_the_heartbeat_advertises_a_reachable_api_url(
    listen: str, advertise: str | None, bound: str, expected: str | None
) -> None:
    shards = ShardSettings(partitions=P, advertise_url=advertise)
    url = advertised_api_url(shards, listen, bound, this_host_address)
    assert url is not None
    if expected is not None:
        assert url == expected
    else:
        assert url.startswith("http://") and url.endswith(":8080") and "0.0.0.0" not in url


async def test_alert_states_are_read_whole_while_other_replicas_write(
    nats_server: NatsServer,
) -> None:
    """nats-py's key listing misses keys updated meanwhile; the stream read does not."""
    nc = await nats.connect(nats_server.url)
    stop = asyncio.Event()
    try:
        js = nc.jetstream()
        kv = await js.create_key_value(bucket="shard-writes-read", history=1)
        states = [firing(n) for n in NODES[:30]]
        for state in states:
            await kv.put(state.alert.fingerprint, encode(state))
        await kv.put("junk", b"\xc1")  # undecodable: skipped

        async def other_replica() -> None:  # keeps re-persisting its states
            i = 0
            while not stop.is_set():
                state = states[i % len(states)]
                await kv.put(state.alert.fingerprint, encode(state))
                i += 1

        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(other_replica())
            for _ in range(20):
                assert len(await read_states(js, kv, "shard-writes-read")) == len(states)
            stop.set()
        await kv.delete(states[0].alert.fingerprint)
        assert states[0].alert.fingerprint not in await read_states(js, kv, "shard-writes-read")
    finally:
        stop.set()
        await nc.close()
