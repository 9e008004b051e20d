"""The device-plugin config document (k8s-rdma-shared-dev-plugin format plus nicfleet's
selectors): the one validator the agent and the aggregator both use.

Owns parsing (JSON or YAML text, or an already-decoded mapping), the rules a document must
pass, and the normal form of selector values. Field names come from proto.messages only.
Pure: no file, clock or logging; the caller reads the text and reports the ConfigError.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from types import UnionType
from typing import Any, Final, Union, get_args, get_origin

import msgspec
import yaml

from proto.messages.config import DevicePluginConfig, ResourceConfig, Selectors

DEFAULT_RESOURCE_PREFIX: Final = "rdma"
# Values of the netdev's link encapsulation, as the upstream plugin reads them from netlink.
LINK_TYPES: Final = ("ether", "infiniband")
LINK_LAYERS: Final = ("InfiniBand", "Ethernet")
# Each slot is a device ID the kubelet lists, tracks and checkpoints; far above any real
# sharing level, far below what turns a typo into a multi-megabyte ListAndWatch response.
MAX_RDMA_HCA: Final = 100_000


_PCI_ID = re.compile(r"(?:0[xX])?([0-9A-Fa-f]{4})")
# domain:bus:device.function; VMD domains have more than four digits (10000:01:00.0).
_PCI_ADDRESS = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[01][0-9A-Fa-f]\.[0-7]")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_ENTRY = re.compile(r"configList\[(\d+)\]")
_NAME_CHARS = re.compile(r"[^\s/:]+")  # what the kernel refuses in netdev and ibdev names


class ConfigError(ValueError):
    """A device-plugin config that is not valid; names the source, field path and entry."""

    def __init__(
        self, source: str, path: str, reason: str, *, resource_name: str | None = None
    ) -> None:
        self.source = source
        self.path = path  # "$" for the whole document, else e.g. configList[2].selectors.vendors
        self.reason = reason
        self.resource_name = resource_name  # the entry's resourceName, when it has one
        entry = "" if resource_name is None else f" (resourceName {resource_name!r})"
        super().__init__(f"{source}: {path}{entry}: {reason}")


class _Invalid(Exception):
    def __init__(self, path: str, reason: str) -> None:
        super().__init__(path, reason)
        self.path = path
        self.reason = reason


def parse_device_plugin_config(
    data: bytes | str | Mapping[str, Any], *, source: str
) -> DevicePluginConfig:
    """Decode, check and normalize a config document; raises one ConfigError."""
    document = _decode(data, source) if isinstance(data, bytes | str) else data
    try:
        canonical = _walk_struct(document, DevicePluginConfig, "")
        if "configList" not in canonical:
            # Upstream refuses to start without it; an explicit [] serves no resources.
            raise _Invalid("configList", "required (an empty list serves no resources)")
    except _Invalid as exc:
        raise _error(source, exc, _raw_names(document)) from None
    try:
        config = msgspec.convert(canonical, DevicePluginConfig)
    except msgspec.ValidationError as exc:  # the walk checks every type; a safety net only
        raise ConfigError(source, "$", str(exc)) from None
    given = ["rdmaHcaMax" in entry for entry in _entries(canonical)]
    _validate(config, source, hca_max_given=given)
    return _normalize(config)


def validate_device_plugin_config(config: DevicePluginConfig, *, source: str) -> None:
    """Check a config built in code or decoded from the wire; raises one ConfigError.

    Unknown keys and a missing rdmaHcaMax can only be seen in the document itself, so text
    goes through `parse_device_plugin_config`, which runs these checks too.
    """
    _validate(config, source, hca_max_given=None)


def resource_full_name(resource: ResourceConfig) -> str:
    """`<resourcePrefix>/<resourceName>`, the name the kubelet advertises."""
    return f"{resource.resource_prefix or DEFAULT_RESOURCE_PREFIX}/{resource.resource_name}"


def normalize_pci_id(value: str) -> str:
    """`0x15B3` or `15b3` -> `15b3` (how the upstream plugin and `lspci -n` write IDs)."""
    match = _PCI_ID.fullmatch(value)
    return match.group(1).lower() if match else value.lower()


def normalize_link_type(value: str) -> str:
    return value.lower()


def normalize_link_layer(value: str) -> str:
    """Any case of "infiniband"/"ethernet" -> the sysfs spelling ("InfiniBand")."""
    return next((layer for layer in LINK_LAYERS if layer.lower() == value.lower()), value)


# --- decoding and the key/type walk -----------------------------------------------------


def _decode(data: bytes | str, source: str) -> object:
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(source, "$", f"not UTF-8 text: {exc}") from None
    try:
        return json.loads(data)
    except RecursionError:  # json and the YAML composer recurse once per nesting level
        raise ConfigError(source, "$", "nested too deeply") from None
    except json.JSONDecodeError as json_error:
        try:
            return yaml.safe_load(data)
        except RecursionError:
            raise ConfigError(source, "$", "nested too deeply") from None
        except yaml.YAMLError as yaml_error:
            # A document that starts like JSON is JSON (the upstream file); report that error.
            if data.lstrip().startswith("{"):
                reason = f"not valid JSON: {json_error.msg}"
                where = f"line {json_error.lineno}, column {json_error.colno}"
            else:
                mark = getattr(yaml_error, "problem_mark", None)
                reason = f"not valid YAML: {getattr(yaml_error, 'problem', None) or yaml_error}"
                where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "$"
            raise ConfigError(source, where, reason) from None


def _walk(value: object, tp: Any, path: str) -> object:
    """Check `value` against the wire type `tp`; returns it with canonical key spelling."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return _walk_struct(value, tp, path)
    origin = get_origin(tp)
    if origin in (Union, UnionType):
        (inner,) = [a for a in get_args(tp) if a is not type(None)]
        return _walk(value, inner, path)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _Invalid(path or "$", f"must be a list, got {_describe(value)}")
        return [_walk(item, get_args(tp)[0], f"{path}[{i}]") for i, item in enumerate(value)]
    if tp is bool and not isinstance(value, bool):
        raise _Invalid(path, f"must be true or false, got {_describe(value)}")
    if tp is int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Invalid(path, f"must be an integer, got {_describe(value)}")
        if not -(2**63) <= value < 2**63:
            raise _Invalid(path, f"{value} is out of range")
    if tp is str and not isinstance(value, str):
        hint = " (quote it: YAML reads 1017 as a number, on/off as booleans)"
        raise _Invalid(path, f"must be a string, got {_describe(value)}{hint}")
    return value


