"""The pair test over real TCP on loopback, with a fake queue pair behind the
agent.verify.pair.queuepair boundary (no RDMA hardware here): results, and every way a peer can fail
the handshake ending in a clear error within the timeout."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import msgspec
import pytest

from agent.verify.pair import sides as pairtest
from agent.verify.pair.handshake import (
    MAX_FRAME,
    Channel,
    Endpoint,
    HandshakeError,
    Start,
    connect,
    encode_frame,
)
from agent.verify.pair.queuepair import RdmaTestError, Transfer
from proto.messages.validation import PairTestResult

pytestmark = pytest.mark.integration

FAST = pairtest.PairSettings(message_size=65536, iterations=100, latency_iterations=100,
                             timeout=5.0)  # fmt: skip
SHORT = pairtest.PairSettings(message_size=65536, iterations=10, latency_iterations=10,
                              timeout=0.3)  # fmt: skip


@dataclass
class FakeQueuePair:
    """Stands in for PyverbsQueuePair; records what the handshake asked of it."""

    device: str
    gid: str
    qpn: int
    fail: str | None = None  # the step that raises RdmaTestError
    remote: Endpoint | None = None
    posted: int = 0
    served: int = 0
    closed: bool = False
    calls: list[str] = field(default_factory=list)

    def endpoint(self) -> Endpoint:
        return Endpoint(qpn=self.qpn, psn=0x100 + self.qpn, lid=0, gid=self.gid, gid_index=3,
                        mtu=4096, rkey=0xABC, addr=0x7F0000001000, size=1 << 20,
                        device=self.device, port=1)  # fmt: skip

    def _step(self, name: str) -> None:
        self.calls.append(name)
        if self.fail == name:
            raise RdmaTestError(f"{name} failed on {self.device}")

    def connect(self, remote: Endpoint) -> None:
        self._step("connect")
        self.remote = remote

    def post_receives(self, count: int) -> None:
        self._step("post_receives")
        self.posted += count

    def serve_latency(self, iterations: int, timeout: float) -> None:
        self._step("serve_latency")
        self.served = iterations

    def write_bandwidth(
        self, remote: Endpoint, size: int, iterations: int, timeout: float
    ) -> Transfer:
        self._step("write_bandwidth")
        return Transfer(size * iterations, 0.25)

    def ping_pong(self, iterations: int, timeout: float) -> list[float]:
        self._step("ping_pong")
        # round trips: all 4 µs but one of 20 µs -> one-way 2 µs, max 10 µs
        return [4e-6] * (iterations - 1) + [20e-6]

    def close(self) -> None:
        self.closed = True


SERVER_GID = "0000:0000:0000:0000:0000:ffff:0a0a:000b"
CLIENT_GID = "0000:0000:0000:0000:0000:ffff:0a0a:000c"


Accepted = asyncio.Queue[Channel]


async def start_server(settings: pairtest.PairSettings) -> tuple[asyncio.Server, Accepted, int]:
    server, queue = await pairtest.listen("127.0.0.1", 0, settings.timeout)
    return server, queue, server.sockets[0].getsockname()[1]


async def serve(
    qp: FakeQueuePair, settings: pairtest.PairSettings, server: asyncio.Server, queue: Accepted
) -> PairTestResult:
    channel = await pairtest.accept_one(server, queue, settings.timeout)
    return await pairtest.serve_pyverbs(channel, lambda: qp, settings)


async def test_pair_test_reports_the_same_numbers_on_both_sides() -> None:
    server_qp = FakeQueuePair("mlx5_0", SERVER_GID, 0x11)
    client_qp = FakeQueuePair("mlx5_1", CLIENT_GID, 0x22)
    server, queue, port = await start_server(FAST)
    async with asyncio.TaskGroup() as tg:
        served = tg.create_task(serve(server_qp, FAST, server, queue))
        client = await pairtest.run_pyverbs("127.0.0.1", port, lambda: client_qp, FAST)
    server_result = served.result()
    assert client.error is None and server_result.error is None
    assert client.bytes_per_second == pytest.approx(65536 * 100 / 0.25)
    assert client.latency is not None
    assert (client.latency.samples, client.latency.p50_us, client.latency.max_us) == (
        100,
        2.0,
        10.0,
    )
    assert client.latency.p99_us == 2.0  # nearest rank: the 99th of 100 sorted samples
    assert server_result.bytes_per_second == client.bytes_per_second
    assert server_result.latency == client.latency
    assert (client.local_device, client.local_gid) == ("mlx5_1", CLIENT_GID)
    assert (client.remote_device, client.remote_gid) == ("mlx5_0", SERVER_GID)
    assert (server_result.local_device, server_result.remote_gid) == ("mlx5_0", CLIENT_GID)
    assert client_qp.remote == server_qp.endpoint() and server_qp.remote == client_qp.endpoint()
    assert (server_qp.posted, server_qp.served) == (100, 100)
    assert server_qp.closed and client_qp.closed
    assert client.message_size == 65536 and client.method == "pyverbs"


async def test_message_size_is_capped_by_the_peer_buffer() -> None:
    settings = pairtest.PairSettings(message_size=4 << 20, iterations=2, latency_iterations=2,
                                     timeout=5.0)  # fmt: skip
    server, queue, port = await start_server(settings)
    async with asyncio.TaskGroup() as tg:
        tg.create_task(serve(FakeQueuePair("mlx5_0", SERVER_GID, 1), settings, server, queue))
        client = await pairtest.run_pyverbs(
            "127.0.0.1", port, lambda: FakeQueuePair("mlx5_1", CLIENT_GID, 2), settings
        )
    assert client.message_size == 1 << 20


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
StartPeer = Callable[[Handler], Awaitable[int]]


@pytest.fixture
async def raw_peer() -> AsyncIterator[StartPeer]:
    """A loopback TCP server whose behaviour the test scripts (silent, garbage, ...)."""
    servers: list[asyncio.Server] = []

    async def start(handler: Handler) -> int:
        server = await asyncio.start_server(handler, "127.0.0.1", 0)
        servers.append(server)
        return int(server.sockets[0].getsockname()[1])

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


def frame(raw: bytes) -> bytes:
    return struct.pack(">I", len(raw)) + raw


async def test_peer_that_never_answers_times_out(raw_peer: StartPeer) -> None:
    release = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(MAX_FRAME)  # the client's endpoint, then silence
        await release.wait()
        writer.close()

    port = await raw_peer(silent)
    qp = FakeQueuePair("mlx5_1", CLIENT_GID, 2)
    result = await pairtest.run_pyverbs("127.0.0.1", port, lambda: qp, SHORT)
    release.set()
    assert result.error == f"127.0.0.1:{port} sent no Endpoint within 0.3 s"
    assert result.bytes_per_second is None and result.latency is None
    assert qp.closed


async def test_nobody_listening_is_a_connect_error() -> None:
    server, _, port = await start_server(SHORT)
    server.close()
    await server.wait_closed()
    result = await pairtest.run_pyverbs(
        "127.0.0.1", port, lambda: FakeQueuePair("d", CLIENT_GID, 1), SHORT
    )
    assert result.error is not None and result.error.startswith(
        f"cannot connect to 127.0.0.1:{port}"
    )
    assert result.bytes_per_second is None


@pytest.mark.parametrize(
    ("reply", "needle"),
    [
        pytest.param(frame(b"\xc1\xc1\xc1"), "malformed handshake message", id="malformed"),
        pytest.param(struct.pack(">I", MAX_FRAME + 1), f"the limit is {MAX_FRAME}", id="oversized"),
        pytest.param(frame(msgspec.msgpack.encode({"kind": "endpoint", "version": 2})),
                     "handshake version 2", id="wrong-version"),
        pytest.param(encode_frame(Start(message_size=1, iterations=1, latency_iterations=1)),
                     "sent Start where Endpoint was expected", id="out-of-order"),
        pytest.param(frame(msgspec.msgpack.encode({"kind": "endpoint", "version": 1, "qpn": -5})),
                     "invalid endpoint message", id="bad-field"),
        pytest.param(b"\x00\x00", "closed the connection before Endpoint", id="truncated"),
    ],
)  # fmt: skip
async def test_bad_replies_fail_the_client_clearly(
    raw_peer: StartPeer, reply: bytes, needle: str
) -> None:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(4)
        writer.write(reply)
        await writer.drain()
        writer.close()

    port = await raw_peer(answer)
    qp = FakeQueuePair("mlx5_1", CLIENT_GID, 2)
    result = await pairtest.run_pyverbs("127.0.0.1", port, lambda: qp, SHORT)
    assert result.error is not None and needle in result.error
    assert result.bytes_per_second is None and qp.closed


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        pytest.param(frame(b"not msgpack at all \xc1"), "malformed", id="malformed"),
        pytest.param(struct.pack(">I", 10 * MAX_FRAME) + b"x" * 100, "byte frame", id="oversized"),
        pytest.param(b"", "closed the connection before Endpoint", id="hang-up"),
    ],
)
async def test_bad_clients_fail_the_server_clearly(payload: bytes, needle: str) -> None:
    server, queue, port = await start_server(SHORT)
    qp = FakeQueuePair("mlx5_0", SERVER_GID, 1)
    async with asyncio.TaskGroup() as tg:
        served = tg.create_task(serve(qp, SHORT, server, queue))
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(payload)
        await writer.drain()
        writer.close()
    result = served.result()
    assert result.error is not None and needle in result.error
    assert result.bytes_per_second is None


async def test_server_without_a_peer_gives_up_within_the_timeout() -> None:
    server, queue, _ = await start_server(SHORT)
    with pytest.raises(HandshakeError, match=r"no peer connected within 0\.3 s"):
        await pairtest.accept_one(server, queue, SHORT.timeout)


async def test_refusing_side_fails_the_peer_fast_with_its_reason() -> None:
    server, queue, port = await start_server(FAST)

    async def refuse() -> None:
        channel = await pairtest.accept_one(server, queue, FAST.timeout)
        await pairtest.refuse(channel, "evidence verdict is broken: no port of mlx5_0 is ACTIVE")

    async with asyncio.TaskGroup() as tg:
        tg.create_task(refuse())
        result = await pairtest.run_pyverbs(
            "127.0.0.1", port, lambda: FakeQueuePair("mlx5_1", CLIENT_GID, 2), FAST
        )
    assert result.error == (
        f"peer 127.0.0.1:{port} aborted: evidence verdict is broken: no port of mlx5_0 is ACTIVE"
    )
    assert result.bytes_per_second is None and result.latency is None


@pytest.mark.parametrize("step", ["connect", "write_bandwidth", "ping_pong"])
async def test_client_qp_failure_reaches_the_server_as_an_abort(step: str) -> None:
    server, queue, port = await start_server(FAST)
    server_qp = FakeQueuePair("mlx5_0", SERVER_GID, 1)
    client_qp = FakeQueuePair("mlx5_1", CLIENT_GID, 2, fail=step)
    async with asyncio.TaskGroup() as tg:
        served = tg.create_task(serve(server_qp, FAST, server, queue))
        client = await pairtest.run_pyverbs("127.0.0.1", port, lambda: client_qp, FAST)
    assert client.error == f"{step} failed on mlx5_1"
    assert client.bytes_per_second is None
    server_error = served.result().error or ""
    assert server_error.startswith("peer 127.0.0.1:")  # the client's ephemeral port
    assert server_error.endswith(f" aborted: {step} failed on mlx5_1")
    assert server_qp.closed and client_qp.closed


async def test_server_qp_failure_reaches_the_client() -> None:
    server, queue, port = await start_server(FAST)
    server_qp = FakeQueuePair("mlx5_0", SERVER_GID, 1, fail="connect")
    async with asyncio.TaskGroup() as tg:
        served = tg.create_task(serve(server_qp, FAST, server, queue))
        client = await pairtest.run_pyverbs(
            "127.0.0.1", port, lambda: FakeQueuePair("mlx5_1", CLIENT_GID, 2), FAST
        )
    assert served.result().error == "connect failed on mlx5_0"
    assert client.error is not None and client.error.endswith("aborted: connect failed on mlx5_0")


async def test_a_port_in_use_is_a_clear_error() -> None:
    server, _, port = await start_server(SHORT)
    try:
        with pytest.raises(HandshakeError, match=f"cannot listen on 127.0.0.1:{port}"):
            await pairtest.listen("127.0.0.1", port, SHORT.timeout)
    finally:
        server.close()
        await server.wait_closed()


async def test_client_started_before_the_server_listens_still_connects() -> None:
    # Both pods of a validation start together; the client retries refused connects. The
    # port is bound but not listening (start_serving=False) until the client runs.
    server, queue = await pairtest.listen("127.0.0.1", 0, FAST.timeout, start_serving=False)
    port = server.sockets[0].getsockname()[1]
    client_qp = FakeQueuePair("mlx5_1", CLIENT_GID, 2)
    async with asyncio.TaskGroup() as tg:
        client = tg.create_task(pairtest.run_pyverbs("127.0.0.1", port, lambda: client_qp, FAST))
        await server.start_serving()
        tg.create_task(serve(FakeQueuePair("mlx5_0", SERVER_GID, 1), FAST, server, queue))
    assert client.result().error is None
    assert client.result().bytes_per_second is not None


async def test_a_server_that_never_listens_is_retried_until_the_timeout() -> None:
    server, _ = await pairtest.listen("127.0.0.1", 0, SHORT.timeout, start_serving=False)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(
            HandshakeError, match=rf"cannot connect to 127.0.0.1:{port} within 0\.3 s"
        ):
            await connect("127.0.0.1", port, timeout=SHORT.timeout)
    finally:
        server.close()
