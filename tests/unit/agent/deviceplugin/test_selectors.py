"""Selector semantics: every selector, OR within, AND across, resources independent, the
deprecated devices list, char-device exclusion, ports, and a rendered lab node."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agent.deviceplugin.selectors import Selection, select_devices, selected_ports
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.dpconfig import parse_device_plugin_config
from proto.inventory import Device, Interface, NodeSnapshot
from proto.messages.config import ResourceConfig, Selectors
from tests.support.builders import T0, nic, port

RDMA_CM = "/dev/infiniband/rdma_cm"


def node(*devices: Device) -> NodeSnapshot:
    return NodeSnapshot(node="gpu-001", agent_version="t", seq=1, collected_at=T0, devices=devices)


# Two ConnectX-7 on IB (one per socket), a ConnectX-6 Dx on Ethernet, an Intel E810 (irdma).
NODE = node(
    nic("mlx5_0", index=0, netdevs=("ib0",), numa=0),
    nic(
        "mlx5_1",
        index=1,
        netdevs=("enp26s0f0np0",),
        link_layer="Ethernet",
        device_id="0x101d",
        numa=0,
        state="DOWN",
    ),
    nic("mlx5_2", index=2, netdevs=("ib1",), numa=1),
    nic(
        "irdma0",
        index=3,
        netdevs=("ens1f0",),
        link_layer="Ethernet",
        vendor="0x8086",
        device_id="0x1592",
        driver="ice",
        numa=1,
    ),
)


def resource(name: str = "r", **selectors: Any) -> ResourceConfig:
    return ResourceConfig(resource_name=name, rdma_hca_max=8, selectors=Selectors(**selectors))


def names(selection: Selection) -> list[str]:
    return [device.name for device in selection.selected]


@pytest.mark.parametrize(
    ("selectors", "expected"),
    [
        pytest.param({"vendors": ("15b3",)}, ["mlx5_0", "mlx5_1", "mlx5_2"], id="vendors"),
        pytest.param({"vendors": ("0x8086",)}, ["irdma0"], id="vendors-0x"),
        pytest.param(
            {"vendors": ("15B3", "8086")}, [d.name for d in NODE.devices], id="vendors-or"
        ),
        pytest.param({"device_ids": ("1021",)}, ["mlx5_0", "mlx5_2"], id="deviceIDs"),
        pytest.param({"device_ids": ("101D", "1592")}, ["mlx5_1", "irdma0"], id="deviceIDs-or"),
        pytest.param({"drivers": ("ice",)}, ["irdma0"], id="drivers"),
        pytest.param({"if_names": ("ib1", "ens1f0")}, ["mlx5_2", "irdma0"], id="ifNames"),
        pytest.param({"link_types": ("ether",)}, ["mlx5_1", "irdma0"], id="linkTypes-ether"),
        pytest.param({"link_types": ("infiniband",)}, ["mlx5_0", "mlx5_2"], id="linkTypes-ib"),
        pytest.param(
            {"pci_addresses": ("0000:19:00.0", "0000:1B:00.0")},
            ["mlx5_0", "mlx5_2"],
            id="pciAddresses",
        ),
        pytest.param(
            {"rdma_devices": ("mlx5_2", "irdma0")}, ["mlx5_2", "irdma0"], id="rdmaDevices"
        ),
        pytest.param({"numa_nodes": (1,)}, ["mlx5_2", "irdma0"], id="numaNodes"),
        pytest.param({"link_layers": ("Ethernet",)}, ["mlx5_1", "irdma0"], id="linkLayers"),
        pytest.param(
            {"link_layers": ("infiniband",)}, ["mlx5_0", "mlx5_2"], id="linkLayers-any-case"
        ),
        pytest.param({"vendors": ("15b3",), "link_types": ("ether",)}, ["mlx5_1"], id="and"),
        pytest.param({"device_ids": ("1021",), "numa_nodes": (1,)}, ["mlx5_2"], id="and-numa"),
        pytest.param(
            {"vendors": ("15b3", "8086"), "numa_nodes": (0,), "link_layers": ("Ethernet",)},
            ["mlx5_1"],
            id="and-of-ors",
        ),
        pytest.param({"vendors": ("8086",), "link_layers": ("InfiniBand",)}, [], id="and-empty"),
        pytest.param(
            {"vendors": ("15b3",), "device_ids": (), "if_names": ()},
            ["mlx5_0", "mlx5_1", "mlx5_2"],
            id="empty-lists-no-constraint",
        ),
        pytest.param({}, [d.name for d in NODE.devices], id="no-selectors-no-constraint"),
        pytest.param({"rdma_devices": ("mlx5_9",)}, [], id="nothing-matches"),
    ],
)
def test_selectors(selectors: dict[str, Any], expected: list[str]) -> None:
    assert names(select_devices(NODE, resource(**selectors))) == expected


@pytest.mark.parametrize(
    ("selectors", "device", "reason"),
    [
        pytest.param(
            {"vendors": ("15b3",)}, "irdma0", "vendors: vendor 8086 not in [15b3]", id="vendor"
        ),
        pytest.param(
            {"device_ids": ("1021",)},
            "mlx5_1",
            "deviceIDs: device ID 101d not in [1021]",
            id="device-id",
        ),
        pytest.param(
            {"drivers": ("mlx5_core",)},
            "irdma0",
            "drivers: driver ice not in [mlx5_core]",
            id="driver",
        ),
        pytest.param(
            {"if_names": ("ib0",)}, "mlx5_2", "ifNames: netdevs [ib1] not in [ib0]", id="ifname"
        ),
        pytest.param(
            {"link_types": ("infiniband",)},
            "mlx5_1",
            "linkTypes: link types [ether] not in [infiniband]",
            id="link-type",
        ),
        pytest.param(
            {"numa_nodes": (0,)}, "mlx5_2", "numaNodes: NUMA node 1 not in [0]", id="numa"
        ),
        pytest.param(
            {"link_layers": ("Ethernet",)},
            "mlx5_0",
            "linkLayers: link layers [InfiniBand] not in [Ethernet]",
            id="link-layer",
        ),
        pytest.param(
            {"pci_addresses": ("0000:19:00.0",)},
            "mlx5_2",
            "pciAddresses: PCI address 0000:1b:00.0 not in [0000:19:00.0]",
            id="pci",
        ),
    ],
)
def test_unmatched_reason_names_the_selector(
    selectors: dict[str, Any], device: str, reason: str
) -> None:
    selection = select_devices(NODE, resource(**selectors))
    assert {u.device: u.reason for u in selection.unmatched}[device] == reason
    assert selection.excluded == ()


def test_unknown_values_never_match() -> None:
    bare = Device(name="rxe0", numa_node=None, char_devices=())
    selection = select_devices(node(bare), resource(numa_nodes=(0,)))
    assert [(u.device, u.reason) for u in selection.unmatched] == [
        ("rxe0", "numaNodes: NUMA node unknown not in [0]")
    ]
    selection = select_devices(node(bare), resource(vendors=("15b3",)))
    assert selection.unmatched[0].reason == "vendors: vendor unknown not in [15b3]"


def test_resources_are_independent_and_may_overlap() -> None:
    everything = resource("all", vendors=("15b3",))
    ib = resource("ib", link_layers=("InfiniBand",))
    socket1 = resource("socket1", numa_nodes=(1,))
    assert names(select_devices(NODE, everything)) == ["mlx5_0", "mlx5_1", "mlx5_2"]
    assert names(select_devices(NODE, ib)) == ["mlx5_0", "mlx5_2"]
    assert names(select_devices(NODE, socket1)) == ["mlx5_2", "irdma0"]
    # Selecting for one resource changes nothing for another.
    assert names(select_devices(NODE, everything)) == ["mlx5_0", "mlx5_1", "mlx5_2"]


def test_deprecated_devices_list_is_ifnames() -> None:
    legacy = ResourceConfig(resource_name="legacy", rdma_hca_max=8, devices=("ib0", "ens1f0"))
    selection = select_devices(NODE, legacy)
    assert names(selection) == ["mlx5_0", "irdma0"]
    assert selection.unmatched[0].reason == "devices: netdevs [enp26s0f0np0] not in [ens1f0, ib0]"
    # Upstream ignores devices when selectors select something; so do we.
    both = ResourceConfig(
        resource_name="both", devices=("ib0",), selectors=Selectors(rdma_devices=("mlx5_2",))
    )
    assert names(select_devices(NODE, both)) == ["mlx5_2"]


def test_selected_device_fields_and_resource_name() -> None:
    config = ResourceConfig(
        resource_name="ib", resource_prefix="example.com", selectors=Selectors(if_names=("ib1",))
    )
    selection = select_devices(NODE, config)
    assert selection.resource == "example.com/ib"
    (chosen,) = selection.selected
    assert (chosen.name, chosen.pci_address, chosen.numa_node, chosen.netdevs, chosen.ports) == (
        "mlx5_2",
        "0000:1b:00.0",
        1,
        ("ib1",),
        (1,),
    )
    assert chosen.char_devices == (
        "/dev/infiniband/umad4",
        "/dev/infiniband/issm4",
        "/dev/infiniband/uverbs2",
        RDMA_CM,
    )


# --- char devices -------------------------------------------------------------------------


def test_rdma_cm_once_per_resource() -> None:
    selection = select_devices(NODE, resource(vendors=("15b3",)))
    paths = selection.char_devices
    assert paths[0] == RDMA_CM
    assert paths.count(RDMA_CM) == 1
    assert {p for p in paths if "uverbs" in p} == {
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
        "/dev/infiniband/uverbs2",
    }
    assert selection.numa_nodes == (0, 1)


def test_without_rdma_cm_adapters_are_still_served() -> None:
    snapshot = node(nic("mlx5_0", rdma_cm=False))
    selection = select_devices(snapshot, resource())
    assert names(selection) == ["mlx5_0"]
    assert selection.rdma_cm is None
    assert RDMA_CM not in selection.char_devices


def test_nothing_selected_hands_out_nothing() -> None:
    assert select_devices(NODE, resource(rdma_devices=("mlx5_9",))).char_devices == ()


@pytest.mark.parametrize(
    ("char_devices", "dev_nodes", "reason"),
    [
        pytest.param(
            ("/dev/infiniband/umad3", "/dev/infiniband/issm3", RDMA_CM),
            None,
            "no uverbs char device (is ib_uverbs loaded?)",
            id="no-uverbs",
        ),
        pytest.param(
            ("/dev/infiniband/uverbs3", RDMA_CM),
            None,
            "no umad char device (is ib_umad loaded?)",
            id="no-umad",
        ),
        pytest.param(
            ("/dev/infiniband/uverbs3", "/dev/infiniband/umad3", RDMA_CM),
            {"/dev/infiniband/umad3", RDMA_CM},
            "missing /dev/infiniband/uverbs3",
            id="node-missing-in-dev",
        ),
    ],
)
def test_adapter_without_its_char_devices_is_excluded(
    char_devices: tuple[str, ...], dev_nodes: set[str] | None, reason: str
) -> None:
    healthy = nic("mlx5_0")
    broken = nic("mlx5_3", index=3, netdevs=("ib3",), char_devices=char_devices, rdma_cm=False)
    present = None if dev_nodes is None else dev_nodes | set(healthy.char_devices)
    selection = select_devices(node(healthy, broken), resource(), dev_nodes=present)
    assert [(e.device, e.reason) for e in selection.excluded] == [("mlx5_3", reason)]
    assert names(selection) == ["mlx5_0"]


def test_dev_nodes_present_select_and_rdma_cm_checked() -> None:
    snapshot = node(nic("mlx5_0"))
    own = {p for p in snapshot.devices[0].char_devices if p != RDMA_CM}
    selection = select_devices(snapshot, resource(), dev_nodes=own)
    assert names(selection) == ["mlx5_0"]
    assert selection.rdma_cm is None  # sysfs says rdma_cm exists, /dev does not have it
    assert RDMA_CM not in selection.selected[0].char_devices
    selection = select_devices(snapshot, resource(), dev_nodes=own | {RDMA_CM})
    assert selection.rdma_cm == RDMA_CM


def test_issm_is_optional() -> None:
    chars = ("/dev/infiniband/uverbs0", "/dev/infiniband/umad0")
    selection = select_devices(node(nic("mlx5_0", char_devices=chars)), resource())
    assert selection.selected[0].char_devices == (*chars, RDMA_CM)


# --- ports ---------------------------------------------------------------------------------

# A dual-port VPI adapter: port 1 InfiniBand (ib0), port 2 Ethernet (eth1).
VPI = Device(
    name="mlx4_0",
    vendor_id="0x15b3",
    device_id="0x1003",
    driver="mlx4_core",
    pci_address="0000:05:00.0",
    numa_node=0,
    netdevs=("ib0", "eth1"),
    interfaces=(Interface(name="ib0", port=1, type=32), Interface(name="eth1", port=2, type=1)),
    char_devices=(
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/umad0",
        "/dev/infiniband/umad1",
        RDMA_CM,
    ),
    ports=(port(1), port(2, "DOWN", link_layer="Ethernet", phys="Disabled")),
)


@pytest.mark.parametrize(
    ("selectors", "ports"),
    [
        pytest.param({}, (1, 2), id="all-ports"),
        pytest.param({"if_names": ("eth1",)}, (2,), id="ifname-port"),
        pytest.param({"link_layers": ("InfiniBand",)}, (1,), id="link-layer-port"),
        pytest.param({"link_types": ("ether",)}, (2,), id="link-type-port"),
        pytest.param({"vendors": ("15b3",), "if_names": ("ib0", "eth1")}, (1, 2), id="both"),
    ],
)
def test_ports_a_resource_uses(selectors: dict[str, Any], ports: tuple[int]) -> None:
    snapshot = node(VPI)
    selection = select_devices(snapshot, resource(**selectors))
    assert selection.selected[0].ports == ports
    assert [(d.name, p.port) for d, p in selected_ports(selection, snapshot)] == [
        ("mlx4_0", n) for n in ports
    ]


def test_port_selectors_must_hold_on_one_port() -> None:
    selection = select_devices(node(VPI), resource(if_names=("eth1",), link_layers=("InfiniBand",)))
    assert selection.selected == ()
    assert "no single port" in selection.unmatched[0].reason


def test_link_type_without_netdev_falls_back_to_link_layer() -> None:
    no_ipoib = nic("mlx5_0", netdevs=())
    assert no_ipoib.netdevs == () and no_ipoib.ports[0].link_layer == "InfiniBand"
    assert names(select_devices(node(no_ipoib), resource(link_types=("infiniband",)))) == ["mlx5_0"]
    selection = select_devices(node(no_ipoib), resource(if_names=("ib0",)))
    assert selection.unmatched[0].reason == "ifNames: netdevs none not in [ib0]"


def test_netdev_of_unknown_port_is_on_every_port() -> None:
    device = Device(
        name="mlx5_0",
        netdevs=("ib0",),  # no interface record, so no port number
        char_devices=("/dev/infiniband/uverbs0", "/dev/infiniband/umad0"),
        ports=(port(1), port(2)),
    )
    selection = select_devices(node(device), resource(if_names=("ib0",)))
    assert selection.selected[0].ports == (1, 2)


def test_selected_ports_against_a_newer_snapshot() -> None:
    selection = select_devices(NODE, resource(device_ids=("1021",)))
    later = node(*[d for d in NODE.devices if d.name != "mlx5_2"])
    assert [d.name for d, _ in selected_ports(selection, later)] == ["mlx5_0"]


def test_device_without_ports_is_selected_with_none() -> None:
    device = Device(
        name="mlx5_0", char_devices=("/dev/infiniband/uverbs0", "/dev/infiniband/umad0")
    )
    selection = select_devices(node(device), resource(rdma_devices=("mlx5_0",)))
    assert selection.selected[0].ports == ()
    assert selected_ports(selection, node(device)) == ()


# --- a rendered lab node --------------------------------------------------------------------

LAB_CONFIG = """
periodicUpdateInterval: 300
configList:
  - resourceName: compute_ib
    rdmaHcaMax: 64
    selectors: {vendors: ["15b3"], deviceIDs: ["1021"], linkTypes: [infiniband]}
  - resourceName: storage_roce
    rdmaHcaMax: 16
    selectors: {linkLayers: [Ethernet]}
  - resourceName: socket1_ib
    rdmaHcaMax: 8
    selectors: {numaNodes: [1], linkLayers: [InfiniBand]}
  - resourceName: legacy
    rdmaHcaMax: 8
    devices: [ib0, ib7]