def _walk_struct(value: object, cls: type[msgspec.Struct], path: str) -> dict[str, object]:
    if value is None and not path:
        raise _Invalid("$", "empty document")
    if not isinstance(value, Mapping):
        hint = ""
        if cls is DevicePluginConfig and isinstance(value, str):
            hint = " (the document itself, not a JSON string holding it)"
        raise _Invalid(path or "$", f"must be a mapping{hint}, got {_describe(value)}")
    fields = {f.encode_name.lower(): f for f in msgspec.structs.fields(cls)}
    spelled: dict[str, str] = {}  # canonical key -> how the document spelt it
    out: dict[str, object] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise _Invalid(path or "$", f"keys must be strings, got {_describe(key)}")
        # Upstream decodes with Go's encoding/json, which matches keys case-insensitively:
        # "deviceIds" works there, so it works here.
        field = fields.get(key.lower())
        if field is None:
            raise _Invalid(_join(path, key), _unknown_key(key, cls))
        if field.encode_name in spelled:
            raise _Invalid(
                _join(path, key), f"given twice (also as {spelled[field.encode_name]!r})"
            )
        spelled[field.encode_name] = key
        if item is not None:  # Go's decoder treats null as "not given"
            out[field.encode_name] = _walk(item, field.type, _join(path, field.encode_name))
    for field in msgspec.structs.fields(cls):
        if field.required and field.encode_name not in out:
            raise _Invalid(_join(path, field.encode_name), "required")
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


