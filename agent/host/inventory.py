"""Assembles a node snapshot from a `Sysfs` tree: RDMA devices, GPUs, GPU<->NIC
topology, kernel modules and platform facts.

Every read is delegated (agent.host.devices, agent.host.pci, agent.host.platform) and
`now` comes from the caller. The collection runs under Sysfs.run_bounded: a read that blocks in the
kernel costs one ETIMEDOUT error in the snapshot, never the snapshot itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from agent.counters import reader as counters
from agent.counters.reader import CounterReader
from agent.errors import CollectionTimeout, ReadErrorLog
from agent.host import devices, pci, platform, rdmakinds, topology
from agent.host.portstates import PortStateReader, collect_port_states
from agent.host.procfs import Procfs
from agent.host.sysfs import Sysfs
from proto.inventory import (
    DataDirectFunction,
    Device,
    Gpu,
    GpuNicRelation,
    ModuleInfo,
    NodeSnapshot,
    Platform,
    ReadError,
    Relation,
)

__all__ = [
    "CounterReader",
    "PortStateReader",
    "collect_port_states",
    "collect_snapshot",
    "gpu_nic_topology",
]

# A healthy 16-adapter node takes tens of milliseconds; an mlx5 hw_counters read can
# wait seconds for a firmware command before the driver gives up.
SNAPSHOT_TIMEOUT: Final = 5.0
_RELATIONS: Final[dict[topology.Relation, Relation]] = {
    topology.Relation.X: "X",
    topology.Relation.PIX: "PIX",
    topology.Relation.PXB: "PXB",
    topology.Relation.PHB: "PHB",
    topology.Relation.NODE: "NODE",
    topology.Relation.SYS: "SYS",
}


@dataclass(frozen=True, slots=True)
class _Collected:
    devices: tuple[Device, ...]
    gpus: tuple[Gpu, ...]
    gpu_nic_topology: tuple[GpuNicRelation, ...]
    modules: dict[str, ModuleInfo]
    platform: Platform
    errors: tuple[ReadError, ...]
    nic_functions: tuple[str, ...] | None
    data_direct: tuple[DataDirectFunction, ...]


def collect_snapshot(
    sysfs: Sysfs,
    *,
    node: str,
    seq: int,
    now: float,
    agent_version: str,
    timeout: float | None = SNAPSHOT_TIMEOUT,
    procfs: Procfs | None = None,
) -> NodeSnapshot:
    """The full inventory of the tree. Per-device read errors are in each
    `Device.errors`, the others in the snapshot's `errors`; nothing raises for bad data.
    `procfs`: where the kernel command line and release are read (None: not read).
    """
    try:
        found = sysfs.run_bounded(lambda: _collect(sysfs, procfs), timeout=timeout)
    except CollectionTimeout as exc:
        return NodeSnapshot(
            node=node,
            agent_version=agent_version,
            seq=seq,
            collected_at=now,
            errors=(exc.to_read_error(),),
        )
    return NodeSnapshot(
        node=node,
        agent_version=agent_version,
        seq=seq,
        collected_at=now,
        devices=found.devices,
        gpus=found.gpus,
        gpu_nic_topology=found.gpu_nic_topology,
        modules=found.modules,
        platform=found.platform,
        errors=found.errors,
        nic_functions=found.nic_functions,
        data_direct=found.data_direct,
    )


def _collect(sysfs: Sysfs, procfs: Procfs | None) -> _Collected:
    errors = ReadErrorLog()
    chars = devices.char_devices(sysfs, errors)
    data_direct = rdmakinds.find_data_direct(sysfs, errors)
    rdma = [
        devices.read_device(sysfs, name, chars, read_vpd=bool(data_direct))
        for name in counters.device_names(sysfs, errors)
    ]
    gpus = pci.find_gpus(sysfs, errors)
    nic_functions = pci.find_nic_functions(sysfs, errors)
    nics = [(r.device.name, r.function) for r in rdma if r.function is not None]
    modules = platform.read_modules(sysfs, errors)
    facts = platform.read_platform(sysfs, modules, gpus, [fn for _, fn in nics], errors, procfs)
    return _Collected(
        devices=tuple(r.device for r in rdma),
        gpus=tuple(_gpu(fn) for fn in gpus),
        gpu_nic_topology=gpu_nic_topology(gpus, nics),
        modules=modules,
        platform=facts,
        errors=errors.to_tuple(),
        nic_functions=nic_functions,
        data_direct=data_direct,
    )


def _gpu(fn: pci.PciFunction) -> Gpu:
    return Gpu(
        pci_address=fn.address,
        numa_node=fn.numa_node,
        device_id=fn.device_id,
        vendor_id=fn.vendor_id,
        class_code=fn.class_code,
        driver=fn.driver,
        pcie=fn.pcie,
        pci_path=fn.chain,
    )


def gpu_nic_topology(
    gpus: Sequence[pci.PciFunction], nics: Sequence[tuple[str, pci.PciFunction]]
) -> tuple[GpuNicRelation, ...]:
    """The `nvidia-smi topo -m` cell of every GPU (address order) and RDMA device
    (natural name order) pair, from their PCI chains and NUMA nodes."""
    return tuple(
        GpuNicRelation(
            gpu=gpu.address,
            nic=name,
            relation=_RELATIONS[
                topology.classify_relation(gpu.path, nic.path, gpu.numa_node, nic.numa_node)
            ],
        )
        for gpu in gpus
        for name, nic in nics
    )
