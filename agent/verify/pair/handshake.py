"""The pair test's out-of-band handshake: length-prefixed msgpack messages over TCP.

Frames are a 4-byte big-endian length and a msgspec-encoded message carrying `version`.
Every read is bounded (size and time); a malformed, oversized or foreign-version frame, a
peer that stays silent or hangs up all become one `HandshakeError` naming what was wrong.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from typing import Annotated, Final, Literal, TypeVar

import msgspec

from agent.errors import AgentError

HANDSHAKE_VERSION: Final = 1
MAX_FRAME: Final = 64 * 1024
_LENGTH: Final = struct.Struct(">I")
_RETRY: Final = 0.2  # seconds between attempts while the server is not listening yet

U8 = Annotated[int, msgspec.Meta(ge=0, le=0xFF)]
U16 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF)]
U24 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFF)]
U32 = Annotated[int, msgspec.Meta(ge=0, le=0xFFFFFFFF)]
U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgspec bounds stop at int64; uint64 decodes
Mtu = Literal[256, 512, 1024, 2048, 4096]
# An RDMA GID as sysfs and pyverbs write it: eight groups of four hex digits.
GidText = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{4}(:[0-9a-f]{4}){7}$")]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
Size = Annotated[int, msgspec.Meta(ge=1, le=1 << 30)]
Count = Annotated[int, msgspec.Meta(ge=1, le=10_000_000)]


class HandshakeError(AgentError):
    """The peer broke the handshake: silent, gone, or sent something not allowed."""


class _Message(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    version: int = HANDSHAKE_VERSION


class Endpoint(_Message, frozen=True, kw_only=True, tag="endpoint"):
    """One side's RC queue pair and buffer: what the other side needs to reach it."""

    qpn: U24
    psn: U24
    lid: U16  # 0 on RoCE
    gid: GidText
    gid_index: U8
    mtu: Mtu  # bytes (path MTU)
    rkey: U32
    addr: U64  # buffer address for RDMA write
    size: Size  # buffer bytes
    device: Name
    port: Annotated[int, msgspec.Meta(ge=1, le=255)]


class Start(_Message, frozen=True, kw_only=True, tag="start"):
    """Client -> server: what the client will run."""

    message_size: Size
    iterations: Count
    latency_iterations: Count


class Ready(_Message, frozen=True, kw_only=True, tag="ready"):
    """Server -> client: receives are posted, go."""


class Finished(_Message, frozen=True, kw_only=True, tag="finished"):
    """Client -> server: the measured numbers (µs, bytes/s), or why there are none."""

    bytes_per_second: Annotated[float, msgspec.Meta(ge=0)] | None = None
    latency_us: tuple[Annotated[float, msgspec.Meta(ge=0)], ...] = ()
    error: str | None = None


class Abort(_Message, frozen=True, kw_only=True, tag="abort"):
    """Either side: the test cannot go on."""

    error: Annotated[str, msgspec.Meta(max_length=4096)]


Message = Endpoint | Start | Ready | Finished | Abort
M = TypeVar("M", Endpoint, Start, Ready, Finished)


class _Envelope(msgspec.Struct, kw_only=True):
    version: int | None = None
    kind: str | None = None


_encoder = msgspec.msgpack.Encoder()
_envelope = msgspec.msgpack.Decoder(_Envelope)
_decoder = msgspec.msgpack.Decoder(Message)


def encode_frame(message: Message) -> bytes:
    body = _encoder.encode(message)
    return _LENGTH.pack(len(body)) + body


def decode_body(body: bytes) -> Message:
    """A frame's body as a message; HandshakeError names the field that is wrong."""
    try:
        envelope = _envelope.decode(body)
    except msgspec.DecodeError as exc:
        raise HandshakeError(f"malformed handshake message: {exc}") from exc
    except msgspec.ValidationError as exc:
        raise HandshakeError(f"malformed handshake message: {exc}") from exc
    if envelope.version != HANDSHAKE_VERSION:
        raise HandshakeError(
            f"peer speaks handshake version {envelope.version}, this agent "
            f"{HANDSHAKE_VERSION}: run the same nicfleet-agent version on both sides"
        )
    try:
        message: Message = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise HandshakeError(f"invalid {envelope.kind or 'handshake'} message: {exc}") from exc
    return message


