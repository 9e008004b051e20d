"""Builders for wire messages in tests: small, explicit proto Structs with sane defaults."""

from __future__ import annotations

from proto.inventory import (
    Device,
    Gpu,
    Interface,
    LinkLayer,
    ModuleInfo,
    NodeSnapshot,
    Port,
    PortStateName,
)
from proto.messages.config import DevicePluginConfig, ResourceConfig, Selectors
from proto.messages.counters import CounterBatch, PortCounters
from proto.messages.events import LinkEvent
from proto.messages.status import DevicePluginStatus, ResourceStatus
from proto.policy import LabelSelector, Metadata, Policy, PolicySpec

T0 = 1_800_000_000.0  # a fixed "now" for pure tests


def port(
    number: int = 1,
    state: PortStateName = "ACTIVE",
    *,
    rate: float | None = 400.0,
    link_layer: LinkLayer = "InfiniBand",
    phys: str | None = "LinkUp",
) -> Port:
    return Port(
        port=number,
        state=state,
        state_id=4 if state == "ACTIVE" else 1,
        phys_state=phys,
        rate_gbps=rate,
        link_layer=link_layer,
    )


def device(
    name: str = "mlx5_0",
    *,
    ports: tuple[Port, ...] | None = None,
    fw: str | None = "28.39.1002",
    pci: str = "0000:3b:00.0",
    numa: int | None = 0,
    netdev: str | None = None,
) -> Device:
    return Device(
        name=name,
        pci_address=pci,
        numa_node=numa,
        driver="mlx5_core",
        fw_ver=fw,
        ports=ports if ports is not None else (port(),),
        netdevs=(netdev,) if netdev else (),
        interfaces=(Interface(name=netdev, port=1),) if netdev else (),
    )


def nic(
    name: str = "mlx5_0",
    *,
    index: int = 0,
    netdevs: tuple[str, ...] = ("ib0",),
    link_layer: LinkLayer = "InfiniBand",
    state: PortStateName = "ACTIVE",
    vendor: str | None = "0x15b3",
    device_id: str | None = "0x1021",
    driver: str | None = "mlx5_core",
    pci: str | None = None,
    numa: int | None = 0,
    char_devices: tuple[str, ...] | None = None,
    rdma_cm: bool = True,
) -> Device:
    """An RDMA adapter with one port per netdev (at least one), as the agent reports it:
    netdev types from the link layer, uverbs<index>, umad/issm per port, rdma_cm."""
    count = max(len(netdevs), 1)
    arphrd = 1 if link_layer == "Ethernet" else 32
    phys = "LinkUp" if state == "ACTIVE" else "Disabled"
    if char_devices is None:
        mads = [f"{kind}{index * 2 + p}" for kind in ("umad", "issm") for p in range(count)]
        char_devices = tuple(f"/dev/infiniband/{n}" for n in (*mads, f"uverbs{index}"))
    if rdma_cm:
        char_devices = (*char_devices, "/dev/infiniband/rdma_cm")
    return Device(
        name=name,
        pci_address=pci if pci is not None else f"0000:{0x19 + index:02x}:00.0",
        vendor_id=vendor,
        device_id=device_id,
        driver=driver,
        numa_node=numa,
        netdevs=netdevs,
        interfaces=tuple(Interface(name=n, port=i + 1, type=arphrd) for i, n in enumerate(netdevs)),
        char_devices=char_devices,
        ports=tuple(port(i + 1, state, link_layer=link_layer, phys=phys) for i in range(count)),
    )


def snapshot(
    node: str = "gpu-001",
    *,
    seq: int = 1,
    collected_at: float = T0,
    devices: tuple[Device, ...] | None = None,
    gpus: int = 8,
    agent_version: str = "0.1.0",
) -> NodeSnapshot:
    return NodeSnapshot(
        node=node,
        agent_version=agent_version,
        seq=seq,
        collected_at=collected_at,
        devices=devices if devices is not None else (device(),),
        gpus=tuple(
            Gpu(pci_address=f"0000:{0x18 + i:02x}:00.0", numa_node=i // 4) for i in range(gpus)
        ),
    )


def counters(
    node: str = "gpu-001", *, seq: int = 1, collected_at: float = T0, rx: int = 0
) -> CounterBatch:
    return CounterBatch(
        node=node,
        seq=seq,
        collected_at=collected_at,
        ports=(PortCounters(device="mlx5_0", port=1, counters={"port_rcv_data": rx}),),
    )


def port_event(
    node: str = "gpu-001",
    *,
    device: str = "mlx5_0",
    port: int = 1,
    new: PortStateName = "DOWN",
    old: PortStateName = "ACTIVE",
    phys: str | None = "Disabled",
    observed_at: float = T0 + 1,
    seq: int = 1,
) -> LinkEvent:
    return LinkEvent(
        node=node,
        seq=seq,
        kind="port-state",
        device=device,
        port=port,
        old_state=old,
        new_state=new,
        phys_state=phys,
        observed_at=observed_at,
    )


RDMA_MODULES = ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "ib_umad", "rdma_ucm")


def modules(*names: str) -> dict[str, ModuleInfo]:
    """`snapshot.modules` with `names` loaded (default: the whole mlx5 RDMA stack)."""
    return {name: ModuleInfo() for name in (names or RDMA_MODULES)}


def resource_status(
    name: str = "rdma/ib",
    *,
    devices: tuple[str, ...] = ("mlx5_0",),
    advertised: int | None = None,
    healthy: int | None = None,
    registration: str = "registered",
    unmatched: dict[str, str] | None = None,
    unhealthy: dict[str, str] | None = None,
    error: str | None = None,
) -> ResourceStatus:
    """A served resource: by default one device ID per selected adapter, all healthy."""
    count = len(devices) if advertised is None else advertised
    return ResourceStatus(
        name=name,
        advertised=count,
        healthy=count if healthy is None else healthy,
        devices=devices,
        unmatched=unmatched or {},
        unhealthy=unhealthy or {},
        registration=registration,
        registration_mode="legacy",
        registration_error=error,
        endpoint=f"/var/lib/kubelet/device-plugins/nicfleet-{name.split('/')[-1]}.sock",
    )


def plugin_status(
    node: str = "gpu-001",
    *resources: ResourceStatus,
    generation: int = 1,
    observed_at: float = T0,
) -> DevicePluginStatus:
    return DevicePluginStatus(
        node=node,
        config_generation=generation,
        registered=all(r.registration == "registered" for r in resources),
        resources=resources,
        observed_at=observed_at,
    )


def rdma_policy(
    name: str = "ib",
    *resources: str,
    labels: dict[str, str] | None = None,
    hca_max: int = 64,
    selectors: Selectors | None = None,
) -> Policy:
    """A policy configuring `resources` (`prefix/name`, default rdma/ib) on matching nodes."""
    configs = tuple(
        ResourceConfig(
            resource_prefix=full.split("/")[0],
            resource_name=full.split("/")[1],
            rdma_hca_max=hca_max,
            selectors=selectors or Selectors(vendors=("15b3",)),
        )
        for full in (resources or ("rdma/ib",))
    )
    return Policy(
        api_version="nicfleet.io/v1alpha1",
        kind="NicFleetPolicy",
        metadata=Metadata(name=name),
        spec=PolicySpec(
            node_selector=LabelSelector(match_labels=labels or {}),
            rdma_shared_device_plugin=DevicePluginConfig(config_list=configs),
        ),
    )
