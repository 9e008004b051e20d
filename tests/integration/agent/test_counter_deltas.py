"""Counter deltas end to end: lab tree → agent → real nats-server → aggregator fleet view."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import nats
import pytest
from nats.aio.msg import Msg

from agent.counters.reader import CounterReader
from agent.host.sysfs import Sysfs
from agent.service import AgentService, AgentSettings
from aggregator.bus.natsserver import NatsServer
from proto import subjects
from proto.codec import decode
from proto.messages.counters import CounterBatch
from tests.integration.agent.test_pipeline import aggregator, lab_node
from tests.support.waits import wait_until

pytestmark = pytest.mark.integration
NODE = "delta-ib-01"
BUMPED = 987_654_321


@asynccontextmanager
async def agent(nats_url: str, root: Path) -> AsyncIterator[AgentService]:
    settings = AgentSettings(
        node_name=NODE,
        sysfs_root=root,
        nats_url=nats_url,
        counter_interval=0.1,
        counter_full_every=4,
        netlink=False,
    )
    service = AgentService(settings)
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(service.run(stop))
        try:
            yield service
        finally:
            stop.set()


async def test_deltas_rebuild_the_full_view_in_the_aggregator(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    root = lab_node(tmp_path, "h100-ib-12nic", NODE)
    seen: list[CounterBatch] = []

    async def capture(msg: Msg) -> None:
        seen.append(decode(msg.data, CounterBatch))

    nc = await nats.connect(nats_server.url)
    await nc.subscribe(subjects.node_subject(NODE, subjects.COUNTERS), cb=capture)
    try:
        async with aggregator(nats_server.url) as agg, agent(nats_server.url, root):

            def stored() -> CounterBatch | None:
                record = agg.fleet.get(NODE)
                return record.counters if record is not None else None

            await wait_until(
                lambda: any(m.base_seq is not None for m in seen),
                timeout=30,
                what="a delta on the wire",
            )
            counter = root / "class/infiniband/mlx5_3/ports/1/counters/port_rcv_data"
            counter.write_text(f"{BUMPED}\n")
            bumped_after = len(seen)

            def merged_delta_has_the_value() -> bool:
                batch = stored()
                deltas = {m.seq for m in seen[bumped_after:] if m.base_seq is not None}
                if batch is None or batch.seq not in deltas:
                    return False
                port = next(p for p in batch.ports if p.device == "mlx5_3")
                return port.counters.get("port_rcv_data") == BUMPED

            await wait_until(
                merged_delta_has_the_value, timeout=30, what="a merged delta with the new value"
            )
            view = stored()
            assert agg.fleet.unmatched_deltas == 0
    finally:
        await nc.close()

    assert view is not None and view.base_seq is None
    # Idle ports are not on the wire, yet the aggregator holds every port as read.
    assert min(len(m.ports) for m in seen if m.base_seq is not None) < len(view.ports)
    with CounterReader(Sysfs(root)) as reader:
        direct = reader.collect(node=NODE, seq=1, now=0.0)
    assert [(p.device, p.counters, p.hw_counters, p.rx_bytes) for p in view.ports] == [
        (p.device, p.counters, p.hw_counters, p.rx_bytes) for p in direct.ports
    ]