def _entries(canonical: dict[str, object]) -> list[dict[str, object]]:
    entries = canonical["configList"]
    assert isinstance(entries, list)  # _walk_struct made it a list of dicts
    return entries


def _raw_names(document: object) -> dict[int, str]:
    """resourceName of each raw entry that has a string one, for error messages."""
    if not isinstance(document, Mapping):
        return {}
    entries = next((v for k, v in document.items() if str(k).lower() == "configlist"), None)
    names: dict[int, str] = {}
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, Mapping):
            name = next((v for k, v in entry.items() if str(k).lower() == "resourcename"), None)
            if isinstance(name, str):
                names[i] = name
    return names


def _error(source: str, exc: _Invalid, names: Mapping[int, str]) -> ConfigError:
    match = _ENTRY.match(exc.path)
    name = names.get(int(match.group(1))) if match else None
    return ConfigError(source, exc.path, exc.reason, resource_name=name)


# --- rules ------------------------------------------------------------------------------


def _validate(config: DevicePluginConfig, source: str, *, hca_max_given: list[bool] | None) -> None:
    names = {i: r.resource_name for i, r in enumerate(config.config_list)}
    try:
        if config.periodic_update_interval < 0:
            raise _Invalid("periodicUpdateInterval", "must be >= 0 (0: no periodic update)")
        # Names first: a duplicate or an invalid name is reported whatever else is wrong.
        seen: dict[str, int] = {}
        for i, resource in enumerate(config.config_list):
            full = _check_name(resource, f"configList[{i}]")
            if full in seen:
                raise _Invalid(
                    f"configList[{i}].resourceName",
                    f"duplicate resource {full!r} (already configList[{seen[full]}])",
                )
            seen[full] = i
        for i, resource in enumerate(config.config_list):
            given = True if hca_max_given is None else hca_max_given[i]
            _check_resource(resource, f"configList[{i}]", hca_max_given=given)
    except _Invalid as exc:
        raise _error(source, exc, names) from None


def _check_name(resource: ResourceConfig, at: str) -> str:
    prefix = resource.resource_prefix or DEFAULT_RESOURCE_PREFIX
    name = resource.resource_name
    if not name:
        raise _Invalid(f"{at}.resourceName", "must not be empty")
    if len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise _Invalid(
            f"{at}.resourceName",
            f"{name!r} is not a Kubernetes resource name: at most 63 characters, letters,"
            " digits, '-', '_' or '.', starting and ending with a letter or digit",
        )
    if not _DNS_SUBDOMAIN.fullmatch(prefix) or len(prefix) > 253:
        raise _Invalid(
            f"{at}.resourcePrefix",
            f"{prefix!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.')",
        )
    # The kubelet's IsExtendedResourceName: outside *kubernetes.io/, no "requests." (quota
    # syntax), and "requests.<prefix>" must still be a valid (<= 253) subdomain.
    if prefix.endswith("kubernetes.io"):
        raise _Invalid(f"{at}.resourcePrefix", f"{prefix!r} is reserved for Kubernetes")
    if prefix.startswith("requests."):
        raise _Invalid(f"{at}.resourcePrefix", f"{prefix!r}: 'requests.' is quota syntax")
    if len(prefix) > 253 - len("requests."):
        raise _Invalid(f"{at}.resourcePrefix", "longer than 244 characters")
    return f"{prefix}/{name}"


