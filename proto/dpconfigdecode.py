"""The device-plugin config document's syntax: decoding (JSON or YAML text) and the walk
that checks every key and value type against the wire Structs of proto.messages.config,
spelling keys canonically. Pure; raises `Invalid` (path, reason), which proto.dpconfig
turns into a ConfigError naming the source and the entry. The rules a decoded document
must pass live in proto.dpconfig.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from types import UnionType
from typing import Any, Union, get_args, get_origin

import msgspec
import yaml

from proto.errors import ProtoError
from proto.messages.config import DevicePluginConfig


class Invalid(ProtoError):
    """One problem at `path` (a field path, or where in the text); the caller names the source."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


def decode(data: bytes | str) -> object:
    """The decoded text: JSON (the upstream plugin's format), else YAML."""
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Invalid("$", f"not UTF-8 text: {exc}") from None
    try:
        return json.loads(data)
    except RecursionError:  # json and the YAML composer recurse once per nesting level
        raise Invalid("$", "nested too deeply") from None
    except json.JSONDecodeError as json_error:
        try:
            return yaml.safe_load(data)
        except RecursionError:
            raise Invalid("$", "nested too deeply") from None
        except yaml.YAMLError as yaml_error:
            # A document that starts like JSON is JSON (the upstream file); report that error.
            if data.lstrip().startswith("{"):
                reason = f"not valid JSON: {json_error.msg}"
                where = f"line {json_error.lineno}, column {json_error.colno}"
            else:
                mark = getattr(yaml_error, "problem_mark", None)
                reason = f"not valid YAML: {getattr(yaml_error, 'problem', None) or yaml_error}"
                where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "$"
            raise Invalid(where, reason) from None


def _walk(value: object, tp: Any, path: str) -> object:
    """Check `value` against the wire type `tp`; returns it with canonical key spelling."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return walk_struct(value, tp, path)
    origin = get_origin(tp)
    if origin in (Union, UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return _walk(value, inner, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise Invalid(path or "$", f"must be a list, got {_describe(value)}")
        return [_walk(item, get_args(tp)[0], f"{path}[{i}]") for i, item in enumerate(value)]
    if tp is bool and not isinstance(value, bool):
        raise Invalid(path, f"must be true or false, got {_describe(value)}")
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise Invalid(path, f"must be an integer, got {_describe(value)}")
        if not -(2**63) <= value < 2**63:
            raise Invalid(path, f"{value} is out of range")
    if tp is str and not isinstance(value, str):
        hint = " (quote it: YAML reads 1017 as a number, on/off as booleans)"
        raise Invalid(path, f"must be a string, got {_describe(value)}{hint}")
    return value


def walk_struct(value: object, cls: type[msgspec.Struct], path: str) -> dict[str, object]:
    """`value` checked as a `cls` at `path` ("" for the document): keys, spelling, types."""
    if value is None and not path:
        raise Invalid("$", "empty document")
    if not isinstance(value, Mapping):
        hint = ""
        if cls is DevicePluginConfig and isinstance(value, str):
            hint = " (the document itself, not a JSON string holding it)"
        raise Invalid(path or "$", f"must be a mapping{hint}, got {_describe(value)}")
    fields = {f.encode_name.lower(): f for f in msgspec.structs.fields(cls)}
    spelled: dict[str, str] = {}  # canonical key -> how the document spelt it
    out: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise Invalid(path or "$", f"keys must be strings, got {_describe(key)}")
        # Upstream decodes with Go's encoding/json, which matches keys case-insensitively:
        # "deviceIds" works there, so it works here.
        field = fields.get(key.lower())
        if field is None:
            raise Invalid(_join(path, key), _unknown_key(key, cls))
        if field.encode_name in spelled:
            raise Invalid(_join(path, key), f"given twice (also as {spelled[field.encode_name]!r})")
        spelled[field.encode_name] = key
        if item is not None:  # Go's decoder treats null as "not given"
            out[field.encode_name] = _walk(item, field.type, _join(path, field.encode_name))
    for field in msgspec.structs.fields(cls):
        if field.required and field.encode_name not in out:
            raise Invalid(_join(path, field.encode_name), "required")
    return out


def _unknown_key(key: str, cls: type[msgspec.Struct]) -> str:
    known = [f.encode_name for f in msgspec.structs.fields(cls)]
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known keys: {', '.join(known)}"
    if cls is DevicePluginConfig and key.lower() in ("config", "image", "repository", "version"):
        hint = (
            "; NicClusterPolicy wraps the plugin config in a `config` string, nicfleet takes"
            " the document itself (periodicUpdateInterval, configList)"
        )
    return f"unknown key{hint}"


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def entries(canonical: dict[str, object]) -> list[dict[str, object]]:
    """The configList entries of a walked document, as the document gave them."""
    found = canonical["configList"]
    assert isinstance(found, list)  # walk_struct made it a list of dicts
    return found


def raw_names(document: object) -> dict[int, str]:
    """resourceName of each raw entry that has a string one, for error messages."""
    if not isinstance(document, Mapping):
        return {}
    listed = next((v for k, v in document.items() if str(k).lower() == "configlist"), None)
    names: dict[int, str] = {}
    for i, entry in enumerate(listed if isinstance(listed, list) else []):
        if isinstance(entry, Mapping):
            name = next((v for k, v in entry.items() if str(k).lower() == "resourcename"), None)
            if isinstance(name, str):
                names[i] = name
    return names
