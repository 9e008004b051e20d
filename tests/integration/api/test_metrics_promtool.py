"""Both live /metrics endpoints (agent with a registered device plugin, aggregator with a
node and a firing alert) hold every family of the issue and pass `promtool check metrics`."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest

from aggregator.bus.natsserver import NatsServer
from tests.support.livemetrics import RESOURCE, families, live_scrape, sample_value

pytestmark = pytest.mark.integration


async def test_both_endpoints_export_the_issue_families_and_pass_promtool(
    own_nats: NatsServer,
) -> None:
    # Its own server: the session's KV holds nodes of other tests, which would be stale here.
    scrapes = await live_scrape(own_nats.url)
    agent, aggregator = scrapes.agent, scrapes.aggregator
    port = {"device": "mlx5_0", "port": "1"}
    assert sample_value(agent, "nicfleet_agent_port_up", **port) == 1
    assert sample_value(agent, "nicfleet_agent_port_state", **port) == 4
    assert (sample_value(agent, "nicfleet_agent_port_rate_bytes_per_second", **port) or 0) > 0
    assert sample_value(agent, "nicfleet_agent_port_stats_total", **port) is not None
    assert sample_value(agent, "nicfleet_agent_collection_duration_seconds", kind="counters")
    healthy = "nicfleet_agent_device_plugin_healthy_devices"
    assert sample_value(agent, "nicfleet_agent_device_plugin_devices", resource=RESOURCE) == 4
    assert sample_value(agent, healthy, resource=RESOURCE) is not None
    assert families(agent)["nicfleet_agent_port_stats"][2] == ("counter", "device", "port")

    assert sample_value(aggregator, "nicfleet_nodes", state="ready") == 1
    assert sample_value(aggregator, "nicfleet_nodes", state="stale") == 0
    assert (sample_value(aggregator, "nicfleet_ingest_messages_total", kind="counters") or 0) > 0
    firing = sample_value(
        aggregator, "nicfleet_alerts_firing", rule="port-down", severity="critical"
    )
    assert firing is not None and firing >= 1
    assert sample_value(aggregator, "nicfleet_rule_evaluation_seconds_count") is not None
    assert sample_value(aggregator, "nicfleet_reconcile_duration_seconds_count") is not None
    assert "nicfleet_kv_write_errors" in families(aggregator)
    assert "nicfleet_ingest_rejected" in families(aggregator)

    if shutil.which("promtool") is None:
        pytest.skip("promtool (Debian prometheus) absent")
    for text in (agent, aggregator):
        command = ["promtool", "check", "metrics"]
        lint = await asyncio.to_thread(
            subprocess.run, command, input=text.encode(), capture_output=True, check=False
        )
        assert lint.returncode == 0, lint.stdout.decode() + lint.stderr.decode()
