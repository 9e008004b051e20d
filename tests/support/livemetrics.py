"""A live scrape of both processes: an aggregator and an agent (device plugin registered
with an emulated kubelet, one port down) run in-process on a lab tree and a real
nats-server; `live_scrape()` returns both /metrics texts once the fleet has settled.
The metric-name checks (dashboard, rules, docs) and the promtool test share it."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agent.deviceplugin.advertised import DevicePluginSettings
from agent.deviceplugin.registration import Backoff
from agent.lab.faults import port_down
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.metrics.collector import agent_registry
from agent.service import AgentService, AgentSettings
from aggregator.api.auth import parse_token_file
from aggregator.service import AggregatorService, AggregatorSettings
from tests.support.kubelet import KubeletEmulator
from tests.support.waits import wait_until

NODE = "metrics-live-01"
RESOURCE = "rdma/ib_gpu0"
TOKEN = "live-metrics-read-token-0123456789"
CONFIG = {"configList": [{"resourceName": "ib_gpu0", "rdmaHcaMax": 4,
                         "selectors": {"rdmaDevices": ["mlx5_0", "mlx5_1"]}}]}  # fmt: skip
SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count",
            "_created"), "summary": ("_sum", "_count", "_created"), "gauge": ("",),
            "info": ("_info",), "unknown": ("",)}  # fmt: skip


@dataclass(frozen=True)
class Scrapes:
    agent: str
    aggregator: str
    # Family name -> label names as declared in code (an empty family shows none).
    labels: dict[str, tuple[str, ...]]


def declared_labels(registry: CollectorRegistry) -> dict[str, tuple[str, ...]]:
    """Label names of every family, from the metric objects and the collectors' families
    (prometheus_client keeps them in `_labelnames` in both cases)."""
    found: dict[str, tuple[str, ...]] = {}
    for collector in list(registry._collector_to_names):  # no public way to list them
        for family in collector.collect():
            names = getattr(family, "_labelnames", ()) or getattr(collector, "_labelnames", ())
            found[family.name] = tuple(str(n) for n in names)
    return found


def sample_value(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return None


def families(text: str) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Family name -> (type, help, label names seen in its samples). The 0.0.4 text format
    lists a counter's `_created` series as a gauge family of its own: not counted here."""
    found: dict[str, tuple[str, str, tuple[str, ...]]] = {}
    for f in text_string_to_metric_families(text):
        if f.name.endswith("_created"):
            continue
        labels = sorted({k for s in f.samples for k in s.labels if k not in ("le", "quantile")})
        found[f.name] = (f.type, f.documentation, tuple(labels))
    return found


def exported_names(text: str) -> set[str]:
    """Every series name a query may use: family names with their type's suffixes."""
    return {name + suffix for name, (kind, _h, _l) in families(text).items()
            for suffix in SUFFIXES[kind]}  # fmt: skip


async def live_scrape(nats_url: str) -> Scrapes:
    work = Path(tempfile.mkdtemp(prefix="lms", dir="/tmp"))  # unix socket path limit
    try:
        return await _scrape(nats_url, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


async def _scrape(nats_url: str, work: Path) -> Scrapes:
    root = work / "tree"
    render(with_node_name(load_builtin("h100-ib-12nic"), NODE), root)
    config = work / "dp.json"
    config.write_text(json.dumps(CONFIG))
    plugins = work / "dp"
    aggregator = AggregatorService(
        AggregatorSettings(
            nats_url=nats_url,
            listen_host="127.0.0.1",
            listen_port=0,
            # Tokens on (their counter is exported), /metrics open as a scraper sees it.
            api_auth=parse_token_file(f"read {TOKEN}", source="test", metrics_public=True),
        )
    )
    agent = AgentService(
        AgentSettings(
            node_name=NODE, sysfs_root=root, nats_url=nats_url, netlink=False,
            counter_interval=0.2, state_poll_interval=0.05, config_watch_interval=0.05,
            device_plugin_config=config, metrics_addr=("127.0.0.1", 0),
            device_plugin=DevicePluginSettings(
                device_plugin_dir=plugins, plugins_registry_dir=work / "no-registry",
                registration_mode="legacy", watch_interval=0.02, call_timeout=1.0,
                backoff=Backoff(initial=0.05, maximum=0.5),
            ),
        )
    )  # fmt: skip
    stop = asyncio.Event()
    async with KubeletEmulator(plugins), asyncio.TaskGroup() as tasks, httpx.AsyncClient() as http:
        tasks.create_task(aggregator.run(stop))
        tasks.create_task(agent.run(stop))
        try:
            assert agent.metrics is not None
            await asyncio.wait_for(aggregator.ready.wait(), timeout=20)
            await asyncio.wait_for(agent.metrics.started.wait(), timeout=20)
            agent_url, api_url = agent.metrics.url or "", f"{aggregator.api_url}/metrics"

            async def scrape(url: str) -> str:
                response = await http.get(url)
                assert response.status_code == 200, response.text
                return response.text

            async def agent_settled() -> bool:
                text = await scrape(agent_url)
                return (
                    sample_value(text, "nicfleet_agent_device_plugin_registered", resource=RESOURCE)
                    == 1
                    and sample_value(text, "nicfleet_agent_port_stats_total") is not None
                )

            await wait_until(agent_settled, timeout=30, what="agent registered, counting")
            port_down(root, "mlx5_1", 1)

            async def aggregator_settled() -> bool:
                text = await scrape(api_url)
                # The node may already be in KV from an earlier scrape on this nats-server:
                # wait for this agent's own messages too.
                messages = "nicfleet_ingest_messages_total"
                return (
                    sample_value(text, "nicfleet_nodes", state="ready") == 1
                    and (sample_value(text, messages, kind="snapshot") or 0) >= 1
                    and (sample_value(text, messages, kind="counters") or 0) >= 1
                    and sample_value(text, "nicfleet_alerts_firing", rule="port-down") is not None
                    and sample_value(text, "nicfleet_reconcile_duration_seconds_count") is not None
                )

            await wait_until(aggregator_settled, timeout=30, what="node ready, port-down firing")
            await http.get(f"{aggregator.api_url}/api/v1/nodes")  # one auth decision (401)
            labels = declared_labels(agent_registry(agent))
            labels |= declared_labels(aggregator.metrics.registry)
            return Scrapes(
                agent=await scrape(agent_url), aggregator=await scrape(api_url), labels=labels
            )
        finally:
            stop.set()