class Channel:
    """One handshake connection; every receive waits at most `timeout` seconds."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, timeout: float
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.timeout = timeout
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)

    async def send(self, message: Message) -> None:
        try:
            self._writer.write(encode_frame(message))
            await asyncio.wait_for(self._writer.drain(), self.timeout)
        except (OSError, TimeoutError) as exc:
            raise HandshakeError(f"cannot send {message.__class__.__name__} to {self.peer}: "
                                 f"{exc or type(exc).__name__}") from exc  # fmt: skip

    async def receive(self, expected: type[M], *, timeout: float | None = None) -> M:
        """The next message, which must be `expected` (an Abort raises with its error)."""
        wait = self.timeout if timeout is None else timeout
        what = expected.__name__
        try:
            async with asyncio.timeout(wait):
                (length,) = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))
                if length > MAX_FRAME:
                    raise HandshakeError(
                        f"{self.peer} sent a {length}-byte frame; the limit is {MAX_FRAME}"
                    )
                body = await self._reader.readexactly(length)
        except TimeoutError as exc:
            raise HandshakeError(f"{self.peer} sent no {what} within {wait:g} s") from exc
        except asyncio.IncompleteReadError as exc:
            raise HandshakeError(f"{self.peer} closed the connection before {what}") from exc
        except OSError as exc:
            raise HandshakeError(f"connection to {self.peer} failed: {exc}") from exc
        message = decode_body(body)
        if isinstance(message, Abort):
            raise HandshakeError(f"peer {self.peer} aborted: {message.error}")
        if not isinstance(message, expected):
            raise HandshakeError(
                f"{self.peer} sent {message.__class__.__name__} where {what} was expected"
            )
        return message

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, TimeoutError):  # a gone peer: nothing to flush
            await asyncio.wait_for(self._writer.wait_closed(), self.timeout)


async def connect(host: str, port: int, *, timeout: float) -> Channel:
    """Connect to a `verify --serve` peer within `timeout` seconds.

    A refused connection is retried until then: the server pod may be running but not yet
    listening (both pods of a validation start at the same time).
    """
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        left = deadline - asyncio.get_running_loop().time()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), left)
        except TimeoutError as exc:
            raise HandshakeError(f"no answer from {host}:{port} within {timeout:g} s") from exc
        except ConnectionRefusedError as exc:
            if left <= _RETRY:
                raise HandshakeError(
                    f"cannot connect to {host}:{port} within {timeout:g} s: {exc}"
                ) from exc
            await asyncio.sleep(_RETRY)  # retry back-off, bounded by the deadline
            continue
        except OSError as exc:
            raise HandshakeError(f"cannot connect to {host}:{port}: {exc}") from exc
        return Channel(reader, writer, timeout=timeout)


def parse_peer(text: str, default_port: int) -> tuple[str, int]:
    """`host`, `host:port`, `[v6]:port` or a bare IPv6 address -> (host, port)."""
    host, port = text, default_port
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"peer {text!r}: expected [IPv6]:PORT")
        if rest and not rest[1:].isdigit():
            raise ValueError(f"peer {text!r}: port {rest[1:]!r} is not a number")
        port = int(rest[1:]) if rest else default_port
    elif text.count(":") == 1:
        host, port_text = text.split(":")
        if not port_text.isdigit():
            raise ValueError(f"peer {text!r}: port {port_text!r} is not a number")
        port = int(port_text)
    if not host:
        raise ValueError(f"peer {text!r}: empty host")
    if not 1 <= port <= 65535:
        raise ValueError(f"peer {text!r}: port {port} is outside 1-65535")
    return host, port
