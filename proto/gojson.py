"""Go `encoding/json.Unmarshal` into a Go struct, reproduced over Python's json: what a Go
program (the upstream RDMA shared device plugin, the network-operator webhook) makes of a
document. Pure: text in, plain Python values (or GoJsonError) out.

The rules, from encoding/json's decode.go and docs (Go 1.25):
- syntax is strict RFC 8259 (no NaN/Infinity, no BOM, no trailing data); invalid UTF-8
  inside strings and unpaired surrogate escapes become U+FFFD;
- an object key matches a field's json tag exactly, else case-insensitively (bytes.EqualFold);
  keys matching no field are ignored (the plugin does not DisallowUnknownFields);
- a repeated key decodes again into the same field: the last scalar or slice wins, a nested
  struct merges (fields the later object omits keep the earlier values);
- `null` sets a slice or pointer to nil and leaves any other value as it was;
- a value of the wrong JSON type (a number into a string, 1.5 or 1e2 into an int) is an
  error; Unmarshal returns it, so a Go caller that checks err sees a failure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from proto.errors import ProtoError

Kind = Literal["string", "int", "bool", "[]string", "*int"]
_INT: Final = re.compile(r"-?(0|[1-9][0-9]*)")
_INT64: Final = (-(2**63), 2**63 - 1)  # Go `int` on the 64-bit platforms the plugin ships for
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
MAX_DEPTH: Final = 10000  # encoding/json's scanner nesting limit


class GoJsonError(ProtoError, ValueError):
    """Unmarshal failed: `syntax` (the text is not JSON for Go) or `type` (a value that
    cannot go into its field). `path` is the JSON path ("configList[0].rdmaHcaMax")."""

    def __init__(self, kind: Literal["syntax", "type"], path: str, reason: str) -> None:
        self.kind = kind
        self.path = path
        self.reason = reason
        super().__init__(f"{path or '$'}: {reason}" if kind == "type" else reason)


@dataclass(frozen=True)
class GoStruct:
    """A Go struct as encoding/json sees it: json tag -> field kind or nested struct.
    `lists` names the tags that are slices of this struct ([]UserConfig)."""

    name: str
    fields: Mapping[str, Kind | GoStruct]
    lists: frozenset[str] = field(default_factory=frozenset)


class _Number(str):
    """A JSON number kept as its literal text: Go parses it only once the target is known."""


class _Pairs:
    """A JSON object with every key, repeats included, in document order (not a list, so
    that an object is never taken for an array)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[str, object]]) -> None:
        self.pairs = pairs

    def __iter__(self) -> Iterator[tuple[str, object]]:
        return iter(self.pairs)


def parse_json(data: bytes | str) -> object:
    """The document as Go's scanner accepts it: objects as key/value pair lists (repeats
    kept), numbers as literal text. Raises GoJsonError("syntax")."""
    # surrogateescape turns each invalid byte into its own lone surrogate: outside a string
    # that is a syntax error, inside one it becomes U+FFFD (one per byte, as Go's unquote).
    text = data.decode("utf-8", errors="surrogateescape") if isinstance(data, bytes) else data
    if text.startswith("\ufeff"):
        raise GoJsonError("syntax", "", "invalid character 'ï' looking for beginning of value")
    try:
        value = json.loads(
            text,
            object_pairs_hook=_Pairs,
            parse_int=_Number,
            parse_float=_Number,
            parse_constant=_reject_constant,
        )
    except json.JSONDecodeError as exc:
        where = f" (line {exc.lineno}, column {exc.colno})"
        raise GoJsonError("syntax", "", f"not valid JSON: {exc.msg}{where}") from None
    except RecursionError:
        raise GoJsonError("syntax", "", f"exceeded max depth {MAX_DEPTH}") from None
    return value


def unmarshal(data: bytes | str, target: GoStruct) -> dict[str, object]:
    """Go's `json.Unmarshal(data, &v)` for a struct `v`: the fields it ends up holding
    (tags as keys; absent means the zero value). Raises GoJsonError."""
    document = parse_json(data)
    out: dict[str, object] = {}
    _into_struct(document, target, out, "")
    return out


