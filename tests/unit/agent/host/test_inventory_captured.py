"""Snapshots of real captured sysfs trees against the reference tools' answers.

procfs-sys is compared with every value procfs' parser gives (procfs-expected.json),
node_exporter-sys with every infiniband and pcidevice sample node_exporter produces
(*.prom, numerically; data counters there are bytes = raw x 4). The captures lack an
mlx5 behind a PCIe switch, GPUs, SR-IOV, netdevs, char devices and modules, so a last
tree adds those, in the kernel's layout, on top of a copy of the node_exporter capture.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ReadErrorLog
from agent.host.inventory import collect_port_states, collect_snapshot
from agent.host.pci import function_of
from agent.host.sysfs import Sysfs
from proto.inventory import Device, Gid, Interface, ModuleInfo, NodeSnapshot, Pcie, Sriov
from tests.support.sysfs_trees import (
    CAPTURED,
    NODE_EXPORTER_SYS,
    PROCFS_SYS,
    attrs,
    link,
    materialize,
    write,
)

PROCFS_EXPECTED: dict[str, Any] = json.loads((CAPTURED / "procfs-expected.json").read_text())
BYTES_PER_GBIT = 125_000_000  # the rate file's first number is Gb/s; the tools say bytes/s
DATA_COUNTERS = ("port_rcv_data", "port_xmit_data", "port_rcv_data_64", "port_xmit_data_64")


def _snapshot(root: Path) -> NodeSnapshot:
    return collect_snapshot(Sysfs(root), node="captured", seq=1, now=0.0, agent_version="test")


def _device(snap: NodeSnapshot, name: str) -> Device:
    return next(d for d in snap.devices if d.name == name)


def _prom(name: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in (CAPTURED / name).read_text().splitlines():
        match = re.fullmatch(r"(\w+)\{([^}]*)\} (\S+)", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            samples.append((match[1], labels, float(match[3])))
    return samples


def _bytes(name: str, value: int) -> int:
    return value * 4 if name in DATA_COUNTERS else value


@pytest.fixture(scope="module")
def procfs_snapshot() -> NodeSnapshot:
    return _snapshot(PROCFS_SYS)


@pytest.fixture(scope="module")
def ne_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return materialize(NODE_EXPORTER_SYS, tmp_path_factory.mktemp("node_exporter") / "sys")


@pytest.fixture(scope="module")
def ne_snapshot(ne_root: Path) -> NodeSnapshot:
    return _snapshot(ne_root)


# --- procfs-sys vs procfs ---------------------------------------------------------------


def test_procfs_devices_and_header(procfs_snapshot: NodeSnapshot) -> None:
    snap = procfs_snapshot
    assert [d.name for d in snap.devices] == sorted(PROCFS_EXPECTED)
    assert (snap.node, snap.seq, snap.collected_at, snap.agent_version) == (
        "captured", 1, 0.0, "test",
    )  # fmt: skip
    assert (snap.gpus, snap.gpu_nic_topology, snap.modules, snap.errors) == ((), (), {}, ())


@pytest.mark.parametrize("name", sorted(PROCFS_EXPECTED))
def test_procfs_every_value(procfs_snapshot: NodeSnapshot, name: str) -> None:
    device, expected = _device(procfs_snapshot, name), PROCFS_EXPECTED[name]
    for key, value in expected.items():
        if key != "ports":
            assert getattr(device, key) == value, key
    assert [p.port for p in device.ports] == sorted(int(n) for n in expected["ports"])
    for port in device.ports:
        want = expected["ports"][str(port.port)]
        seen = {
            "state": port.state,
            "state_id": port.state_id,
            "phys_state": port.phys_state,
            "phys_state_id": port.phys_state_id,
            "link_layer": port.link_layer,
            "rate_bytes_per_second": (port.rate_gbps or 0) * BYTES_PER_GBIT,
            "rate_raw": f"{port.rate_gbps:g} Gb/sec ({port.rate_lanes}X {port.rate_speed})",
            # procfs reports the data counters in bytes already: raw x 4.
            "counters": {k: _bytes(k, v) for k, v in port.counters.items()},
            "hw_counters": port.hw_counters,
        }
        assert {key: seen[key] for key in want} == want, f"{name} port {port.port}"
        assert (port.rx_bytes, port.tx_bytes) == (
            want["counters"]["port_rcv_data"], want["counters"]["port_xmit_data"],
        )  # fmt: skip


def test_procfs_has_no_pci_links_and_says_so(procfs_snapshot: NodeSnapshot) -> None:
    for device in procfs_snapshot.devices:
        assert (device.pci_address, device.pcie, device.pci_path) == (None, None, ())
        assert device.errors[0].path == f"/class/infiniband/{device.name}/device"
        assert device.errors[0].error == "ENOENT"
    hfi = _device(procfs_snapshot, "hfi1_0")
    assert (hfi.hca_type, hfi.node_guid, hfi.ports[0].lid) == (None, None, None)
    paths = {e.path for e in hfi.errors}
    assert {"/class/infiniband/hfi1_0/hca_type", "/class/infiniband/hfi1_0/ports/1/lid"} <= paths


# --- node_exporter-sys vs node_exporter ---------------------------------------------------

# node_exporter metric -> (counter group, file); data counters are compared in bytes.
NE_COUNTERS = {
    "legacy_data_received_bytes_total": ("counters_ext", "port_rcv_data_64"),
    "legacy_data_transmitted_bytes_total": ("counters_ext", "port_xmit_data_64"),
    "legacy_multicast_packets_received_total": ("counters_ext", "port_multicast_rcv_packets"),
    "legacy_multicast_packets_transmitted_total": ("counters_ext", "port_multicast_xmit_packets"),
    "legacy_packets_received_total": ("counters_ext", "port_rcv_packets_64"),
    "legacy_packets_transmitted_total": ("counters_ext", "port_xmit_packets_64"),
    "legacy_unicast_packets_received_total": ("counters_ext", "port_unicast_rcv_packets"),
    "legacy_unicast_packets_transmitted_total": ("counters_ext", "port_unicast_xmit_packets"),
    "link_downed_total": ("counters", "link_downed"),
    "link_error_recovery_total": ("counters", "link_error_recovery"),
    "multicast_packets_received_total": ("counters", "multicast_rcv_packets"),
    "multicast_packets_transmitted_total": ("counters", "multicast_xmit_packets"),
    "port_constraint_errors_received_total": ("counters", "port_rcv_constraint_errors"),
    "port_constraint_errors_transmitted_total": ("counters", "port_xmit_constraint_errors"),
    "port_data_received_bytes_total": ("counters", "port_rcv_data"),
    "port_data_transmitted_bytes_total": ("counters", "port_xmit_data"),
    "port_discards_received_total": ("counters", "port_rcv_discards"),
    "port_discards_transmitted_total": ("counters", "port_xmit_discards"),
    "port_errors_received_total": ("counters", "port_rcv_errors"),
    "port_packets_received_total": ("counters", "port_rcv_packets"),
    "port_packets_transmitted_total": ("counters", "port_xmit_packets"),
    "port_transmit_wait_total": ("counters", "port_xmit_wait"),
    "unicast_packets_received_total": ("counters", "unicast_rcv_packets"),
    "unicast_packets_transmitted_total": ("counters", "unicast_xmit_packets"),
}
NE_IB = _prom("node_exporter-infiniband-expected.prom")
NE_PCI = _prom("node_exporter-pcidevice-expected.prom")


def test_node_exporter_infiniband_every_sample(ne_snapshot: NodeSnapshot) -> None:
    expected: dict[tuple[str, ...], float] = {}
    for metric, labels, value in NE_IB:
        name = metric.removeprefix("node_infiniband_")
        if name == "info":
            key = (labels["device"], labels["board_id"], labels["firmware_version"],
                   labels["hca_type"])  # fmt: skip
            expected[("info", *key)] = value
        elif name in NE_COUNTERS:
            group, file = NE_COUNTERS[name]
            expected[(labels["device"], labels["port"], group, file)] = value
        else:
            assert name in ("state_id", "physical_state_id", "rate_bytes_per_second"), name
            expected[(labels["device"], labels["port"], name)] = value
    ours: dict[tuple[str, ...], float] = {}
    for d in ne_snapshot.devices:
        ours[("info", d.name, d.board_id or "", d.fw_ver or "", d.hca_type or "")] = 1
        for p in d.ports:
            port = str(p.port)
            ours[(d.name, port, "state_id")] = float(p.state_id or -1)
            ours[(d.name, port, "physical_state_id")] = float(p.phys_state_id or -1)
            ours[(d.name, port, "rate_bytes_per_second")] = (p.rate_gbps or 0) * BYTES_PER_GBIT
            for group in ("counters", "counters_ext"):
                for file, raw in getattr(p, group).items():
                    ours[(d.name, port, group, file)] = float(_bytes(file, raw))
    # Same set both ways: mlx4_0 port 2 has only 8 counter files, i40iw0's read N/A, and
    # neither side invents the missing ones.
    assert ours == expected


def _address(labels: dict[str, str], prefix: str = "") -> str:
    return (
        f"{labels[prefix + 'segment']}:{labels[prefix + 'bus']}:"
        f"{labels[prefix + 'device']}.{labels[prefix + 'function']}"
    )


NE_ADDRESSES = sorted({_address(labels) for _, labels, _ in NE_PCI})


@pytest.mark.parametrize("address", NE_ADDRESSES)
def test_node_exporter_pcidevice_every_sample(ne_root: Path, address: str) -> None:
    log = ReadErrorLog()
    fn = function_of(Sysfs(ne_root).dir(f"bus/pci/devices/{address}"), log)
    assert fn is not None
    assert fn.address == address
    pcie, sriov = fn.pcie, fn.sriov
    assert pcie is not None
    assert sriov is not None
    seen: dict[str, Any] = {
        "current_link_transfers_per_second": (pcie.current_speed_gts or 0) * 1e9,
        # node_exporter reports the function's own maximum; ours is also the effective one.
        "max_link_transfers_per_second": (pcie.device_max_speed_gts or 0) * 1e9,
        "current_link_width": pcie.current_width,
        "max_link_width": pcie.device_max_width,
        "d3cold_allowed": float(bool(fn.d3cold_allowed)),
        "sriov_drivers_autoprobe": float(bool(fn.sriov_drivers_autoprobe)),
        "sriov_numvfs": sriov.numvfs,
        "sriov_totalvfs": sriov.totalvfs,
        "sriov_vf_total_msix": fn.sriov_vf_total_msix,
    }
    samples = [(m.removeprefix("node_pcidevice_"), lb, v) for m, lb, v in NE_PCI]
    for metric, labels, value in samples:
        if _address(labels) != address:
            continue
        if metric == "info":
            parent = "" if labels["parent_bus"] == "*" else _address(labels, "parent_")
            assert (fn.vendor_id, fn.device_id, fn.class_code, fn.revision) == (
                labels["vendor_id"], labels["device_id"], labels["class_id"], labels["revision"],
            )  # fmt: skip
            assert (fn.subsystem_vendor_id, fn.subsystem_device_id) == (
                labels["subsystem_vendor_id"], labels["subsystem_device_id"],
            )  # fmt: skip
            assert (fn.chain[-1] if parent else "") == parent
        elif metric == "power_state":
            assert value == float(fn.power_state == labels["state"]), labels["state"]
        elif metric == "numa_node":
            assert fn.numa_node == value
        else:
            assert seen[metric] == value, metric
    # numa_node -1 means unknown: node_exporter leaves the line out, we say null.
    if not any(m == "numa_node" and _address(lb) == address for m, lb, _ in samples):
        assert fn.numa_node is None


@pytest.mark.parametrize(
    ("address", "chain", "pcie"),
    [
        pytest.param("0000:00:02.1", ("pci0000:00",),
                     Pcie(current_speed_gts=8.0, current_width=4, max_speed_gts=8.0, max_width=8,
                          degraded=True, device_max_speed_gts=8.0, device_max_width=8),
                     id="root-port-x4-of-x8"),
        # A Gen4 NVMe behind a Gen3 root port: its 8 GT/s is all the slot allows.
        pytest.param("0000:01:00.0", ("pci0000:00", "0000:00:02.1"),
                     Pcie(current_speed_gts=8.0, current_width=4, max_speed_gts=8.0, max_width=4,
                          degraded=False, device_max_speed_gts=16.0, device_max_width=4),
                     id="nvme-gen4-card-in-gen3-slot"),
        pytest.param("0000:45:00.0", ("pci0000:40", "0000:40:01.3"),
                     Pcie(current_speed_gts=5.0, current_width=4, max_speed_gts=5.0, max_width=4,
                          degraded=False, device_max_speed_gts=5.0, device_max_width=4),
                     id="igb-upstream-link-unknown"),
    ],
)  # fmt: skip
def test_pcie_effective_maximum(
    ne_root: Path, address: str, chain: tuple[str, ...], pcie: Pcie
) -> None:
    log = ReadErrorLog()
    fn = function_of(Sysfs(ne_root).dir(f"bus/pci/devices/{address}"), log)
    assert fn is not None
    assert (fn.chain, fn.pcie) == (chain, pcie)
    # Partial capture: every `driver` link dangles (absent, recorded) and 40:01.3 has no
    # link attributes, so igb's effective maximum is its own.
    assert log.get(f"/bus/pci/devices/{address}/driver") == "ENOENT"
    assert fn.driver is None


def test_node_exporter_tree_has_no_gpus_and_no_host_errors(ne_snapshot: NodeSnapshot) -> None:
    assert (ne_snapshot.gpus, ne_snapshot.errors) == ((), ())


# --- the capture plus an mlx5 behind a PCIe switch, SR-IOV, a GPU, netdevs, char devices ---

SWITCH = "devices/pci0000:40/0000:40:01.1/0000:41:00.0"
PF = f"{SWITCH}/0000:42:00.0/0000:43:00.0"
VF = f"{SWITCH}/0000:42:00.0/0000:43:00.2"
GPU = f"{SWITCH}/0000:42:01.0/0000:44:00.0"
UP = "../../../../../.."  # from PF, VF and GPU directories to the root
IPOIB_ADDRESS = "00:00:10:29:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:01:02:03"


def acs_config(control: int | None) -> bytes:
    """A 4096-byte config space: ACS at 0x100 with `control`, or no capability."""
    buf = bytearray(4096)
    if control is not None:
        buf[0x100:0x104] = (0x000D | 1 << 16).to_bytes(4, "little")
        buf[0x106:0x108] = control.to_bytes(2, "little")
    return bytes(buf)


def _pci(root: Path, directory: str, driver: str, **values: str) -> None:
    defaults = {
        "numa_node": "1", "local_cpulist": "16-31", "revision": "0x00", "power_state": "D0",
        "current_link_speed": "16.0 GT/s PCIe", "current_link_width": "16",
        "max_link_speed": "16.0 GT/s PCIe", "max_link_width": "16",
    }  # fmt: skip
    attrs(root, directory, **(defaults | values))
    (root / f"bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
    link(root, f"{directory}/driver", f"{UP}/bus/pci/drivers/{driver}")
    link(root, f"bus/pci/devices/{directory.rsplit('/', 1)[-1]}", f"../../../{directory}")


def _port(root: Path, directory: str, state: str, phys: str, **extra: str) -> None:
    attrs(root, directory, state=state, phys_state=phys, rate="400 Gb/sec (4X NDR)",
          link_layer="InfiniBand", **extra)  # fmt: skip


def _extend(root: Path) -> None:
    for bridge in ("devices/pci0000:40/0000:40:01.1", SWITCH, f"{SWITCH}/0000:42:00.0",
                   f"{SWITCH}/0000:42:01.0"):  # fmt: skip
        _pci(root, bridge, "pcieport", vendor="0x1000", device="0xc030", **{"class": "0x060400"})
    write(root, f"{SWITCH}/0000:42:00.0/config", acs_config(0x1D))  # Linux's "enabled"
    write(root, f"{SWITCH}/0000:42:01.0/config", acs_config(0x10))  # upstream forwarding only
    write(root, f"{SWITCH}/config", acs_config(None))  # switch upstream port: no ACS
    mlx = {"vendor": "0x15b3", "subsystem_vendor": "0x15b3", "subsystem_device": "0x0007",
           "class": "0x020700"}  # fmt: skip
    _pci(root, PF, "mlx5_core", device="0x101b", sriov_totalvfs="8", sriov_numvfs="2",
         sriov_drivers_autoprobe="1", sriov_vf_total_msix="0", **mlx)  # fmt: skip
    for n, fn in enumerate(("0000:43:00.2", "0000:43:00.3")):
        link(root, f"{PF}/virtfn{n}", f"../{fn}")
    for vf in (VF, VF.replace("43:00.2", "43:00.3")):
        _pci(root, vf, "mlx5_core", device="0x101c", **mlx)
        link(root, f"{vf}/physfn", "../0000:43:00.0")
    ib = f"{PF}/infiniband/mlx5_0"
    attrs(root, ib, fw_ver="20.35.1012", board_id="MT_0000000223", hca_type="MT4123",
          hw_rev="0", node_guid="b8ce:f603:0001:0203", sys_image_guid="b8ce:f603:0001:0203",
          node_type="1: CA")  # fmt: skip
    link(root, f"{ib}/device", "../../../0000:43:00.0")
    link(root, "class/infiniband/mlx5_0", f"../../{ib}")
    port = f"{ib}/ports/1"
    _port(root, port, "4: ACTIVE", "5: LinkUp", lid="0x1f", sm_lid="0x1", lid_mask_count="0",
          cap_mask="0xa751e848")  # fmt: skip
    attrs(root, f"{port}/counters", port_xmit_data="1000", port_rcv_data="2000")
    attrs(root, f"{port}/hw_counters", out_of_buffer="7", lifespan="10")
    attrs(root, f"{port}/gids", **{"0": "fe80:0000:0000:0000:b8ce:f603:0001:0203",
                                   "1": "0000:0000:0000:0000:0000:0000:0000:0000"})  # fmt: skip
    attrs(root, f"{port}/gid_attrs/types", **{"0": "IB/RoCE v1"})
    (root / port / "gid_attrs/ndevs").mkdir()
    attrs(root, f"{port}/pkeys", **{"0": "0xffff", "1": "0x0000", "2": "0x8001"})
    attrs(root, f"{PF}/net/ib0", mtu="4092", operstate="up", carrier="1",
          address=IPOIB_ADDRESS, type="32", dev_port="0")  # fmt: skip
    link(root, "class/net/ib0", f"../../{PF}/net/ib0")

    # mlx5_5: a sub-function, an auxiliary device below the PF; its PCI function is the PF.
    sf = f"{PF}/mlx5_core.sf.2/infiniband/mlx5_5"
    link(root, f"{sf}/device", "../../../mlx5_core.sf.2")
    link(root, "class/infiniband/mlx5_5", f"../../{sf}")
    _port(root, f"{sf}/ports/1", "4: ACTIVE", "5: LinkUp")
    # mlx5_6: the RDMA device of the first VF.
    vf_ib = f"{VF}/infiniband/mlx5_6"
    link(root, f"{vf_ib}/device", "../../../0000:43:00.2")
    link(root, "class/infiniband/mlx5_6", f"../../{vf_ib}")
    _port(root, f"{vf_ib}/ports/1", "4: ACTIVE", "5: LinkUp")

    _pci(root, GPU, "nvidia", vendor="0x10de", device="0x2330", subsystem_vendor="0x10de",
         subsystem_device="0x16c1", **{"class": "0x030200"})  # fmt: skip

    # mlx5_10: no PCI link (a soft device); sorts after mlx5_6.
    _port(root, "class/infiniband/mlx5_10/ports/1", "1: DOWN", "3: Disabled")
    # mlx5_2: a garbled state and a directory where the rate file should be, on port 1
    # only; port 2 and every other device must be unaffected.
    _port(root, "class/infiniband/mlx5_2/ports/2", "4: ACTIVE", "5: LinkUp")
    attrs(root, "class/infiniband/mlx5_2/ports/1", state="garbage", phys_state="5: LinkUp")
    (root / "class/infiniband/mlx5_2/ports/1/rate").mkdir()

    write(root, "class/infiniband_verbs/abi_version", "6\n")
    attrs(root, "class/infiniband_verbs/uverbs0", ibdev="mlx5_0")
    attrs(root, "class/infiniband_verbs/uverbs1", ibdev="mlx5_1")  # not mlx5_10's
    attrs(root, "class/infiniband_verbs/uverbs2", ibdev="mlx5_10")
    write(root, "class/infiniband_mad/abi_version", "5\n")
    attrs(root, "class/infiniband_mad/umad0", ibdev="mlx5_0")
    attrs(root, "class/infiniband_mad/issm0", ibdev="mlx5_0")
    attrs(root, "class/misc/rdma_cm", dev="10:58")
    (root / "class/iommu/dmar0").mkdir(parents=True)

    attrs(root, "module/mlx5_core", version="24.10-1.1.4", srcversion="1A2B3C")
    (root / "module/ib_core/parameters").mkdir(parents=True)  # in-tree: no version file
    attrs(root, "module/nvidia", version="550.54.15")
    attrs(root, "module/nv_peer_mem", version="1.3-0")  # the legacy peer-memory module


@pytest.fixture(scope="module")
def rdma_root(ne_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rdma") / "sys"
    shutil.copytree(ne_root, root, symlinks=True)
    _extend(root)
    return root


@pytest.fixture(scope="module")
def rdma_snapshot(rdma_root: Path) -> NodeSnapshot:
    return _snapshot(rdma_root)


def test_devices_in_natural_order(rdma_snapshot: NodeSnapshot) -> None:
    names = [d.name for d in rdma_snapshot.devices]
    assert names == ["i40iw0", "mlx4_0", "mlx5_0", "mlx5_2", "mlx5_5", "mlx5_6", "mlx5_10"]


def test_mlx5_behind_a_switch(rdma_snapshot: NodeSnapshot) -> None:
    d = _device(rdma_snapshot, "mlx5_0")
    assert (d.pci_address, d.vendor_id, d.device_id, d.class_code, d.revision) == (
        "0000:43:00.0", "0x15b3", "0x101b", "0x020700", "0x00",
    )  # fmt: skip
    assert d.pci_path == ("pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:00.0")
    assert (d.driver, d.numa_node, d.local_cpulist, d.power_state) == (
        "mlx5_core", 1, "16-31", "D0",
    )  # fmt: skip
    assert d.pcie == Pcie(current_speed_gts=16.0, current_width=16, max_speed_gts=16.0,
                          max_width=16, device_max_speed_gts=16.0, device_max_width=16)  # fmt: skip
    assert d.sriov == Sriov(totalvfs=8, numvfs=2, vfs=("0000:43:00.2", "0000:43:00.3"))
    assert (d.node_guid, d.sys_image_guid, d.node_type, d.hw_rev) == (
        "b8ce:f603:0001:0203", "b8ce:f603:0001:0203", "CA", "0",
    )  # fmt: skip
    port = d.ports[0]
    assert (port.lid, port.sm_lid, port.lid_mask_count, port.cap_mask) == (31, 1, 0, "0xa751e848")
    assert (port.rate_gbps, port.rate_lanes, port.rate_speed) == (400.0, 4, "NDR")
    assert port.gids == (
        Gid(index=0, gid="fe80:0000:0000:0000:b8ce:f603:0001:0203", type="IB/RoCE v1"),
    )
    assert port.pkeys == ("0xffff", "0x8001")
    assert (port.counters, port.counters_ext) == (
        {"port_rcv_data": 2000, "port_xmit_data": 1000},
        {},
    )
    assert port.hw_counters == {"lifespan": 10, "out_of_buffer": 7}
    assert (port.rx_bytes, port.tx_bytes) == (8000, 4000)
    assert d.netdevs == ("ib0",)
    assert d.interfaces == (
        Interface(name="ib0", port=1, mtu=4092, operstate="up", carrier=True,
                  address=IPOIB_ADDRESS, type=32),
    )  # fmt: skip
    assert d.errors == ()


def test_virtual_function_names_its_physical_function(rdma_snapshot: NodeSnapshot) -> None:
    vf = _device(rdma_snapshot, "mlx5_6")
    assert (vf.pci_address, vf.device_id) == ("0000:43:00.2", "0x101c")
    assert vf.sriov == Sriov(physfn="0000:43:00.0")


def test_sub_function_reports_its_parent_pci_function(rdma_snapshot: NodeSnapshot) -> None:
    sf, pf = _device(rdma_snapshot, "mlx5_5"), _device(rdma_snapshot, "mlx5_0")
    assert (sf.pci_address, sf.pci_path, sf.pcie, sf.sriov) == (
        pf.pci_address, pf.pci_path, pf.pcie, pf.sriov,
    )  # fmt: skip
    assert sf.netdevs == ()  # the SF has no net/ of its own here


def test_char_devices_match_ibdev_exactly(rdma_snapshot: NodeSnapshot) -> None:
    assert _device(rdma_snapshot, "mlx5_0").char_devices == (
        "/dev/infiniband/issm0",
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/umad0",
        "/dev/infiniband/uverbs0",
    )
    assert _device(rdma_snapshot, "mlx5_10").char_devices == (
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs2",
    )


def test_rdma_cm_only_when_rdma_ucm_created_it(ne_snapshot: NodeSnapshot) -> None:
    assert all(d.char_devices == () for d in ne_snapshot.devices)


def test_gpu_and_its_relation_to_every_nic(rdma_snapshot: NodeSnapshot) -> None:
    (gpu,) = rdma_snapshot.gpus
    assert (gpu.pci_address, gpu.driver, gpu.class_code, gpu.device_id, gpu.numa_node) == (
        "0000:44:00.0", "nvidia", "0x030200", "0x2330", 1,
    )  # fmt: skip
    assert gpu.pci_path == ("pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:01.0")
    relations = {(r.gpu, r.nic): r.relation for r in rdma_snapshot.gpu_nic_topology}
    # Sibling downstream ports of one switch; devices without a PCI function (the capture's
    # mlx4_0 and i40iw0, soft devices) have no place to compare and are not listed.
    assert relations == {
        ("0000:44:00.0", "mlx5_0"): "PIX",
        ("0000:44:00.0", "mlx5_5"): "PIX",
        ("0000:44:00.0", "mlx5_6"): "PIX",
    }


def test_platform(rdma_snapshot: NodeSnapshot) -> None:
    platform = rdma_snapshot.platform
    # 42:00.0 (the NIC's downstream port) redirects peer-to-peer traffic; 42:01.0 only
    # forwards upstream; 41:00.0 has no ACS capability.
    assert platform.acs_enabled_bridges == ("0000:42:00.0",)
    assert (platform.iommu, platform.peermem) == (True, True)
    assert rdma_snapshot.modules == {
        "mlx5_core": ModuleInfo(version="24.10-1.1.4", srcversion="1A2B3C"),
        "ib_core": ModuleInfo(),
        "nvidia": ModuleInfo(version="550.54.15"),
        "nv_peer_mem": ModuleInfo(version="1.3-0"),
    }
    assert rdma_snapshot.errors == ()


def test_one_bad_port_hides_nothing_else(rdma_snapshot: NodeSnapshot) -> None:
    bad = _device(rdma_snapshot, "mlx5_2")
    port1, port2 = bad.ports
    assert (port1.state_id, port1.state, port1.phys_state) == (None, "UNKNOWN", "LinkUp")
    assert (port1.rate_gbps, port1.rate_lanes) == (None, None)
    assert (port2.state, port2.rate_gbps) == ("ACTIVE", 400.0)
    errors = {e.path: e.error for e in bad.errors}
    assert errors["/class/infiniband/mlx5_2/ports/1/state"] == "unparsable: 'garbage'"
    assert errors["/class/infiniband/mlx5_2/ports/1/rate"] == "EISDIR"
    assert _device(rdma_snapshot, "mlx5_10").ports[0].state == "DOWN"
    assert _device(rdma_snapshot, "mlx5_0").errors == ()


def test_errors_sorted_and_unique(rdma_snapshot: NodeSnapshot) -> None:
    for errors in [rdma_snapshot.errors, *(d.errors for d in rdma_snapshot.devices)]:
        paths = [e.path for e in errors]
        assert paths == sorted(set(paths))
        assert all(p.startswith("/") for p in paths)


def test_port_states_for_the_fast_poll(rdma_root: Path) -> None:
    assert collect_port_states(Sysfs(rdma_root)) == {
        ("i40iw0", 1): ("ACTIVE", "LinkUp"),
        ("mlx4_0", 1): ("ACTIVE", "LinkUp"),
        ("mlx4_0", 2): ("ACTIVE", "LinkUp"),
        ("mlx5_0", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_2", 1): ("UNKNOWN", "LinkUp"),
        ("mlx5_2", 2): ("ACTIVE", "LinkUp"),
        ("mlx5_5", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_6", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_10", 1): ("DOWN", "Disabled"),
    }
