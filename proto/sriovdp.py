"""The NicClusterPolicy's `sriovDevicePlugin.config` as k8snetworkplumbingwg/
sriov-network-device-plugin (at 40b6f50) reads and applies it: its Go decoding (cmd/sriovdp
readConfig, pkg/factory parseObjectOrSlice), its start checks (validConfigs) and its netDevice
selectors (pkg/resources/deviceSelectors.go, pkg/netdevice GetFilteredDevices) against the
adapters the snapshots list.

Pure. What a snapshot cannot show is said, not guessed: the default-route netdev the plugin
skips, acpiIndexes, pKeys, vdpaType, a switchdev PF's uplink representor name.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from proto.gojson import (
    GoJsonError,
    GoStruct,
    fold,
    is_number,
    objects,
    parse_json,
    unmarshal,
)
from proto.inventory import Device, NodeSnapshot
from proto.nicpolicysections import Note, Severity

_LIST_KEYS: Final = (
    "vendors", "devices", "drivers", "pciAddresses", "pfNames", "rootDevices", "linkTypes",
    "acpiIndexes", "ddpProfiles", "pKeys",
)  # fmt: skip
# NetDeviceSelectors with its embedded structs flattened; IsRdma has no json tag, so Go
# matches its field name, case-insensitively ("isRdma").
SELECTORS: Final = GoStruct(
    "NetDeviceSelectors",
    {**dict.fromkeys(_LIST_KEYS, "[]string"), "IsRdma": "bool", "needVhostNet": "bool",
     "vdpaType": "string"},
)  # fmt: skip
RESOURCE: Final = GoStruct(
    "ResourceConfig",
    {"resourcePrefix": "string", "resourceName": "string", "deviceType": "string",
     "excludeTopology": "bool"},
)  # fmt: skip
CONF_LIST: Final = GoStruct(
    "ResourceConfList", {"resourceList": RESOURCE}, lists=frozenset({"resourceList"})
)
DEVICE_TYPES: Final = ("netDevice", "accelerator", "auxNetDevice")
_NAME: Final = re.compile(r"[a-zA-Z0-9_-]+")  # utils.ValidResourceName
_INT: Final = re.compile(r"[+-]?[0-9]+")
# The operator webhook's sriovResourceNameRegex and fqdnRegex (Go's $ is the text's end).
_WEBHOOK_NAME: Final = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.]*)?[A-Za-z0-9]")
_FQDN: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z]{2,})+")
_ENCAP: Final = {1: "ether", 32: "infiniband"}  # netlink EncapType of the ARPHRD
_UNSEEN: Final = ("acpiIndexes", "pKeys")  # not in a snapshot
PATH: Final = "spec.sriovDevicePlugin.config"


class Resource(msgspec.Struct, frozen=True, kw_only=True):
    index: int
    name: str
    prefix: str
    device_type: str
    selectors: tuple[dict[str, object], ...] = ()  # decoded NetDeviceSelectors, one per group
    dropped: str | None = None  # why readConfig leaves the entry out (selectors do not decode)


class Refusal(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    reason: str


def read_config(raw: str) -> tuple[Resource, ...] | Refusal:
    """readConfig then validConfigs: the resources the plugin serves, or why it does not
    start (it then serves nothing)."""
    try:
        top = unmarshal(raw, CONF_LIST)
        document = parse_json(raw)
    except GoJsonError as exc:
        return Refusal(path=exc.path, reason=f"not valid for Go's json.Unmarshal: {exc.reason}")
    decoded = top.get("resourceList") or []
    items = _last(document, "resourceList")
    resources = []
    for i, fields in enumerate(decoded if isinstance(decoded, list) else []):
        at = f"resourceList[{i}]"
        entry = items[i] if isinstance(items, list) and i < len(items) else None
        kind = str(fields.get("deviceType") or "") or "netDevice"
        if kind not in DEVICE_TYPES:
            return Refusal(path=f"{at}.deviceType", reason=f"unsupported deviceType {kind!r}")
        raw_selectors = _last(entry, "selectors")
        name = str(fields.get("resourceName") or "")
        if raw_selectors is None:
            # rc.Selectors is a nil *json.RawMessage: parseObjectOrSlice dereferences it.
            return Refusal(path=f"{at}.selectors", reason="missing or null: the plugin "
                           "dereferences the nil selectors and panics at start")  # fmt: skip
        groups, why = _selector_groups(raw_selectors)
        resources.append(Resource(
            index=i, name=name, prefix=str(fields.get("resourcePrefix") or ""),
            device_type=kind, selectors=groups, dropped=why,
        ))  # fmt: skip
    served = [r for r in resources if r.dropped is None]
    if not served:
        return Refusal(path="resourceList", reason="no resource configuration left: it exits")
    seen: set[str] = set()
    for r in served:
        at = f"resourceList[{r.index}]"
        if not _NAME.fullmatch(r.name):
            why = f"resource name {r.name!r} contains invalid characters"
            return Refusal(path=f"{at}.resourceName", reason=why)
        full = f"{r.prefix or '<--resource-prefix>'}/{r.name}"
        if full in seen:
            return Refusal(path=f"{at}.resourceName", reason=f"resource name {full} already exists")
        seen.add(full)
        if any(g.get("IsRdma") and g.get("vdpaType") for g in r.selectors):
            return Refusal(path=f"{at}.selectors",
                           reason="isRdma and vdpaType are mutually exclusive")  # fmt: skip
    return tuple(resources)


def _selector_groups(value: object) -> tuple[tuple[dict[str, object], ...], str | None]:
    """parseObjectOrSlice: one NetDeviceSelectors object, else a non-empty array of them."""
    text = _text(value)
    try:
        return (unmarshal(text, SELECTORS),), None
    except GoJsonError:
        pass
    try:
        groups = unmarshal(f'{{"l":{text}}}', GoStruct("L", {"l": SELECTORS}, frozenset({"l"})))
    except GoJsonError as exc:
        return (), f"the selectors do not decode ({exc.reason}): the plugin leaves it out"
    found = groups.get("l")
    if not isinstance(found, list) or not found:
        return (), "need at least one selector, got 0: the plugin leaves it out"
    return tuple(found), None


def selected(resource: Resource, snap: NodeSnapshot) -> tuple[list[Device], list[str]]:
    """The adapters of `snap` the resource selects (any selector group), and what the
    snapshot cannot tell about them."""
    candidates = [d for d in snap.devices if _discovered(d)]
    found: dict[str, Device] = {}
    unseen: set[str] = set()
    for group in resource.selectors:
        unseen |= {k for k in _UNSEEN if group.get(k)}
        if group.get("vdpaType"):
            unseen.add("vdpaType")
            continue
        for device in candidates:
            if _matches(group, device, snap):
                found.setdefault(device.pci_address or device.name, device)
    return list(found.values()), sorted(unseen)


def _discovered(device: Device) -> bool:
    """AddTargetDevices: a network-class function, not a PF with VFs created."""
    if not (device.class_code or "0x02").lower().removeprefix("0x").startswith("02"):
        return False
    return not (device.sriov is not None and device.sriov.physfn is None and device.sriov.numvfs)


def _matches(group: Mapping[str, object], device: Device, snap: NodeSnapshot) -> bool:
    pf = _pf(device, snap)
    index = _vf_index(device, pf)
    link = _link_type(device, pf)
    have = {
        "vendors": _ghw(device.vendor_id), "devices": _ghw(device.device_id),
        "drivers": device.driver or "", "pciAddresses": device.pci_address or "",
        "linkTypes": link,
    }  # fmt: skip
    for key, value in have.items():
        wanted = group.get(key)
        if isinstance(wanted, list) and wanted and value not in wanted:  # exact (contains)
            return False
    # pfNames / rootDevices: only a VF has a PF name / address; "name#0-3,7" picks VF indexes.
    pf_name = (sorted(pf.netdevs) or [""])[0] if pf is not None else ""
    pf_addr = pf.pci_address or "" if pf is not None else ""
    for key, value in (("pfNames", pf_name), ("rootDevices", pf_addr)):
        wanted = group.get(key)
        if wanted and not (value and _pick(wanted, value, index)):
            return False
    # ddpProfiles: an Intel (ice/i40e) DDP package; no Mellanox function has one.
    return not group.get("ddpProfiles")


def _pick(items: object, name: str, index: int) -> bool:
    entry = next((str(i) for i in items if fold(str(i).split("#", 1)[0]) == fold(name)), None) \
        if isinstance(items, list) else None  # fmt: skip
    if entry is None:
        return False
    if "#" not in entry:
        return True
    fields = entry.split("#")
    if len(fields) != 2:
        return False
    for part in fields[1].split(","):
        bounds = part.split("-")
        numbers = [_atoi(b) for b in bounds]
        if len(bounds) > 2 or None in numbers:
            return False  # isSelected gives up on the first entry it cannot parse
        if len(numbers) == 2 and numbers[0] <= index <= numbers[1]:  # type: ignore[operator]
            return True
        if len(numbers) == 1 and numbers[0] == index:
            return True
    return False


def _atoi(text: str) -> int | None:
    """strconv.Atoi: an optional sign and decimal digits."""
    return int(text) if _INT.fullmatch(text) else None


def _pf(device: Device, snap: NodeSnapshot) -> Device | None:
    if device.sriov is None or device.sriov.physfn is None:
        return None
    return next((d for d in snap.devices if d.pci_address == device.sriov.physfn), None)


def _vf_index(device: Device, pf: Device | None) -> int:
    if pf is None or pf.sriov is None or device.pci_address not in pf.sriov.vfs:
        return -1
    return pf.sriov.vfs.index(device.pci_address)  # virtfnN, in N order


def _link_type(device: Device, pf: Device | None) -> str:
    """EncapType of the function's first netdev (by name), else of its PF's."""
    for owner in (device, pf):
        if owner is None or not owner.netdevs:
            continue
        first = sorted(owner.netdevs)[0]
        kind = next((i.type for i in owner.interfaces if i.name == first), None)
        return _ENCAP.get(kind or 0, "")
    return ""


def _ghw(value: str | None) -> str:
    return (value or "").lower().removeprefix("0x")


def _last(value: object, tag: str) -> Any:
    """What Go decodes into the field `tag` from a parsed object: every key equal to it
    (exactly or case-insensitively) decodes in turn, so the last one wins."""
    matches = [v for k, v in getattr(value, "pairs", ()) if fold(k) == fold(tag)]
    return matches[-1] if matches else None


def _text(value: object) -> str:
    """A parsed value back to JSON text, repeated keys and number literals kept."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if is_number(value):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ",".join(_text(v) for v in value) + "]"
    pairs = getattr(value, "pairs", ())
    return "{" + ",".join(f"{json.dumps(k)}:{_text(v)}" for k, v in pairs) + "}"


def sriov_notes(plugin: Mapping[str, Any], snapshots: Mapping[str, NodeSnapshot]) -> list[Note]:
    """Whether the plugin starts with the config, and what each resource selects."""
    raw = plugin.get("config")
    if not plugin or raw is None:
        return []
    if not isinstance(raw, str):
        return [_note("critical", PATH, "config must be a string holding JSON")]
    refused = webhook_refusals(raw)
    config = read_config(raw)
    if isinstance(config, Refusal):
        where = f"{PATH}.{config.path}" if config.path else PATH
        why = f"the sriov device plugin would not start: {config.reason}"
        return [*refused, _note("critical", where, why)]
    notes = refused + [
        _note("warning", f"{PATH}.resourceList[{r.index}].selectors",
              f"resource {r.name!r}: {r.dropped}")
        for r in config if r.dropped is not None
    ]  # fmt: skip
    for r in (r for r in config if r.dropped is None):
        notes.extend(_resource_notes(r, snapshots))
    return notes


def _resource_notes(r: Resource, snapshots: Mapping[str, NodeSnapshot]) -> list[Note]:
    at = f"{PATH}.resourceList[{r.index}]"
    if r.device_type != "netDevice":
        return [_note("info", at, f"resource {r.name!r} is a {r.device_type}: not judged")]
    hits: list[str] = []
    unseen: set[str] = set()
    for node in sorted(snapshots):
        devices, blind = selected(r, snapshots[node])
        hits += [f"{node}/{d.name}" for d in devices]
        unseen |= set(blind)
    caveat = f" ({', '.join(sorted(unseen))} not in snapshots: not applied)" if unseen else ""
    if snapshots and not hits:
        return [_note("warning", at, f"resource {r.name!r} selects no adapter on any of "
                      f"{len(snapshots)} nodes: it advertises 0{caveat}")]  # fmt: skip
    if not hits:
        return []
    shown = ", ".join(hits[:8]) + (" …" if len(hits) > 8 else "")
    return [_note("info", at, f"resource {r.name!r} selects {len(hits)} adapters: {shown}"
                  f"{caveat} (a netdev holding the default route is skipped by the plugin; "
                  "snapshots carry no routes)")]  # fmt: skip


