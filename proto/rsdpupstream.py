"""What the upstream k8s-rdma-shared-dev-plugin (Mellanox, v1.5+ at commit 410b0f3) does with
a config document on a node: refuse to start, or advertise N for each resource. Pure: the
document and a NodeSnapshot in, verdicts out; nicfleet's own semantics are proto.dpconfig's.

Upstream facts this module encodes (pkg/types, pkg/resources, cmd/k8s-rdma-shared-dp):
- ReadConfig is `json.Unmarshal` into UserConfigList (proto.gojson's rules); any error, and
  the first failed check of ValidateConfigs, is `log.Fatal`: the whole plugin exits;
- an adapter is a PCI function of class 0x02 that has the char devices rdma_cm, umad and
  uverbs (issm is not required); one missing drops the adapter from every resource;
- each selector compares strings exactly (no case folding, no "0x"): vendor and device IDs
  as ghw writes them (lowercase 4-hex), the driver's name, the FIRST netdev name under the
  PCI function (ReadDir order: sorted), and that netdev's netlink encap type ("ether",
  "infiniband"), "" for an adapter without netdev;
- a resource with at least one adapter advertises rdmaHcaMax devices (default 0), else 0;
- after ValidateConfigs, ValidateRdmaSystemMode reads the RDMA subsystem's netns mode over
  netlink (`rdma system show netns`): "exclusive" is `log.Fatalf("Exiting.. can not change :
  incorrect RDMA subsystem network namespace")`; a kernel without the query (before 5.2,
  EINVAL) logs "too old kernel to get RDMA subsystem" and goes on; any other error exits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Final, Literal

import msgspec

from proto.gojson import GoJsonError, GoStruct, is_number, objects, parse_json, unmarshal
from proto.inventory import Device, NodeSnapshot, Platform

SELECTOR_KEYS: Final = ("vendors", "deviceIDs", "drivers", "ifNames", "linkTypes")
SELECTORS: Final = GoStruct("Selectors", dict.fromkeys(SELECTOR_KEYS, "[]string"))
USER_CONFIG: Final = GoStruct(
    "UserConfig",
    {
        "resourceName": "string",
        "resourcePrefix": "string",
        "rdmaHcaMax": "int",
        "devices": "[]string",
        "selectors": SELECTORS,
    },
)
USER_CONFIG_LIST: Final = GoStruct(
    "UserConfigList",
    {"periodicUpdateInterval": "*int", "configList": USER_CONFIG},
    lists=frozenset({"configList"}),
)
DEFAULT_PREFIX: Final = "rdma"
DEFAULT_PERIODIC_UPDATE: Final = 60
REQUIRED_CHAR_DEVICES: Final = ("rdma_cm", "umad", "uverbs")  # requiredRdmaDevices
_NAME: Final = re.compile(r"[a-zA-Z0-9_]+\Z")  # validResourceName; Go's $ is \Z
# vishvananda/netlink's IfInfomsg.EncapType() for the ARPHRD values an RDMA netdev has.
ENCAP_TYPES: Final = {1: "ether", 32: "infiniband", 772: "loopback", 768: "ipip", 776: "sit"}
# The operator's webhook (api/v1alpha1/validator/nicpolicy_webhook.go at b06827e).
_WEBHOOK_NAME: Final = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_FQDN: Final = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?(?:\.[a-zA-Z]{2,})+\Z")
_PCI_ID: Final = re.compile(r"(?:0[xX])?([0-9A-Fa-f]{4})")


class Resource(msgspec.Struct, frozen=True, kw_only=True):
    """One configList entry as the plugin holds it after ValidateConfigs."""

    name: str
    prefix: str = DEFAULT_PREFIX
    rdma_hca_max: int = 0
    selectors: dict[str, tuple[str, ...]] = msgspec.field(default_factory=dict)
    from_devices: bool = False  # the deprecated `devices` list became selectors.ifNames

    @property
    def full_name(self) -> str:
        return f"{self.prefix}/{self.name}"


class Config(msgspec.Struct, frozen=True, kw_only=True):
    periodic_update_interval: int = DEFAULT_PERIODIC_UPDATE
    resources: tuple[Resource, ...] = ()


class StartFailure(msgspec.Struct, frozen=True, kw_only=True):
    """Why the plugin exits at start: the first error, as it logs it before log.Fatal."""

    stage: Literal["decode", "validate"]
    path: str  # JSON path of the offending field, "" for the whole document
    reason: str


class Adapter(msgspec.Struct, frozen=True, kw_only=True):
    """A PCI function as the plugin sees it."""

    pci_address: str
    rdma_device: str  # the nicfleet name (mlx5_0), for people; upstream has no use for it
    vendor: str
    device_id: str
    driver: str
    if_name: str  # the first of `netdevs`: the only one the plugin looks at
    netdevs: tuple[str, ...]
    link_type: str
    link_type_known: bool  # False: the snapshot lacks the netdev's type, link_type is a guess
    dropped: str | None = None  # why the plugin skips this adapter for every resource


class NetnsCheck(msgspec.Struct, frozen=True, kw_only=True):
    """ValidateRdmaSystemMode on a node: whether the plugin gets past it, and why."""

    outcome: Literal["starts", "exits", "unknown"]
    reason: str


class Unmatched(msgspec.Struct, frozen=True, kw_only=True):
    adapter: str  # PCI address
    selector: str  # the first selector that drops it, e.g. deviceIDs
    reason: str


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    resource: str  # <prefix>/<name>
    advertised: int
    selected: tuple[str, ...] = ()  # PCI addresses
    unmatched: tuple[Unmatched, ...] = ()


def read_config(data: bytes | str) -> Config | StartFailure:
    """ReadConfig then ValidateConfigs: the config the plugin runs with, or why it exits."""
    try:
        raw = unmarshal(data, USER_CONFIG_LIST)
    except GoJsonError as exc:
        return StartFailure(stage="decode", path=exc.path, reason=str(exc.reason))
    return validate(raw)


def validate(raw: Mapping[str, object]) -> Config | StartFailure:
    """ValidateConfigs over the decoded fields (absent = Go's zero value)."""
    interval = raw.get("periodicUpdateInterval")
    period = DEFAULT_PERIODIC_UPDATE if interval is None else _int(interval)
    if period < 0:
        return _refuse(
            "periodicUpdateInterval",
            f'invalid "periodicUpdateInterval" configuration "{period * 10**9}"',
        )
    entries = raw.get("configList")
    items: list[Mapping[str, object]] = list(entries) if isinstance(entries, list) else []
    if not items:
        return _refuse("configList", "no resources configuration found")
    seen: set[str] = set()
    resources: list[Resource] = []
    for i, entry in enumerate(items):
        at = f"configList[{i}]"
        name = _str(entry.get("resourceName"))
        if not _NAME.match(name):
            return _refuse(
                f"{at}.resourceName", f'error: resource name "{name}" contains invalid characters'
            )
        if name in seen:  # compared without the prefix
            return _refuse(f"{at}.resourceName", f'error: resource name "{name}" already exists')
        hca_max = _int(entry.get("rdmaHcaMax"))
        if hca_max < 0:
            return _refuse(
                f"{at}.rdmaHcaMax", f"error: Invalid value for rdmaHcaMax < 0: {hca_max}"
            )
        selectors = entry.get("selectors")
        chosen = {
            key: tuple(_strs(selectors.get(key)))
            for key in SELECTOR_KEYS
            if isinstance(selectors, dict) and _strs(selectors.get(key))
        }
        devices = tuple(_strs(entry.get("devices")))
        if not chosen and not devices:
            return _refuse(
                f"{at}.selectors",
                'error: configuration missmatch. neither "selectors" nor "devices" fields exits',
            )
        if chosen and devices:
            return _refuse(
                f"{at}.devices",
                'configuration mismatch. Cannot specify both "selectors" and "devices" fields',
            )
        seen.add(name)
        resources.append(
            Resource(
                name=name,
                prefix=_str(entry.get("resourcePrefix")) or DEFAULT_PREFIX,
                rdma_hca_max=hca_max,
                selectors=chosen or {"ifNames": devices},
                from_devices=not chosen,
            )
        )
    return Config(periodic_update_interval=period, resources=tuple(resources))


def adapters(snapshot: NodeSnapshot) -> tuple[Adapter, ...]:
    """The node's adapters as the plugin discovers them, one per PCI function."""
    rdma_cm = any(_base(p) == "rdma_cm" for d in snapshot.devices for p in d.char_devices)
    seen: set[str] = set()
    found: list[Adapter] = []
    for device in snapshot.devices:
        if device.pci_address is None or device.pci_address in seen:
            continue  # a PCI function with several RDMA devices (SFs) is one adapter
        seen.add(device.pci_address)
        found.append(adapter_of(device, node_has_rdma_cm=rdma_cm))
    return tuple(found)


def adapter_of(device: Device, *, node_has_rdma_cm: bool) -> Adapter:
    if_name = sorted(device.netdevs)[0] if device.netdevs else ""
    iface = next((i for i in device.interfaces if i.name == if_name), None)
    if not if_name:
        link_type, known = "", True
    elif iface is not None and iface.type is not None:
        link_type, known = ENCAP_TYPES.get(iface.type, f"arphrd-{iface.type}"), True
    else:  # no type recorded: guess from the port's link layer
        layer = device.ports[0].link_layer if device.ports else "Unknown"
        link_type, known = {"InfiniBand": "infiniband", "Ethernet": "ether"}.get(layer, ""), False
    return Adapter(
        pci_address=device.pci_address or "",
        rdma_device=device.name,
        vendor=_ghw_id(device.vendor_id),
        device_id=_ghw_id(device.device_id),
        driver=device.driver or "",
        if_name=if_name,
        netdevs=tuple(sorted(device.netdevs)),
        link_type=link_type,
        link_type_known=known,
        dropped=_dropped(device, node_has_rdma_cm),
    )


def predict(resource: Resource, found: Sequence[Adapter]) -> Prediction:
    """GetFilteredDevices then newResourceServer: what the resource advertises."""
    selected: list[str] = []
    unmatched: list[Unmatched] = []
    for adapter in found:
        if adapter.dropped is not None:
            unmatched.append(
                Unmatched(adapter=adapter.pci_address, selector="-", reason=adapter.dropped)
            )
            continue
        miss = first_mismatch(resource, adapter)
        if miss is None:
            selected.append(adapter.pci_address)
        else:
            unmatched.append(miss)
    return Prediction(
        resource=resource.full_name,
        advertised=resource.rdma_hca_max if selected else 0,
        selected=tuple(selected),
        unmatched=tuple(unmatched),
    )


def first_mismatch(resource: Resource, adapter: Adapter) -> Unmatched | None:
    """The first selector (in the plugin's filter order) that drops `adapter`, with why."""
    have = {
        "vendors": adapter.vendor,
        "deviceIDs": adapter.device_id,
        "drivers": adapter.driver,
        "ifNames": adapter.if_name,
        "linkTypes": adapter.link_type,
    }
    for key in SELECTOR_KEYS:
        wanted = resource.selectors.get(key, ())
        if not wanted or have[key] in wanted:
            continue
        shown = "devices (as ifNames)" if key == "ifNames" and resource.from_devices else key
        written = ", ".join(repr(w) for w in wanted)
        reason = f"{shown} [{written}] does not contain {have[key]!r}"
        hint = _hint(key, wanted, adapter)
        return Unmatched(adapter=adapter.pci_address, selector=key, reason=f"{reason}{hint}")
    return None


def netns_check(platform: Platform) -> NetnsCheck:
    """ValidateRdmaSystemMode from the snapshot's `rdma_netns_mode` (and, when the mode is
    unknown, its kernel release: a kernel before 5.2 has neither the mode nor the query)."""
    mode = platform.rdma_netns_mode
    if mode == "exclusive":
        return NetnsCheck(
            outcome="exits",
            reason="RDMA subsystem in exclusive netns mode: ValidateRdmaSystemMode fails and the"
            ' plugin exits ("Exiting.. can not change : incorrect RDMA subsystem network'
            ' namespace")',
        )
    if mode == "shared":
        return NetnsCheck(outcome="starts", reason="RDMA subsystem in shared netns mode")
    release = _kernel_version(platform.kernel_release)
    if release is not None and release < (5, 2):
        return NetnsCheck(
            outcome="starts",
            reason=f"kernel {platform.kernel_release} predates RDMA netns modes: the plugin"
            ' logs "too old kernel to get RDMA subsystem" and goes on',
        )
    return NetnsCheck(
        outcome="unknown",
        reason="the RDMA netns mode is not in the snapshot (an agent older than the field, or"
        " ib_core not loaded): whether upstream starts cannot be judged; it exits in"
        " exclusive mode",
    )


def _kernel_version(release: str | None) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", release or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def webhook_errors(data: bytes | str) -> tuple[str, ...]:
    """What the network-operator's admission webhook says about a rdmaSharedDevicePlugin
    config (its JSON schema, then the name and prefix patterns); () when it admits it."""
    try:
        document = parse_json(data)
    except GoJsonError as exc:
        return (f"Invalid json of RdmaSharedDevicePluginConfig: {exc.reason}",)
    top = objects(document)
    if top is None:
        return (f"(root): Invalid type. Expected: object, given: {_json_type(document)}",)
    if "configList" not in top:
        return ("(root): configList is required",)
    items = top["configList"]
    if not isinstance(items, list):
        return (f"configList: Invalid type. Expected: array, given: {_json_type(items)}",)
    if not items:
        return ("configList: Array must have at least 1 items",)
    errors: list[str] = []
    for i, item in enumerate(items):
        errors.extend(_webhook_entry(item, f"configList.{i}"))
    if errors:
        return tuple(errors)
    for i, item in enumerate(items):
        entry = objects(item) or {}
        name = entry.get("resourceName")
        if isinstance(name, str) and not _WEBHOOK_NAME.match(name):
            errors.append(f"configList.{i}.resourceName: Invalid Resource name {name!r}")
        prefix = entry.get("resourcePrefix")
        if isinstance(prefix, str) and not _FQDN.match(prefix):
            errors.append(
                f"configList.{i}.resourcePrefix: Invalid Resource prefix, it must be a valid FQDN"
            )
            break  # the webhook returns at the first bad prefix
    return tuple(errors)


def _webhook_entry(item: object, at: str) -> list[str]:
    entry = objects(item)
    if entry is None:
        return [f"{at}: Invalid type. Expected: object, given: {_json_type(item)}"]
    errors = [
        f"{at}: {key} is required" for key in ("resourceName", "rdmaHcaMax") if key not in entry
    ]
    if "selectors" not in entry and "devices" not in entry:
        errors.append(
            f"{at}: Must validate at least one schema (anyOf): selectors or devices is required"
        )
    for key, want in (
        ("resourceName", "string"),
        ("resourcePrefix", "string"),
        ("rdmaHcaMax", "integer"),
    ):
        if key in entry and _json_type(entry[key]) != want:
            errors.append(
                f"{at}.{key}: Invalid type. Expected: {want}, given: {_json_type(entry[key])}"
            )
    if "devices" in entry:
        errors.extend(_string_array(entry["devices"], f"{at}.devices"))
    if "selectors" in entry:
        selectors = objects(entry["selectors"])
        if selectors is None:
            errors.append(
                f"{at}.selectors: Invalid type. Expected: object,"
                f" given: {_json_type(entry['selectors'])}"
            )
        else:
            for key, value in selectors.items():
                if key not in SELECTOR_KEYS:
                    errors.append(f"{at}.selectors: Additional property {key} is not allowed")
                else:
                    errors.extend(_string_array(value, f"{at}.selectors.{key}"))
            if not any(key in selectors for key in SELECTOR_KEYS):
                errors.append(f"{at}.selectors: Must validate at least one schema (anyOf)")
    return errors


def _string_array(value: object, at: str) -> list[str]:
    if not isinstance(value, list):
        return [f"{at}: Invalid type. Expected: array, given: {_json_type(value)}"]
    errors = []
    for i, item in enumerate(value):
        if _json_type(item) != "string":
            errors.append(f"{at}.{i}: Invalid type. Expected: string, given: {_json_type(item)}")
        elif not item:
            errors.append(f"{at}.{i}: String length must be greater than or equal to 1")
    return errors


def _json_type(value: object) -> str:
    # gojsonschema's names; a number with no fractional part is an "integer" (1.0 too).
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if is_number(value):
        text = str(value)
        try:
            integral = float(text).is_integer() if not re.fullmatch(r"-?\d+", text) else True
        except OverflowError:
            integral = False
        return "integer" if integral else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _hint(key: str, wanted: Sequence[str], adapter: Adapter) -> str:
    if key in ("vendors", "deviceIDs"):
        have = adapter.vendor if key == "vendors" else adapter.device_id
        near = [w for w in wanted if (m := _PCI_ID.fullmatch(w)) and m.group(1).lower() == have]
        if near:
            return f": upstream compares exactly; write {have!r}, not {near[0]!r}"
    if key == "ifNames" and set(adapter.netdevs[1:]) & set(wanted):
        return f": upstream sees only the adapter's first netdev ({adapter.if_name!r})"
    if key == "ifNames" and not adapter.if_name:
        return ": the adapter has no netdev"
    if key == "linkTypes":
        if not adapter.if_name:
            return ": without a netdev upstream's link type is empty"
        if any(w.lower() == adapter.link_type for w in wanted):
            return f": upstream compares exactly; write {adapter.link_type!r}"
    if key == "drivers" and any(w.lower() == adapter.driver.lower() for w in wanted):
        return f": upstream compares exactly; write {adapter.driver!r}"
    return ""


def _dropped(device: Device, node_has_rdma_cm: bool) -> str | None:
    if device.class_code is not None and not device.class_code.lower().removeprefix(
        "0x"
    ).startswith("02"):
        return f"PCI class {device.class_code} is not a network controller (0x02): not discovered"
    if not device.driver:
        return "no driver bound: the plugin cannot read its driver link and skips it"
    names = [_base(p) for p in device.char_devices]
    missing = [
        need
        for need in REQUIRED_CHAR_DEVICES
        if not any(need in n for n in names) and not (need == "rdma_cm" and node_has_rdma_cm)
    ]
    if missing:
        return (
            f'RDMA device "{missing[0]}" not found (missing {", ".join(missing)}):'
            " the plugin skips the adapter"
        )
    return None


def _ghw_id(value: str | None) -> str:
    # ghw reads IDs from the modalias, lowercased, without 0x.
    return (value or "").lower().removeprefix("0x")


def _base(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _refuse(path: str, reason: str) -> StartFailure:
    return StartFailure(stage="validate", path=path, reason=reason)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _strs(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []
