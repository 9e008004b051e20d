"""The agent process: owns its tasks, the stop event and the order of things.

Snapshots on start, reconnect, change and every `inventory_interval`; counter batches
at a fixed interval (deltas between periodic full ones); link events as netlink or the
port poll see changes. Readers read, pure modules decide, `publisher` sends; this module
only schedules.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from agent import __version__
from agent.bus.desired import DesiredConfigWatcher, DesiredSettings
from agent.bus.publisher import Publisher, PublishStats
from agent.bus.resync import ResyncControl
from agent.bus.resyncpacing import ResyncPolicy
from agent.counters.deltas import DEFAULT_FULL_EVERY, DeltaEncoder
from agent.counters.rates import with_rates
from agent.counters.reader import CounterReader
from agent.deviceplugin.manager import DevicePluginManager, DevicePluginSettings
from agent.errors import CollectionTimeout
from agent.host.inventory import collect_snapshot
from agent.host.portstates import PortStateReader
from agent.host.sysfs import Sysfs
from agent.host.verbs import probe_verbs
from agent.links.netdevs import (
    NetdevPorts,
    Netdevs,
    diff_netdevs,
    netdev_ports,
    netdevs_from_dump,
    update_netdevs,
)
from agent.links.netlink import NetlinkUnavailable, NetlinkWatcher
from agent.links.portdiff import PortStates, diff_port_states
from agent.metrics.collector import MetricsServer, agent_registry
from proto.codec import encode
from proto.compact import inventory_only
from proto.dpconfig import ConfigError, parse_device_plugin_config
from proto.inventory import NodeSnapshot
from proto.messages.config import DesiredConfig, DevicePluginConfig
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
    resync: ResyncPolicy = field(default_factory=ResyncPolicy)


class AgentService:
    def __init__(self, settings: AgentSettings, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._sysfs = Sysfs(settings.sysfs_root)
        self._counters = CounterReader(self._sysfs)
        self._port_states = PortStateReader(self._sysfs)
        self._resync = asyncio.Event()  # publish a fresh snapshot now
        self._reread = asyncio.Event()  # poll port states now
        self._first_snapshot = asyncio.Event()
        self.netlink_watching = asyncio.Event()  # set once the first link dump is known
        self.control = ResyncControl(settings.resync, node=settings.node_name)  # resyncs asked
        self._publisher = Publisher(
            node=settings.node_name,
            url=settings.nats_url,
            on_reconnect=self._request_resync,
            security=settings.nats_security,
            on_control=self.control.handle,
        )
        self._snapshot_seq = 0
        self._counter_seq = 0
        # A delta is sent only when it is smaller on the wire than the (packed) full batch.
        self._deltas = DeltaEncoder(
            full_every=settings.counter_full_every, size=lambda m: len(encode(m))
        )
        self._event_seq = 0
        self._states: PortStates | None = None  # None: no poll has succeeded yet
        self._netdevs: Netdevs = {}
        self._ports: NetdevPorts = {}
        self._verbs: str | None = None
        self._snapshot: NodeSnapshot | None = None
        self.last_counters: CounterBatch | None = None  # the latest full batch (metrics)
        self._status_changed = asyncio.Event()
        self.plugin: DevicePluginManager | None = None
        self.config_errors = 0  # device-plugin config versions refused (logged)
        self._file_config: tuple[DevicePluginConfig, int] | None = None
        self._desired: DesiredConfig | None = None
        self._applied: tuple[DevicePluginConfig, int] | None = None
        self.config_source: str | None = None  # "file" | "aggregator" | None (nothing yet)
        self.desired: DesiredConfigWatcher | None = None
        # Read by agent.metrics.collector at scrape time.
        self.configs_applied: dict[str, int] = {}  # device-plugin configs applied, by source
        self.collect_seconds: dict[str, float] = {}  # last collection's wall time, by kind
        self.metrics: MetricsServer | None = None
        if settings.metrics_addr is not None:
            self.metrics = MetricsServer(agent_registry(self), *settings.metrics_addr)
        if settings.device_plugin_config is not None or settings.device_plugin_enabled:
            self.plugin = DevicePluginManager(
                settings.device_plugin,
                node=settings.node_name,
                clock=clock,
                on_status=lambda _status: self._status_changed.set(),
            )
            if settings.desired_config:
                self.desired = DesiredConfigWatcher(
                    node=settings.node_name,
                    url=settings.nats_url,
                    on_config=self._on_desired,
                    settings=settings.desired,
                    security=settings.nats_security,
                )

    @property
    def nats_connected(self) -> bool:
        return self._publisher.connected

    @property
    def publish_stats(self) -> PublishStats:
        return self._publisher.stats

    @property
    def last_snapshot(self) -> NodeSnapshot | None:
        return self._snapshot

    # -- read by agent.metrics.collector at scrape time ---------------------------------------
    @property
    def port_states(self) -> PortStates | None:
        return self._states

    @property
    def plugin_resources(self) -> tuple[ResourceStatus, ...] | None:
        return self.plugin.status() if self.plugin is not None else None

    @property
    def node_name(self) -> str:
        return self.settings.node_name

    @property
    def version(self) -> str:
        return __version__

    async def _request_resync(self) -> None:
        self._resync.set()
        self._deltas.resync()  # the next counter batch is a full one
        self._status_changed.set()  # the device-plugin status is re-sent too

    async def run(self, stop: asyncio.Event) -> None:
        try:
            await self._run(stop)
        finally:
            self._counters.close()
            self._port_states.close()
            await self._publisher.close()

    async def _run(self, stop: asyncio.Event) -> None:
        if self.settings.verbs:
            self._verbs = await asyncio.to_thread(probe_verbs, search_path=self.settings.verbs_path)
            log.info("verbs probe: %s", self._verbs)
        with contextlib.suppress(CollectionTimeout):  # the state loop retries and logs
            self._states = await asyncio.to_thread(self._port_states.collect)
        # Reading and serving the kubelet never wait for NATS: the device plugin must
        # work while the message bus is down; what cannot be published is counted.
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(self._connect(stop))
            tasks.create_task(self._snapshot_loop(stop))
            tasks.create_task(self._counter_loop(stop))
            tasks.create_task(self._state_loop(stop))
            tasks.create_task(self.control.run(stop, self._request_resync))
            if self.settings.netlink:
                tasks.create_task(self._netlink_loop(stop))
            if self.plugin is not None:
                tasks.create_task(self.plugin.run(stop))
                if self.settings.device_plugin_config is not None:
                    tasks.create_task(self._config_loop(stop))
                if self.desired is not None:
                    tasks.create_task(self.desired.run(stop))
                tasks.create_task(self._status_loop(stop))
            if self.metrics is not None:
                tasks.create_task(self.metrics.run(stop))

    async def _connect(self, stop: asyncio.Event) -> None:
        if await self._publisher.connect(stop):
            self._resync.set()
            self._status_changed.set()

    async def _config_loop(self, stop: asyncio.Event) -> None:
        """Apply the device-plugin config file, and every later version of it, live."""
        assert self.plugin is not None and self.settings.device_plugin_config is not None
        path = self.settings.device_plugin_config
        seen: tuple[int, int] | None = None
        generation = 0
        while not stop.is_set():
            try:
                stat = path.stat()
                stamp = (stat.st_mtime_ns, stat.st_size)
                if stamp != seen:
                    seen = stamp
                    config = parse_device_plugin_config(path.read_bytes(), source=str(path))
                    generation += 1
                    self._file_config = (config, generation)
                    self._apply_effective()
            except (OSError, ConfigError) as exc:
                # A broken edit keeps the last good config serving; the error is logged.
                self.config_errors += 1
                log.error("device-plugin config not applied: %s", exc)
            await _wait_any(stop, timeout=self.settings.config_watch_interval)

    def _on_desired(self, desired: DesiredConfig | None) -> None:
        self._desired = desired
        self._apply_effective()

    def _apply_effective(self) -> None:
        """Serve the aggregator's desired config when there is one, else the file's; with
        neither (the desired key was deleted and there is no file) serve nothing."""
        assert self.plugin is not None
        if self._desired is not None:
            wanted = (self._desired.device_plugin, self._desired.generation)
            source = "aggregator"
        elif self._file_config is not None:
            wanted, source = self._file_config, "file"
        else:
            generation = self._applied[1] if self._applied is not None else 0
            wanted, source = (DevicePluginConfig(), generation), "none"
        if wanted == self._applied:
            return
        if source == "file" and self.config_source == "aggregator":
            log.info("desired config removed; back to the config file")
        self._applied, self.config_source = wanted, source
        self.plugin.apply_config(*wanted)
        self.configs_applied[source] = self.configs_applied.get(source, 0) + 1
        log.info("device-plugin config generation %d applied (from %s)", wanted[1], source)

    async def _status_loop(self, stop: asyncio.Event) -> None:
        assert self.plugin is not None
        while not stop.is_set():
            await _wait_any(stop, self._status_changed, timeout=self.settings.inventory_interval)
            if stop.is_set():
                return
            self._status_changed.clear()
            status: DevicePluginStatus = self.plugin.plugin_status()
            await self._publisher.publish(status)

    def _feed_plugin(self) -> None:
        if self.plugin is not None and self._snapshot is not None:
            self.plugin.update(self._snapshot, self._states or {})

    async def _snapshot_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await _wait_any(stop, self._resync, timeout=self.settings.inventory_interval)
            if stop.is_set():
                return
            self._resync.clear()
            self._snapshot_seq += 1
            started = time.perf_counter()
            snapshot = await asyncio.to_thread(
                collect_snapshot,
                self._sysfs,
                node=self.settings.node_name,
                seq=self._snapshot_seq,
                now=self._clock(),
                agent_version=__version__,
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

    async def _state_loop(self, stop: asyncio.Event) -> None:
        # Polled for every port, netdev or not: a netdev event wakes this loop at once,
        # but the RDMA port state in sysfs may follow the netdev a little later.
        stuck = False
        while not stop.is_set():
            await _wait_any(stop, self._reread, timeout=self.settings.state_poll_interval)
            if stop.is_set():
                return
            self._reread.clear()
            try:
                current = await asyncio.to_thread(self._port_states.collect)
            except CollectionTimeout as exc:
                stuck = _log_stuck(stuck, "port-state poll", exc)
                continue
            stuck = _log_recovered(stuck, "port-state poll")
            if self._states is None:
                self._states = current  # the first successful poll is the baseline
                continue
            events = diff_port_states(
                self._states,
                current,
                node=self.settings.node_name,
                now=self._clock(),
                seq=self._event_seq,
            )
            if not events:
                continue
            self._states = current
            self._feed_plugin()  # health reaches the kubelet before anything is published
            await self._publish_events(events)
            if any(e.kind != "port-state" for e in events):
                self._counters.rediscover()
            self._resync.set()

    async def _netlink_loop(self, stop: asyncio.Event) -> None:
        # Reading a netlink socket blocks until the kernel says something, so the
        # follower is cancelled when the agent stops rather than checking `stop`.
        async with asyncio.TaskGroup() as tasks:
            follower = tasks.create_task(self._follow_netlink())
            await stop.wait()
            follower.cancel()

    async def _follow_netlink(self) -> None:
        await self._first_snapshot.wait()  # netdev -> RDMA port mapping comes from it
        watched = False
        retry = self.settings.netlink_retry
        while True:
            try:
                async with NetlinkWatcher(netns=self.settings.netns) as watcher:
                    dump = netdevs_from_dump(await watcher.dump())
                    if watched:
                        log.info("netlink watch re-established")
                        await self._apply_netdevs(dump)  # publishes what we missed
                    else:
                        self._netdevs = dump
                        log.info("watching %d netdevs via netlink", len(dump))
                    watched, retry = True, self.settings.netlink_retry
                    self.netlink_watching.set()
                    while True:
                        table = self._netdevs
                        for observation in await watcher.changes():
                            table = update_netdevs(table, observation)
                        await self._apply_netdevs(table)
            except NetlinkUnavailable as exc:
                if not watched:
                    log.warning("netlink unavailable (%s); port state is polled only", exc)
                    return
                if self.netlink_watching.is_set():
                    log.warning("netlink watch lost (%s); re-opening", exc)
                else:
                    log.debug("netlink still unavailable: %s", exc)
                self.netlink_watching.clear()
            await asyncio.sleep(retry)
            retry = min(retry * 2, 30.0)

    async def _apply_netdevs(self, table: Netdevs) -> None:
        changes = diff_netdevs(
            self._netdevs,
            table,
            ports=self._ports,
            node=self.settings.node_name,
            now=self._clock(),
            seq=self._event_seq,
        )
        self._netdevs = table
        await self._publish_events(changes.events)
        if changes.reread:
            self._reread.set()
            self._resync.set()

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
