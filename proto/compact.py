"""Compact forms of wire objects held by the thousand (the aggregator's fleet view).

`inventory_only`: a snapshot without its per-port counters (counter batches carry them;
docs/wire.md, "Snapshot counters"); strings interned and equal immutable parts (GPU/NIC
topology, GPUs, PCIe, paths) shared between nodes. No I/O; equal but for those counters.
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Final, TypeVar

from msgspec.structs import replace

from proto.inventory import Device, Interface, NodeSnapshot, Port

_H = TypeVar("_H", bound=Hashable)
# Equal values seen, by value: same-model nodes hold one copy. Cleared when full.
_SHARED: Final[dict[object, object]] = {}
MAX_SHARED: Final = 20_000

# One empty dict for every stripped counter group: stored objects are never mutated.
_EMPTY: Final[dict[str, int]] = {}
_intern = sys.intern


def shared(value: _H) -> _H:
    """The first value equal to `value` seen (a frozen Struct, tuple or str)."""
    found = _SHARED.get(value)
    if found is None:
        if len(_SHARED) >= MAX_SHARED:
            _SHARED.clear()
        _SHARED[value] = found = value
    return found  # type: ignore[return-value]


def _opt(value: str | None) -> str | None:
    return None if value is None else _intern(value)


def negative_only(values: dict[str, int]) -> dict[str, int]:
    """Only the negative values (bad data the data-quality rule reports); usually none."""
    if not values or min(values.values()) >= 0:
        return _EMPTY
    return {_intern(k): v for k, v in values.items() if v < 0}


def inventory_only(snap: NodeSnapshot) -> NodeSnapshot:
    """`snap` with every Port's counter groups reduced to their negative values and its
    rx_bytes/tx_bytes None; device, port, interface and version strings interned."""
    return replace(
        snap,
        node=_intern(snap.node),
        agent_version=_intern(snap.agent_version),
        devices=tuple(map(_device, snap.devices)),
        gpus=shared(snap.gpus),
        gpu_nic_topology=shared(snap.gpu_nic_topology),
        platform=shared(snap.platform),
        modules={_intern(k): shared(v) for k, v in snap.modules.items()},
    )


def _device(d: Device) -> Device:
    return replace(
        d,
        name=_intern(d.name),
        pci_address=_opt(d.pci_address),
        vendor_id=_opt(d.vendor_id),
        device_id=_opt(d.device_id),
        subsystem_vendor_id=_opt(d.subsystem_vendor_id),
        subsystem_device_id=_opt(d.subsystem_device_id),
        class_code=_opt(d.class_code),
        revision=_opt(d.revision),
        power_state=_opt(d.power_state),
        driver=_opt(d.driver),
        fw_ver=_opt(d.fw_ver),
        board_id=_opt(d.board_id),
        hca_type=_opt(d.hca_type),
        hw_rev=_opt(d.hw_rev),
        node_type=_opt(d.node_type),
        local_cpulist=_opt(d.local_cpulist),
        netdevs=shared(d.netdevs),
        interfaces=tuple(map(_interface, d.interfaces)),
        char_devices=shared(d.char_devices),
        pcie=shared(d.pcie),
        sriov=shared(d.sriov),
        pci_path=shared(d.pci_path),
        ports=tuple(map(_port, d.ports)),
    )


def _interface(i: Interface) -> Interface:
    return replace(i, name=_intern(i.name), operstate=_opt(i.operstate))


def _port(p: Port) -> Port:
    return replace(
        p,
        phys_state=_opt(p.phys_state),
        rate_speed=_opt(p.rate_speed),
        cap_mask=_opt(p.cap_mask),
        pkeys=shared(p.pkeys),
        counters=negative_only(p.counters),
        counters_ext=negative_only(p.counters_ext),
        hw_counters=negative_only(p.hw_counters),
        rx_bytes=None,
        tx_bytes=None,
    )
