"""The aggregator process: owns NATS (embedded or remote), the fleet, storage and the API.

Start order (docs/architecture.md): embedded nats-server (when no URL is given) → NATS
connection → KV bucket → fleet rebuilt from KV (or, sharded, partitions taken) → policies,
leader election, reconciler, alerts, validations → HTTP API → ready file. Every resource is
entered into one AsyncExitStack, so stopping (or a failed start) closes them in reverse.
All long-running work lives in one TaskGroup; `stop` ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from aiohttp import web
from nats.aio.client import Client as NatsClient

from aggregator.alerts.engine import AlertEngine, Evaluate
from aggregator.alerts.wiring import AlertWiring
from aggregator.api.alerts import add_alert_routes
from aggregator.api.app import ApiSettings, build_app
from aggregator.api.auth import ApiAuth
from aggregator.api.limits import HttpLimits, HttpLimitSettings
from aggregator.api.statuspage import add_ui_routes
from aggregator.api.tokenreview import ReviewSettings, TokenReviewer
from aggregator.api.validations import add_validation_routes
from aggregator.bus.calloutservice import CalloutSettings
from aggregator.bus.claimanswer import ClaimFeed
from aggregator.bus.desiredanswer import DesiredFeed
from aggregator.bus.natsserver import NatsServerSettings
from aggregator.bus.resyncrequest import ResyncRequester, ResyncRequestSettings
from aggregator.dra.claims import ClaimIndex
from aggregator.dra.publisher import PublishSettings, SlicePublisher
from aggregator.errors import KubeError
from aggregator.fleet.changefeed import ChangeFeed
from aggregator.fleet.ingest import Ingest
from aggregator.fleet.state import Fleet
from aggregator.fleet.store import SnapshotWriter, ensure_buckets, open_bucket
from aggregator.fleet.views import nodes_by_state
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClaimWatcher, WatchSettings
from aggregator.metrics import Metrics
from aggregator.reconcile.apply import ConfigStore, open_config_bucket
from aggregator.reconcile.loop import Reconciler, ReconcileSettings
from aggregator.reconcile.nvidia import audit_nic_cluster_policy
from aggregator.replicas.leader import LEADER_BUCKET, LeaderElector, LeaderSettings
from aggregator.replicas.partitions import ShardSettings
from aggregator.rules.finding import Finding
from aggregator.runtime import parts
from aggregator.runtime.parts import Bus, Cluster, Runtime, ServiceNotStarted
from aggregator.runtime.strategy import AlertWires, Intake, advertised_api_url, choose_replica
from aggregator.validations.record import ValidationSettings
from aggregator.validations.runner import (
    KV_VALIDATIONS,
    TEMPLATE,
    ValidationRunner,
)
from proto import subjects
from proto.messages.alerts import Alert
from proto.messages.control import ResyncReason
from proto.policy import Policy
from proto.runtime.natsconnect import NO_SECURITY, NatsClientSecurity

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
    resync: ResyncRequestSettings = field(default_factory=ResyncRequestSettings)
    # --partitions: one replica of a sharded aggregator (docs/scaling.md); 0: all nodes here.
    shards: ShardSettings = field(default_factory=ShardSettings)
    # The HTTP API's bounds against hostile clients (--http-*, docs/security.md).
    http: HttpLimitSettings = field(default_factory=HttpLimitSettings)
    # --nats-callout-*: agents join NATS by ServiceAccount token (needs `kube`).
    nats_callout: CalloutSettings | None = None
    # --dra-publish: the leader writes every node's rdma.nicfleet.io ResourceSlices (needs
    # `kube`; docs/dra.md "Who publishes the ResourceSlices"). Off: none are written.
    dra_publish: bool = False
    # The cluster lists' periods and retries (pods, DRA objects: listed every pods_every_s).
    watch: WatchSettings = field(default_factory=WatchSettings)


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
        self.http_limits = HttpLimits.create(settings.http, self.metrics.registry)
        self.fleet = Fleet()
        self.ready = asyncio.Event()
        # Every accepted node message is announced here; loops that react to the fleet
        # (rules, reconcile) subscribe instead of polling.
        self.changes = ChangeFeed()
        self._rules = rules
        # Read-only audit of an NVIDIA Network Operator NicClusterPolicy, when one exists.
        self.nvidia_findings: tuple[Finding, ...] = ()
        self._runtime: Runtime | None = None  # `runtime`: published once the API is up
        self._startup = "not connected to NATS"  # the readiness reason until then
        # In a pod, the hostname resolves to the pod IP (/etc/hosts); looked up once.
        self._host_address = functools.cache(parts.this_host_address)
        self.metrics.watch_fleet(
            lambda: nodes_by_state(self.fleet, clock(), settings.stale_after),
            alerts=self._firing_alerts,
            findings=self._findings,
        )

    @property
    def runtime(self) -> Runtime:
        """What `run` opened, from `ready` on (kept after stop, for inspection);
        ServiceNotStarted before."""
        if self._runtime is None:
            raise ServiceNotStarted("the aggregator is not started yet: await `ready` first")
        return self._runtime

    @property
    def api_url(self) -> str:
        return self.runtime.api_url

    @property
    def leader(self) -> LeaderElector:
        return self.runtime.leader

    @property
    def alerts(self) -> AlertEngine:
        return self.runtime.alerts

    @property
    def reconciler(self) -> Reconciler:
        return self.runtime.reconciler

    @property
    def resync(self) -> ResyncRequester:
        return self.runtime.bus.resync

    @property
    def token_reviewer(self) -> TokenReviewer | None:
        return self.runtime.token_reviewer

    def readiness(self) -> tuple[bool, str]:
        if self._runtime is None:
            return False, self._startup
        bus = self._runtime.bus
        if not bus.nc.is_connected:
            return False, "not connected to NATS"
        if not bus.writer.healthy:
            return False, bus.writer.last_error or "KV writes failing"
        return True, "ok"

    async def run(self, stop: asyncio.Event) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(self._remove_ready_file)  # last out: after the nats-server
            bus = await self._open_bus(stack, stop)
            if bus is None:
                return  # stopped before NATS answered
            runtime = await self._open(stack, bus)
            self._runtime = runtime
            self._write_ready_file(runtime)
            stack.callback(self.ready.clear)  # first out
            self.ready.set()
            async with asyncio.TaskGroup() as tasks:
                self._start_tasks(runtime, tasks, stop)

    async def _open_bus(self, stack: contextlib.AsyncExitStack, stop: asyncio.Event) -> Bus | None:
        settings = self.settings
        url = settings.nats_url
        if url is None:  # start our own
            embedded = NatsServerSettings(
                store_dir=settings.nats_store_dir, config_file=settings.nats_server_config
            )
            url = await parts.start_embedded(stack, embedded)
        nc = await parts.connect(
            url, settings.nats_security, stop=stop,
            connected=self.metrics.nats_connected, ask_resync=self._ask_resync,
        )  # fmt: skip
        if nc is None:
            return None
        parts.closing(stack, "NATS connection", functools.partial(parts.close_nats, nc))
        self._startup = "fleet not yet rebuilt from KV"
        if settings.kv_replicas > 1:  # one copy: the openers below create them
            await ensure_buckets(nc.jetstream(), KV_BUCKETS, replicas=settings.kv_replicas)
        kv = await open_bucket(nc.jetstream())
        writer = SnapshotWriter(kv, self.metrics)
        ingest = Ingest(
            fleet=self.fleet,
            metrics=self.metrics,
            clock=self.clock,
            on_snapshot=writer.submit,
            on_change=self.changes.publish,
        )
        resync = ResyncRequester(
            nc, settings.resync, nodes=lambda: len(self.fleet), clock=self.clock
        )
        return Bus(nats_url=url, nc=nc, nodes_kv=kv, writer=writer, ingest=ingest, resync=resync)

    async def _open(self, stack: contextlib.AsyncExitStack, bus: Bus) -> Runtime:
        settings, nc = self.settings, bus.nc
        replica = await choose_replica(settings.shards).open(
            Intake(
                nc=nc, nodes_kv=bus.nodes_kv, fleet=self.fleet, ingest=bus.ingest,
                resync=bus.resync, changes=self.changes, shards=settings.shards,
                identity=settings.identity, stale_after=settings.stale_after, clock=self.clock,
                extra=lambda: self.nvidia_findings, api_url=self._advertised_api_url,
            )
        )  # fmt: skip
        config_kv = await open_config_bucket(nc.jetstream())
        desired = DesiredFeed(nc, config_kv, registry=self.metrics.registry)
        await desired.open()  # before ready: an agent's request is answered from then on
        parts.closing(stack, "desired-config answers", desired.close)
        config_store = ConfigStore(config_kv, announce=desired.announce)
        cluster = await parts.open_cluster(
            stack, nc, settings.kube, policy_file=settings.policy_file,
            policies=settings.policies, policy_watch_interval=settings.policy_watch_interval,
            leader_ttl=settings.leader_ttl, watch=settings.watch,
        )  # fmt: skip
        leader = LeaderElector(
            cluster.lease, LeaderSettings(identity=settings.identity, ttl_s=settings.leader_ttl)
        )
        writes = replica.writes(leader)
        reconciler = Reconciler(
            ReconcileSettings(stale_after=settings.stale_after, tick=settings.reconcile_tick),
            fleet=replica.planned, changes=self.changes.subscribe(), policies=cluster.policies,
            store=config_store, kube=cluster.kube, cluster=cluster.view, is_leader=writes,
            observed_generation=functools.partial(parts.observed_generation, cluster.watcher),
            clock=self.clock, observer=self.metrics,
        )  # fmt: skip
        alerts, computed = await replica.open_alerts(
            AlertWires(
                nc=nc, fleet=self.fleet, changes=self.changes,
                policies=lambda: cluster.policies.current().policies, cluster=cluster.view,
                registry=self.metrics.registry, clock=self.clock, wiring=settings.alerts,
                rules=self._rules, kube=cluster.kube, extra=lambda: self.nvidia_findings,
                leader=leader, writes=writes,
            )
        )  # fmt: skip
        validations = await parts.open_validations(
            nc, cluster.kube, settings.kube, settings.validation, settings.validation_template,
            identity=settings.identity, clock=self.clock, registry=self.metrics.registry,
        )  # fmt: skip
        reviewer = parts.token_reviewer(cluster.kube, settings.api_token_review)
        app = self._build_app(cluster, reconciler, alerts, validations, reviewer)
        replica.add_routes(app, self.fleet, computed)
        api_url = await parts.start_api(
            stack, app, settings.listen_host, settings.listen_port, self.http_limits
        )
        return Runtime(
            bus=bus, replica=replica, cluster=cluster, leader=leader, reconciler=reconciler,
            alerts=alerts, validations=validations, token_reviewer=reviewer, api_url=api_url,
            desired=desired,
        )  # fmt: skip

    def _slice_publisher(self, runtime: Runtime) -> SlicePublisher:
        cluster, fleet = runtime.cluster, runtime.replica.planned
        watcher = cluster.watcher
        assert cluster.kube is not None

        def cluster_nodes() -> dict[str, str | None] | None:  # None until the Node list is in
            if watcher is None or not watcher.nodes_synced.is_set():
                return None
            return {name: node.uid for name, node in cluster.view().nodes.items()}

        return SlicePublisher(
            PublishSettings(stale_after=self.settings.stale_after),
            api=cluster.kube, changes=self.changes.subscribe(), records=fleet.view,
            cluster_nodes=cluster_nodes, is_leader=runtime.replica.writes(runtime.leader),
            clock=self.clock, registry=self.metrics.registry,
        )  # fmt: skip

    def _build_app(
        self,
        cluster: Cluster,
        reconciler: Reconciler,
        alerts: AlertEngine,
        validations: ValidationRunner,
        reviewer: TokenReviewer | None,
    ) -> web.Application:
        policies = cluster.policies
        app = build_app(
            fleet=self.fleet,
            settings=ApiSettings(stale_after=self.settings.stale_after),
            readiness=self.readiness,
            clock=self.clock,
            metrics=self.metrics.registry,
            policies=self.settings.policies,
            cluster_source=cluster.view,
            policy_source=lambda: policies.current().policies,
            policy_report=reconciler.latest,
            auth=self.settings.api_auth,
            token_review=reviewer,
            latest_validation=validations.store.latest_for,
            limits=self.http_limits,
        )
        add_alert_routes(app, engine=alerts, limits=self.http_limits)
        add_validation_routes(app, runner=validations, fleet=self.fleet, cluster=cluster.view)
        add_ui_routes(app)  # the status page at /ui/ (open: it holds no data)
        return app

    def _start_tasks(self, runtime: Runtime, tasks: asyncio.TaskGroup, stop: asyncio.Event) -> None:
        cluster = runtime.cluster
        tasks.create_task(runtime.bus.writer.run(stop))
        tasks.create_task(runtime.bus.resync.run(stop))
        tasks.create_task(runtime.desired.run(stop))
        runtime.replica.start(tasks, stop, runtime.leader)  # sharded: owner, whole fleet
        tasks.create_task(cluster.policies.run(stop))
        tasks.create_task(runtime.leader.run(stop))
        if cluster.watcher is not None:
            tasks.create_task(cluster.watcher.run(stop))
        if cluster.kube is not None:
            tasks.create_task(self._audit_nvidia_policy(cluster.kube, stop))
            tasks.create_task(self._answer_claims(runtime.bus.nc, cluster.kube, stop))
        tasks.create_task(runtime.reconciler.run(stop))
        if self.settings.dra_publish and cluster.kube is not None:
            tasks.create_task(self._slice_publisher(runtime).run(stop))
        tasks.create_task(runtime.alerts.run(stop))
        tasks.create_task(runtime.validations.run(stop))
        if (callout := self.settings.nats_callout) is not None:
            responder = parts.callout_responder(
                cluster.kube, callout, registry=self.metrics.registry
            )
            security = replace(
                self.settings.nats_security, nkey_seed_file=callout.security.nkey_seed_file,
                user=None, password_file=None, token_file=None,
            )  # fmt: skip
            tasks.create_task(
                parts.serve_auth_callout(runtime.bus.nats_url, responder, security, stop=stop)
            )

    def _advertised_api_url(self) -> str | None:
        """The API URL in the shard heartbeat (`advertise_url` alone until the API is up)."""
        bound = self._runtime.api_url if self._runtime is not None else None
        shards = self.settings.shards
        return advertised_api_url(shards, self.settings.listen_host, bound, self._host_address)

    def _ask_resync(self, reason: ResyncReason) -> None:
        """Every agent, or (sharded) only the agents of the partitions held here. Until the
        runtime is up the start request is still pending (it covers a reconnect)."""
        if self._runtime is not None:
            self._runtime.replica.ask_resync(reason)

    async def _answer_claims(self, nc: NatsClient, kube: KubeClient, stop: asyncio.Event) -> None:
        """The DRA plugins' claim requests, from watched ResourceClaims (docs/dra.md,
        "Prepare"); a cluster without resource.k8s.io/v1 only logs and retries."""
        index = ClaimIndex()
        feed = ClaimFeed(nc, index, registry=self.metrics.registry)
        await feed.open()
        try:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(ClaimWatcher(kube, index).run(stop))
                tasks.create_task(feed.run(stop))
        finally:
            await feed.close()

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

    def _firing_alerts(self) -> list[Alert]:
        """For /metrics: only the leader runs the alert lifecycle (sharded: each replica
        for its own nodes, the leader also for fleet-level alerts)."""
        runtime = self._runtime
        return runtime.replica.firing(runtime.alerts, runtime.leader) if runtime else []

    def _findings(self) -> tuple[Finding, ...]:
        return self._runtime.alerts.findings if self._runtime is not None else ()

    def _write_ready_file(self, runtime: Runtime) -> None:
        path = self.settings.ready_file
        if path is None:
            return
        tmp = path.with_name(path.name + ".tmp")
        doc = {"api_url": runtime.api_url, "nats_url": runtime.bus.nats_url, "pid": os.getpid()}
        tmp.write_text(json.dumps(doc))
        tmp.replace(path)

    def _remove_ready_file(self) -> None:
        if self.settings.ready_file is not None:
            self.settings.ready_file.unlink(missing_ok=True)
