"""Handshake frames as bytes: round trips, and every malformed, foreign or out-of-range
message refused with an error that names what is wrong."""

from __future__ import annotations

import struct

import msgspec
import pytest

from agent.verify.pair.handshake import (
    HANDSHAKE_VERSION,
    Abort,
    Endpoint,
    Finished,
    HandshakeError,
    Ready,
    Start,
    decode_body,
    encode_frame,
    parse_peer,
)

ENDPOINT = Endpoint(
    qpn=0x1295, psn=0xE41D2A, lid=0, gid="0000:0000:0000:0000:0000:ffff:0a0a:000b",
    gid_index=3, mtu=4096, rkey=0x17EEDF, addr=0x7F760C947000, size=65536,
    device="mlx5_0", port=1,
)  # fmt: skip


def body(**changes: object) -> bytes:
    raw = msgspec.msgpack.decode(encode_frame(ENDPOINT)[4:])
    raw.update(changes)
    return msgspec.msgpack.encode(raw)


@pytest.mark.parametrize(
    "message",
    [
        ENDPOINT,
        Start(message_size=65536, iterations=5000, latency_iterations=1000),
        Ready(),
        Finished(bytes_per_second=2.4e10, latency_us=(1.9, 2.1)),
        Finished(error="RDMA write failed"),
        Abort(error="evidence verdict is broken"),
    ],
)
def test_round_trip(message: Endpoint | Start | Ready | Finished | Abort) -> None:
    frame = encode_frame(message)
    (length,) = struct.unpack(">I", frame[:4])
    assert length == len(frame) - 4
    assert decode_body(frame[4:]) == message
    assert message.version == HANDSHAKE_VERSION


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        pytest.param(body(qpn=1 << 24), "qpn", id="qpn-over-24-bits"),
        pytest.param(body(psn=-1), "psn", id="negative-psn"),
        pytest.param(body(lid=1 << 16), "lid", id="lid-over-16-bits"),
        pytest.param(body(mtu=1500), "mtu", id="not-an-ib-mtu"),
        pytest.param(body(gid="fe80::1"), "gid", id="gid-not-eight-groups"),
        pytest.param(body(rkey=1 << 32), "rkey", id="rkey-over-32-bits"),
        pytest.param(body(size=0), "size", id="empty-buffer"),
        pytest.param(body(size=1 << 31), "size", id="buffer-over-1-GiB"),
        pytest.param(body(port=0), "port", id="port-zero"),
        pytest.param(body(device=""), "device", id="empty-device"),
        pytest.param(body(addr="0x7f00"), "addr", id="addr-not-int"),
        pytest.param(body(qpn=None), "qpn", id="qpn-null"),
        pytest.param(body(kind="teleport"), "teleport", id="unknown-kind"),
        pytest.param(body(version=2), "version 2", id="newer-version"),
        pytest.param(body(version="1"), "malformed", id="version-not-int"),
        pytest.param(msgspec.msgpack.encode({"kind": "ready"}), "version None", id="no-version"),
        pytest.param(b"\xc1garbage", "malformed", id="garbage"),
        pytest.param(b"", "malformed", id="empty"),
        pytest.param(msgspec.msgpack.encode([1, 2]), "malformed", id="array"),
        pytest.param(
            msgspec.msgpack.encode({"kind": "abort", "version": 1, "error": "x" * 5000}),
            "error",
            id="abort-reason-too-long",
        ),
        pytest.param(
            msgspec.msgpack.encode({"kind": "finished", "version": 1, "latency_us": [-1.0]}),
            "latency_us",
            id="negative-latency",
        ),
    ],
)
def test_bad_messages_are_named(payload: bytes, needle: str) -> None:
    with pytest.raises(HandshakeError) as info:
        decode_body(payload)
    assert needle in str(info.value)


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    assert decode_body(body(ece=7)) == ENDPOINT


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("server-0", ("server-0", 18515)),
        ("10.0.0.5:9000", ("10.0.0.5", 9000)),
        ("[fd00::5]:9000", ("fd00::5", 9000)),
        ("[fd00::5]", ("fd00::5", 18515)),
        ("fd00::5", ("fd00::5", 18515)),
    ],
)
def test_parse_peer(text: str, expected: tuple[str, int]) -> None:
    assert parse_peer(text, 18515) == expected


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (":9000", "empty host"),
        ("host:http", "not a number"),
        ("host:0", "outside"),
        ("host:70000", "outside"),
        ("[fd00::5", "expected [IPv6]:PORT"),
        ("[fd00::5]:x", "not a number"),
    ],
)
def test_parse_peer_refuses(text: str, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("[", r"\[")):
        parse_peer(text, 18515)