"""


def test_lab_node_h100_ib_12nic(tmp_path: Path) -> None:
    render(load_builtin("h100-ib-12nic"), tmp_path)
    snapshot = collect_snapshot(Sysfs(tmp_path), node="n", seq=1, now=0.0, agent_version="t")
    config = parse_device_plugin_config(LAB_CONFIG, source="lab")
    compute, storage, socket1, legacy = (select_devices(snapshot, r) for r in config.config_list)
    cx7 = ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    assert names(compute) == cx7
    assert {u.device for u in compute.unmatched} == {"mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"}
    assert names(storage) == ["mlx5_1", "mlx5_2", "mlx5_7", "mlx5_8"]
    assert names(socket1) == ["mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"]
    assert socket1.numa_nodes == (1,)
    assert names(legacy) == ["mlx5_0", "mlx5_11"]
    # Every selected adapter brings its uverbs and umad; the lab renders no rdma_cm.
    for selection in (compute, storage, socket1, legacy):
        assert selection.excluded == ()
        for chosen in selection.selected:
            kinds = {Path(p).name.rstrip("0123456789") for p in chosen.char_devices}
            assert {"uverbs", "umad"} <= kinds
    # The down Ethernet ports are what a health check would look at for storage_roce.
    states = {(d.name, p.state) for d, p in selected_ports(storage, snapshot)}
    assert ("mlx5_1", "DOWN") in states and ("mlx5_7", "ACTIVE") in states
