"""Fault of the store: the `nicfleet-nodes` bucket's stream runs into its `max_bytes`
limit (JetStream's "disk full"), so KV puts fail with the server's real error; then an
operator raises the limit with a stream update and every pending snapshot is written.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import httpx
import nats
import pytest
from nats.js.client import JetStreamContext

from agent.lab.faults import port_down
from aggregator.bus.natsserver import NatsServer
from aggregator.fleet.store import StoredNode
from aggregator.service import AggregatorService
from proto import subjects
from proto.codec import decode
from tests.integration.agent.test_pipeline import agent, lab_node
from tests.integration.alerts.test_alerts import aggregator
from tests.support.waits import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow]

STREAM = f"KV_{subjects.KV_NODES}"
FULL = "maximum bytes exceeded"  # nats-server's NewJSStreamStoreFailedError text


def write_errors(agg: AggregatorService) -> float:
    value = agg.metrics.registry.get_sample_value(
        "nicfleet_kv_write_errors_total", {"bucket": subjects.KV_NODES}
    )
    return value or 0.0


def counter_seq(agg: AggregatorService, node: str) -> int:
    record = agg.fleet.get(node)
    return record.counters.seq if record is not None and record.counters is not None else 0


async def set_max_bytes(js: JetStreamContext, max_bytes: int) -> None:
    """What `nats stream edit KV_nicfleet-nodes --max-bytes` does: a stream update."""
    config = (await js.stream_info(STREAM)).config
    await js.update_stream(dataclasses.replace(config, max_bytes=max_bytes))


async def stored(js: JetStreamContext, node: str) -> StoredNode | None:
    kv = await js.key_value(subjects.KV_NODES)
    try:
        entry = await kv.get(subjects.node_token(node))
    except nats.js.errors.KeyNotFoundError:
        return None
    return decode(entry.value or b"", StoredNode)


async def test_kv_at_max_bytes_is_reported_and_written_once_space_returns(
    own_nats: NatsServer, tmp_path: Path
) -> None:
    first, second = "kv-full-01", "kv-full-02"
    roots = {first: lab_node(tmp_path, "roce-cx6dx", first),
             second: lab_node(tmp_path, "h100-ib-12nic", second)}  # fmt: skip
    nc = await nats.connect(own_nats.url)
    js = nc.jetstream()
    try:
        async with aggregator(own_nats.url) as agg, agent(own_nats.url, roots[first], first):

            async def first_stored() -> bool:
                return await stored(js, first) is not None

            await wait_until(first_stored, what="first node stored")
            # The stream is full: its limit is exactly what it holds now.
            used = (await js.stream_info(STREAM)).state.bytes
            await set_max_bytes(js, used)
            async with agent(own_nats.url, roots[second], second):
                # A new node's snapshot does not fit any more.
                await wait_until(lambda: write_errors(agg) >= 1, what="a failed KV write")
                is_ready, reason = agg.readiness()
                assert not is_ready
                assert FULL in reason
                async with httpx.AsyncClient(base_url=agg.api_url or "") as api:
                    response = await api.get("/readyz")
                    assert response.status_code == 503
                    assert FULL in response.text
                    assert f"KV write for node {second} failed" in response.text
                    assert (await api.get("/healthz")).status_code == 200
                    # Ingest goes on while storage is full: both nodes, live counters,
                    # and a fault on the first node reaches the fleet.
                    for node in (first, second):
                        seq = counter_seq(agg, node)
                        await wait_until(
                            lambda n=node, s=seq: counter_seq(agg, n) > s + 2,  # type: ignore[misc]
                            what=f"counters of {node} while full",
                        )
                    port_down(roots[first], "mlx5_0", 1)
                    await wait_until(
                        lambda: (
                            (r := agg.fleet.get(first)) is not None
                            and r.snapshot is not None
                            and r.snapshot.devices[0].ports[0].state == "DOWN"
                        ),
                        what="DOWN in the fleet",
                    )
                    errors = write_errors(agg)
                    await wait_until(lambda: write_errors(agg) > errors, what="retries failing")
                    assert await stored(js, second) is None  # nothing half-written

                    # Space returns: an operator raises the limit.
                    await set_max_bytes(js, 64 * 1024 * 1024)

                    async def ready() -> bool:
                        return (await api.get("/readyz")).status_code == 200

                    await wait_until(ready, timeout=15, what="ready after space returned")

                async def newest_everywhere() -> bool:
                    for node in (first, second):
                        record, kept = agg.fleet.get(node), await stored(js, node)
                        if record is None or kept is None or kept.snapshot != record.snapshot:
                            return False
                    return True

                await wait_until(newest_everywhere, timeout=15, what="KV = fleet")
            kept = await stored(js, first)
            assert kept is not None and kept.snapshot.devices[0].ports[0].state == "DOWN"
            assert agg.readiness() == (True, "ok")
    finally:
        await nc.close()
