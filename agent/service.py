"""The agent process: owns its tasks, the stop event and the order of things.

Snapshots on start, reconnect, change and every `inventory_interval`; counter batches
at a fixed interval (deltas between periodic full ones); link events as netlink or the
port poll see changes. Readers read, pure modules decide, `publisher` sends; this module
only schedules.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from agent import __version__
from agent.bus.desired import DesiredConfigWatcher, DesiredSettings
from agent.bus.publisher import Publisher, PublishStats
from agent.bus.republish import RepublishControl
from agent.bus.republishpacing import RepublishPolicy
from agent.counters.deltas import DEFAULT_FULL_EVERY, DeltaEncoder
from agent.counters.rates import with_rates
from agent.counters.reader import CounterReader
from agent.deviceplugin.advertised import AdvertisedResources, DevicePluginSettings
from agent.deviceplugin.configsource import ConfigSources, Served, config_sources
from agent.deviceplugin.liveconfig import LiveConfig
from agent.dra.claimsnats import NatsClaims
from agent.dra.pluginrunner import DraPlugin, DraSettings
from agent.errors import CollectionTimeout
from agent.host.inventory import collect_snapshot
from agent.host.portstates import PortStateReader
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from agent.host.verbs import probe_verbs
from agent.links.follower import NetdevFollower
from agent.links.netdevs import NetdevChanges, NetdevPorts, netdev_ports
from agent.links.portdiff import PortStates
from agent.links.portpoll import PortPoll
from agent.metrics.collector import MetricsServer, agent_registry
from proto.codec import encode
from proto.compact import inventory_only
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.runtime.natsconnect import NO_SECURITY, NatsClientSecurity

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    node_name: str
    sysfs_root: Path
    nats_url: str
    proc_root: Path | None = None  # kernel command line and release; None: not read
    counter_interval: float = 1.0
    # Counter batches between two full ones; the others are deltas (agent.counters.deltas).
    # 1: every batch is full (for aggregators older than counter deltas).
    counter_full_every: int = DEFAULT_FULL_EVERY
    # Port state files have no change notification; a dozen small reads every 100 ms
    # catch a port flip long before the next counter batch would.
    state_poll_interval: float = 0.1
    # Full inventory re-read (and snapshot publish) when no event asked for one.
    inventory_interval: float = 300.0
    netlink: bool = True
    netns: str | None = None  # watch links in this network namespace (tests, labs)
    netlink_retry: float = 1.0  # first wait before re-opening a lost netlink socket
    verbs: bool = False  # probe libibverbs once at start for Platform.verbs
    verbs_path: Path | None = None  # directory holding the pyverbs package
    # The kubelet device plugin runs when a config file is given; the file is re-read
    # when it changes (checked every `config_watch_interval`) and applied live.
    device_plugin_config: Path | None = None
    device_plugin: DevicePluginSettings = field(default_factory=DevicePluginSettings)
    config_watch_interval: float = 1.0
    # The device plugin also runs without a file when asked to (`--device-plugin`): the
    # aggregator then provides its config through KV nicfleet-config (`desired_config`).
    # A desired config, once present, wins over the file; see docs/reconcile.md.
    device_plugin_enabled: bool = False
    desired_config: bool = True
    desired: DesiredSettings = field(default_factory=DesiredSettings)
    # NKey seed / user and TLS for both NATS connections (publisher, desired config).
    nats_security: NatsClientSecurity = NO_SECURITY
    metrics_addr: tuple[str, int] | None = None  # serve /metrics on (host, port); None: off
    # Answers to the aggregator's resync requests: random delay, at most one per interval.
    republish: RepublishPolicy = field(default_factory=RepublishPolicy)
    dra: DraSettings | None = None  # the DRA kubelet plugin (`--dra`); None: off


class AgentService:
    def __init__(self, settings: AgentSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._sysfs = Sysfs(settings.sysfs_root)
        self._procfs = None if settings.proc_root is None else Procfs(settings.proc_root)
        self._counters = CounterReader(self._sysfs)
        self._republish_now = asyncio.Event()  # publish a fresh snapshot now
        self._first_snapshot = asyncio.Event()
        # The aggregator's resync requests, answered by a republish.
        self.control = RepublishControl(settings.republish, node=settings.node_name)
        self.epoch = round(clock() * 1e9)  # this process's start (docs/wire.md, "Ordering")
        self._publisher = Publisher(
            node=settings.node_name,
            url=settings.nats_url,
            on_reconnect=self._republish,
            security=settings.nats_security,
            on_control=self.control.handle,
            epoch=self.epoch,
        )
        self._snapshot_seq = 0
        self._counter_seq = 0
        # A delta is sent only when it is smaller on the wire than the (packed) full batch.
        self._deltas = DeltaEncoder(
            full_every=settings.counter_full_every, size=lambda m: len(encode(m))
        )
        self._event_seq = 0
        self._poll_reader = PortStateReader(self._sysfs)
        self._poll = PortPoll(
            self._poll_reader,
            node=settings.node_name,
            interval=settings.state_poll_interval,
            clock=clock,
            last_seq=lambda: self._event_seq,
            on_events=self._on_port_events,
        )
        self._ports: NetdevPorts = {}
        self._netlink = NetdevFollower(
            node=settings.node_name,
            netns=settings.netns,
            retry=settings.netlink_retry,
            clock=clock,
            ports=lambda: self._ports,
            last_seq=lambda: self._event_seq,
            on_changes=self._on_netdev_changes,
        )
        self.netlink_watching = self._netlink.watching  # set once the first link dump is known
        self._verbs: str | None = None
        self._snapshot: NodeSnapshot | None = None
        self.last_counters: CounterBatch | None = None  # the latest full batch (metrics)
        self._status_changed = asyncio.Event()
        self.collect_seconds: dict[str, float] = {}  # last collection's wall time, by kind
        self.sources = _device_plugin_sources(settings)
        self.plugin: AdvertisedResources | None = None
        self._config: LiveConfig | None = None
        self.desired: DesiredConfigWatcher | None = None
        if self.sources.plugin:
            self._wire_device_plugin()
        self.dra: DraPlugin | None = None
        if settings.dra is not None:
            claims = (
                NatsClaims(lambda: self._publisher.client, node=settings.node_name)
                if settings.dra.claims_from == "nats"
                else None  # DraPlugin's ClaimDirectory
            )
            self.dra = DraPlugin(
                settings.dra,
                node=settings.node_name,
                source=claims,
                clock=clock,
                on_change=self._status_changed.set,
            )
        self.metrics: MetricsServer | None = None
        if settings.metrics_addr is not None:
            self.metrics = MetricsServer(agent_registry(self), *settings.metrics_addr)

    def _wire_device_plugin(self) -> None:
        settings = self.settings
        self.plugin = AdvertisedResources(
            settings.device_plugin,
            node=settings.node_name,
            clock=self._clock,
            on_status=lambda _status: self._status_changed.set(),
        )
        self._config = LiveConfig(
            self.plugin, file=self.sources.file, watch_interval=settings.config_watch_interval
        )
        if self.sources.aggregator:
            self.desired = DesiredConfigWatcher(
                node=settings.node_name,
                url=settings.nats_url,
                on_config=self._config.on_desired,
                settings=settings.desired,
                security=settings.nats_security,
            )

    # -- read by agent.metrics.collector at scrape time ---------------------------------------
    @property
    def nats_connected(self) -> bool:
        return self._publisher.connected

    @property
    def publish_stats(self) -> PublishStats:
        return self._publisher.stats

    @property
    def last_snapshot(self) -> NodeSnapshot | None:
        return self._snapshot

    @property
    def port_states(self) -> PortStates | None:
        return self._poll.states

    @property
    def plugin_resources(self) -> tuple[ResourceStatus, ...] | None:
        return self.plugin.status() if self.plugin is not None else None

    @property
    def config_source(self) -> Served | None:
        return self._config.source if self._config is not None else None

    @property
    def configs_applied(self) -> Mapping[str, int]:  # device-plugin configs, by source
        return self._config.applied if self._config is not None else {}

    @property
    def config_errors(self) -> int:  # device-plugin config file versions refused (logged)
        return self._config.errors if self._config is not None else 0

    @property
    def node_name(self) -> str:
        return self.settings.node_name

    @property
    def version(self) -> str:
        return __version__

    async def _republish(self) -> None:
        self._republish_now.set()
        self._deltas.rebase()  # the next counter batch is a full one
        self._status_changed.set()  # the device-plugin status is re-sent too

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._run(stop)
        finally:
            self._counters.close()
            self._poll_reader.close()
            await self._publisher.close()

    async def _run(self, stop: asyncio.Event) -> None:
        if self.settings.verbs:
            self._verbs = await asyncio.to_thread(probe_verbs, search_path=self.settings.verbs_path)
            log.info("verbs probe: %s", self._verbs)
        await self._poll.baseline()
        # Reading and serving the kubelet never wait for NATS: the device plugin must
        # work while the message bus is down; what cannot be published is counted.
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._connect(stop))
            tasks.create_task(self._snapshot_loop(stop))
            tasks.create_task(self._counter_loop(stop))
            tasks.create_task(self._poll.run(stop))
            tasks.create_task(self.control.run(stop, self._republish))
            if self.settings.netlink:
                tasks.create_task(self._netlink.run(stop, self._first_snapshot))
            if self.plugin is not None and self._config is not None:
                log.info("device-plugin config: %s", self.sources.why)
                tasks.create_task(self.plugin.run(stop))
                if self.sources.file is not None:
                    tasks.create_task(self._config.watch_file(stop))
                if self.desired is not None:
                    tasks.create_task(self.desired.run(stop))
            if self.plugin is not None or self.dra is not None:
                tasks.create_task(self._status_loop(stop))
            if self.metrics is not None:
                tasks.create_task(self.metrics.run(stop))
            if self.dra is not None:
                tasks.create_task(self.dra.run(stop))

    async def _connect(self, stop: asyncio.Event) -> None:
        if await self._publisher.connect(stop):
            self._republish_now.set()
            self._status_changed.set()

    async def _status_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _wait_any(stop, self._status_changed, timeout=self.settings.inventory_interval)
            if stop.is_set():
                return
            self._status_changed.clear()
            await self._publisher.publish(self.plugin_status())

    def plugin_status(self) -> DevicePluginStatus:
        """Both kubelet plugins in one message: the device plugin's resources (none when it
        is off) and the DRA plugin's status (None when it is off)."""
        if self.plugin is not None:
            status = self.plugin.plugin_status()
        else:
            status = DevicePluginStatus(node=self.settings.node_name, observed_at=self._clock())
        if self.dra is None:
            return status
        return msgspec.structs.replace(status, dra=self.dra.status())

    def _feed_plugin(self) -> None:
        if self.plugin is not None and self._snapshot is not None:
            self.plugin.update(self._snapshot, self._poll.states or {})
        if self.dra is not None and self._snapshot is not None:
            self.dra.update(self._snapshot, self._poll.states or {})

    async def _snapshot_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _wait_any(stop, self._republish_now, timeout=self.settings.inventory_interval)
            if stop.is_set():
                return
            self._republish_now.clear()
            self._snapshot_seq += 1
            started = time.perf_counter()
            snapshot = await asyncio.to_thread(
                collect_snapshot,
                self._sysfs,
                node=self.settings.node_name,
                seq=self._snapshot_seq,
                now=self._clock(),
                agent_version=__version__,
                procfs=self._procfs,
            )
            self.collect_seconds["snapshot"] = time.perf_counter() - started
            snapshot = with_verbs(snapshot, self._verbs)
            if snapshot.devices or not snapshot.errors:
                # A collection that timed out as a whole has no devices; keep mapping
                # netdevs (and feeding the device plugin) with the last good one.
                self._ports = netdev_ports(snapshot)
                self._snapshot = snapshot
                self._feed_plugin()
            self._first_snapshot.set()
            # Per-port counters travel in counter batches (docs/wire.md, "Snapshot counters").
            await self._publisher.publish(inventory_only(snapshot))

    async def _counter_loop(self, stop: asyncio.Event) -> None:
        previous: CounterBatch | None = None
        stuck = False
        while not stop.is_set():
            started = time.perf_counter()
            try:
                raw = await asyncio.to_thread(
                    self._counters.collect,
                    node=self.settings.node_name,
                    seq=self._counter_seq + 1,
                    now=self._clock(),
                )
            except CollectionTimeout as exc:
                stuck = _log_stuck(stuck, "counter sample", exc)
            else:
                stuck = _log_recovered(stuck, "counter sample")
                self.collect_seconds["counters"] = time.perf_counter() - started
                self._counter_seq += 1
                previous = batch = self.last_counters = with_rates(previous, raw)
                message = self._deltas.encode(batch)
                self._deltas.sent(message, await self._publisher.publish(message))
            await _wait_any(stop, timeout=self.settings.counter_interval)

    async def _on_port_events(self, events: list[LinkEvent]) -> None:
        self._feed_plugin()  # health reaches the kubelet before anything is published
        await self._publish_events(events)
        if any(e.kind != "port-state" for e in events):
            self._counters.rediscover()
        self._republish_now.set()

    async def _on_netdev_changes(self, changes: NetdevChanges) -> None:
        await self._publish_events(changes.events)
        if changes.reread:
            self._poll.reread.set()
            self._republish_now.set()

    async def _publish_events(self, events: Sequence[LinkEvent]) -> None:
        if not events:
            return
        # Claim the numbers before the first await: the other event source may run
        # while this one publishes.
        self._event_seq = events[-1].seq
        for event in events:
            log.info(
                "%s %s/%s %s: %s -> %s",
                event.kind,
                event.device,
                event.port,
                event.netdev or "-",
                event.old_state,
                event.new_state,
                extra={"node": event.node, "device": event.device, "port": event.port},
            )
            await self._publisher.publish(event)


def _device_plugin_sources(settings: AgentSettings) -> ConfigSources:
    return config_sources(
        config_file=settings.device_plugin_config,
        plugin_enabled=settings.device_plugin_enabled,
        desired_config=settings.desired_config,
    )


def with_verbs(snapshot: NodeSnapshot, verbs: str | None) -> NodeSnapshot:
    """Pure: `snapshot` with `platform.verbs` set (the probe runs once per process)."""
    if verbs is None:
        return snapshot
    platform = msgspec.structs.replace(snapshot.platform, verbs=verbs)
    return msgspec.structs.replace(snapshot, platform=platform)


def _log_stuck(stuck: bool, what: str, exc: CollectionTimeout) -> bool:
    if not stuck:
        log.warning("%s keeps blocking in the kernel (%s); retrying", what, exc)
    return True


def _log_recovered(stuck: bool, what: str) -> bool:
    if stuck:
        log.info("%s works again", what)
    return False


async def _wait_any(*events: asyncio.Event, timeout: float) -> None:
    """Wait until any event is set or `timeout` passes (an interruptible sleep)."""
    waiters = [asyncio.create_task(e.wait()) for e in events]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
