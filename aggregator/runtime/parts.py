"""The aggregator's opened parts and how each is opened into the run's AsyncExitStack.

Every opener that makes something to close registers the close on the stack it is given,
so a stop, or a start that fails halfway, closes what was opened in reverse order. The
frozen `Runtime` is assembled only once the API is up; nothing here starts a task.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
from aiohttp import web
from nats.aio.client import Client as NatsClient
from nats.errors import Error as NatsError
from nats.errors import SlowConsumerError
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Gauge

from aggregator.alerts.engine import AlertEngine
from aggregator.api.connections import GuardedSite, log_accept_errors
from aggregator.api.limits import HttpLimits
from aggregator.api.tokenreview import ReviewSettings, TokenReviewer
from aggregator.bus import authcallout
from aggregator.bus.calloutservice import CalloutResponder, CalloutSettings, read_issuer_seed
from aggregator.bus.desiredanswer import DesiredFeed
from aggregator.bus.natsserver import NatsServer, NatsServerSettings
from aggregator.bus.resyncrequest import ResyncRequester
from aggregator.cluster import NO_CLUSTER, ClusterView
from aggregator.errors import AggregatorError, SettingsError, StoreError
from aggregator.fleet.ingest import Ingest
from aggregator.fleet.store import SnapshotWriter
from aggregator.kube.client import KubeClient, KubeSettings
from aggregator.kube.watch import ClusterWatcher, WatchSettings
from aggregator.metrics import JoinMetrics
from aggregator.reconcile.loop import Reconciler
from aggregator.reconcile.policies import ClusterPolicies, FilePolicies, PolicySource
from aggregator.replicas.leader import KubeLease, LeaderElector, LeaseStore, NatsLease
from aggregator.runtime.strategy import Replica, url_host
from aggregator.validations.record import ValidationSettings
from aggregator.validations.runner import ValidationRunner, ValidationStore, load_template
from proto.messages.control import ResyncReason
from proto.policy import Policy
from proto.runtime.natsconnect import NatsClientSecurity, connect_options

log = logging.getLogger(__name__)


class ServiceNotStarted(AggregatorError, RuntimeError):
    """A part of the runtime was read before `AggregatorService.run` built it."""


@dataclass(frozen=True, kw_only=True)
class Bus:
    """NATS, once connected: the nodes bucket, its writer and the node-message intake."""

    nats_url: str
    nc: NatsClient
    nodes_kv: KeyValue
    writer: SnapshotWriter
    ingest: Ingest
    resync: ResyncRequester


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """Where policies, the lease and the cluster view come from: a Kubernetes API server,
    or (without one) the --policy file and a NATS KV lease."""

    kube: KubeClient | None
    watcher: ClusterWatcher | None
    policies: PolicySource
    view: Callable[[], ClusterView]
    lease: LeaseStore


@dataclass(frozen=True, kw_only=True)
class Runtime:
    """Everything `run` opened, once the API is up (closing is the exit stack's job)."""

    bus: Bus
    replica: Replica
    cluster: Cluster
    leader: LeaderElector
    reconciler: Reconciler
    alerts: AlertEngine
    validations: ValidationRunner
    token_reviewer: TokenReviewer | None  # with settings.api_token_review
    api_url: str
    desired: DesiredFeed  # answers agents' desired-config requests


def closing(
    stack: contextlib.AsyncExitStack, what: str, close: Callable[[], Awaitable[Any]]
) -> None:
    """Close `what` when the stack unwinds (in reverse order of entering), and say so."""

    async def closed() -> None:
        await close()
        log.debug("closed %s", what)

    stack.push_async_callback(closed)


async def close_nats(nc: NatsClient) -> None:
    if nc.is_closed:
        return
    try:
        await nc.drain()
    except (TimeoutError, NatsError, OSError):
        await nc.close()


async def start_embedded(stack: contextlib.AsyncExitStack, settings: NatsServerSettings) -> str:
    """Start a nats-server of our own (no --nats-url); its URL."""
    embedded = NatsServer(settings)
    await asyncio.to_thread(embedded.start)
    closing(stack, "embedded nats-server", functools.partial(asyncio.to_thread, embedded.close))
    log.info("embedded nats-server listening on %s", embedded.url)
    return embedded.url


async def open_cluster(
    stack: contextlib.AsyncExitStack,
    nc: NatsClient,
    kube_settings: KubeSettings | None,
    *,
    policy_file: Path | None,
    policies: tuple[Policy, ...],
    policy_watch_interval: float,
    leader_ttl: float,
    watch: WatchSettings,
) -> Cluster:
    if kube_settings is None:
        return Cluster(
            kube=None,
            watcher=None,
            policies=FilePolicies(policy_file, policies, interval=policy_watch_interval),
            view=no_cluster,
            lease=await NatsLease.open(nc.jetstream(), leader_ttl),
        )
    kube = await KubeClient.connect(kube_settings)
    closing(stack, "Kubernetes client", kube.close)
    watcher = ClusterWatcher(kube, watch)
    return Cluster(
        kube=kube,
        watcher=watcher,
        policies=ClusterPolicies(watcher),
        view=watcher.cluster_view,
        lease=KubeLease(kube, leader_ttl),
    )


async def start_api(
    stack: contextlib.AsyncExitStack,
    app: web.Application,
    host: str,
    port: int,
    limits: HttpLimits,
) -> str:
    """Serve `app` on host:port (0: any free port) within `limits`; the bound URL."""
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=limits.keepalive_timeout)
    await runner.setup()
    closing(stack, "API", runner.cleanup)
    stack.callback(
        log_accept_errors(
            asyncio.get_running_loop(), interval=limits.settings.accept_log_interval,
            metrics=limits.metrics, guard=limits.connections,
        )
    )  # fmt: skip
    site = GuardedSite(runner, host, port, limits.connections)
    await site.start()
    bound_host, bound_port = site.bound()
    api_url = f"http://{url_host(bound_host)}:{bound_port}"
    log.info("API listening on %s", api_url)
    return api_url


