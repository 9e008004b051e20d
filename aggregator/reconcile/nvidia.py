"""Audit of an NVIDIA `NicClusterPolicy`'s `spec.rdmaSharedDevicePlugin.config` against the
fleet: valid, accepted by the upstream plugin, and selecting at least one adapter?
Pure and read-only: the object dict and the fleet in, Findings out. Validation is
proto.dpconfig's (the agent's); the matcher follows the upstream plugin's selectors.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from aggregator.fleet.state import NodeRecord
from aggregator.rules.finding import Finding
from proto.dpconfig import ConfigError, normalize_pci_id, parse_device_plugin_config
from proto.inventory import Device
from proto.messages.config import DevicePluginConfig, ResourceConfig, Selectors

RULE_INVALID: Final = "nvidia-policy-invalid"
RULE_MATCHES_NOTHING: Final = "selector-matches-nothing"
SUBJECT: Final = "NicClusterPolicy/nic-cluster-policy"
# The upstream plugin's resource-name check (stricter than Kubernetes: no '-' or '.').
_UPSTREAM_NAME: Final = re.compile(r"[a-zA-Z0-9_]+")
# Selectors and keys only nicfleet understands; upstream's JSON decoder drops them silently.
_NICFLEET_ONLY_SELECTORS: Final = ("pciAddresses", "rdmaDevices", "numaNodes", "linkLayers")
_UPSTREAM_SELECTORS: Final = ("vendors", "deviceIDs", "drivers", "ifNames", "linkTypes")
_ARPHRD_LINK_TYPES: Final = {1: "ether", 32: "infiniband"}
_LAYER_LINK_TYPES: Final = {"Ethernet": "ether", "InfiniBand": "infiniband"}


def audit_nic_cluster_policy(
    obj: Mapping[str, Any], fleet: Mapping[str, NodeRecord]
) -> tuple[Finding, ...]:
    """Findings about the NicClusterPolicy `obj`; () when it has no plugin config."""
    plugin = _mapping(_mapping(obj.get("spec")).get("rdmaSharedDevicePlugin"))
    if not plugin or plugin.get("config") is None:
        return ()
    raw = plugin["config"]
    where = "spec.rdmaSharedDevicePlugin.config"
    if not isinstance(raw, str):
        return (_invalid(where, "must be a string holding the JSON config document"),)
    if not raw.lstrip().startswith("{"):
        return (_invalid(where, "not valid JSON: the upstream plugin reads JSON only"),)
    try:
        config = parse_device_plugin_config(raw, source=SUBJECT)
    except ConfigError as exc:
        if exc.path == "$" or exc.path.startswith("line "):  # the text itself is broken
            where_in_text = "" if exc.path == "$" else f" ({exc.path})"
            return (_invalid(where, f"{exc.reason}{where_in_text}"),)
        path = f"{where}.{exc.path}"
        return (_invalid(path, exc.reason, resource=exc.resource_name),)
    findings = list(_upstream_rejects(config, where))
    if any(f.evidence.get("fatal") for f in findings):
        return tuple(findings)  # upstream would not start: matching adds nothing
    findings.extend(_matches_nothing(config, fleet))
    return tuple(findings)


def _upstream_rejects(config: DevicePluginConfig, where: str) -> list[Finding]:
    findings: list[Finding] = []
    if not config.config_list:
        findings.append(_invalid(f"{where}.configList", "empty: upstream refuses to start"))
    seen: dict[str, int] = {}
    for i, resource in enumerate(config.config_list):
        at = f"{where}.configList[{i}]"
        name = resource.resource_name
        if not _UPSTREAM_NAME.fullmatch(name):
            findings.append(
                _invalid(
                    f"{at}.resourceName",
                    f"{name!r}: the upstream plugin accepts only letters, digits and '_'",
                    resource=name,
                )
            )
        if name in seen:  # upstream compares names without their prefix
            findings.append(
                _invalid(
                    f"{at}.resourceName",
                    f"duplicate of configList[{seen[name]}] for the upstream plugin",
                    resource=name,
                )
            )
        seen.setdefault(name, i)
        extras = _nicfleet_only(resource)
        if extras:
            upstream_empty = not _upstream_selector_set(resource.selectors)
            fatal = upstream_empty and not resource.devices
            reason = f"{', '.join(extras)} unknown to the upstream plugin, which ignores them" + (
                ": it sees no selector and refuses to start"
                if fatal
                else ": it selects more adapters than written"
            )
            findings.append(_invalid(at, reason, resource=name, fatal=fatal))
    return findings


def _matches_nothing(config: DevicePluginConfig, fleet: Mapping[str, NodeRecord]) -> list[Finding]:
    devices = [
        device
        for record in fleet.values()
        if record.snapshot is not None
        for device in record.snapshot.devices
    ]
    if not devices:
        return []  # no inventory yet: nothing can be said
    findings = []
    for resource in config.config_list:
        if any(selects(resource, device) for device in devices):
            continue
        findings.append(
            Finding(
                rule=RULE_MATCHES_NOTHING,
                severity="warning",
                node=None,
                subject=f"{SUBJECT}/{resource.resource_name}",
                message=(
                    f"resource {resource.resource_name!r} of the NicClusterPolicy selects no"
                    f" adapter on any of {len(fleet)} nodes: it will advertise 0"
                ),
                evidence={"resource": resource.resource_name, "adapters": len(devices)},
            )
        )
    return findings


def selects(resource: ResourceConfig, device: Device) -> bool:
    """The upstream plugin's filters, ANDed: vendors, deviceIDs, drivers, ifNames (or the
    deprecated `devices`), linkTypes. An empty filter passes everything."""
    s = resource.selectors or Selectors()
    if_names = s.if_names or resource.devices
    link_types = {
        _ARPHRD_LINK_TYPES[i.type] for i in device.interfaces if i.type in _ARPHRD_LINK_TYPES
    } or {
        _LAYER_LINK_TYPES[p.link_layer] for p in device.ports if p.link_layer in _LAYER_LINK_TYPES
    }
    checks = (
        (s.vendors, {normalize_pci_id(device.vendor_id or "")}),
        (s.device_ids, {normalize_pci_id(device.device_id or "")}),
        (s.drivers, {device.driver or ""}),
        (if_names, set(device.netdevs)),
        (s.link_types, link_types),
    )
    return all(not wanted or set(wanted) & have for wanted, have in checks)


def _nicfleet_only(resource: ResourceConfig) -> list[str]:
    s = resource.selectors
    found = []
    if s is not None:
        encoded = {f.name: f.encode_name for f in msgspec.structs.fields(Selectors)}
        found = [
            name
            for attr, name in encoded.items()
            if name in _NICFLEET_ONLY_SELECTORS and getattr(s, attr)
        ]
        found = [f"selectors.{name}" for name in found]
    if resource.exclusive:
        found.append("exclusive")
    return found


def _upstream_selector_set(s: Selectors | None) -> bool:
    if s is None:
        return False
    encoded = {f.encode_name: f.name for f in msgspec.structs.fields(Selectors)}
    return any(getattr(s, encoded[name]) for name in _UPSTREAM_SELECTORS)


def _invalid(path: str, reason: str, *, resource: str | None = None, fatal: bool = True) -> Finding:
    entry = f" (resourceName {resource!r})" if resource else ""
    return Finding(
        rule=RULE_INVALID,
        severity="critical" if fatal else "warning",
        node=None,
        subject=SUBJECT,
        message=f"{path}{entry}: {reason}",
        evidence={"path": path, "reason": reason, "resource": resource, "fatal": fatal},
    )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
