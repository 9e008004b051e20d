"""The pair test between two pods: `verify --serve` and `verify --peer` sides.

Drives the handshake (agent.verify.pair.handshake) and a queue pair behind the
agent.verify.pair.queuepair boundary, or runs perftest and parses it
(agent.verify.pair.perftest). Every wait is bounded; every failure becomes a
PairTestResult with `error` and no numbers, never an exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
from collections.abc import Callable
from dataclasses import dataclass

from agent.verify.pair import perftest
from agent.verify.pair import results as pairresult
from agent.verify.pair.handshake import (
    Abort,
    Channel,
    Endpoint,
    Finished,
    HandshakeError,
    Ready,
    Start,
    connect,
)
from agent.verify.pair.queuepair import QueuePair, RdmaTestError
from proto.messages.validation import LatencySummary, PairTestMethod, PairTestResult

DEFAULT_PORT = 18515  # perftest's default port, so firewall rules written for it fit


@dataclass(frozen=True, kw_only=True)
class PairSettings:
    message_size: int = 65536
    iterations: int = 5000
    latency_iterations: int = 1000
    timeout: float = 30.0  # per wait: connect, each handshake message, each phase


OpenQueuePair = Callable[[], QueuePair]


def perftest_available() -> bool:
    return all(shutil.which(tool) for tool in (perftest.WRITE_BW, perftest.SEND_LAT))


async def _open(open_qp: OpenQueuePair) -> QueuePair:
    return await asyncio.to_thread(open_qp)


def _result(
    qp: QueuePair | None, remote: Endpoint | None, peer: str | None, **fields: object
) -> PairTestResult:
    local = qp.endpoint() if qp is not None else None
    return PairTestResult(
        method="pyverbs",
        peer=peer,
        local_device=local.device if local else None,
        local_port=local.port if local else None,
        local_gid=local.gid if local else None,
        remote_device=remote.device if remote else None,
        remote_gid=remote.gid if remote else None,
        **fields,  # type: ignore[arg-type]
    )


async def accept_one(
    server: asyncio.Server, queue: asyncio.Queue[Channel], timeout: float
) -> Channel:
    """The first connection of a listening server (others are refused), within `timeout`."""
    try:
        return await asyncio.wait_for(queue.get(), timeout)
    except TimeoutError as exc:
        raise HandshakeError(f"no peer connected within {timeout:g} s") from exc
    finally:
        server.close()


async def listen(
    host: str, port: int, timeout: float, *, start_serving: bool = True
) -> tuple[asyncio.Server, asyncio.Queue[Channel]]:
    """A TCP server whose first accepted connection lands in the returned queue.

    Raises HandshakeError when the address cannot be bound.
    """
    queue: asyncio.Queue[Channel] = asyncio.Queue(maxsize=1)

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        channel = Channel(reader, writer, timeout=timeout)
        try:
            queue.put_nowait(channel)
        except asyncio.QueueFull:
            await channel.close()  # one peer per test

    try:
        server = await asyncio.start_server(accepted, host, port, start_serving=start_serving)
    except OSError as exc:
        raise HandshakeError(f"cannot listen on {host}:{port}: {exc}") from exc
    return server, queue


async def serve_pyverbs(
    channel: Channel, open_qp: OpenQueuePair, settings: PairSettings
) -> PairTestResult:
    """The server side: answer the client's endpoint, post receives, echo pings."""
    qp: QueuePair | None = None
    remote: Endpoint | None = None
    try:
        remote = await channel.receive(Endpoint)
        qp = await _open(open_qp)
        await channel.send(qp.endpoint())
        await asyncio.to_thread(qp.connect, remote)
        start = await channel.receive(Start)
        await asyncio.to_thread(qp.post_receives, start.latency_iterations)
        await channel.send(Ready())
        await asyncio.to_thread(qp.serve_latency, start.latency_iterations, settings.timeout)
        done = await channel.receive(Finished)
        return _result(qp, remote, channel.peer, message_size=start.message_size,
                       iterations=start.iterations, bytes_per_second=done.bytes_per_second,
                       latency=_latency(done), error=done.error)  # fmt: skip
    except (HandshakeError, RdmaTestError) as exc:
        await _abort(channel, str(exc))
        return _result(qp, remote, channel.peer, error=str(exc))
    finally:
        await _finish(channel, qp)


def _latency(done: Finished) -> LatencySummary | None:
    return pairresult.latency_summary(done.latency_us) if done.latency_us else None


