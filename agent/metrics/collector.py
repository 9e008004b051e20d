"""The agent's Prometheus metrics: a collector that reads the live agent at scrape time.

Nothing is counted twice: every value comes from state the agent keeps anyway (the
desired-config watcher, the publisher's stats, the last snapshot, port poll and counter
batch, the advertised device-plugin resources; the port and device-plugin families:
agent.metrics.ports).
Served over HTTP by `MetricsServer` when `run --metrics-addr` is given. docs/metrics.md.
"""

from __future__ import annotations

import asyncio
import logging
import posixpath
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector

from agent.metrics.ports import PortStates, device_plugin_families, port_families
from proto.inventory import NodeSnapshot
from proto.messages.counters import CounterBatch
from proto.messages.status import ResourceStatus

log = logging.getLogger(__name__)


class PublishStatsView(Protocol):
    @property
    def published(self) -> Mapping[str, int]: ...
    @property
    def failed(self) -> Mapping[str, int]: ...
    @property
    def reconnects(self) -> int: ...


class DesiredView(Protocol):
    @property
    def rejected(self) -> int: ...


class AgentView(Protocol):
    """What a scrape reads from the agent (AgentService has all of it)."""

    @property
    def desired(self) -> DesiredView | None: ...
    @property
    def configs_applied(self) -> Mapping[str, int]: ...
    @property
    def config_errors(self) -> int: ...
    @property
    def nats_connected(self) -> bool: ...
    @property
    def publish_stats(self) -> PublishStatsView: ...
    @property
    def collect_seconds(self) -> Mapping[str, float]: ...
    @property
    def last_snapshot(self) -> NodeSnapshot | None: ...
    @property
    def port_states(self) -> PortStates | None: ...
    @property
    def last_counters(self) -> CounterBatch | None: ...
    @property
    def plugin_resources(self) -> Sequence[ResourceStatus] | None: ...
    @property
    def node_name(self) -> str: ...
    @property
    def version(self) -> str: ...


class AgentCollector(Collector):
    """Builds every metric family from `agent` on each scrape."""

    def __init__(self, agent: AgentView) -> None:
        self._agent = agent

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        info = GaugeMetricFamily(
            "nicfleet_agent_info",
            "Always 1; the agent's version and node name.",
            labels=["version", "node_name"],
        )
        info.add_metric([agent.version, agent.node_name], 1.0)
        yield info
        rejected = CounterMetricFamily(
            "nicfleet_agent_desired_config_rejected",
            "Desired configs from KV nicfleet-config that did not decode or validate.",
        )
        rejected.add_metric([], agent.desired.rejected if agent.desired is not None else 0)
        yield rejected
        applied = CounterMetricFamily(
            "nicfleet_agent_device_plugin_configs_applied",
            "Device-plugin config versions applied, by source (aggregator, file, none).",
            labels=["source"],
        )
        for source, count in sorted(agent.configs_applied.items()):
            applied.add_metric([source], count)
        yield applied
        config_errors = CounterMetricFamily(
            "nicfleet_agent_device_plugin_config_errors",
            "Device-plugin config file versions refused (the last good one stays).",
        )
        config_errors.add_metric([], agent.config_errors)
        yield config_errors
        yield _gauge("nicfleet_agent_nats_connected", "1 while connected to NATS.",
                     1.0 if agent.nats_connected else 0.0)  # fmt: skip
        yield from _publish_families(agent.publish_stats)
        duration = GaugeMetricFamily(
            "nicfleet_agent_collection_duration_seconds",
            "Wall time of the last collection, by kind (snapshot, counters).",
            labels=["kind"],
        )
        for kind, seconds in sorted(agent.collect_seconds.items()):
            duration.add_metric([kind], seconds)
        yield duration
        errors = GaugeMetricFamily(
            "nicfleet_agent_sysfs_read_errors",
            "Failed sysfs reads in the last snapshot, by file name (state, fw_ver, ...).",
            labels=["file"],
        )
        for name, count in sorted(read_errors_by_file(agent.last_snapshot).items()):
            errors.add_metric([name], count)
        yield errors
        yield from port_families(agent.last_snapshot, agent.port_states, agent.last_counters)
        yield from device_plugin_families(agent.plugin_resources)


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family


def _publish_families(stats: PublishStatsView) -> Iterator[Metric]:
    published = CounterMetricFamily(
        "nicfleet_agent_messages_published",
        "Messages handed to NATS, by kind (snapshot, counters, event, status).",
        labels=["kind"],
    )
    for kind, count in sorted(stats.published.items()):
        published.add_metric([kind], count)
    yield published
    failed = CounterMetricFamily(
        "nicfleet_agent_messages_failed",
        "Messages not published (NATS down or the publish failed), by kind.",
        labels=["kind"],
    )
    for kind, count in sorted(stats.failed.items()):
        failed.add_metric([kind], count)
    yield failed
    reconnects = CounterMetricFamily("nicfleet_agent_nats_reconnects", "NATS reconnects.")
    reconnects.add_metric([], stats.reconnects)
    yield reconnects


def read_errors_by_file(snapshot: NodeSnapshot | None) -> dict[str, int]:
    """Pure: the snapshot's read errors (host and per device) counted by file name."""
    if snapshot is None:
        return {}
    paths = [e.path for e in snapshot.errors]
    paths += [e.path for d in snapshot.devices for e in d.errors]
    return dict(Counter(posixpath.basename(p.rstrip("/")) or "/" for p in paths))


def agent_registry(agent: AgentView) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(agent))
    return registry


class MetricsServer:
    """`/metrics` on `host:port` (port 0: any free one); `url` is known once started."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self._registry = registry
        self._host, self._port = host, port
        self.url: str | None = None
        self.started = asyncio.Event()

    async def _metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop`. An address that cannot be bound is logged and metrics stay
        off: the agent's real work (publishing, the device plugin) must not depend on it."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            site = web.TCPSite(runner, self._host, self._port)
            try:
                await site.start()
            except OSError as exc:
                log.error("cannot serve metrics on %s:%d: %s; metrics off", self._host,
                          self._port, exc)  # fmt: skip
                return
            host, port = _bound_address(site, self._port)
            self.url = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
            log.info("serving metrics on %s", self.url)
            self.started.set()
            await stop.wait()
        finally:
            await runner.cleanup()


def _bound_address(site: web.TCPSite, port: int) -> tuple[str, int]:
    server = site._server  # aiohttp exposes the asyncio.Server only here
    for sock in getattr(server, "sockets", None) or ():
        host, bound = sock.getsockname()[:2]
        return str(host), int(bound)
    return site.name, port


def parse_metrics_addr(value: str) -> tuple[str, int]:
    """`HOST:PORT` or `[IPv6]:PORT` → (host, port); port 0 lets the OS choose."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host.strip("[]"):
        raise ValueError(f"expected HOST:PORT (e.g. 127.0.0.1:9101), got {value!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"port must be 0-65535, got {port_text!r}")
    return host.strip("[]"), int(port_text)
