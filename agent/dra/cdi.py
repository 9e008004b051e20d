"""Per-claim CDI specs of the DRA plugin (kind `rdma.nicfleet.io/claim`), one file a claim.

`claim_spec` is pure: one CDI device per allocated RDMA device holding its own char
devices (uverbs/umad/issm, the device plugin's choice) and, spec-wide, rdma_cm and the env
naming the claim's RDMA devices and PCI addresses. The env is spec-wide because CDI merges
the edits of every injected device and per-device values of one list variable would
overwrite each other. Host netdev names are left out: under DRA they stay in the host
namespace, so they are not the pod's. The spec file is named after the claim UID, which is
how unprepare (and a retry after a crash between spec and checkpoint) finds it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec

from agent.deviceplugin.plan import (
    ADAPTER_CHAR_PREFIXES,
    DEVICE_PERMISSIONS,
    ENV_PCI_ADDRESSES,
    ENV_RDMA_DEVICES,
    RDMA_CM_NAME,
)
from agent.dra.checkpoint import write_atomic
from proto.dranames import DRIVER
from proto.inventory import Device

# 0.5.0: the first spec version with `hostPath` on device nodes (as the device plugin).
CDI_VERSION: Final = "0.5.0"
CDI_KIND: Final = f"{DRIVER}/claim"
# Kubernetes UIDs are RFC 4122 strings; anything else is refused before it names a file.
_UID: Final = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def valid_uid(uid: str) -> bool:
    return bool(_UID.match(uid))


def spec_file_name(uid: str) -> str:
    return f"{DRIVER}-claim_{uid}.json"


def cdi_device_name(uid: str, device: str) -> str:
    return f"{uid}-{device}"


def cdi_id(uid: str, device: str) -> str:
    return f"{CDI_KIND}={cdi_device_name(uid, device)}"


def claim_spec(uid: str, devices: Sequence[tuple[str, Device]]) -> dict[str, Any]:
    """The spec of claim `uid` for (DRA device name, inventory device) pairs, in order."""
    spec_devices = [
        {
            "name": cdi_device_name(uid, name),
            "containerEdits": {"deviceNodes": [_node(c) for c in _own_char_devices(device)]},
        }
        for name, device in devices
    ]
    edits: dict[str, Any] = {
        "env": [
            f"{ENV_RDMA_DEVICES}={','.join(d.name for _, d in devices)}",
            f"{ENV_PCI_ADDRESSES}={','.join(d.pci_address for _, d in devices if d.pci_address)}",
        ]
    }
    cm = next(
        (c for _, d in devices for c in d.char_devices if _base_name(c) == RDMA_CM_NAME), None
    )
    if cm is not None:
        edits["deviceNodes"] = [_node(cm)]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": CDI_KIND,
        "devices": spec_devices,
        "containerEdits": edits,
    }


def _own_char_devices(device: Device) -> list[str]:
    return [c for c in device.char_devices if _base_name(c).startswith(ADAPTER_CHAR_PREFIXES)]


def _base_name(path: str) -> str:
    # Prepare builds a spec per claim on the event loop: a string split, not a PurePath
    # per char device (a tenth of a millisecond per 8-device claim otherwise).
    return path.rpartition("/")[2]


def _node(path: str) -> dict[str, str]:
    return {"path": path, "hostPath": path, "permissions": DEVICE_PERMISSIONS}


def write_claim_spec(directory: Path, uid: str, spec: dict[str, Any]) -> Path:
    target = directory / spec_file_name(uid)
    # msgspec, not json.dumps: `indent` sends json.dumps to its pure-Python encoder, which
    # costs prepare more than the write; same text (sorted keys, 2-space indent).
    data = msgspec.json.format(msgspec.json.encode(spec, order="sorted"), indent=2)
    write_atomic(target, data + b"\n")
    return target


def remove_claim_spec(directory: Path, file_name: str) -> None:
    (directory / file_name).unlink(missing_ok=True)
