"""The real RC queue pair (agent.verify.pair.queuepair) on RDMA hardware: both sides of the
pair test in one process on one port, the handshake over loopback TCP. Needs a device with an ACTIVE
port and Debian's python3-pyverbs; run with NICFLEET_RDMA_HW=1 [NICFLEET_RDMA_DEVICE=mlx5_0
NICFLEET_RDMA_PORT=1 NICFLEET_RDMA_GID_INDEX=3 (RoCE v2)]."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from agent.host.verbs import load_pyverbs
from agent.verify.pair import sides as pairtest
from agent.verify.pair.queuepair import PyverbsQueuePair
from proto.messages.validation import PairTestResult

pytestmark = [
    pytest.mark.rdma_hw,
    pytest.mark.integration,
    pytest.mark.skipif(
        os.environ.get("NICFLEET_RDMA_HW") != "1", reason="RDMA hardware test: NICFLEET_RDMA_HW=1"
    ),
]

DEVICE = os.environ.get("NICFLEET_RDMA_DEVICE", "mlx5_0")
PORT = int(os.environ.get("NICFLEET_RDMA_PORT", "1"))
GID_INDEX = int(os.environ.get("NICFLEET_RDMA_GID_INDEX", "0"))
VERBS_PATH = Path(os.environ.get("NICFLEET_VERBS_PATH", "/usr/lib/python3/dist-packages"))


def open_qp() -> PyverbsQueuePair:
    return PyverbsQueuePair(
        load_pyverbs(VERBS_PATH), device=DEVICE, port=PORT, gid_index=GID_INDEX, size=1 << 20
    )


async def test_loopback_pair_test_measures_bandwidth_and_latency() -> None:
    settings = pairtest.PairSettings(message_size=65536, iterations=2000, latency_iterations=500,
                                     timeout=30.0)  # fmt: skip
    server, queue = await pairtest.listen("127.0.0.1", 0, settings.timeout)
    port = server.sockets[0].getsockname()[1]

    async def serve() -> PairTestResult:
        channel = await pairtest.accept_one(server, queue, settings.timeout)
        return await pairtest.serve_pyverbs(channel, open_qp, settings)

    async with asyncio.TaskGroup() as tg:
        served = tg.create_task(serve())
        client = await pairtest.run_pyverbs("127.0.0.1", port, open_qp, settings)
    assert client.error is None, client.error
    assert served.result().error is None
    assert client.bytes_per_second is not None and client.bytes_per_second > 0
    assert client.latency is not None and client.latency.samples == 500
    assert 0 < client.latency.p50_us <= client.latency.p99_us
    assert client.local_device == client.remote_device == DEVICE
