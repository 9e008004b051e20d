"""Device-plugin test inputs: RDMA devices with char devices and PCI chains, configs."""

from __future__ import annotations

from collections.abc import Sequence

from proto.inventory import Device, Interface, NodeSnapshot, Port, PortStateName
from proto.messages.config import DevicePluginConfig, ResourceConfig, Selectors
from tests.support.builders import T0

RDMA_CM = "/dev/infiniband/rdma_cm"


def rdma_device(
    name: str,
    index: int,
    *,
    numa: int | None = 0,
    ports: Sequence[tuple[PortStateName, str | None]] = (("ACTIVE", "LinkUp"),),
    chain: Sequence[str] | None = None,
    uverbs: bool = True,
    netdev: str | None = None,
) -> Device:
    """mlx5_<index>-like device at 0000:<bus>:00.0, by default alone on its own switch."""
    bus = 0x19 + index * 0x10
    address = f"0000:{bus:02x}:00.0"
    path = (
        tuple(chain)
        if chain is not None
        else (
            f"pci0000:{bus - 4:02x}",
            f"0000:{bus - 4:02x}:01.0",
            f"0000:{bus - 3:02x}:00.0",
            f"0000:{bus - 2:02x}:01.0",
        )
    )
    chars = [f"/dev/infiniband/umad{index}", f"/dev/infiniband/issm{index}", RDMA_CM]
    if uverbs:
        chars.insert(0, f"/dev/infiniband/uverbs{index}")
    netdev = netdev or f"ib{index}"
    return Device(
        name=name,
        pci_address=address,
        vendor_id="0x15b3",
        device_id="0x1021",
        driver="mlx5_core",
        numa_node=numa,
        netdevs=(netdev,),
        interfaces=(Interface(name=netdev, port=1),),
        char_devices=tuple(chars),
        pci_path=path,
        ports=tuple(
            Port(port=n, state=state, phys_state=phys, link_layer="InfiniBand")
            for n, (state, phys) in enumerate(ports, start=1)
        ),
    )


def node(*devices: Device, seq: int = 1) -> NodeSnapshot:
    return NodeSnapshot(
        node="gpu-001", agent_version="0.1.0", seq=seq, collected_at=T0, devices=devices
    )


def resource(
    name: str = "hca_shared",
    *,
    devices: Sequence[str] = (),
    hca_max: int = 4,
    exclusive: bool = False,
    prefix: str = "rdma",
) -> ResourceConfig:
    return ResourceConfig(
        resource_name=name,
        resource_prefix=prefix,
        rdma_hca_max=hca_max,
        exclusive=exclusive,
        selectors=Selectors(rdma_devices=tuple(devices)),
    )


def config(*resources: ResourceConfig) -> DevicePluginConfig:
    return DevicePluginConfig(config_list=resources)