def objects(value: object) -> dict[str, object] | None:
    """A parsed object as a plain dict, repeats resolved last-wins (Go's map decoding), or
    None when `value` is not an object. For callers decoding into map[string]interface{}."""
    if not isinstance(value, _Pairs):
        return None
    return dict(value.pairs)


def is_number(value: object) -> bool:
    return isinstance(value, _Number)


def as_int(value: object) -> int | None:
    """The Go int of a JSON number literal, None when Go would refuse it for an int."""
    if isinstance(value, _Number) and _INT.fullmatch(value):
        number = int(value)
        return number if _INT64[0] <= number <= _INT64[1] else None
    return None


def fold(key: str) -> str:
    """bytes.EqualFold's equivalence for the field names at hand (simple case folding:
    'ſ' folds to 's' and the Kelvin sign to 'k', as Go's does)."""
    return "".join(c.casefold() if len(c.casefold()) == 1 else c for c in key)


def _reject_constant(name: str) -> object:
    raise json.JSONDecodeError(
        f"invalid character {name[0]!r} looking for beginning of value", name, 0
    )


def _field_for(key: str, target: GoStruct) -> str | None:
    if key in target.fields:
        return key
    folded = fold(key)
    return next((tag for tag in target.fields if fold(tag) == folded), None)


def _into_struct(value: object, target: GoStruct, out: dict[str, object], path: str) -> None:
    if value is None:
        return  # null into a struct: no effect
    if not isinstance(value, _Pairs):
        raise _type_error(value, target.name, path)
    for key, item in value:
        tag = _field_for(key, target)
        if tag is None:
            continue
        at = f"{path}.{tag}" if path else tag
        kind = target.fields[tag]
        if isinstance(kind, GoStruct) and tag in target.lists:
            out[tag] = _list_of_structs(item, kind, at)
        elif isinstance(kind, GoStruct):
            nested = out.get(tag)
            merged: dict[str, object] = dict(nested) if isinstance(nested, dict) else {}
            _into_struct(item, kind, merged, at)
            out[tag] = merged
        else:
            _into_scalar(item, kind, out, tag, at)


def _list_of_structs(value: object, target: GoStruct, path: str) -> list[dict[str, object]] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _type_error(value, f"[]{target.name}", path)
    items: list[dict[str, object]] = []
    for i, item in enumerate(value):
        one: dict[str, object] = {}
        _into_struct(item, target, one, f"{path}[{i}]")
        items.append(one)
    return items


def _into_scalar(value: object, kind: Kind, out: dict[str, object], tag: str, path: str) -> None:
    if value is None:
        if kind in ("[]string", "*int"):
            out[tag] = None  # nil slice / nil pointer
        return  # null into string, int or bool: no effect
    if kind == "string":
        out[tag] = _string(value, path)
    elif kind in ("int", "*int"):
        number = as_int(value)
        if number is None:
            # Go names the literal when a number does not parse as an int ("number 1.5").
            shown = f"number {value}" if isinstance(value, _Number) else describe(value)
            raise GoJsonError(
                "type", path, f"json: cannot unmarshal {shown} into Go value of type int"
            )
        out[tag] = number
    elif kind == "bool":
        if not isinstance(value, bool):
            raise _type_error(value, "bool", path)
        out[tag] = value
    else:
        if not isinstance(value, list):
            raise _type_error(value, "[]string", path)
        # A null element decodes into a fresh zero value: "".
        out[tag] = ["" if v is None else _string(v, f"{path}[{i}]") for i, v in enumerate(value)]


def _string(value: object, path: str) -> str:
    if isinstance(value, str) and not isinstance(value, _Number):
        return _SURROGATE.sub("\ufffd", value)
    raise _type_error(value, "string", path)


def _type_error(value: object, go_type: str, path: str) -> GoJsonError:
    return GoJsonError(
        "type", path, f"json: cannot unmarshal {describe(value)} into Go value of type {go_type}"
    )


def describe(value: object) -> str:
    """How encoding/json names a JSON value in its errors ("number 1.5", "string")."""
    if isinstance(value, _Number):
        return "number"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, _Pairs):
        return "object"
    return "null"
