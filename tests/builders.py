"""Builders for wire messages in tests: small, explicit proto Structs with sane defaults."""

from __future__ import annotations

from proto.inventory import (
    Adapter,
    Gpu,
    LinkLayer,
    Netdev,
    NodeSnapshot,
    PciFunction,
    Port,
    PortStateName,
)
from proto.messages import CounterBatch, LinkEvent, PortCounters

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
        number=number,
        state_name=state,
        state=4 if state == "ACTIVE" else 1,
        phys_state_name=phys,
        rate_gbps=rate,
        link_layer=link_layer,
    )


def adapter(
    name: str = "mlx5_0",
    *,
    ports: tuple[Port, ...] | None = None,
    fw: str | None = "28.39.1002",
    pci: str = "0000:3b:00.0",
    numa: int | None = 0,
    netdev: str | None = None,
) -> Adapter:
    netdevs = (Netdev(name=netdev, port=1),) if netdev else ()
    return Adapter(
        name=name,
        pci=PciFunction(address=pci, numa_node=numa, driver="mlx5_core"),
        fw_ver=fw,
        ports=ports if ports is not None else (port(),),
        netdevs=netdevs,
    )


def snapshot(
    node: str = "gpu-001",
    *,
    seq: int = 1,
    collected_at: float = T0,
    adapters: tuple[Adapter, ...] | None = None,
    gpus: int = 8,
    agent_version: str = "0.1.0",
) -> NodeSnapshot:
    return NodeSnapshot(
        node=node,
        agent_version=agent_version,
        seq=seq,
        collected_at=collected_at,
        adapters=adapters if adapters is not None else (adapter(),),
        gpus=tuple(
            Gpu(pci=PciFunction(address=f"0000:{0x18 + i:02x}:00.0", numa_node=i // 4))
            for i in range(gpus)
        ),
    )


def counters(
    node: str = "gpu-001", *, seq: int = 1, collected_at: float = T0, rx: int = 0
) -> CounterBatch:
    values = {"port_rcv_data": rx}
    return CounterBatch(
        node=node,
        seq=seq,
        collected_at=collected_at,
        ports=(PortCounters(adapter="mlx5_0", port=1, values=values),),
    )


def port_event(
    node: str = "gpu-001",
    *,
    adapter: str = "mlx5_0",
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
        adapter=adapter,
        port=port,
        old_state=old,
        new_state=new,
        phys_state=phys,
        observed_at=observed_at,
    )
