"""Hand-built views for the pod claim (DRA) chain tests: two IB nodes with agents running
the DRA plugin, their ResourceSlices as the publisher builds them (proto.draslices), a
GPU slice, and a pod `ml/w-0` whose claim `w-0-nic` got mlx5-0 on gpu-ib-01."""

from __future__ import annotations

from typing import Any

import msgspec

from aggregator.cluster import (
    ClusterView,
    DraClaim,
    DraDevice,
    DraDeviceClass,
    DraResult,
    PodClaim,
    PodRequest,
)
from aggregator.dra.objects import parse_slice
from aggregator.fleet.state import NodeRecord
from proto.dranames import DRIVER
from proto.draslices import SliceSettings, build_slices
from proto.inventory import Device, LinkLayer, NodeSnapshot, PortStateName
from proto.messages.status import DevicePluginStatus, DraClaimState, DraPluginStatus
from tests.support.builders import T0, nic, snapshot

GPU_DRIVER = "gpu.nvidia.com"
IB_CLASS = f"ib.{DRIVER}"
ROOT = "pci0000:17"
NIC_SPEC: dict[str, Any] = {
    "devices": {"requests": [{"name": "nic", "exactly": {"deviceClassName": IB_CLASS}}]}
}
GPU_NIC_SPEC: dict[str, Any] = {
    "devices": {
        "requests": [
            {"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER}},
            {"name": "nic", "exactly": {"deviceClassName": IB_CLASS}},
        ],
        "constraints": [{"matchAttribute": "resource.kubernetes.io/pcieRoot"}],
    }
}
GPU_SPEC: dict[str, Any] = {
    "devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU_DRIVER}}]}
}
GPU_CLASS = DraDeviceClass(name=GPU_DRIVER, selectors=(f'device.driver == "{GPU_DRIVER}"',))


def adapter(
    name: str, index: int, state: PortStateName = "ACTIVE", link: LinkLayer = "InfiniBand"
) -> Device:
    netdev = f"ib{index}" if link == "InfiniBand" else f"eth{index}"
    found = nic(name, index=index, netdevs=(netdev,), state=state, link_layer=link)
    return msgspec.structs.replace(found, fw_ver="28.39.1002", pci_path=(ROOT, "0000:16:00.0"))


def node_snapshot(node: str, *adapters: Device) -> NodeSnapshot:
    return snapshot(node, devices=adapters)


def record(snap: NodeSnapshot, dra: DraPluginStatus | None, *, last_seen: float = T0) -> NodeRecord:
    status = DevicePluginStatus(node=snap.node, observed_at=T0, dra=dra)
    return NodeRecord(
        name=snap.node, snapshot=snap, first_seen=T0, last_seen=last_seen, device_plugin=status
    )


def published(snap: NodeSnapshot) -> tuple[DraDevice, ...]:
    """The node's devices as the cluster view holds them: the publisher's slices, parsed."""
    return tuple(
        DraDevice(
            driver=d.driver, pool=d.pool, node=d.node, name=d.name, slice=doc["metadata"]["name"],
            attributes=dict(d.attributes), capacity=dict(d.capacity),
        )
        for doc in build_slices(snap, {}, SliceSettings())
        for d in parse_slice(doc)
    )  # fmt: skip


def gpu(node: str, name: str = "gpu-0", root: str = ROOT) -> DraDevice:
    return DraDevice(
        driver=GPU_DRIVER, pool=node, node=node, name=name, slice=f"{node}-gpu",
        attributes={"resource.kubernetes.io/pcieRoot": root},
    )  # fmt: skip


def prepared(uid: str = "u-1", *devices: str) -> DraPluginStatus:
    return DraPluginStatus(
        state="registered",
        endpoint="/var/lib/kubelet/plugins/rdma.nicfleet.io/dra.sock",
        prepared=(
            DraClaimState(
                uid=uid, namespace="ml", name="w-0-nic", devices=devices or ("mlx5-0",),
                cdi_ids=("rdma.nicfleet.io/claim=u-1",), at=T0 - 60,
            ),
        ),
    )  # fmt: skip


def nodes() -> dict[str, NodeSnapshot]:
    return {
        "gpu-ib-01": node_snapshot("gpu-ib-01", adapter("mlx5_0", 0), adapter("mlx5_1", 1)),
        "gpu-ib-02": node_snapshot("gpu-ib-02", adapter("mlx5_0", 0)),
    }


def fleet(
    dra: DraPluginStatus | None = None, snaps: dict[str, NodeSnapshot] | None = None
) -> dict[str, NodeRecord]:
    """Every node's agent runs the DRA plugin (`dra`, by default having prepared u-1)."""
    plugin = dra if dra is not None else prepared()
    return {name: record(snap, plugin) for name, snap in (snaps or nodes()).items()}


def result(device: str = "mlx5-0", pool: str = "gpu-ib-01", request: str = "nic") -> DraResult:
    return DraResult(request=request, driver=DRIVER, pool=pool, device=device)


def claim(**changes: Any) -> DraClaim:
    base = DraClaim(
        namespace="ml", name="w-0-nic", uid="u-1", spec=NIC_SPEC, allocated=True,
        results=(result(),), node="gpu-ib-01", reserved_for=("ml/w-0",),
    )  # fmt: skip
    return msgspec.structs.replace(base, **changes)


def pod(**changes: Any) -> PodRequest:
    base = PodRequest(
        namespace="ml", name="w-0", node="gpu-ib-01", phase="Running",
        claims=(PodClaim(name="nic", claim="w-0-nic", template="nic"),),
    )  # fmt: skip
    return msgspec.structs.replace(base, **changes)


def cluster(
    *claims: DraClaim,
    snaps: dict[str, NodeSnapshot] | None = None,
    pods: tuple[PodRequest, ...] = (),
) -> ClusterView:
    found = snaps if snaps is not None else nodes()
    return ClusterView(
        present=True,
        pods=pods or (pod(),),
        dra_present=True,
        claims=claims or (claim(),),
        dra_devices=tuple(d for s in found.values() for d in published(s)),
        device_classes=(GPU_CLASS,),
    )
