"""Encode and decode wire messages (msgpack via msgspec) and their JSON twins.

Every decode failure — truncated or random bytes, wrong types, a message of another
schema, an oversize payload — becomes one `CodecError` that names the message type and
the field path, so callers have a single thing to count and log.
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import msgspec

from proto.inventory import NodeSnapshot
from proto.messages import (
    Alert,
    CounterBatch,
    DesiredConfig,
    DevicePluginStatus,
    LinkEvent,
    ValidationResult,
)

# NATS' default max_payload is 1 MiB; nothing we send should come near it.
MAX_PAYLOAD: Final = 1024 * 1024

WIRE_TYPES: Final = (
    NodeSnapshot,
    CounterBatch,
    LinkEvent,
    DevicePluginStatus,
    DesiredConfig,
    Alert,
    ValidationResult,
)

T = TypeVar("T", bound=msgspec.Struct)

_PATH = re.compile(r" - at `(?P<path>[^`]*)`$")


class CodecError(ValueError):
    """A payload that is not a valid message of the expected type."""

    def __init__(self, type_name: str, path: str, reason: str) -> None:
        self.type_name = type_name
        self.path = path
        self.reason = reason
        super().__init__(f"invalid {type_name} at {path}: {reason}")


_msgpack_encoder = msgspec.msgpack.Encoder()
_json_encoder = msgspec.json.Encoder(order="deterministic")
_msgpack_decoders: dict[type[Any], msgspec.msgpack.Decoder[Any]] = {}
_json_decoders: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def encode(message: msgspec.Struct) -> bytes:
    """msgpack bytes of a wire message."""
    return _msgpack_encoder.encode(message)


def to_json(message: Any) -> bytes:
    """Deterministic JSON (sorted dict keys, Struct fields in declaration order)."""
    return _json_encoder.encode(message)


def decode(data: bytes, type_: type[T]) -> T:
    """Decode msgpack `data` as `type_`, raising CodecError on any problem."""
    decoder = _msgpack_decoders.get(type_)
    if decoder is None:
        decoder = _msgpack_decoders[type_] = msgspec.msgpack.Decoder(type_)
    return _run(decoder, data, type_)


def from_json(data: bytes | str, type_: type[T]) -> T:
    """Decode JSON `data` as `type_`, raising CodecError on any problem."""
    decoder = _json_decoders.get(type_)
    if decoder is None:
        decoder = _json_decoders[type_] = msgspec.json.Decoder(type_)
    return _run(decoder, data, type_)


def _run(decoder: Any, data: bytes | str, type_: type[T]) -> T:
    name = type_.__name__
    if len(data) > MAX_PAYLOAD:
        raise CodecError(name, "$", f"payload of {len(data)} bytes exceeds {MAX_PAYLOAD}")
    try:
        result: T = decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH.search(text)
        path = match.group("path") if match else "$"
        reason = text[: match.start()] if match else text
        raise CodecError(name, path, reason) from exc
    except msgspec.DecodeError as exc:
        raise CodecError(name, "$", str(exc)) from exc
    except RecursionError as exc:  # nesting deeper than msgspec follows (skipped fields too)
        raise CodecError(name, "$", "nested too deeply") from exc
    return result
