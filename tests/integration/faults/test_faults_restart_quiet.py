"""Aggregator restarts stay quiet (issue 19 §4): with three healthy agents, a SIGTERM and
restart of `python -m aggregator run`, or the leader stopped under a second replica, sends
nothing — no alert received by a real Alertmanager, none on `nicfleet.v1.alert.>`.

The nodes loaded from KV carry their last snapshot's receive time; `agent-stale` must count
from when the new process could first have heard them, not from that time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import nats
import pytest
from nats.aio.client import Client as NatsClient
from nats.js.errors import KeyNotFoundError

from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import StoredNode
from aggregator.replicas.leader import LEADER_BUCKET, LEADER_KEY
from proto import subjects
from proto.codec import decode
from tests.integration.agent.test_pipeline import lab_node
from tests.integration.alerts.test_alertmanager import (
    alertmanager_factory as alertmanager_factory,  # the fixture, re-exported for pytest
)
from tests.integration.alerts.test_alertmanager import am_alerts, am_ready, webhook
from tests.integration.faults.test_faults_aggregator import evaluations
from tests.support.faults import AggregatorProcess, add_alert_recorder, recorded_alerts
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# agent-stale's staleAfter here (default 30 s) and the agents' counter interval: healthy
# agents (3 batches within staleAfter) whose next message after a restart comes, for most
# nodes, after the new leader's first evaluation — as with the defaults at scale.
STALE_AFTER = 12.0
COUNTER_INTERVAL = 4.0
NODES = ("quiet-01", "quiet-02", "quiet-03")
POLICY = f"""\
apiVersion: nicfleet.io/v1alpha1
kind: NicFleetPolicy
metadata: {{name: quiet-restart}}
spec:
  alerts:
    agent-stale: {{thresholds: {{staleAfter: {STALE_AFTER:g}}}}}
"""


@contextlib.asynccontextmanager
async def _agents(nats_url: str, roots: list[Path]) -> AsyncIterator[None]:
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        for node, root in zip(NODES, roots, strict=True):
            settings = AgentSettings(node_name=node, sysfs_root=root, nats_url=nats_url,
                                     counter_interval=COUNTER_INTERVAL, netlink=False)  # fmt: skip
            tasks.create_task(AgentService(settings).run(stop))
        try:
            yield
        finally:
            stop.set()


async def _received_by_alertmanager(am_url: str) -> float:
    """Alerts Alertmanager accepted (firing and resolved, any API), from its own metrics."""
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"{am_url}/metrics")).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("alertmanager_alerts_received_total")
    )


async def _stored_older_than(nc: NatsClient, age: float) -> bool:
    """Every node's snapshot in KV was received more than `age` seconds ago."""
    kv = await nc.jetstream().key_value(subjects.KV_NODES)
    for node in NODES:
        try:
            entry = await kv.get(subjects.node_token(node))
        except KeyNotFoundError:
            return False
        if time.time() - decode(entry.value or b"", StoredNode).received_at <= age:
            return False
    return True


async def _leader(nc: NatsClient) -> str:
    kv = await nc.jetstream().key_value(LEADER_BUCKET)
    try:
        entry = await kv.get(LEADER_KEY)
    except KeyNotFoundError:
        return ""
    return str(json.loads(entry.value or b"{}").get("holder") or "")


async def _evaluations(proc: AggregatorProcess) -> float:
    async with httpx.AsyncClient(base_url=proc.api_url) as api:
        return evaluations((await api.get("/metrics")).text)


async def _nodes_heard_since(proc: AggregatorProcess, since: float) -> bool:
    """The API shows every node with a receive time after `since` (the true time)."""
    async with httpx.AsyncClient(base_url=proc.api_url) as api:
        for node in NODES:
            reply = await api.get(f"/api/v1/nodes/{node}")
            if reply.status_code != 200 or float(reply.json()["summary"]["last_seen"]) <= since:
                return False
    return True


class Sent(NamedTuple):
    """What had been alerted before the restart: the recorder's alerts, Alertmanager's count."""

    recorded: Sequence[tuple[str, str, str, str]]
    alertmanager: float


async def _sent(nc: NatsClient, am_url: str) -> Sent:
    await nc.flush()
    recorded = [(a.rule, a.node, a.subject, a.state) for a in await recorded_alerts(nc)]
    return Sent(recorded, await _received_by_alertmanager(am_url))


