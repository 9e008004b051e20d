"""Faults of the aggregator process: SIGKILL and restart (state from KV, no re-notify,
1,000 stored nodes back), and KV writes failing underneath it (readiness, metric, recovery).

The restart tests run `python -m aggregator run` as a real child process.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import msgspec
import nats
import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.faults import port_down
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import StoredNode, open_bucket
from aggregator.replicas.leader import LEADER_BUCKET, LEADER_KEY
from aggregator.service import AggregatorService, AggregatorSettings
from proto import subjects
from proto.codec import decode, encode
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.integration.alerts.test_alerts import aggregator
from tests.support.faults import (
    AggregatorProcess,
    add_alert_recorder,
    recorded_alerts,
    transitions,
)
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def evaluations(metrics_text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in metrics_text.splitlines()
        if line.startswith("nicfleet_rule_evaluations_total{")
    )


async def test_aggregator_sigkill_restart_keeps_state_and_does_not_renotify(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "agg-kill-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    nc = await nats.connect(own_nats.url)
    first = AggregatorProcess(own_nats.url, tmp_path, "first")
    second = AggregatorProcess(own_nats.url, tmp_path, "second")
    try:
        await add_alert_recorder(nc)
        first.start()
        await wait_until(first.is_ready, timeout=30, what="first aggregator ready")
        async with agent(own_nats.url, root, node):
            port_down(root, "mlx5_0", 1)

            async def fired() -> bool:
                return transitions(await recorded_alerts(nc), node, "mlx5_0/1") == ["firing"]

            await wait_until(fired, timeout=20, what="port-down firing")
            nodes = await nc.jetstream().key_value(subjects.KV_NODES)

            async def stored_down() -> bool:
                entry = await nodes.get(subjects.node_token(node))
                stored = decode(entry.value or b"", StoredNode)
                return stored.snapshot.devices[0].ports[0].state == "DOWN"

            await wait_until(stored_down, what="DOWN snapshot in KV")
            alert_kv = await nc.jetstream().key_value(subjects.KV_ALERTS)
            await wait_until(lambda: _has_keys(alert_kv), what="firing alert state persisted in KV")
        # The agent is gone: whatever the new process knows comes from KV.
        await asyncio.to_thread(first.kill)
        second.start()
        await wait_until(second.is_ready, timeout=30, what="second aggregator ready")
        async with httpx.AsyncClient(base_url=second.api_url) as api:
            detail = (await api.get(f"/api/v1/nodes/{node}")).json()
            assert detail["snapshot"]["devices"][0]["ports"][0]["state"] == "DOWN"

            async def still_firing() -> bool:
                items = (await api.get("/api/v1/alerts")).json()["items"]
                return any(
                    (a["node"], a["subject"], a["state"]) == (node, "mlx5_0/1", "firing")
                    for a in items
                )

            await wait_until(still_firing, what="alert firing after restart")
            base = evaluations((await api.get("/metrics")).text)

            async def evaluated_twice_more() -> bool:
                return evaluations((await api.get("/metrics")).text) >= base + 2

            # Evaluations count only as leader: the killed process's lease expires first
            # (leader_ttl), then the new leader takes over the persisted states.
            await wait_until(evaluated_twice_more, timeout=30, what="evaluating as leader")
        await nc.flush()
        assert transitions(await recorded_alerts(nc), node, "mlx5_0/1") == ["firing"]
    finally:
        await asyncio.to_thread(first.kill)
        await asyncio.to_thread(second.stop)
        await nc.close()


async def _has_keys(kv: nats.js.kv.KeyValue) -> bool:
    try:
        return bool(await kv.keys())
    except nats.js.errors.NoKeysError:
        return False


async def test_thousand_nodes_in_kv_are_back_after_restart(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    root = lab_node(tmp_path, "h100-ib-12nic", "template")
    template = collect_snapshot(Sysfs(root), node="template", seq=1, now=1.0, agent_version="t")
    nc = await nats.connect(own_nats.url)
    proc = AggregatorProcess(own_nats.url, tmp_path, "thousand")
    try:
        kv = await open_bucket(nc.jetstream())
        names = [f"seeded-{i:04d}" for i in range(1000)]
        for name in names:
            snap = msgspec.structs.replace(template, node=name)
            await kv.put(
                subjects.node_token(name), encode(StoredNode(snapshot=snap, received_at=1.0))
            )
        proc.start()
        await wait_until(proc.is_ready, timeout=45, what="aggregator ready")
        async with httpx.AsyncClient(base_url=proc.api_url) as api:
            listing = (await api.get("/api/v1/nodes", params={"limit": 5000})).json()
        assert sorted(i["name"] for i in listing["items"]) == names
        assert listing["total"] == len(names) and "continue" not in listing
    finally:
        await asyncio.to_thread(proc.stop)
        await nc.close()


async def test_kv_write_failure_reported_and_recovered(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    node = "kv-fail-01"
    root = lab_node(tmp_path, "roce-cx6dx", node)
    nc = await nats.connect(own_nats.url)
    js = nc.jetstream()
    try:
        async with aggregator(own_nats.url) as agg, agent(own_nats.url, root, node):

            def write_errors() -> float:
                value = agg.metrics.registry.get_sample_value(
                    "nicfleet_kv_write_errors_total", {"bucket": subjects.KV_NODES}
                )
                return value or 0.0

            kv = await js.key_value(subjects.KV_NODES)
            await wait_until(lambda: _has_keys(kv), what="first snapshot stored")
            # The bucket's stream disappears underneath the running aggregator.
            await js.delete_key_value(subjects.KV_NODES)
            port_down(root, "mlx5_0", 1)  # a new snapshot to write
            await wait_until(lambda: write_errors() >= 1, what="a failed KV write counted")
            async with httpx.AsyncClient(base_url=agg.api_url or "") as api:
                response = await api.get("/readyz")
                assert response.status_code == 503
                assert "KV write for node kv-fail-01 failed" in response.text
                assert (await api.get("/healthz")).status_code == 200
                # Ingest goes on while storage is down.
                await wait_until(
                    lambda: (
                        (r := agg.fleet.get(node)) is not None
                        and r.snapshot is not None
                        and r.snapshot.devices[0].ports[0].state == "DOWN"
                    ),
                    what="DOWN in the fleet",
                )
                # Space returns: the pending snapshot is written and readiness comes back.
                await js.create_key_value(bucket=subjects.KV_NODES, history=1)

                async def ready() -> bool:
                    return (await api.get("/readyz")).status_code == 200

                await wait_until(ready, timeout=15, what="ready after recovery")
            kv = await js.key_value(subjects.KV_NODES)
            stored = decode((await kv.get(subjects.node_token(node))).value or b"", StoredNode)
            assert stored.snapshot.devices[0].ports[0].state == "DOWN"
    finally:
        await nc.close()


async def test_alert_state_unreadable_at_leader_takeover_does_not_crash(
    own_nats: NatsServer,
) -> None:
    nc = await nats.connect(own_nats.url)
    js = nc.jetstream()
    service = AggregatorService(
        AggregatorSettings(nats_url=own_nats.url, listen_port=0, leader_ttl=4.0)
    )
    stop = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as tasks:
            tasks.create_task(service.run(stop))
            try:
                await asyncio.wait_for(service.ready.wait(), timeout=15)
                leader = service.leader
                assert leader is not None
                await wait_until(lambda: leader.is_leader, what="leading")
                # The alert states become unreadable, and another holder takes the lease.
                await js.delete_key_value(subjects.KV_ALERTS)
                lease = await js.key_value(LEADER_BUCKET)
                await lease.put(LEADER_KEY, b'{"holder": "someone-else"}')
                await wait_until(lambda: not leader.is_leader, what="stepped down")
                # The other holder never renews: this process takes over again and must
                # survive failing to load the persisted states.
                await wait_until(lambda: leader.is_leader, timeout=20, what="leading again")
                before = _evaluations(service)
                await wait_until(lambda: _evaluations(service) > before, what="evaluating")
                assert service.readiness()[0]
            finally:
                stop.set()
    finally:
        await nc.close()


def _evaluations(service: AggregatorService) -> float:
    registry = service.metrics.registry
    return sum(
        registry.get_sample_value("nicfleet_rule_evaluations_total", {"trigger": t}) or 0.0
        for t in ("start", "change", "tick")
    )