def _check_resource(resource: ResourceConfig, at: str, *, hca_max_given: bool) -> None:
    if not hca_max_given and not resource.exclusive:
        raise _Invalid(
            f"{at}.rdmaHcaMax",
            "required: how many pods may share the selected adapters"
            " (without it the upstream plugin silently advertises 0)",
        )
    if not 0 <= resource.rdma_hca_max <= MAX_RDMA_HCA:
        raise _Invalid(f"{at}.rdmaHcaMax", f"must be between 0 and {MAX_RDMA_HCA}")
    selectors = resource.selectors
    has_selectors = selectors is not None and any(
        getattr(selectors, f.name) for f in msgspec.structs.fields(Selectors)
    )
    if has_selectors and resource.devices:
        raise _Invalid(
            f"{at}.devices",
            "cannot be combined with selectors (upstream refuses both too);"
            " put these names in selectors.ifNames",
        )
    if not has_selectors and not resource.devices:
        raise _Invalid(
            f"{at}.selectors",
            "missing or empty, and no devices list: the resource would select nothing"
            " (give e.g. vendors, deviceIDs or ifNames)",
        )
    for i, name in enumerate(resource.devices):
        _check_ifname(name, f"{at}.devices[{i}]")
    if selectors is not None:
        _check_selectors(selectors, f"{at}.selectors")


def _check_selectors(s: Selectors, at: str) -> None:
    for field, values in (("vendors", s.vendors), ("deviceIDs", s.device_ids)):
        for i, value in enumerate(values):
            if not _PCI_ID.fullmatch(value):
                raise _Invalid(
                    f"{at}.{field}[{i}]", f"{value!r} is not a PCI ID (4 hex digits: '15b3')"
                )
    for i, value in enumerate(s.pci_addresses):
        if not _PCI_ADDRESS.fullmatch(value):
            raise _Invalid(
                f"{at}.pciAddresses[{i}]",
                f"{value!r} is not a full PCI address (domain:bus:device.function, '0000:3b:00.0')",
            )
    for i, value in enumerate(s.link_types):
        if normalize_link_type(value) not in LINK_TYPES:
            hint = " (for the port's link layer use linkLayers)" if "net" in value.lower() else ""
            raise _Invalid(
                f"{at}.linkTypes[{i}]", f"{value!r} is not one of {', '.join(LINK_TYPES)}{hint}"
            )
    for i, value in enumerate(s.link_layers):
        if normalize_link_layer(value) not in LINK_LAYERS:
            raise _Invalid(
                f"{at}.linkLayers[{i}]", f"{value!r} is not one of {', '.join(LINK_LAYERS)}"
            )
    for i, node in enumerate(s.numa_nodes):
        if node < 0:
            raise _Invalid(f"{at}.numaNodes[{i}]", f"must be >= 0, got {node}")
    for i, value in enumerate(s.if_names):
        _check_ifname(value, f"{at}.ifNames[{i}]")
    for field, values, limit in (("drivers", s.drivers, 255), ("rdmaDevices", s.rdma_devices, 63)):
        for i, value in enumerate(values):
            if len(value) > limit or not _NAME_CHARS.fullmatch(value):
                raise _Invalid(
                    f"{at}.{field}[{i}]",
                    f"{value!r} is not a {field[:-1]} name (1-{limit} characters, no spaces,"
                    " '/' or ':')",
                )


def _check_ifname(value: str, at: str) -> None:
    # dev_valid_name(): 1-15 bytes, not "." or "..", no '/', ':' or whitespace.
    if len(value) > 15 or value in (".", "..") or not _NAME_CHARS.fullmatch(value):
        raise _Invalid(
            at, f"{value!r} is not a network interface name (1-15 characters, no spaces, '/', ':')"
        )


def _normalize(config: DevicePluginConfig) -> DevicePluginConfig:
    def resource(r: ResourceConfig) -> ResourceConfig:
        s = r.selectors
        if s is not None:
            s = msgspec.structs.replace(
                s,
                vendors=tuple(map(normalize_pci_id, s.vendors)),
                device_ids=tuple(map(normalize_pci_id, s.device_ids)),
                pci_addresses=tuple(a.lower() for a in s.pci_addresses),
                link_types=tuple(map(normalize_link_type, s.link_types)),
                link_layers=tuple(map(normalize_link_layer, s.link_layers)),
            )
        return msgspec.structs.replace(
            r, resource_prefix=r.resource_prefix or DEFAULT_RESOURCE_PREFIX, selectors=s
        )

    return msgspec.structs.replace(config, config_list=tuple(map(resource, config.config_list)))