async def _aged_and_settled(
    nc: NatsClient, leader: AggregatorProcess, name: str, am_url: str
) -> Sent:
    """Wait until `leader` leads, every stored snapshot is older than staleAfter and every
    alert of the agents' first contact is resolved; what was sent until then."""
    await wait_until(lambda: _leader_is(nc, name), timeout=30, what=f"{name} leading")
    await wait_until(
        lambda: _stored_older_than(nc, STALE_AFTER + 1.0),
        timeout=30,
        what="stored snapshots older than staleAfter",
    )

    async def settled() -> bool:
        states = [s[3] for s in (await _sent(nc, am_url)).recorded]
        return states.count("firing") == states.count("resolved") and not await am_alerts(am_url)

    await wait_until(settled, timeout=30, what="first-contact alerts resolved")
    before = await _sent(nc, am_url)
    # A first contact (a counter batch before the snapshot) raises nothing: state not yet
    # observed is no finding (docs/alerts.md), so nothing fired or resolved.
    assert before.recorded == []
    return before


async def _leader_is(nc: NatsClient, name: str) -> bool:
    return await _leader(nc) == name


async def _evaluated_after_hearing(proc: AggregatorProcess, since: float) -> None:
    """The new leader has heard every node again and evaluated a few times since: any
    alert the restart would cause has been sent by then (before the fix: at its first
    cycle as leader)."""
    await wait_until(
        lambda: _nodes_heard_since(proc, since), timeout=30, what="every node heard again"
    )
    base = await _evaluations(proc)

    async def evaluated() -> bool:
        return await _evaluations(proc) >= base + 3

    await wait_until(evaluated, timeout=30, what="three more evaluations")


async def _assert_nothing_sent(nc: NatsClient, am_url: str, before: Sent) -> None:
    after = await _sent(nc, am_url)
    assert after.recorded[len(before.recorded) :] == []
    assert after.alertmanager == before.alertmanager  # Alertmanager received nothing
    assert await am_alerts(am_url) == []


def _process(url: str, work: Path, name: str, policy: Path, am_url: str) -> AggregatorProcess:
    extra = ("--policy", str(policy), "--alertmanager-url", am_url, "--identity", name)
    return AggregatorProcess(url, work, name, extra=extra)


async def test_sigterm_restart_with_healthy_agents_sends_nothing(
    own_nats: NatsServer, tmp_path: Path, alertmanager_factory: Any
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    roots = [lab_node(tmp_path, "a100-ib-4nic", node) for node in NODES]
    nc = await nats.connect(own_nats.url)
    async with webhook() as (_, hook_url):  # Alertmanager's receiver (nothing reaches it)
        am_url = alertmanager_factory(hook_url)
        await wait_until(lambda: am_ready(am_url), timeout=20, what="Alertmanager ready")
        first = _process(own_nats.url, tmp_path, "first", policy, am_url)
        second = _process(own_nats.url, tmp_path, "second", policy, am_url)
        try:
            await add_alert_recorder(nc)
            first.start()
            await wait_until(first.is_ready, timeout=30, what="first aggregator ready")
            async with _agents(own_nats.url, roots):
                before = await _aged_and_settled(nc, first, "first", am_url)
                await asyncio.to_thread(first.stop)  # SIGTERM: the lease is released
                restarted = time.time()
                second.start()
                await wait_until(second.is_ready, timeout=30, what="second aggregator ready")
                await wait_until(lambda: _leader_is(nc, "second"), timeout=30, what="leading")
                await _evaluated_after_hearing(second, restarted)
                await _assert_nothing_sent(nc, am_url, before)
        finally:
            await asyncio.to_thread(first.stop)
            await asyncio.to_thread(second.stop)
            await nc.close()


async def test_leader_stopped_under_a_second_replica_sends_nothing(
    own_nats: NatsServer, tmp_path: Path, alertmanager_factory: Any
) -> None:
    """The follower starts once the stored snapshots are older than staleAfter (so it loads
    aged records), then the leader is stopped and the follower takes over."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    roots = [lab_node(tmp_path, "a100-ib-4nic", node) for node in NODES]
    nc = await nats.connect(own_nats.url)
    async with webhook() as (_, hook_url):  # Alertmanager's receiver (nothing reaches it)
        am_url = alertmanager_factory(hook_url)
        await wait_until(lambda: am_ready(am_url), timeout=20, what="Alertmanager ready")
        leader = _process(own_nats.url, tmp_path, "leader", policy, am_url)
        follower = _process(own_nats.url, tmp_path, "follower", policy, am_url)
        try:
            await add_alert_recorder(nc)
            leader.start()
            await wait_until(leader.is_ready, timeout=30, what="leader ready")
            async with _agents(own_nats.url, roots):
                before = await _aged_and_settled(nc, leader, "leader", am_url)
                follower.start()
                await wait_until(follower.is_ready, timeout=30, what="follower ready")
                await asyncio.to_thread(leader.stop)
                stopped = time.time()
                await wait_until(
                    lambda: _leader_is(nc, "follower"), timeout=30, what="follower leading"
                )
                await _evaluated_after_hearing(follower, stopped)
                await _assert_nothing_sent(nc, am_url, before)
        finally:
            await asyncio.to_thread(leader.stop)
            await asyncio.to_thread(follower.stop)
            await nc.close()
