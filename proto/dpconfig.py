"""The device-plugin config document (k8s-rdma-shared-dev-plugin format plus nicfleet's
selectors): the one validator the agent and the aggregator both use.

Owns parsing (JSON or YAML text, or an already-decoded mapping; the syntax walk is
proto.dpconfigdecode), the rules a document must pass, and the normal form of selector
values. Strict (`parse_`/`validate_device_plugin_config`: the document passes whole) or
resource by resource (`parse_`/`check_device_plugin_resources`: errors upstream's plugin also
exits on stay fatal, an entry only it would fail is left out and reported, see
docs/device-plugin-config.md). Field names come from proto.messages only.
Pure: no file, clock or logging; the caller reads the text and reports the ConfigError.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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
# upstream's validResourceName (pkg/resources/resources_manager.go): it exits on any other name.
_UPSTREAM_NAME = re.compile(r"[a-zA-Z0-9_]+")


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


@dataclass(frozen=True, kw_only=True)
class InvalidResource:
    """One configList entry left out of a config checked resource by resource."""

    index: int  # its position in configList
    name: str  # `<resourcePrefix>/<resourceName>` as written (the fault may be in it)
    path: str  # the field at fault, e.g. configList[2].resourcePrefix
    reason: str

    @property
    def message(self) -> str:
        return f"{self.path} (resource {self.name!r}): {self.reason}"


@dataclass(frozen=True, kw_only=True)
class CheckedConfig:
    """A config checked resource by resource: what to serve, and what was left out."""

    config: DevicePluginConfig  # the valid entries only, normalized
    invalid: tuple[InvalidResource, ...] = ()  # one per entry left out, in document order


def parse_device_plugin_config(
    data: bytes | str | Mapping[str, Any], *, source: str
) -> DevicePluginConfig:
    """Decode, check and normalize a config document; raises one ConfigError."""
    config, given = _decode(data, source)
    _raise_first(_problems(config, hca_max_given=given), config, source)
    return _normalize(config)


def parse_device_plugin_resources(
    data: bytes | str | Mapping[str, Any], *, source: str
) -> CheckedConfig:
    """Decode and check a document resource by resource; raises one ConfigError for an
    error the whole document fails on (its text, shape, or a rule upstream exits on)."""
    config, given = _decode(data, source)
    return _split(config, source, hca_max_given=given)


def validate_device_plugin_config(config: DevicePluginConfig, *, source: str) -> None:
    """Check a config built in code or decoded from the wire; raises one ConfigError.

    Unknown keys and a missing rdmaHcaMax can only be seen in the document itself, so text
    goes through `parse_device_plugin_config`, which runs these checks too.
    """
    _raise_first(_problems(config, hca_max_given=None), config, source)


def check_device_plugin_resources(config: DevicePluginConfig, *, source: str) -> CheckedConfig:
    """`validate_device_plugin_config`, resource by resource (see
    `parse_device_plugin_resources`)."""
    return _split(config, source, hca_max_given=None)


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


def _decode(
    data: bytes | str | Mapping[str, Any], source: str
) -> tuple[DevicePluginConfig, list[bool]]:
    """The document as a Struct (not normalized) and, per entry, whether rdmaHcaMax was
    given; raises a ConfigError for text, keys or types (upstream's decoder fails whole)."""
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
    return config, ["rdmaHcaMax" in entry for entry in entries(canonical)]


def _names(config: DevicePluginConfig) -> dict[int, str]:
    return {i: r.resource_name for i, r in enumerate(config.config_list)}


def _raise_first(problems: Iterator[_Problem], config: DevicePluginConfig, source: str) -> None:
    for _, exc in problems:
        raise _error(source, exc, _names(config))


def _split(
    config: DevicePluginConfig, source: str, *, hca_max_given: list[bool] | None
) -> CheckedConfig:
    first: dict[int, Invalid] = {}
    for index, exc in _problems(config, hca_max_given=hca_max_given):
        if index is None:
            raise _error(source, exc, _names(config))
        first.setdefault(index, exc)
    invalid = tuple(
        InvalidResource(
            index=i,
            name=resource_full_name(config.config_list[i]),
            path=exc.path,
            reason=exc.reason,
        )
        for i, exc in sorted(first.items())
    )
    kept = tuple(r for i, r in enumerate(config.config_list) if i not in first)
    valid = msgspec.structs.replace(config, config_list=kept)
    return CheckedConfig(config=_normalize(valid), invalid=invalid)


# --- rules ------------------------------------------------------------------------------

# A problem and whom it fails: an entry's index, or None for the whole document. Whole:
# what upstream's ValidateConfigs (pkg/resources/resources_manager.go) exits on. An entry:
# what upstream lets through and then fails for that resource alone (the kubelet refuses
# its registration, or its selectors match nothing), plus nicfleet's extra entry checks.
_Problem = tuple[int | None, Invalid]


def _problems(
    config: DevicePluginConfig, *, hca_max_given: list[bool] | None
) -> Iterator[_Problem]:
    """Every problem, in the order the strict check reports the first: the interval, the
    names of all entries, then each entry."""
    if config.periodic_update_interval < 0:
        yield None, Invalid("periodicUpdateInterval", "must be >= 0 (0: no periodic update)")
    seen: dict[str, int] = {}
    for i, resource in enumerate(config.config_list):
        at = f"configList[{i}]"
        try:
            _check_name(resource, at)
        except Invalid as exc:
            upstream_accepts = bool(_UPSTREAM_NAME.fullmatch(resource.resource_name))
            yield (i if upstream_accepts or exc.path.endswith("Prefix") else None), exc
        full = resource_full_name(resource)
        if full in seen:
            yield (
                None,
                Invalid(
                    f"{at}.resourceName",
                    f"duplicate resource {full!r} (already configList[{seen[full]}])",
                ),
            )
        seen.setdefault(full, i)
    for i, resource in enumerate(config.config_list):
        given = True if hca_max_given is None else hca_max_given[i]
        yield from _resource_problems(i, resource, f"configList[{i}]", hca_max_given=given)


def _check_name(resource: ResourceConfig, at: str) -> None:
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


def _resource_problems(
    i: int, resource: ResourceConfig, at: str, *, hca_max_given: bool
) -> Iterator[_Problem]:
    if not hca_max_given and not resource.exclusive:
        yield (
            i,
            Invalid(
                f"{at}.rdmaHcaMax",
                "required: how many pods may share the selected adapters"
                " (without it the upstream plugin silently advertises 0)",
            ),
        )
    if resource.rdma_hca_max < 0:  # upstream exits; above the maximum it would serve
        yield None, Invalid(f"{at}.rdmaHcaMax", f"must be between 0 and {MAX_RDMA_HCA}")
    elif resource.rdma_hca_max > MAX_RDMA_HCA:
        yield i, Invalid(f"{at}.rdmaHcaMax", f"must be between 0 and {MAX_RDMA_HCA}")
    selectors = resource.selectors
    has_selectors = selectors is not None and any(
        getattr(selectors, f.name) for f in msgspec.structs.fields(Selectors)
    )
    if has_selectors and resource.devices:
        yield (
            None,
            Invalid(
                f"{at}.devices",
                "cannot be combined with selectors (upstream refuses both too);"
                " put these names in selectors.ifNames",
            ),
        )
    if not has_selectors and not resource.devices:
        yield (
            None,
            Invalid(
                f"{at}.selectors",
                "missing or empty, and no devices list: the resource would select nothing"
                " (give e.g. vendors, deviceIDs or ifNames)",
            ),
        )
    # Values upstream never checks: a bad one matches nothing, for this resource only.
    try:
        for n, name in enumerate(resource.devices):
            _check_ifname(name, f"{at}.devices[{n}]")
        if selectors is not None:
            _check_selectors(selectors, f"{at}.selectors")
    except Invalid as exc:
        yield i, exc


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
