"""One aggregator, or one replica of a sharded one: the two strategies and their choice.

`choose_replica` picks a strategy once, from settings; its `open` takes the nodes (rebuilds
the fleet from KV and subscribes, or takes partitions) and returns a `Replica`, which answers
every later difference (what the reconciler plans over, who writes, which alert engine, shard
routes, tasks, resync scope). Starts no task itself: `Replica.start` adds to the service's.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from aiohttp import web
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry

from aggregator.alerts.engine import AlertEngine, Evaluate, HeardSince
from aggregator.alerts.wiring import AlertWiring, NodeEvents, open_alert_engine
from aggregator.api.shards import add_shard_routes
from aggregator.bus.resyncrequest import ResyncRequester
from aggregator.cluster import ClusterView
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import load_nodes
from aggregator.kube.client import KubeClient
from aggregator.replicas.alerts import AlertScope, open_sharded_alert_engine
from aggregator.replicas.leader import LeaderElector
from aggregator.replicas.owner import ShardOwner
from aggregator.replicas.partitions import ShardSettings
from aggregator.replicas.wholefleet import WholeFleet
from aggregator.rules.finding import Finding
from proto import subjects
from proto.messages.alerts import Alert
from proto.messages.control import ResyncReason
from proto.policy import Policy

log = logging.getLogger(__name__)

Findings = Callable[[], Sequence[Finding]]


@dataclass(frozen=True, kw_only=True)
class Intake:
    """What a strategy needs to take its nodes: NATS, the nodes bucket, the fleet."""

    nc: NatsClient
    nodes_kv: KeyValue
    fleet: Fleet
    ingest: Ingest
    resync: ResyncRequester
    changes: ChangeFeed
    shards: ShardSettings
    identity: str
    stale_after: float
    clock: Callable[[], float]
    extra: Findings  # findings not from rules (the NicClusterPolicy audit)
    api_url: Callable[[], str | None]  # sharded: advertised in the heartbeat


@dataclass(frozen=True, kw_only=True)
class AlertWires:
    """What both alert engines are opened with."""

    nc: NatsClient
    fleet: Fleet
    changes: ChangeFeed
    policies: Callable[[], tuple[Policy, ...]]
    cluster: Callable[[], ClusterView]
    registry: CollectorRegistry
    clock: Callable[[], float]
    wiring: AlertWiring
    rules: Evaluate | None  # None: every rule
    kube: KubeClient | None
    extra: Findings
    leader: LeaderElector
    writes: Callable[[], bool]


class Replica(Protocol):
    """One aggregator (every node) or one replica of a sharded one (its partitions')."""

    @property
    def planned(self) -> Fleet:  # what the reconciler plans desired config and status over
        ...

    def writes(self, leader: LeaderElector) -> Callable[[], bool]: ...
    async def open_alerts(self, wires: AlertWires) -> tuple[AlertEngine, Findings]: ...
    def add_routes(self, app: web.Application, fleet: Fleet, computed: Findings) -> None: ...
    def start(
        self, tasks: asyncio.TaskGroup, stop: asyncio.Event, leader: LeaderElector
    ) -> None: ...
    def ask_resync(self, reason: ResyncReason) -> None: ...
    def firing(self, alerts: AlertEngine, leader: LeaderElector) -> list[Alert]: ...


def choose_replica(shards: ShardSettings) -> type[SingleReplica] | type[ShardedReplica]:
    """The strategy for these settings: sharded when the node subjects are partitioned."""
    return ShardedReplica if shards.partitions else SingleReplica


def advertised_api_url(
    shards: ShardSettings, listen_host: str, bound: str | None, host_address: Callable[[], str]
) -> str | None:
    """The API URL peers forward node requests to (sharded): `shards.advertise_url`, else
    the bound one — with a wildcard listen address, `host_address()`'s (pure: it is given)."""
    if shards.advertise_url or bound is None:
        return shards.advertise_url or bound
    if listen_host not in ("", "0.0.0.0", "::"):
        return bound
    return f"http://{url_host(host_address())}:{bound.rsplit(':', 1)[1]}"


def url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _rebuilt(count: int) -> None:
    log.info("rebuilt %d nodes from KV %s", count, subjects.KV_NODES)
    # What was loaded lives long: keep it out of the cyclic collector's full passes
    # (at 10k nodes those pauses were seconds long; refcounting still frees it).
    gc.freeze()


async def _open_whole_alerts(
    wires: AlertWires, heard_since: HeardSince
) -> tuple[AlertEngine, Findings]:
    engine = await open_alert_engine(
        nc=wires.nc,
        fleet=wires.fleet,
        changes=wires.changes.subscribe(),
        policies=wires.policies,
        cluster=wires.cluster,
        registry=wires.registry,
        clock=wires.clock,
        wiring=wires.wiring,
        evaluate=wires.rules,  # None: every rule
        events=NodeEvents(wires.kube) if wires.kube is not None else None,
        extra_findings=wires.extra,
        is_leader=wires.writes,
        heard_since=heard_since,
    )
    return engine, lambda: engine.findings


@dataclass(frozen=True, kw_only=True)
class SingleReplica:
    """Every node here: the fleet rebuilt from KV, one subscription to every node subject.
    `heard_since`: each node loaded from KV -> when the subscription went up (a follower
    hears every node too, so a leader takeover moves nothing)."""

    planned: Fleet
    resync: ResyncRequester
    heard_since: Mapping[str, float]

    @classmethod
    async def open(cls, intake: Intake) -> SingleReplica:
        loaded: list[str] = []
        async for stored in load_nodes(intake.nodes_kv):
            intake.fleet.apply_snapshot(stored.snapshot, stored.received_at)
            loaded.append(stored.snapshot.node)
        _rebuilt(len(loaded))
        ingest = intake.ingest

        async def on_message(msg: Msg) -> None:
            ingest.handle(msg.subject, msg.data)

        await intake.nc.subscribe(subjects.NODE_WILDCARD, cb=on_message, pending_msgs_limit=200_000)
        subscribed = intake.clock()  # the SUB is sent; the server has it a round trip later
        # Changes published while we were away (or loading) are only re-sent on request.
        intake.resync.request("start")
        heard = MappingProxyType(dict.fromkeys(loaded, subscribed))
        return cls(planned=intake.fleet, resync=intake.resync, heard_since=heard)

    def writes(self, leader: LeaderElector) -> Callable[[], bool]:
        return lambda: leader.is_leader

    async def open_alerts(self, wires: AlertWires) -> tuple[AlertEngine, Findings]:
        heard = self.heard_since
        return await _open_whole_alerts(wires, lambda: heard)

    def add_routes(self, app: web.Application, fleet: Fleet, computed: Findings) -> None:
        pass  # no shard routes

    def start(self, tasks: asyncio.TaskGroup, stop: asyncio.Event, leader: LeaderElector) -> None:
        pass  # nothing beyond the service's own tasks

    def ask_resync(self, reason: ResyncReason) -> None:
        self.resync.request(reason)

    def firing(self, alerts: AlertEngine, leader: LeaderElector) -> list[Alert]:
        return alerts.firing() if leader.is_leader else []  # only the leader runs the lifecycle


@dataclass(frozen=True, kw_only=True)
class ShardedReplica:
    """One replica of a sharded aggregator (docs/scaling.md): `ShardOwner` takes partitions
    and subscribes to them; the leader plans over the whole fleet (`WholeFleet`)."""

    planned: WholeFleet
    shard: ShardOwner
    resync: ResyncRequester
    partitions: int
    nodes_kv: KeyValue
    nc: NatsClient

    @classmethod
    async def open(cls, intake: Intake) -> ShardedReplica:
        _rebuilt(0)  # each partition taken loads its own nodes (and asks its own agents)
        resync, parts = intake.resync, intake.shards.partitions
        shard = ShardOwner(
            intake.nc, intake.shards, identity=intake.identity, fleet=intake.fleet,
            nodes_kv=intake.nodes_kv, handle=intake.ingest.handle,
            on_change=intake.changes.publish,
            resync=lambda held: resync.request_partitions(held, parts), clock=intake.clock,
            extra=intake.extra, api_url=intake.api_url, stale_after=intake.stale_after,
        )  # fmt: skip
        await shard.start()
        # docs/scaling.md, "Writes": the leader plans desired config and status over the
        # whole fleet (its own nodes + KV `nicfleet-nodes`) once it has read it.
        whole = WholeFleet(intake.fleet, intake.clock, stale_elsewhere=shard.stale_elsewhere)
        return cls(
            planned=whole, shard=shard, resync=resync, partitions=parts,
            nodes_kv=intake.nodes_kv, nc=intake.nc,
        )  # fmt: skip

    def writes(self, leader: LeaderElector) -> Callable[[], bool]:
        whole = self.planned
        return lambda: leader.is_leader and whole.synced

    async def open_alerts(self, wires: AlertWires) -> tuple[AlertEngine, Findings]:
        shard, leader = self.shard, wires.leader
        if wires.rules is not None:  # given rules run whole, as on one replica
            return await _open_whole_alerts(wires, lambda: shard.heard_since)
        scope = AlertScope(
            self.partitions,
            held=lambda: shard.held,
            leading=lambda: leader.is_leader,
            clock=wires.clock,
            grace_s=wires.wiring.engine.startup_grace_s,
        )
        engine = await open_sharded_alert_engine(
            nc=wires.nc, fleet=wires.fleet, changes=wires.changes.subscribe(),
            policies=wires.policies, cluster=wires.cluster,
            registry=wires.registry, clock=wires.clock, wiring=wires.wiring,
            evaluate=shard.rules.evaluate,
            timings=shard.rules.timings, scope=scope,
            events=NodeEvents(wires.kube) if wires.kube is not None else None,
            heard_since=lambda: shard.heard_since,
        )  # fmt: skip
        return engine, lambda: scope.computed  # each replica's alerts: its own nodes

    def add_routes(self, app: web.Application, fleet: Fleet, computed: Findings) -> None:
        add_shard_routes(app, self.shard, fleet, computed)  # who holds what, forwarding

    def start(self, tasks: asyncio.TaskGroup, stop: asyncio.Event, leader: LeaderElector) -> None:
        tasks.create_task(self.shard.run(stop))
        tasks.create_task(self.planned.run(stop, leader.leading, self.nodes_kv, self.nc))

    def ask_resync(self, reason: ResyncReason) -> None:
        """Only the agents of the partitions held here."""
        if self.shard.held:
            self.resync.request_partitions(self.shard.held, self.partitions)

    def firing(self, alerts: AlertEngine, leader: LeaderElector) -> list[Alert]:
        return alerts.firing()  # each replica for its own nodes, the leader also `_fleet`