async def run_pyverbs(
    host: str, port: int, open_qp: OpenQueuePair, settings: PairSettings
) -> PairTestResult:
    """The client side: exchange endpoints, RDMA-write for bandwidth, ping-pong."""
    peer = f"{host}:{port}"
    try:
        channel = await connect(host, port, timeout=settings.timeout)
    except HandshakeError as exc:
        return _result(None, None, peer, error=str(exc))
    qp: QueuePair | None = None
    remote: Endpoint | None = None
    try:
        qp = await _open(open_qp)
        local = qp.endpoint()
        await channel.send(local)
        remote = await channel.receive(Endpoint)
        await asyncio.to_thread(qp.connect, remote)
        size = min(settings.message_size, remote.size, local.size)
        await channel.send(Start(message_size=size, iterations=settings.iterations,
                                 latency_iterations=settings.latency_iterations))  # fmt: skip
        await channel.receive(Ready)
        transfer = await asyncio.to_thread(
            qp.write_bandwidth, remote, size, settings.iterations, settings.timeout
        )
        rtts = await asyncio.to_thread(qp.ping_pong, settings.latency_iterations, settings.timeout)
        rate = pairresult.bytes_per_second(transfer.transferred, transfer.seconds)
        samples = pairresult.one_way_us(rtts)
        await channel.send(Finished(bytes_per_second=rate, latency_us=tuple(samples)))
        latency = pairresult.latency_summary(samples)
        return _result(qp, remote, peer, message_size=size, iterations=settings.iterations,
                       bytes_per_second=rate, latency=latency)  # fmt: skip
    except (HandshakeError, RdmaTestError, ValueError) as exc:
        await _abort(channel, str(exc))
        return _result(qp, remote, peer, error=str(exc))
    finally:
        await _finish(channel, qp)


async def refuse(channel: Channel, reason: str) -> None:
    """Tell the peer why this side cannot take part (its evidence verdict), then close."""
    await _abort(channel, reason)
    await channel.close()


async def _abort(channel: Channel, reason: str) -> None:
    with contextlib.suppress(HandshakeError):
        await channel.send(Abort(error=reason[:4096]))


async def _finish(channel: Channel, qp: QueuePair | None) -> None:
    await channel.close()
    if qp is not None:
        await asyncio.to_thread(qp.close)


async def run_perftest(
    *, device: str, gid_index: int | None, port: int, peer: str | None, settings: PairSettings
) -> PairTestResult:
    """ib_write_bw, then ib_send_lat on port + 1; server when `peer` is None."""
    method: PairTestMethod = "perftest"
    bw_cmd = perftest.write_bw_command(device=device, gid_index=gid_index, port=port,
                                       size=settings.message_size,
                                       iterations=settings.iterations, peer=peer)  # fmt: skip
    lat_cmd = perftest.send_lat_command(
        device=device, gid_index=gid_index, port=port + 1,
        iterations=settings.latency_iterations, peer=peer,
    )  # fmt: skip
    try:
        bw_out = await _run(bw_cmd, settings.timeout * 4)
        lat_out = await _run(lat_cmd, settings.timeout * 4, retries=0 if peer is None else 20)
        bw = perftest.parse_bandwidth(bw_out)[-1]
        lat = perftest.parse_latency(lat_out)[-1]
    except (OSError, RuntimeError, perftest.PerftestParseError) as exc:
        return PairTestResult(method=method, peer=peer, local_device=device, error=str(exc))
    return PairTestResult(
        method=method, peer=peer, message_size=bw.message_size, iterations=bw.iterations,
        bytes_per_second=bw.bytes_per_second, latency=lat.summary(), local_device=device,
    )  # fmt: skip


async def _run(command: list[str], timeout: float, *, retries: int = 0) -> str:
    """stdout of a perftest run; a client retries while its server is not listening yet."""
    for attempt in range(retries + 1):
        process = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise RuntimeError(f"{command[0]} did not finish within {timeout:g} s") from None
        if process.returncode == 0:
            return out.decode(errors="replace")
        if attempt < retries and b"Couldn't connect" in out + err:
            await asyncio.sleep(0.5)  # the server side starts its next tool; bounded retries
            continue
        tail = (err or out).decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{command[0]} exited with {process.returncode}: {' | '.join(tail)}")
    raise RuntimeError(f"{command[0]} found no server")