def webhook_refusals(raw: str) -> list[Note]:
    """The operator webhook's own checks of the config that need no JSON schema: valid
    JSON into a map, each resourceName (`^([A-Za-z0-9][A-Za-z0-9_.]*)?[A-Za-z0-9]$`) and
    resourcePrefix (an FQDN). Its JSON-schema checks are not reproduced."""
    try:
        document = objects(parse_json(raw))
    except GoJsonError:
        document = None
    refuses = "the operator's webhook refuses it: "
    if document is None:
        why = refuses + "Invalid json of SriovNetworkDevicePluginConfig"
        return [_note("critical", PATH, why, "webhook")]
    items = document.get("resourceList")  # a Go map: the exact key
    notes = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        fields = objects(item) or {}
        name, prefix = fields.get("resourceName"), fields.get("resourcePrefix")
        at = f"{PATH}.resourceList[{i}]"
        if isinstance(name, str) and not _WEBHOOK_NAME.fullmatch(name):
            why = f"invalid resource name {name!r}"
            notes.append(_note("critical", f"{at}.resourceName", refuses + why, "webhook"))
        elif isinstance(prefix, str) and not _FQDN.fullmatch(prefix):
            why = f"resource prefix {prefix!r} is not an FQDN"
            notes.append(_note("critical", f"{at}.resourcePrefix", refuses + why, "webhook"))
    return notes


def _note(severity: Severity, path: str, message: str, section: str = "sriovDevicePlugin") -> Note:
    return Note(section=section, severity=severity, path=path, message=message)
