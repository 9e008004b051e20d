"""Facts the rules share, derived from the fleet view: ports, adapter models, compute
adapters and their rail index, majorities, and the expectations that apply to a node.

Pure. "Compute adapters" of a node are its physical functions (no SR-IOV VFs) with the
node's compute link layer (policy `expect.linkLayer`, else the most common one, ties to
InfiniBand); adapter i is the i-th of them by PCI address (docs/rules.md).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Iterable, Iterator, Mapping
from typing import Final, TypeVar

from aggregator.cluster import ClusterView, policies_by_node
from aggregator.fleet.state import NodeRecord
from aggregator.rules.nodememo import NodeMemo
from proto.ibta import ACTIVE_STATES
from proto.inventory import Device, NodeSnapshot, Port
from proto.policy import Expect, Policy

K = TypeVar("K", bound=Hashable)
DEFAULT_MAX_RELATION: Final = "PXB"  # NCCL's default limit for GPUDirect RDMA
RELATION_ORDER: Final[Mapping[str, int]] = {
    "X": 0, "PIX": 1, "PXB": 2, "PHB": 3, "NODE": 4, "SYS": 5,
}  # fmt: skip
# PCI device id -> adapter model (Mellanox/NVIDIA, vendor 0x15b3).
MODEL_NAMES: Final[Mapping[str, str]] = {
    "0x1017": "ConnectX-5", "0x1019": "ConnectX-5 Ex", "0x101b": "ConnectX-6",
    "0x101d": "ConnectX-6 Dx", "0x101f": "ConnectX-6 Lx", "0x1021": "ConnectX-7",
    "0x1023": "ConnectX-8", "0xa2d6": "BlueField-2", "0xa2dc": "BlueField-3",
}  # fmt: skip


def snapshots(fleet: Mapping[str, NodeRecord]) -> Iterator[tuple[str, NodeSnapshot]]:
    for name in sorted(fleet):
        snap = fleet[name].snapshot
        if snap is not None:
            yield name, snap


def ports(snap: NodeSnapshot) -> Iterator[tuple[Device, Port]]:
    for device in snap.devices:
        for port in device.ports:
            yield device, port


def subject(device: Device, port: Port) -> str:
    return f"{device.name}/{port.port}"


def is_active(port: Port) -> bool:
    return port.state in ACTIVE_STATES and port.phys_state in (None, "LinkUp")


def is_vf(device: Device) -> bool:
    return device.sriov is not None and device.sriov.physfn is not None


def model_of(device: Device) -> str | None:
    """What "the same model" means: the PCI device id, else the HCA type, else board id."""
    if device.device_id:
        return device.device_id.lower()
    return device.hca_type or device.board_id


def model_label(device: Device) -> str:
    key = model_of(device)
    if key is None:
        return "unknown model"
    name = MODEL_NAMES.get(key)
    return f"{name} ({key})" if name else key


def finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value >= 0


def majority(values: Iterable[K]) -> K | None:
    """The value held by more than half, or None when there is no strict majority."""
    counts = Counter(values)
    total = sum(counts.values())
    if not total:
        return None
    value, count = counts.most_common(1)[0]
    return value if count * 2 > total else None


def majority_of(counts: Mapping[K, int]) -> K | None:
    """`majority` of already counted values (value -> positive count)."""
    total = sum(counts.values())
    for value, count in counts.items():
        if count * 2 > total:
            return value
    return None


def expectations(
    fleet: Mapping[str, NodeRecord], policies: tuple[Policy, ...], cluster: ClusterView
) -> dict[str, Expect]:
    """node -> the `expect` of the first (by name) policy selecting it, else defaults."""
    by_node = policies_by_node(policies, fleet, cluster)
    result: dict[str, Expect] = {}
    for name in fleet:
        selecting = sorted(by_node.get(name, ()), key=lambda p: p.metadata.name)
        result[name] = selecting[0].spec.expect if selecting else Expect()
    return result


def compute_layer(snap: NodeSnapshot, expect: Expect) -> str | None:
    if expect.link_layer is not None:
        return expect.link_layer
    layers: Counter[str] = Counter()
    for device in snap.devices:
        sriov = device.sriov
        if sriov is None or sriov.physfn is None:  # not is_vf(device)
            layers.update(p.link_layer for p in device.ports if p.link_layer != "Unknown")
    if not layers:
        return None
    best = max(layers.values())
    tied = sorted(layer for layer, count in layers.items() if count == best)
    return "InfiniBand" if "InfiniBand" in tied else tied[0]


def compute_adapters(snap: NodeSnapshot, expect: Expect) -> list[Device]:
    """Physical functions on the compute link layer, in PCI address order (rails)."""
    layer = compute_layer(snap, expect)
    chosen = [
        d for d in snap.devices if not is_vf(d) and any(p.link_layer == layer for p in d.ports)
    ]
    return sorted(chosen, key=lambda d: (d.pci_address or "~", d.name))


_ADAPTERS: Final[NodeMemo[tuple[Device, ...]]] = NodeMemo()


def node_compute_adapters(node: str, snap: NodeSnapshot, expect: Expect) -> tuple[Device, ...]:
    """`compute_adapters`, computed once per snapshot object of `node` (several rules ask
    for them per node and evaluation)."""
    return _ADAPTERS.get(
        node, snap, expect.link_layer, lambda: tuple(compute_adapters(snap, expect))
    )
