"""Encode and decode wire messages (msgpack via msgspec) and their JSON twins.
A full CounterBatch goes out packed (proto/packedcounters.py); either form is read.

Every decode failure — truncated or random bytes, wrong types, a message of another
schema, an oversize payload — becomes one `CodecError` that names the message type and
the field path, so callers have a single thing to count and log.
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import msgspec

from proto.errors import ProtoError
from proto.inventory import NodeSnapshot
from proto.messages.alerts import Alert
from proto.messages.config import DesiredConfig
from proto.messages.counters import CounterBatch
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus
from proto.messages.validation import ValidationResult
from proto.packedcounters import (
    CleanPackedCounterBatch,
    PackedCounterBatch,
    PackError,
    check,
    pack,
    unpack,
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


class CodecError(ProtoError, ValueError):
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
_packed_decoder = msgspec.msgpack.Decoder(PackedCounterBatch)
_clean_decoder = msgspec.msgpack.Decoder(CleanPackedCounterBatch)
# First byte of a msgpack array (fixarray, array 16, array 32); a map is anything else.
_ARRAY_HEADS: Final = frozenset([*range(0x90, 0xA0), 0xDC, 0xDD])


def encode(message: msgspec.Struct) -> bytes:
    """msgpack bytes of a wire message; a CounterBatch (full or delta) packed.

    Packing shrinks a full batch 13x and a busy 16-port delta 4.5x; the aggregator reads a
    packed batch without building its dicts (`decode_counters`)."""
    if type(message) is CounterBatch:
        return _msgpack_encoder.encode(pack(message))
    return _msgpack_encoder.encode(message)


def encode_map(message: msgspec.Struct) -> bytes:
    """msgpack bytes with every Struct as a map (the form of CounterBatch before packing)."""
    return _msgpack_encoder.encode(message)


def to_json(message: Any) -> bytes:
    """Deterministic JSON (sorted dict keys, Struct fields in declaration order)."""
    return _json_encoder.encode(message)


def decode(data: bytes, type_: type[T]) -> T:
    """Decode msgpack `data` as `type_`, raising CodecError on any problem.

    A CounterBatch is accepted packed (an array) or as a map (older agents)."""
    if type_ is CounterBatch and data[:1] and data[0] in _ARRAY_HEADS:
        return _decode_packed(data, type_)
    decoder = _msgpack_decoders.get(type_)
    if decoder is None:
        decoder = _msgpack_decoders[type_] = msgspec.msgpack.Decoder(type_)
    result: T = _run(decoder, data, type_)
    return result


def decode_counters(data: bytes) -> CounterBatch | PackedCounterBatch:
    """A counter batch as the aggregator's ingest takes it: a packed one (full or delta)
    checked but not unpacked (proto.packedcounters.check) — a CleanPackedCounterBatch when
    no port has a value data-quality would list — a map as `decode(data, CounterBatch)`."""
    if data[:1] and data[0] in _ARRAY_HEADS:
        packed = _clean(data)  # most batches: values verified clean while decoding
        if packed is None:  # a value to look at, or not a batch (the error comes from here)
            packed = _run(_packed_decoder, data, CounterBatch, PackedCounterBatch)
        try:
            check(packed)
        except PackError as exc:
            raise CodecError(CounterBatch.__name__, exc.path, exc.reason) from exc
        return packed
    return decode(data, CounterBatch)


def _clean(data: bytes) -> CleanPackedCounterBatch | None:
    if len(data) > MAX_PAYLOAD:
        return None
    try:
        batch: CleanPackedCounterBatch = _clean_decoder.decode(data)
    except (msgspec.MsgspecError, RecursionError):
        return None
    return batch


def from_json(data: bytes | str, type_: type[T]) -> T:
    """Decode JSON `data` as `type_`, raising CodecError on any problem."""
    decoder = _json_decoders.get(type_)
    if decoder is None:
        decoder = _json_decoders[type_] = msgspec.json.Decoder(type_)
    result: T = _run(decoder, data, type_)
    return result


def _decode_packed(data: bytes, type_: type[T]) -> T:
    packed: PackedCounterBatch = _run(_packed_decoder, data, type_, PackedCounterBatch)
    try:
        batch: Any = unpack(packed)  # type_ is CounterBatch
    except PackError as exc:
        raise CodecError(type_.__name__, exc.path, exc.reason) from exc
    result: T = batch
    return result


def _run(decoder: Any, data: bytes | str, type_: type[Any], wire: type[Any] | None = None) -> Any:
    """`decoder.decode(data)`; errors name `type_` (and fields of `wire`, if array_like)."""
    name = type_.__name__
    if len(data) > MAX_PAYLOAD:
        raise CodecError(name, "$", f"payload of {len(data)} bytes exceeds {MAX_PAYLOAD}")
    try:
        return decoder.decode(data)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _PATH.search(text)
        path = match.group("path") if match else "$"
        if wire is not None:
            path = field_path(path, wire)
        reason = text[: match.start()] if match else text
        raise CodecError(name, path, reason) from exc
    except msgspec.DecodeError as exc:
        raise CodecError(name, "$", str(exc)) from exc
    except RecursionError as exc:  # nesting deeper than msgspec follows (skipped fields too)
        raise CodecError(name, "$", "nested too deeply") from exc


_STEP = re.compile(r"\[(\d+)\]|\.([^.\[]+)")


def field_path(path: str, type_: type[Any]) -> str:
    """msgspec's path into array_like Structs (`$[3][0][2]`) with field names instead
    (`$.ports[0].counters`); elements of plain arrays keep their index."""
    info: Any = msgspec.inspect.type_info(type_)
    out = "$"
    for step in _STEP.finditer(path, 1):
        index, name = step.group(1), step.group(2)
        info = _unwrap(info)
        if isinstance(info, msgspec.inspect.StructType):
            field: msgspec.inspect.Field | None
            if index is not None and info.array_like:
                i = int(index)
                if info.tag_field is not None:
                    if i == 0:
                        out += "." + info.tag_field
                        info = None
                        continue
                    i -= 1
                field = info.fields[i] if i < len(info.fields) else None
            else:
                field = next((f for f in info.fields if f.encode_name == name), None)
            if field is None:
                return out + path[step.start() :]
            out += "." + field.encode_name
            info = field.type
        elif index is not None and isinstance(info, _SEQUENCES):
            out += step.group(0)
            info = info.item_type
        else:
            return out + path[step.start() :]
    return out


_SEQUENCES: Final = (
    msgspec.inspect.ListType,
    msgspec.inspect.VarTupleType,
    msgspec.inspect.SetType,
    msgspec.inspect.FrozenSetType,
)


def _unwrap(info: Any) -> Any:
    """The Struct or sequence inside an optional (`X | None`) type, else `info`."""
    if isinstance(info, msgspec.inspect.UnionType):
        for option in info.types:
            if isinstance(option, (msgspec.inspect.StructType, *_SEQUENCES)):
                return option
    return info
