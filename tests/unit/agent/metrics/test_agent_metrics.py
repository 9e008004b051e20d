"""agent.metrics.collector: the collector's output from a fake agent state, the exposition as
promtool sees it, the --metrics-addr parser and the HTTP endpoint."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import msgspec
import pytest
from click.testing import CliRunner
from prometheus_client.exposition import generate_latest

from agent.bus.publisher import PublishStats
from agent.cli import main
from agent.metrics.collector import (
    MetricsServer,
    agent_registry,
    parse_metrics_addr,
    read_errors_by_file,
)
from agent.metrics.ports import PORT_COUNTERS, PortStates, counter_errors_by_group, port_states
from proto.inventory import NodeSnapshot, ReadError
from proto.messages.counters import CounterBatch, PortCounters
from proto.messages.status import ResourceStatus
from tests.support.builders import device, snapshot


@dataclass
class FakeDesired:
    rejected: int = 0


@dataclass
class FakeAgent:
    desired: FakeDesired | None = None
    configs_applied: Mapping[str, int] = field(default_factory=dict)
    config_errors: int = 0
    nats_connected: bool = False
    publish_stats: PublishStats = field(default_factory=PublishStats)
    collect_seconds: Mapping[str, float] = field(default_factory=dict)
    last_snapshot: NodeSnapshot | None = None
    port_states: PortStates | None = None
    last_counters: CounterBatch | None = None
    plugin_resources: tuple[ResourceStatus, ...] | None = None
    node_name: str = "node-a"
    version: str = "0.0.0-test"


def with_errors() -> NodeSnapshot:
    broken = msgspec.structs.replace(
        device("mlx5_1"),
        errors=(
            ReadError(path="/class/infiniband/mlx5_1/fw_ver", error="EIO"),
            ReadError(path="/class/infiniband/mlx5_1/ports/1/state", error="ENOENT"),
        ),
    )
    snap = snapshot(devices=(device(), broken))
    host = (ReadError(path="/class/infiniband/mlx5_0/ports/1/state", error="EIO"),)
    return msgspec.structs.replace(snap, errors=host)


def sample(agent: FakeAgent, name: str, labels: dict[str, str] | None = None) -> float | None:
    return agent_registry(agent).get_sample_value(name, labels or {})


def test_every_metric_comes_from_the_live_state() -> None:
    agent = FakeAgent(
        desired=FakeDesired(rejected=3),
        configs_applied={"aggregator": 2, "file": 1},
        config_errors=4,
        nats_connected=True,
        publish_stats=PublishStats(
            published={"snapshot": 5, "counters": 40}, failed={"counters": 2}, reconnects=1
        ),
        collect_seconds={"snapshot": 0.012, "counters": 0.003},
        last_snapshot=with_errors(),
    )
    assert sample(agent, "nicfleet_agent_desired_config_rejected_total") == 3
    applied = "nicfleet_agent_device_plugin_configs_applied_total"
    assert sample(agent, applied, {"source": "aggregator"}) == 2
    assert sample(agent, applied, {"source": "file"}) == 1
    assert sample(agent, "nicfleet_agent_device_plugin_config_errors_total") == 4
    assert sample(agent, "nicfleet_agent_nats_connected") == 1
    published = "nicfleet_agent_messages_published_total"
    assert sample(agent, published, {"kind": "counters"}) == 40
    assert sample(agent, "nicfleet_agent_messages_failed_total", {"kind": "counters"}) == 2
    assert sample(agent, "nicfleet_agent_nats_reconnects_total") == 1
    duration = "nicfleet_agent_collection_duration_seconds"
    assert sample(agent, duration, {"kind": "snapshot"}) == 0.012
    errors = "nicfleet_agent_sysfs_read_errors"
    assert sample(agent, errors, {"file": "state"}) == 2
    assert sample(agent, errors, {"file": "fw_ver"}) == 1


def test_a_scrape_sees_changes_made_after_registration() -> None:
    agent = FakeAgent(desired=FakeDesired())
    registry = agent_registry(agent)
    assert registry.get_sample_value("nicfleet_agent_desired_config_rejected_total") == 0
    assert agent.desired is not None
    agent.desired.rejected = 7
    agent.nats_connected = True
    assert registry.get_sample_value("nicfleet_agent_desired_config_rejected_total") == 7
    assert registry.get_sample_value("nicfleet_agent_nats_connected") == 1


def test_an_agent_without_device_plugin_or_snapshot_still_exposes_every_family() -> None:
    text = generate_latest(agent_registry(FakeAgent())).decode()
    for family in (
        "nicfleet_agent_desired_config_rejected",
        "nicfleet_agent_device_plugin_configs_applied",
        "nicfleet_agent_nats_connected",
        "nicfleet_agent_messages_published",
        "nicfleet_agent_collection_duration_seconds",
        "nicfleet_agent_sysfs_read_errors",
        "nicfleet_agent_port_up",
        "nicfleet_agent_port_stats_total",
        "nicfleet_agent_counter_read_errors",
        "nicfleet_agent_device_plugin_registered",
        "nicfleet_agent_device_plugin_healthy_devices",
    ):
        assert f"# TYPE {family}" in text
    assert "nicfleet_agent_desired_config_rejected_total 0.0" in text


def test_read_errors_by_file() -> None:
    assert read_errors_by_file(None) == {}
    assert read_errors_by_file(snapshot()) == {}
    assert read_errors_by_file(with_errors()) == {"state": 2, "fw_ver": 1}


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) absent")
def test_promtool_accepts_the_exposition() -> None:
    agent = FakeAgent(
        desired=FakeDesired(rejected=1),
        configs_applied={"aggregator": 1},
        publish_stats=PublishStats(published={"snapshot": 1}, failed={"status": 1}),
        collect_seconds={"counters": 0.001},
        last_snapshot=with_errors(),
    )
    body = generate_latest(agent_registry(agent))
    result = subprocess.run(
        ["promtool", "check", "metrics"], input=body, capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@pytest.mark.parametrize(
    ("value", "expected"),
    [("127.0.0.1:9101", ("127.0.0.1", 9101)), ("[::1]:0", ("::1", 0)), ("node:1", ("node", 1))],
)
def test_parse_metrics_addr(value: str, expected: tuple[str, int]) -> None:
    assert parse_metrics_addr(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9101", "expected HOST:PORT"),
        (":9101", "expected HOST:PORT"),
        ("[]:9101", "expected HOST:PORT"),
        ("host:", "port must be 0-65535"),
        ("host:http", "port must be 0-65535"),
        ("host:65536", "port must be 0-65535"),
        ("host:-1", "port must be 0-65535"),
    ],
)
def test_parse_metrics_addr_rejects(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_metrics_addr(value)


async def test_endpoint_serves_the_registry_and_a_taken_port_leaves_metrics_off() -> None:
    agent = FakeAgent(desired=FakeDesired(rejected=2))
    server = MetricsServer(agent_registry(agent), "127.0.0.1", 0)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(server.run(stop))
        try:
            await asyncio.wait_for(server.started.wait(), timeout=10)
            assert server.url is not None
            async with httpx.AsyncClient() as client:
                response = await client.get(server.url)
                assert response.status_code == 200
                assert response.headers["content-type"].startswith("text/plain")
                assert "nicfleet_agent_desired_config_rejected_total 2.0" in response.text
                assert (await client.get(server.url.replace("/metrics", "/"))).status_code == 404
            port = int(server.url.rsplit(":", 1)[1].split("/")[0])
            # A second server on the same port: logged, returns, nothing raised.
            taken = MetricsServer(agent_registry(agent), "127.0.0.1", port)
            await asyncio.wait_for(taken.run(asyncio.Event()), timeout=10)
            assert taken.url is None
        finally:
            stop.set()


@pytest.mark.parametrize("value", ["9101", "127.0.0.1:http", "127.0.0.1:70000"])
def test_run_refuses_a_bad_metrics_addr_naming_the_option(value: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["run", "--nats-url", "nats://127.0.0.1:1", "--sysfs-root", str(tmp_path),
         "--metrics-addr", value],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--metrics-addr" in result.output
    assert "Traceback" not in result.output


def test_ports_live_state_wins_over_the_snapshot_and_rate_is_in_bytes() -> None:
    snap = snapshot(devices=(device(), device("mlx5_1", pci="0000:3c:00.0")))
    agent = FakeAgent(last_snapshot=snap, port_states={("mlx5_1", 1): ("DOWN", "Disabled")})
    assert port_states(snap, agent.port_states) == {("mlx5_0", 1): "ACTIVE", ("mlx5_1", 1): "DOWN"}
    assert sample(agent, "nicfleet_agent_port_up", {"device": "mlx5_0", "port": "1"}) == 1
    assert sample(agent, "nicfleet_agent_port_up", {"device": "mlx5_1", "port": "1"}) == 0
    assert sample(agent, "nicfleet_agent_port_state", {"device": "mlx5_1", "port": "1"}) == 1
    rate = "nicfleet_agent_port_rate_bytes_per_second"
    assert sample(agent, rate, {"device": "mlx5_0", "port": "1"}) == 50e9


def test_counters_come_from_the_latest_batch_limited_to_the_fixed_set() -> None:
    batch = CounterBatch(
        node="node-a",
        seq=3,
        collected_at=1.0,
        ports=(
            PortCounters(
                device="mlx5_0",
                port=1,
                counters={"symbol_error": 5, "port_rcv_data": 100, "some_vendor_counter": 1},
                hw_counters={"out_of_sequence": 7, "np_cnp_sent": 2},
                rx_bytes=400,
                tx_bytes=800,
            ),
        ),
        errors=(ReadError(path="/class/infiniband/mlx5_0/ports/1/hw_counters/x", error="EIO"),),
    )
    agent = FakeAgent(last_counters=batch)
    where = {"device": "mlx5_0", "port": "1"}
    counter = "nicfleet_agent_port_stats_total"
    assert sample(agent, counter, {**where, "counter": "symbol_error"}) == 5
    assert sample(agent, counter, {**where, "counter": "out_of_sequence"}) == 7
    assert sample(agent, counter, {**where, "counter": "some_vendor_counter"}) is None
    assert sample(agent, counter, {**where, "counter": "port_rcv_data"}) is None
    assert sample(agent, "nicfleet_agent_port_received_bytes_total", where) == 400
    assert sample(agent, "nicfleet_agent_port_transmitted_bytes_total", where) == 800
    assert sample(agent, "nicfleet_agent_counter_read_errors", {"group": "hw_counters"}) == 1
    assert counter_errors_by_group(None) == {}
    assert len(set(PORT_COUNTERS)) == len(PORT_COUNTERS)
    assert {c.split("/")[0] for c in PORT_COUNTERS} <= {"counters", "hw_counters"}


def test_device_plugin_registration_and_health_per_resource() -> None:
    resources = (
        ResourceStatus(name="rdma/a", advertised=8, healthy=6, registration="registered"),
        ResourceStatus(name="rdma/b", advertised=2, healthy=0, registration="retrying",
                       registration_attempts=3),
    )  # fmt: skip
    agent = FakeAgent(plugin_resources=resources)
    assert sample(agent, "nicfleet_agent_device_plugin_registered", {"resource": "rdma/a"}) == 1
    assert sample(agent, "nicfleet_agent_device_plugin_registered", {"resource": "rdma/b"}) == 0
    state = "nicfleet_agent_device_plugin_registration_state"
    assert sample(agent, state, {"resource": "rdma/b", "state": "retrying"}) == 1
    failures = "nicfleet_agent_device_plugin_registration_failures"
    assert sample(agent, failures, {"resource": "rdma/b"}) == 3
    assert sample(agent, "nicfleet_agent_device_plugin_devices", {"resource": "rdma/a"}) == 8
    healthy = "nicfleet_agent_device_plugin_healthy_devices"
    assert sample(agent, healthy, {"resource": "rdma/a"}) == 6
    info = {"version": "0.0.0-test", "node_name": "node-a"}
    assert sample(agent, "nicfleet_agent_info", info) == 1