async def connect(
    url: str,
    security: NatsClientSecurity,
    *,
    stop: asyncio.Event,
    connected: Gauge,
    ask_resync: Callable[[ResyncReason], None],
) -> NatsClient | None:
    """Connect, retrying until `stop`; None if stopped first. A reconnect or messages
    nats-py dropped ask the agents for a resync (`ask_resync`)."""

    async def up() -> None:
        connected.set(1)
        log.info("reconnected to NATS")
        ask_resync("reconnect")  # whatever arrived while cut off is lost

    async def down() -> None:
        connected.set(0)
        log.warning("disconnected from NATS")

    async def error(exc: Exception) -> None:
        if isinstance(exc, SlowConsumerError):
            ask_resync("slow-consumer")  # nats-py dropped messages itself
        log.warning("NATS error: %s", exc)

    while not stop.is_set():
        try:
            nc = await nats.connect(
                url,
                name="nicfleet-aggregator",
                reconnect_time_wait=0.25,
                max_reconnect_attempts=-1,
                reconnected_cb=up,
                disconnected_cb=down,
                error_cb=error,
                **connect_options(security),
            )
            connected.set(1)
            return nc
        except (TimeoutError, OSError, NatsError) as exc:
            log.warning("cannot connect to NATS at %s: %s; retrying", url, exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
    return None


async def open_validations(
    nc: NatsClient,
    kube: KubeClient | None,
    kube_settings: KubeSettings | None,
    settings: ValidationSettings,
    template: Path,
    *,
    identity: str,
    clock: Callable[[], float],
    registry: CollectorRegistry,
) -> ValidationRunner:
    return ValidationRunner(
        kube=kube,
        namespace=kube_settings.validation_namespace if kube_settings else "",
        nc=nc,
        store=await ValidationStore.open(nc, keep=settings.keep),
        settings=settings,
        # Pods are made only with a cluster and a template; else POST answers 503.
        template=validation_template(template) if kube else None,
        identity=identity,
        clock=clock,
        registry=registry,
    )


def token_reviewer(kube: KubeClient | None, review: ReviewSettings | None) -> TokenReviewer | None:
    if review is None:
        return None
    if kube is None:
        raise SettingsError("API TokenReview needs a Kubernetes API server (settings.kube)")
    return TokenReviewer(kube.review_token, review, clock=time.monotonic)


def callout_responder(
    kube: KubeClient | None, settings: CalloutSettings, *, registry: CollectorRegistry
) -> CalloutResponder:
    """The auth-callout responder, reviewing agent tokens with this cluster's TokenReview."""
    if kube is None:
        raise SettingsError("the NATS auth callout needs a Kubernetes API server (settings.kube)")
    metrics = JoinMetrics.create(registry)

    async def review(token: str, audiences: tuple[str, ...]) -> authcallout.Reviewed:
        result = await kube.review_token(token, audiences)
        return authcallout.Reviewed(
            authenticated=result.authenticated, username=result.username,
            audiences=result.audiences, extra=result.extra, error=result.error,
        )  # fmt: skip

    return CalloutResponder(
        settings=settings.join,
        review=review,
        issuer_seed=read_issuer_seed(settings.issuer_seed_file),
        wall_clock=time.time,
        on_decision=lambda decision: metrics.record(*authcallout.outcome_labels(decision)),
    )


async def serve_auth_callout(
    url: str,
    responder: CalloutResponder,
    security: NatsClientSecurity,
    *,
    stop: asyncio.Event,
) -> None:
    """Answer the server's auth callout on a connection of its own (the callout user's
    permissions, this process's TLS) until `stop`; established agents outlive it."""
    nc = await nats.connect(
        url,
        name="nicfleet-auth-callout",
        reconnect_time_wait=0.25,
        max_reconnect_attempts=-1,
        **connect_options(security),
    )
    log.info("answering the NATS auth callout (agents join by ServiceAccount token)")
    try:
        await responder.serve(nc, stop)
    finally:
        await close_nats(nc)


def validation_template(path: Path) -> dict[str, Any] | None:
    try:
        return load_template(path)
    except StoreError as exc:
        log.warning("pair validations off: %s", exc)
        return None


def observed_generation(watcher: ClusterWatcher | None, policy: str) -> int | None:
    if watcher is None:
        return None
    found = watcher.policy_objects().get(policy)
    return found.generation if found is not None else None


def this_host_address() -> str:
    """In a pod, the hostname resolves to the pod IP (/etc/hosts)."""
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def no_cluster() -> ClusterView:
    return NO_CLUSTER
