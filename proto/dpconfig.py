"""The device-plugin config document (k8s-rdma-shared-dev-plugin format plus nicfleet's
selectors): the one validator the agent and the aggregator both use.

Owns parsing (JSON or YAML text, or an already-decoded mapping; the syntax walk is
proto.dpconfigdecode), the rules a document must pass, and the normal form of selector
values. Field names come from proto.messages only.
Pure: no file, clock or logging; the caller reads the text and reports the ConfigError.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from proto.dpconfigdecode import Invalid, decode, entries, raw_names, walk_struct
from proto.errors import ProtoError
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


class ConfigError(ProtoError, ValueError):
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


def parse_device_plugin_config(
    data: bytes | str | Mapping[str, Any], *, source: str
) -> DevicePluginConfig:
    """Decode, check and normalize a config document; raises one ConfigError."""
    try:
        document = decode(data) if isinstance(data, bytes | str) else data
    except Invalid as exc:
        raise _error(source, exc, {}) from None
    try:
        canonical = walk_struct(document, DevicePluginConfig, "")
        if "configList" not in canonical:
            # Upstream refuses to start without it; an explicit [] serves no resources.
            raise Invalid("configList", "required (an empty list serves no resources)")
    except Invalid as exc:
        raise _error(source, exc, raw_names(document)) from None
    try:
        config = msgspec.convert(canonical, DevicePluginConfig)
    except msgspec.ValidationError as exc:  # the walk checks every type; a safety net only
        raise ConfigError(source, "$", str(exc)) from None
    given = ["rdmaHcaMax" in entry for entry in entries(canonical)]
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


def _error(source: str, exc: Invalid, names: Mapping[int, str]) -> ConfigError:
    match = _ENTRY.match(exc.path)
    name = names.get(int(match.group(1))) if match else None
    return ConfigError(source, exc.path, exc.reason, resource_name=name)


# --- rules ------------------------------------------------------------------------------


def _validate(config: DevicePluginConfig, source: str, *, hca_max_given: list[bool] | None) -> None:
    names = {i: r.resource_name for i, r in enumerate(config.config_list)}
    try:
        if config.periodic_update_interval < 0:
            raise Invalid("periodicUpdateInterval", "must be >= 0 (0: no periodic update)")
        # Names first: a duplicate or an invalid name is reported whatever else is wrong.
        seen: dict[str, int] = {}
        for i, resource in enumerate(config.config_list):
            full = _check_name(resource, f"configList[{i}]")
            if full in seen:
                raise Invalid(
                    f"configList[{i}].resourceName",
                    f"duplicate resource {full!r} (already configList[{seen[full]}])",
                )
            seen[full] = i
        for i, resource in enumerate(config.config_list):
            given = True if hca_max_given is None else hca_max_given[i]
            _check_resource(resource, f"configList[{i}]", hca_max_given=given)
    except Invalid as exc:
        raise _error(source, exc, names) from None


def _check_name(resource: ResourceConfig, at: str) -> str:
    prefix = resource.resource_prefix or DEFAULT_RESOURCE_PREFIX
    name = resource.resource_name
    if not name:
        raise Invalid(f"{at}.resourceName", "must not be empty")
    if len(name) > 63 or not _QUALIFIED_NAME.fullmatch(name):
        raise Invalid(
            f"{at}.resourceName",
            f"{name!r} is not a Kubernetes resource name: at most 63 characters, letters,"
            " digits, '-', '_' or '.', starting and ending with a letter or digit",
        )
    if not _DNS_SUBDOMAIN.fullmatch(prefix) or len(prefix) > 253:
        raise Invalid(
            f"{at}.resourcePrefix",
            f"{prefix!r} is not a DNS subdomain (lower-case letters, digits, '-' and '.')",
        )
    # The kubelet's IsExtendedResourceName: outside *kubernetes.io/, no "requests." (quota
    # syntax), and "requests.<prefix>" must still be a valid (<= 253) subdomain.
    if prefix.endswith("kubernetes.io"):
        raise Invalid(f"{at}.resourcePrefix", f"{prefix!r} is reserved for Kubernetes")
    if prefix.startswith("requests."):
        raise Invalid(f"{at}.resourcePrefix", f"{prefix!r}: 'requests.' is quota syntax")
    if len(prefix) > 253 - len("requests."):
        raise Invalid(f"{at}.resourcePrefix", "longer than 244 characters")
    return f"{prefix}/{name}"


def _check_resource(resource: ResourceConfig, at: str, *, hca_max_given: bool) -> None:
    if not hca_max_given and not resource.exclusive:
        raise Invalid(
            f"{at}.rdmaHcaMax",
            "required: how many pods may share the selected adapters"
            " (without it the upstream plugin silently advertises 0)",
        )
    if not 0 <= resource.rdma_hca_max <= MAX_RDMA_HCA:
        raise Invalid(f"{at}.rdmaHcaMax", f"must be between 0 and {MAX_RDMA_HCA}")
    selectors = resource.selectors
    has_selectors = selectors is not None and any(
        getattr(selectors, f.name) for f in msgspec.structs.fields(Selectors)
    )
    if has_selectors and resource.devices:
        raise Invalid(
            f"{at}.devices",
            "cannot be combined with selectors (upstream refuses both too);"
            " put these names in selectors.ifNames",
        )
    if not has_selectors and not resource.devices:
        raise Invalid(
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
                raise Invalid(
                    f"{at}.{field}[{i}]", f"{value!r} is not a PCI ID (4 hex digits: '15b3')"
                )
    for i, value in enumerate(s.pci_addresses):
        if not _PCI_ADDRESS.fullmatch(value):
            raise Invalid(
                f"{at}.pciAddresses[{i}]",
                f"{value!r} is not a full PCI address (domain:bus:device.function, '0000:3b:00.0')",
            )
    for i, value in enumerate(s.link_types):
        if normalize_link_type(value) not in LINK_TYPES:
            hint = " (for the port's link layer use linkLayers)" if "net" in value.lower() else ""
            raise Invalid(
                f"{at}.linkTypes[{i}]", f"{value!r} is not one of {', '.join(LINK_TYPES)}{hint}"
            )
    for i, value in enumerate(s.link_layers):
        if normalize_link_layer(value) not in LINK_LAYERS:
            raise Invalid(
                f"{at}.linkLayers[{i}]", f"{value!r} is not one of {', '.join(LINK_LAYERS)}"
            )
    for i, node in enumerate(s.numa_nodes):
        if node < 0:
            raise Invalid(f"{at}.numaNodes[{i}]", f"must be >= 0, got {node}")
    for i, value in enumerate(s.if_names):
        _check_ifname(value, f"{at}.ifNames[{i}]")
    for field, values, limit in (("drivers", s.drivers, 255), ("rdmaDevices", s.rdma_devices, 63)):
        for i, value in enumerate(values):
            if len(value) > limit or not _NAME_CHARS.fullmatch(value):
                raise Invalid(
                    f"{at}.{field}[{i}]",
                    f"{value!r} is not a {field[:-1]} name (1-{limit} characters, no spaces,"
                    " '/' or ':')",
                )


def _check_ifname(value: str, at: str) -> None:
    # dev_valid_name(): 1-15 bytes, not "." or "..", no '/', ':' or whitespace.
    if len(value) > 15 or value in (".", "..") or not _NAME_CHARS.fullmatch(value):
        raise Invalid(
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
