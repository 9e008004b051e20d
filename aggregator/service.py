"""The aggregator process: owns NATS (embedded or remote), the fleet, storage and the API.

Start order: embedded nats-server (when no URL is given) → NATS connection → KV bucket
→ fleet rebuilt from KV → subscriptions → HTTP API → ready file. Stop reverses it.
All long-running work lives in one TaskGroup; `stop` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
from aiohttp import web
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import SlowConsumerError

from aggregator.alerts.engine import AlertEngine, Evaluate
from aggregator.alerts.wiring import AlertWiring, NodeEvents, open_alert_engine
from aggregator.api.alerts import add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.api.auth import ApiAuth
from aggregator.api.shards import add_shard_routes
from aggregator.api.statuspage import add_ui_routes
from aggregator.api.tokenreview import ReviewSettings, TokenReviewer
from aggregator.api.validations import add_validation_routes
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.resync import ResyncRequester, ResyncSettings
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.errors import KubeError, SettingsError, StoreError
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet, nodes_by_state
from aggregator.fleet.store import (
    SnapshotWriter,
    StoredNode,
    ensure_buckets,
    load_nodes,
    open_bucket,
)
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClusterWatcher
from aggregator.metrics import Metrics
from aggregator.reconcile.apply import ConfigStore, open_config_bucket
from aggregator.reconcile.loop import Reconciler, ReconcileSettings
from aggregator.reconcile.nvidia import audit_nic_cluster_policy
from aggregator.reconcile.policies import ClusterPolicies, FilePolicies, PolicySource
from aggregator.replicas.alerts import AlertScope, open_sharded_alert_engine
from aggregator.replicas.leader import (
    LEADER_BUCKET,
    KubeLease,
    LeaderElector,
    LeaderSettings,
    LeaseStore,
    NatsLease,
)
from aggregator.replicas.owner import ShardOwner
from aggregator.replicas.partitions import ShardSettings
from aggregator.replicas.wholefleet import WholeFleet
from aggregator.rules.finding import Finding
from aggregator.validations.record import ValidationSettings
from aggregator.validations.runner import (
    KV_VALIDATIONS,
    TEMPLATE,
    ValidationRunner,
    ValidationStore,
    load_template,
)
from proto import subjects
from proto.messages.alerts import Alert
from proto.messages.control import ResyncReason
from proto.policy import Policy
from proto.runtime.natsconnect import NO_SECURITY, NatsClientSecurity, connect_options

log = logging.getLogger(__name__)

# Every KV bucket the aggregator uses (created with --kv-replicas copies at start).
KV_BUCKETS: tuple[str, ...] = (
    subjects.KV_NODES,
    subjects.KV_CONFIG,
    subjects.KV_ALERTS,
    LEADER_BUCKET,
    KV_VALIDATIONS,
)


@dataclass(frozen=True, kw_only=True)
class AggregatorSettings:
    nats_url: str | None = None  # None: start an embedded nats-server
    listen_host: str = "127.0.0.1"
    listen_port: int = 8080
    stale_after: float = 30.0
    nats_store_dir: Path | None = None  # embedded server's JetStream store
    # Embedded server's config (users, permissions, TLS: `nicfleet-aggregator nats-auth`).
    nats_server_config: Path | None = None
    nats_security: NatsClientSecurity = NO_SECURITY  # this process's NATS credentials, TLS
    ready_file: Path | None = None
    policies: tuple[Policy, ...] = ()  # from --policy; the CRD replaces this in clusters
    policy_file: Path | None = (
        None  # --policy: re-read when it changes (aggregator.reconcile.policies)
    )
    policy_watch_interval: float = 0.5
    reconcile_tick: float = 5.0
    alerts: AlertWiring = field(default_factory=AlertWiring)  # rules tick, Alertmanager
    # A Kubernetes API server: policies from NicFleetPolicy objects, node allocatable,
    # status/Events/labels written back. None: no cluster (policies from --policy).
    kube: KubeSettings | None = None
    # One replica leads (writes config, status, labels); all serve reads. The lease is a
    # Kubernetes Lease with a cluster, a NATS KV entry without one.
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    leader_ttl: float = 10.0
    # Copies of every KV bucket in a JetStream cluster (1: single server; 3 in deploy/).
    kv_replicas: int = 1
    nvidia_audit_interval: float = 30.0
    api_auth: ApiAuth | None = None  # --api-token-file: bearer tokens; None: the API is open
    # --api-token-review: tokens not in api_auth are checked by TokenReview (needs `kube`).
    api_token_review: ReviewSettings | None = None
    # Pair validations (POST /api/v1/validations): pods from this template, phase timeouts.
    validation: ValidationSettings = field(default_factory=ValidationSettings)
    validation_template: Path = TEMPLATE
    # Resync requests to the agents after start/reconnect/dropped messages (docs/wire.md).
    resync: ResyncSettings = field(default_factory=ResyncSettings)
    # --partitions: one replica of a sharded aggregator (docs/scaling.md); 0: all nodes here.
    shards: ShardSettings = field(default_factory=ShardSettings)


class AggregatorService:
    def __init__(
        self,
        settings: AggregatorSettings,
        *,
        clock: Callable[[], float] = time.time,
        rules: Evaluate | None = None,  # default: every rule (aggregator.alerts.wiring)
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.metrics = Metrics.create()
        self.fleet = Fleet()
        self.nats_url: str | None = settings.nats_url
        self.api_url: str | None = None
        self._nc: NatsClient | None = None
        self._writer: SnapshotWriter | None = None
        self._loaded = False
        self.ready = asyncio.Event()
        # Every accepted node message is announced here; loops that react to the fleet
        # (rules, reconcile) subscribe instead of polling.
        self.changes = ChangeFeed()
        self.reconciler: Reconciler | None = None  # set once NATS is up (run)
        self._rules = rules
        self.alerts: AlertEngine | None = None  # set once NATS is up (run)
        self.leader: LeaderElector | None = None  # set once NATS is up (run)
        self.watcher: ClusterWatcher | None = None  # set when a cluster is configured
        self._policy_source: PolicySource | None = None
        self._kube: KubeClient | None = None
        self.token_reviewer: TokenReviewer | None = None  # with settings.api_token_review
        self.validations: ValidationRunner | None = None  # set once NATS is up (run)
        self.resync: ResyncRequester | None = None  # set once node messages are subscribed
        self.shard: ShardOwner | None = None  # sharded: this replica's partitions (run)
        self._advertised: str | None = None  # the API URL in the shard heartbeat
        # Sharded: every finding this replica computed (its alerts: only the owned ones).
        self._computed: Callable[[], Sequence[Finding]] = self._findings
        # Read-only audit of an NVIDIA Network Operator NicClusterPolicy, when one exists.
        self.nvidia_findings: tuple[Finding, ...] = ()
        self.metrics.watch_fleet(
            lambda: nodes_by_state(self.fleet, clock(), settings.stale_after),
            alerts=self._firing_alerts,
            findings=self._findings,
        )

    def readiness(self) -> tuple[bool, str]:
        if self._nc is None or not self._nc.is_connected:
            return False, "not connected to NATS"
        if not self._loaded:
            return False, "fleet not yet rebuilt from KV"
        if self._writer is not None and not self._writer.healthy:
            return False, self._writer.last_error or "KV writes failing"
        return True, "ok"

    async def run(self, stop: asyncio.Event) -> None:
        embedded: NatsServer | None = None
        runner: web.AppRunner | None = None
        try:
            if self.nats_url is None:
                embedded = NatsServer(
                    NatsServerSettings(
                        store_dir=self.settings.nats_store_dir,
                        config_file=self.settings.nats_server_config,
                    )
                )
                await asyncio.to_thread(embedded.start)
                self.nats_url = embedded.url
                log.info("embedded nats-server listening on %s", self.nats_url)
            nc = await self._connect(stop)
            if nc is None:
                return
            if self.settings.kv_replicas > 1:  # one copy: the openers below create them
                await ensure_buckets(nc.jetstream(), KV_BUCKETS, replicas=self.settings.kv_replicas)
            kv = await open_bucket(nc.jetstream())
            self._writer = SnapshotWriter(kv, self.metrics)
            ingest = Ingest(
                fleet=self.fleet,
                metrics=self.metrics,
                clock=self.clock,
                on_snapshot=self._writer.submit,
                on_change=self.changes.publish,
            )
            count = 0
            sharded = bool(self.settings.shards.partitions)  # its partitions' nodes: ShardOwner
            async for stored in load_nodes(kv) if not sharded else _no_nodes():
                self.fleet.apply_snapshot(stored.snapshot, stored.received_at)
                count += 1
            self._loaded = True
            log.info("rebuilt %d nodes from KV %s", count, subjects.KV_NODES)
            # What was loaded lives long: keep it out of the cyclic collector's full passes
            # (at 10k nodes those pauses were seconds long; refcounting still frees it).
            gc.freeze()

            async def on_message(msg: Msg) -> None:
                ingest.handle(msg.subject, msg.data)

            if not sharded:  # sharded: ShardOwner subscribes to its partitions
                await nc.subscribe(
                    subjects.NODE_WILDCARD, cb=on_message, pending_msgs_limit=200_000
                )
            # Changes published while we were away (or loading) are only re-sent on request.
            self.resync = ResyncRequester(
                nc, self.settings.resync, nodes=lambda: len(self.fleet), clock=self.clock
            )
            if not sharded:  # sharded: each partition taken asks its own agents
                self.resync.request("start")
            if sharded:  # docs/scaling.md
                resync, parts = self.resync, self.settings.shards.partitions
                self.shard = ShardOwner(
                    nc, self.settings.shards, identity=self.settings.identity, fleet=self.fleet,
                    nodes_kv=kv, handle=ingest.handle, on_change=self.changes.publish,
                    resync=lambda held: resync.request_partitions(held, parts), clock=self.clock,
                    extra=lambda: self.nvidia_findings, api_url=self._advertised_api_url,
                    stale_after=self.settings.stale_after,
                )  # fmt: skip
                await self.shard.start()
            config_store = ConfigStore(await open_config_bucket(nc.jetstream()))
            policy_source: PolicySource
            lease: LeaseStore
            cluster: Callable[[], ClusterView] = _no_cluster
            if self.settings.kube is not None:
                kube = self._kube = await KubeClient.connect(self.settings.kube)
                watcher = self.watcher = ClusterWatcher(kube)
                policy_source = ClusterPolicies(watcher)
                cluster = watcher.cluster_view
                lease = KubeLease(kube, self.settings.leader_ttl)
            else:
                kube = None
                policy_source = FilePolicies(
                    self.settings.policy_file,
                    self.settings.policies,
                    interval=self.settings.policy_watch_interval,
                )
                lease = await NatsLease.open(nc.jetstream(), self.settings.leader_ttl)
            self._policy_source = policy_source
            leader = self.leader = LeaderElector(
                lease,
                LeaderSettings(identity=self.settings.identity, ttl_s=self.settings.leader_ttl),
            )
            # Sharded (docs/scaling.md, "Writes"): the leader plans desired config and status
            # over the whole fleet (its own nodes + KV `nicfleet-nodes`) once it has read it.
            whole = (
                WholeFleet(self.fleet, self.clock, stale_elsewhere=self.shard.stale_elsewhere)
                if self.shard is not None
                else None
            )
            writes: Callable[[], bool] = (
                (lambda: leader.is_leader and whole.synced)
                if whole is not None
                else (lambda: leader.is_leader)
            )
            self.reconciler = Reconciler(
                ReconcileSettings(
                    stale_after=self.settings.stale_after, tick=self.settings.reconcile_tick
                ),
                fleet=whole if whole is not None else self.fleet,
                changes=self.changes.subscribe(),
                policies=policy_source,
                store=config_store,
                kube=kube,
                cluster=cluster,
                is_leader=writes,
                observed_generation=self._observed_generation,
                clock=self.clock,
                observer=self.metrics,
            )
            shard = self.shard
            if shard is not None and self._rules is None:  # each replica: its own nodes
                scope = AlertScope(
                    self.settings.shards.partitions,
                    held=lambda: shard.held,
                    leading=lambda: leader.is_leader,
                    clock=self.clock,
                    grace_s=self.settings.alerts.engine.startup_grace_s,
                )
                self.alerts = await open_sharded_alert_engine(
                    nc=nc, fleet=self.fleet, changes=self.changes.subscribe(),
                    policies=lambda: policy_source.current().policies, cluster=cluster,
                    registry=self.metrics.registry, clock=self.clock,
                    wiring=self.settings.alerts, evaluate=shard.rules.evaluate,
                    timings=shard.rules.timings, scope=scope,
                    events=NodeEvents(kube) if kube is not None else None,
                )  # fmt: skip
                self._computed = lambda: scope.computed
            else:
                self.alerts = await open_alert_engine(
                    nc=nc,
                    fleet=self.fleet,
                    changes=self.changes.subscribe(),
                    policies=lambda: policy_source.current().policies,
                    cluster=cluster,
                    registry=self.metrics.registry,
                    clock=self.clock,
                    wiring=self.settings.alerts,
                    evaluate=self._rules,  # None: every rule (a sharded replica: above)
                    events=NodeEvents(kube) if kube is not None else None,
                    extra_findings=lambda: self.nvidia_findings,
                    is_leader=writes,
                )
            self.validations = ValidationRunner(
                kube=kube,
                namespace=self.settings.kube.validation_namespace if self.settings.kube else "",
                nc=nc,
                store=await ValidationStore.open(nc, keep=self.settings.validation.keep),
                settings=self.settings.validation,
                # Pods are made only with a cluster and a template; else POST answers 503.
                template=self._validation_template() if kube else None,
                identity=self.settings.identity,
                clock=self.clock,
                registry=self.metrics.registry,
            )
            runner = await self._start_api(cluster)
            self._write_ready_file()
            self.ready.set()
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(self._writer.run(stop))
                tasks.create_task(self.resync.run(stop))
                if self.shard is not None:
                    tasks.create_task(self.shard.run(stop))
                if whole is not None:
                    tasks.create_task(whole.run(stop, leader.leading, kv, nc))
                tasks.create_task(policy_source.run(stop))
                tasks.create_task(leader.run(stop))
                if self.watcher is not None:
                    tasks.create_task(self.watcher.run(stop))
                if kube is not None:
                    tasks.create_task(self._audit_nvidia_policy(kube, stop))
                tasks.create_task(self.reconciler.run(stop))
                tasks.create_task(self.alerts.run(stop))
                tasks.create_task(self.validations.run(stop))
        finally:
            self.ready.clear()
            if runner is not None:
                await runner.cleanup()
            if self._nc is not None and not self._nc.is_closed:
                try:
                    await self._nc.drain()
                except (TimeoutError, NatsError, OSError):
                    await self._nc.close()
            if self._kube is not None:
                await self._kube.close()
            if embedded is not None:
                await asyncio.to_thread(embedded.close)
            if self.settings.ready_file is not None:
                self.settings.ready_file.unlink(missing_ok=True)

    async def _connect(self, stop: asyncio.Event) -> NatsClient | None:
        assert self.nats_url is not None
        connected = self.metrics.nats_connected

        async def up() -> None:
            connected.set(1)
            log.info("reconnected to NATS")
            self._ask_resync("reconnect")  # whatever arrived while cut off is lost

        async def down() -> None:
            connected.set(0)
            log.warning("disconnected from NATS")

        async def error(exc: Exception) -> None:
            if isinstance(exc, SlowConsumerError):
                self._ask_resync("slow-consumer")  # nats-py dropped messages itself
            log.warning("NATS error: %s", exc)

        while not stop.is_set():
            try:
                self._nc = await nats.connect(
                    self.nats_url,
                    name="nicfleet-aggregator",
                    reconnect_time_wait=0.25,
                    max_reconnect_attempts=-1,
                    reconnected_cb=up,
                    disconnected_cb=down,
                    error_cb=error,
                    **connect_options(self.settings.nats_security),
                )
                connected.set(1)
                return self._nc
            except (TimeoutError, OSError, NatsError) as exc:
                log.warning("cannot connect to NATS at %s: %s; retrying", self.nats_url, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=0.5)
        return None

    def _advertised_api_url(self) -> str | None:
        """The API URL peers forward node requests to (sharded): `shards.advertise_url`,
        else the bound one — with a wildcard listen address, this host's address."""
        if self.settings.shards.advertise_url or self.api_url is None:
            return self.settings.shards.advertise_url or self.api_url
        if self.settings.listen_host not in ("", "0.0.0.0", "::"):
            return self.api_url
        if self._advertised is None:
            try:  # in a pod, the hostname resolves to the pod IP (/etc/hosts)
                address = socket.gethostbyname(socket.gethostname())
            except OSError:
                address = "127.0.0.1"
            port = self.api_url.rsplit(":", 1)[1]
            self._advertised = f"http://{_url_host(address)}:{port}"
        return self._advertised

    def _ask_resync(self, reason: ResyncReason) -> None:
        """Every agent, or (sharded) only the agents of the partitions held here."""
        if self.resync is None:
            return
        if self.shard is None:
            self.resync.request(reason)
        elif self.shard.held:
            self.resync.request_partitions(self.shard.held, self.settings.shards.partitions)

    async def _audit_nvidia_policy(self, kube: KubeClient, stop: asyncio.Event) -> None:
        """Re-read `nic-cluster-policy` (never written) and audit it against the fleet."""
        while not stop.is_set():
            try:
                obj = await kube.read_nic_cluster_policy()
            except KubeError as exc:
                log.debug("NicClusterPolicy not readable: %s", exc)
            else:
                found = audit_nic_cluster_policy(obj, self.fleet.view()) if obj else ()
                if found != self.nvidia_findings:
                    self.nvidia_findings = found
                    self.changes.publish("_fleet", "nvidia-policy")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.settings.nvidia_audit_interval)

    def _observed_generation(self, policy: str) -> int | None:
        if self.watcher is None:
            return None
        found = self.watcher.policy_objects().get(policy)
        return found.generation if found is not None else None

    def _current_policies(self) -> tuple[Policy, ...]:
        if self._policy_source is None:
            return self.settings.policies
        return self._policy_source.current().policies

    async def _start_api(self, cluster: Callable[[], ClusterView]) -> web.AppRunner:
        reconciler = self.reconciler
        app = build_app(
            fleet=self.fleet,
            settings=ApiSettings(stale_after=self.settings.stale_after),
            readiness=self.readiness,
            clock=self.clock,
            metrics=self.metrics.registry,
            policies=self.settings.policies,
            cluster_source=cluster,
            policy_source=self._current_policies,
            policy_report=reconciler.latest if reconciler is not None else None,
            auth=self.settings.api_auth,
            token_review=self._token_reviewer(),
            latest_validation=self.validations.store.latest_for if self.validations else None,
        )
        if self.alerts is not None:
            add_alert_routes(app, engine=self.alerts)
        if self.validations is not None:
            add_validation_routes(app, runner=self.validations, fleet=self.fleet, cluster=cluster)
        add_ui_routes(app)  # the status page at /ui/ (open: it holds no data)
        if self.shard is not None:  # sharded: who holds what, forwarding (docs/scaling.md)
            add_shard_routes(app, self.shard, self.fleet, self._computed)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, self.settings.listen_host, self.settings.listen_port)
        await site.start()
        host, port = _bound_address(site)
        self.api_url = f"http://{_url_host(host)}:{port}"
        log.info("API listening on %s", self.api_url)
        return runner

    def _validation_template(self) -> dict[str, Any] | None:
        try:
            return load_template(self.settings.validation_template)
        except StoreError as exc:
            log.warning("pair validations off: %s", exc)
            return None

    def _token_reviewer(self) -> TokenReviewer | None:
        review = self.settings.api_token_review
        if review is None:
            return None
        if self._kube is None:
            raise SettingsError("API TokenReview needs a Kubernetes API server (settings.kube)")
        self.token_reviewer = TokenReviewer(self._kube.review_token, review, clock=time.monotonic)
        return self.token_reviewer

    def _firing_alerts(self) -> list[Alert]:
        """For /metrics: only the leader runs the alert lifecycle (sharded: each replica
        for its own nodes, the leader also for fleet-level alerts)."""
        if self.alerts is not None and self.shard is not None:
            return self.alerts.firing()
        if self.alerts is None or self.leader is None or not self.leader.is_leader:
            return []
        return self.alerts.firing()

    def _findings(self) -> tuple[Finding, ...]:
        return self.alerts.findings if self.alerts is not None else ()

    def _write_ready_file(self) -> None:
        path = self.settings.ready_file
        if path is None:
            return
        tmp = path.with_name(path.name + ".tmp")
        doc = {"api_url": self.api_url, "nats_url": self.nats_url, "pid": os.getpid()}
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)


async def _no_nodes() -> AsyncIterator[StoredNode]:
    return
    yield  # an empty async generator (a sharded replica loads its partitions' nodes)


def _no_cluster() -> ClusterView:
    return NO_CLUSTER


def _bound_address(site: web.TCPSite) -> tuple[str, int]:
    server = site._server  # aiohttp exposes the asyncio.Server only here
    sockets = getattr(server, "sockets", None) or ()
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        return str(host), int(port)
    raise StoreError("API server has no listening socket")


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
