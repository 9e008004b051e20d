"""End to end on real parts: lab tree → agent → real nats-server → aggregator → HTTP API."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import nats
import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.faults import port_down
from agent.lab.render import render
from agent.lab.spec import load_builtin, with_node_name
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import encode
from proto.messages.counters import CounterBatch
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration


def lab_node(root: Path, spec: str, node: str) -> Path:
    path = root / node
    render(with_node_name(load_builtin(spec), node), path)
    return path


@asynccontextmanager
async def aggregator(nats_url: str) -> AsyncIterator[AggregatorService]:
    service = AggregatorService(
        AggregatorSettings(nats_url=nats_url, listen_host="127.0.0.1", listen_port=0)
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        await asyncio.wait_for(service.ready.wait(), timeout=15)
        try:
            yield service
        finally:
            stop.set()


@asynccontextmanager
async def agent(nats_url: str, root: Path, node: str) -> AsyncIterator[AgentService]:
    service = AgentService(
        AgentSettings(node_name=node, sysfs_root=root, nats_url=nats_url, counter_interval=0.2)
    )
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            yield service
        finally:
            stop.set()


def has_snapshot(service: AggregatorService, node: str) -> bool:
    record = service.fleet.get(node)
    return record is not None and record.snapshot is not None


async def api_get(service: AggregatorService, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=service.api_url or "") as client:
        return await client.get(path)


async def node_detail(service: AggregatorService, node: str) -> dict[str, object] | None:
    response = await api_get(service, f"/api/v1/nodes/{node}")
    return response.json() if response.status_code == 200 else None


async def test_agent_to_api_end_to_end(nats_server: NatsServer, tmp_path: Path) -> None:
    root = lab_node(tmp_path, "h100-ib-12nic", "e2e-ib-01")
    expected = collect_snapshot(Sysfs(root), node="e2e-ib-01", seq=1, now=0.0, agent_version="x")
    async with aggregator(nats_server.url) as agg, agent(nats_server.url, root, "e2e-ib-01"):
        await wait_until(lambda: has_snapshot(agg, "e2e-ib-01"), what="node in fleet")
        listing = (await api_get(agg, "/api/v1/nodes")).json()
        assert "e2e-ib-01" in [item["name"] for item in listing["items"]]
        detail = await node_detail(agg, "e2e-ib-01")
        assert detail is not None
        snap = detail["snapshot"]
        assert isinstance(snap, dict)
        assert [a["name"] for a in snap["devices"]] == [a.name for a in expected.devices]
        assert [a["fw_ver"] for a in snap["devices"]] == [a.fw_ver for a in expected.devices]
        assert [[p["state"] for p in a["ports"]] for a in snap["devices"]] == [
            [p.state for p in a.ports] for a in expected.devices
        ]
        # Counters flow too.
        await wait_until(
            lambda: (rec := agg.fleet.get("e2e-ib-01")) is not None and rec.counters is not None,
            what="a counter batch",
        )
        # A fault in the tree reaches the API as an event and as the port's new state.
        port_down(root, "mlx5_0", 1)

        async def down_seen() -> bool:
            detail = await node_detail(agg, "e2e-ib-01")
            events = detail["events"] if detail else []
            assert isinstance(events, list)
            return any(e["device"] == "mlx5_0" and e["new_state"] == "DOWN" for e in events)

        await wait_until(down_seen, what="port-down event in the API")
        record = agg.fleet.get("e2e-ib-01")
        assert record is not None and record.snapshot is not None
        port = record.snapshot.devices[0].ports[0]
        assert port.state == "DOWN"


async def test_nats_restart_mid_run_aggregator_gets_next_snapshot(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    root = lab_node(tmp_path, "roce-cx6dx", "restart-01")
    async with aggregator(own_nats.url) as agg, agent(own_nats.url, root, "restart-01"):
        await wait_until(lambda: has_snapshot(agg, "restart-01"), what="first snapshot")
        record = agg.fleet.get("restart-01")
        assert record is not None and record.snapshot is not None
        first_seq = record.snapshot.seq
        await asyncio.to_thread(own_nats.restart)

        def newer_snapshot() -> bool:
            rec = agg.fleet.get("restart-01")
            return rec is not None and rec.snapshot is not None and rec.snapshot.seq > first_seq

        await wait_until(newer_snapshot, timeout=20, what="snapshot re-published after restart")
        await wait_until(lambda: agg.readiness()[0], timeout=20, what="aggregator ready again")


async def test_bad_messages_are_counted_and_dropped_while_good_ones_flow(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    root = lab_node(tmp_path, "roce-cx6dx", "bad-input-01")
    async with aggregator(nats_server.url) as agg, agent(nats_server.url, root, "bad-input-01"):
        await wait_until(lambda: has_snapshot(agg, "bad-input-01"), what="snapshot")
        before = agg.fleet.get("bad-input-01")
        assert before is not None
        nc = await nats.connect(nats_server.url)
        try:
            snap_subject = subjects.node_subject("bad-input-01", subjects.SNAPSHOT)
            await nc.publish(snap_subject, b"\x00garbage")  # undecodable
            await nc.publish(snap_subject, encode(CounterBatch(node="x", seq=1, collected_at=1)))
            await nc.publish(  # speaks for another node
                subjects.node_subject("bad-input-01", subjects.COUNTERS),
                encode(CounterBatch(node="someone-else", seq=99, collected_at=9e9)),
            )
            await nc.publish("nicfleet.v1.node.BAD_NAME.snapshot", b"{}")  # bad subject
            await nc.flush()
        finally:
            await nc.close()

        def rejected(kind: str, reason: str) -> float:
            value = agg.metrics.registry.get_sample_value(
                "nicfleet_ingest_rejected_total", {"kind": kind, "reason": reason}
            )
            return value or 0.0

        await wait_until(
            lambda: (
                rejected("snapshot", "decode") >= 2
                and rejected("counters", "node-mismatch") >= 1
                and rejected("unknown", "subject") >= 1
            ),
            what="all bad messages counted",
        )
        assert "someone-else" not in agg.fleet.names()
        # Good traffic keeps flowing after the garbage.
        seq_now = (agg.fleet.get("bad-input-01") or before).counters
        start = seq_now.seq if seq_now else 0

        def counters_advanced() -> bool:
            rec = agg.fleet.get("bad-input-01")
            return rec is not None and rec.counters is not None and rec.counters.seq > start + 1

        await wait_until(counters_advanced, what="counters after bad input")
        after = agg.fleet.get("bad-input-01")
        assert after is not None and after.snapshot == before.snapshot


async def test_fleet_is_rebuilt_from_kv_on_restart(nats_server: NatsServer, tmp_path: Path) -> None:
    root = lab_node(tmp_path, "roce-cx6dx", "kv-rebuild-01")
    async with aggregator(nats_server.url) as agg:
        async with agent(nats_server.url, root, "kv-rebuild-01"):
            await wait_until(lambda: has_snapshot(agg, "kv-rebuild-01"), what="snapshot")
        await wait_until(
            lambda: (agg.metrics.registry.get_sample_value(
                "nicfleet_kv_writes_total", {"bucket": subjects.KV_NODES}
            ) or 0) >= 1,
            what="snapshot persisted",
        )  # fmt: skip
        stored = agg.fleet.get("kv-rebuild-01")
    # A new aggregator, no agent running: the node comes back from KV alone.
    async with aggregator(nats_server.url) as fresh:
        rebuilt = fresh.fleet.get("kv-rebuild-01")
        assert rebuilt is not None and stored is not None
        assert rebuilt.snapshot == stored.snapshot
        response = await api_get(fresh, "/api/v1/nodes/kv-rebuild-01")
        assert response.status_code == 200
