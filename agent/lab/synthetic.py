"""Synthetic node specs of any size, for benchmarks: N multi-port ConnectX-7 cards and M
H100 GPUs behind Gen5 switches on 2 NUMA nodes. As on mlx5, a P-port card is P PCI
functions, each its own RDMA device with one port (16 dual-port cards = 32 devices);
counter files carry real mlx5 names only. Pure: returns a checked NodeSpec.
"""

from __future__ import annotations

from typing import Literal

import msgspec

from agent.lab.models import ALL_HW_COUNTERS, PMA_COUNTERS
from agent.lab.nodespec import (
    Adapter,
    Bridge,
    Gpu,
    HostBridge,
    LinkLayer,
    Module,
    NodeSpec,
    Port,
    Switch,
)
from agent.lab.spec import check_spec

MAX_ADAPTERS = 128
MAX_COUNTERS = len(PMA_COUNTERS)  # 21: every file a current mlx5 port has in counters/
MAX_HW_COUNTERS = len(ALL_HW_COUNTERS) + 1  # 30 with hw_counters/lifespan
CARDS_PER_SWITCH = 8
FIRST_BUS = 0x10
OFED, DRIVER = "24.04-0.7.0", "550.90.07"
Peermem = Literal["nvidia_peermem", "nv_peer_mem"] | None


def synthetic_spec(
    adapters: int,
    ports_per_adapter: int = 2,
    hw_counters: int = MAX_HW_COUNTERS,
    counters: int = MAX_COUNTERS,
    gpus: int = 8,
    *,
    link_layer: LinkLayer = "InfiniBand",
    peermem: Peermem = "nvidia_peermem",
) -> NodeSpec:
    """`adapters` cards of `ports_per_adapter` ports (= PCI functions = mlx5 devices) each,
    with the first `counters` PMA files and `hw_counters` hw_counters files (lifespan
    included) per port. Cards are dealt round-robin over max(gpus, cards / 8, 2) switches,
    GPU k on switch k; the first half of the switches sit on NUMA node 0."""
    _require(1 <= adapters <= MAX_ADAPTERS, f"adapters must be 1..{MAX_ADAPTERS}")
    _require(1 <= ports_per_adapter <= 8, "ports_per_adapter must be 1..8 (PCI functions)")
    _require(0 <= counters <= MAX_COUNTERS, f"counters must be 0..{MAX_COUNTERS} (real names)")
    _require(0 <= hw_counters <= MAX_HW_COUNTERS, f"hw_counters must be 0..{MAX_HW_COUNTERS}")
    _require(0 <= gpus <= 32, "gpus must be 0..32")
    n_switches = max(gpus, -(-adapters // CARDS_PER_SWITCH), 2)
    cards = [[c for c in range(adapters) if c % n_switches == s] for s in range(n_switches)]
    gpu_on = {g * n_switches // gpus: g for g in range(gpus)} if gpus else {}
    host_bridges, switches, gpu_specs, functions = [], [], [], []
    bus = FIRST_BUS
    for s in range(n_switches):
        endpoints = ([("gpu", gpu_on[s])] if s in gpu_on else []) + [("card", c) for c in cards[s]]
        if bus + 3 + len(endpoints) > 0x100:
            raise ValueError(f"{adapters} cards and {gpus} GPUs do not fit one PCI domain")
        root_port, upstream = f"0000:{bus:02x}:01.0", f"0000:{bus + 1:02x}:00.0"
        numa = int(s >= (n_switches + 1) // 2)
        hb = HostBridge(name=f"pci0000:{bus:02x}", numa_node=numa, root_ports=[root_port])
        host_bridges.append(hb)
        downstream: list[str | Bridge] = []
        for k, (kind, index) in enumerate(endpoints):
            port, device = f"0000:{bus + 2:02x}:{k:02x}.0", f"0000:{bus + 3 + k:02x}:00"
            downstream.append(port)
            if kind == "gpu":
                gpu_specs.append(Gpu(address=f"{device}.0", parent=port, model="H100 SXM5"))
            else:
                functions += [(f"{device}.{f}", port, index, f) for f in range(ports_per_adapter)]
        switches.append(Switch(parent=root_port, upstream=upstream, downstream=downstream))
        bus += 3 + len(endpoints)
    ports = _port_template(counters, hw_counters, link_layer)
    adapter_specs = [
        _adapter(n, address, parent, card, function, ports)
        for n, (address, parent, card, function) in enumerate(sorted(functions))
    ]  # the kernel probes in PCI order, so mlx5_N follows the address
    modules: dict[str, str | Module | None] = dict.fromkeys(
        ("mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs"), OFED
    )
    modules["nvidia"] = DRIVER
    if peermem is not None:
        modules[peermem] = DRIVER if peermem == "nvidia_peermem" else "1.3-0"
    spec = NodeSpec(
        name=f"synthetic-{adapters}",
        description=f"{adapters}x {ports_per_adapter}-port ConnectX-7, {gpus}x H100 (synthetic)",
        numa_nodes={0: "0-47,96-143", 1: "48-95,144-191"},
        modules=modules,
        host_bridges=host_bridges,
        switches=switches,
        gpus=gpu_specs,
        adapters=adapter_specs,
    )
    check_spec(spec, "synthetic")
    return spec


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _port_template(counters: int, hw_counters: int, link_layer: LinkLayer) -> Port:
    hw_names = [*ALL_HW_COUNTERS[: hw_counters - 1], "lifespan"] if hw_counters else []
    return Port(
        link_layer=link_layer,
        rate="4X NDR",
        counter_names=list(PMA_COUNTERS)[:counters],
        hw_counter_names=hw_names,
    )


def _adapter(n: int, address: str, parent: str, card: int, function: int, port: Port) -> Adapter:
    # GUIDs: Mellanox OUI, the "03:00" mlx5 middle, then card and function; the card's
    # function 0 GUID is the shared sys_image_guid.
    guid = f"0x58a2e10300{0x400000 | card << 4 | function:06x}"
    image = f"0x58a2e10300{0x400000 | card << 4:06x}"
    ib = port.link_layer == "InfiniBand"
    netdev = f"ib{n}" if ib else f"enp{int(address[5:7], 16)}s0f{function}np{function}"
    port = msgspec.structs.replace(port, netdev=netdev, lid=n + 1 if ib else 0, sm_lid=int(ib))
    return Adapter(
        name=f"mlx5_{n}",
        model="ConnectX-7",
        address=address,
        parent=parent,
        node_guid=guid,
        sys_image_guid=image,
        fw_ver="28.41.1000",
        board_id="MT_0000000838",
        ports=[port],
    )
