"""`nicfleet-agent run --metrics-addr` as a real process: /metrics follows the live agent
(NATS connection, published messages, collection time) and a garbage desired config in
KV nicfleet-config, relayed by the aggregator's responder, raises the rejected counter while
a good one is applied."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from aggregator.bus.natsserver import NatsServer
from proto.codec import encode
from tests.integration.agent.test_desired_config import desired, feeding
from tests.support.faults import AgentProcess
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def short_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="amx", dir="/tmp"))  # unix socket path limit
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def test_scrape_a_running_agent_and_count_a_rejected_desired_config(
    own_nats: NatsServer, short_dir: Path, tmp_path: Path
) -> None:
    node = "metrics-01"
    root = tmp_path / "tree"
    render(with_node_name(load_builtin("roce-cx6dx"), node), root)
    agent = AgentProcess(
        own_nats.url, root, node, work=tmp_path, plugin_dir=short_dir / "device-plugins"
    )
    feeds = AsyncExitStack()  # the aggregator's side of desired config
    feeder = await feeds.enter_async_context(feeding(own_nats.url))
    try:
        agent.start()
        await wait_until(lambda: agent.metrics_url() is not None, timeout=20, what="metrics up")
        url = agent.metrics_url()
        assert url is not None
        async with httpx.AsyncClient() as client:

            async def scrape() -> str:
                response = await client.get(url)
                assert response.status_code == 200
                return response.text

            async def connected_and_publishing() -> bool:
                text = await scrape()
                return (
                    value(text, "nicfleet_agent_nats_connected") == 1
                    and value(text, "nicfleet_agent_messages_published_total", kind="snapshot") >= 1
                    and value(text, "nicfleet_agent_messages_published_total", kind="counters") >= 2
                )

            await wait_until(connected_and_publishing, timeout=20, what="connected, publishing")
            text = await scrape()
            rejected = "nicfleet_agent_desired_config_rejected_total"
            assert value(text, rejected) == 0
            assert value(text, "nicfleet_agent_collection_duration_seconds", kind="snapshot") > 0

            await feeder.put_raw(node, b"\x93garbage")

            async def rejected_once() -> bool:
                return value(await scrape(), rejected) == 1

            await wait_until(rejected_once, timeout=20, what="the garbage counted")
            await feeder.put_raw(node, encode(desired(node, 3, hca_max=2)))
            applied = "nicfleet_agent_device_plugin_configs_applied_total"

            async def applied_once() -> bool:
                return value(await scrape(), applied, source="aggregator") == 1

            await wait_until(applied_once, timeout=20, what="the good config applied")
            text = await scrape()
            assert value(text, rejected) == 1  # the good one is not counted as rejected
            if shutil.which("promtool") is not None:
                lint = await asyncio.to_thread(
                    subprocess.run,
                    ["promtool", "check", "metrics"],
                    input=text.encode(),
                    capture_output=True,
                    check=False,
                )
                assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
    finally:
        await asyncio.to_thread(agent.stop)
        await feeds.aclose()
