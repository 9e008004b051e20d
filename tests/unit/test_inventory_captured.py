"""Inventory assembly against real captured sysfs trees and the reference tools' answers.

procfs-sys is compared with procfs' parse (procfs-expected.json), node_exporter-sys with
node_exporter's end-to-end expectations (*.prom). The captures lack an mlx5 behind a PCIe
switch, GPUs, netdevs, char devices and modules, so one test tree adds those, in the
kernel's layout, on top of a copy of the node_exporter capture.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agent.inventory import (
    CounterReader,
    collect_counters,
    collect_pci_function,
    collect_port_states,
    collect_snapshot,
)
from agent.parse import data_bytes
from agent.sysfs import ReadErrorLog, Sysfs
from proto.inventory import Adapter, Gpu, Module, Netdev, NodeSnapshot, PcieLink, ReadError

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
CAPTURED = FIXTURES / "captured"
PROCFS_EXPECTED: dict[str, Any] = json.loads((CAPTURED / "procfs-expected.json").read_text())
# The rate file's first number is Gb/s; the reference tools report bytes/s.
BYTES_PER_GBIT = 125_000_000


def _snapshot(root: Path) -> NodeSnapshot:
    return collect_snapshot(Sysfs(root), node="captured", seq=1, now=0.0, agent_version="test")


def _adapter(snap: NodeSnapshot, name: str) -> Adapter:
    return next(a for a in snap.adapters if a.name == name)


def _prom(name: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in (CAPTURED / name).read_text().splitlines():
        match = re.fullmatch(r"(\w+)\{([^}]*)\} (\S+)", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match[2]))
            samples.append((match[1], labels, float(match[3])))
    return samples


# The shared copy of this capture stores each symlink as a regular file holding the link
# target (its archive format lost them). Rebuild real links in a tmp copy, so the tree
# looks like the host it came from: bus/pci/devices/* links and dangling `driver` links.
_LINK_FILE = re.compile(rb"(?:\.\./)+[^\n]+")


def _materialize(src: Path, dst: Path) -> None:
    for dirpath, _, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        (dst / rel).mkdir(parents=True, exist_ok=True)
        for name in filenames:
            data = (Path(dirpath) / name).read_bytes()
            if _LINK_FILE.fullmatch(data):
                (dst / rel / name).symlink_to(data.decode())
            else:
                (dst / rel / name).write_bytes(data)


@pytest.fixture(scope="module")
def procfs_snapshot() -> NodeSnapshot:
    return _snapshot(CAPTURED / "procfs-sys")


@pytest.fixture(scope="module")
def ne_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("node_exporter") / "sys"
    _materialize(CAPTURED / "node_exporter-sys", root)
    return root


@pytest.fixture(scope="module")
def ne_snapshot(ne_root: Path) -> NodeSnapshot:
    return _snapshot(ne_root)


# --- procfs-sys vs procfs ---------------------------------------------------------------


def test_procfs_adapters_sorted(procfs_snapshot: NodeSnapshot) -> None:
    assert [a.name for a in procfs_snapshot.adapters] == sorted(PROCFS_EXPECTED)
    snap = procfs_snapshot
    assert (snap.node, snap.seq, snap.collected_at, snap.agent_version) == (
        "captured",
        1,
        0.0,
        "test",
    )


@pytest.mark.parametrize("name", sorted(PROCFS_EXPECTED))
def test_procfs_identity(procfs_snapshot: NodeSnapshot, name: str) -> None:
    adapter, expected = _adapter(procfs_snapshot, name), PROCFS_EXPECTED[name]
    for field in ("board_id", "fw_ver", "hca_type", "node_guid"):
        assert getattr(adapter, field) == expected.get(field), field
    # No `device` link in this capture: no PCI function, and the miss is recorded.
    assert adapter.pci is None
    error = ReadError(path=f"/class/infiniband/{name}/device", error="ENOENT")
    assert error in procfs_snapshot.read_errors


PROCFS_PORTS = [
    pytest.param(name, int(number), id=f"{name}-{number}")
    for name, adapter in sorted(PROCFS_EXPECTED.items())
    for number in sorted(adapter["ports"])
]


@pytest.mark.parametrize(("name", "number"), PROCFS_PORTS)
def test_procfs_port(procfs_snapshot: NodeSnapshot, name: str, number: int) -> None:
    port = next(p for p in _adapter(procfs_snapshot, name).ports if p.number == number)
    expected = PROCFS_EXPECTED[name]["ports"][str(number)]
    assert (port.state, port.state_name) == (expected["state_id"], expected["state"])
    assert (port.phys_state, port.phys_state_name) == (
        expected["phys_state_id"],
        expected["phys_state"],
    )
    assert port.link_layer == expected["link_layer"]
    assert port.rate_gbps is not None
    assert port.rate_gbps * BYTES_PER_GBIT == expected["rate_bytes_per_second"]


@pytest.mark.parametrize(("name", "number"), PROCFS_PORTS)
def test_procfs_counters(procfs_snapshot: NodeSnapshot, name: str, number: int) -> None:
    port = next(p for p in _adapter(procfs_snapshot, name).ports if p.number == number)
    expected = PROCFS_EXPECTED[name]["ports"][str(number)]
    # procfs already multiplied the data counters by 4; we keep the kernel's raw units.
    wanted = dict(expected["counters"])
    wanted.update({f"hw_counters/{k}": v for k, v in expected.get("hw_counters", {}).items()})
    # hw_counters/lifespan is the driver's cache period (ms), a setting we do not report.
    wanted.pop("hw_counters/lifespan", None)
    assert {k: data_bytes(k, v) for k, v in port.counters.items()} == wanted
    assert list(port.counters) == sorted(port.counters)


def test_procfs_raw_data_counter_is_a_quarter_of_bytes(procfs_snapshot: NodeSnapshot) -> None:
    port = _adapter(procfs_snapshot, "mlx5_0").ports[0]
    assert port.counters["port_xmit_data"] * 4 == 11523046035392


def test_procfs_missing_attributes_are_none_and_recorded(procfs_snapshot: NodeSnapshot) -> None:
    hfi = _adapter(procfs_snapshot, "hfi1_0")
    assert (hfi.hca_type, hfi.node_guid, hfi.ports[0].lid) == (None, None, None)
    paths = {e.path for e in procfs_snapshot.read_errors}
    assert "/class/infiniband/hfi1_0/hca_type" in paths
    assert "/class/infiniband/hfi1_0/ports/1/lid" in paths


# --- node_exporter-sys vs node_exporter ---------------------------------------------------

# node_exporter metric -> our counter key (data counters compared in bytes).
NE_COUNTERS = {
    "legacy_data_received_bytes_total": "counters_ext/port_rcv_data_64",
    "legacy_data_transmitted_bytes_total": "counters_ext/port_xmit_data_64",
    "legacy_multicast_packets_received_total": "counters_ext/port_multicast_rcv_packets",
    "legacy_multicast_packets_transmitted_total": "counters_ext/port_multicast_xmit_packets",
    "legacy_packets_received_total": "counters_ext/port_rcv_packets_64",
    "legacy_packets_transmitted_total": "counters_ext/port_xmit_packets_64",
    "legacy_unicast_packets_received_total": "counters_ext/port_unicast_rcv_packets",
    "legacy_unicast_packets_transmitted_total": "counters_ext/port_unicast_xmit_packets",
    "link_downed_total": "link_downed",
    "link_error_recovery_total": "link_error_recovery",
    "multicast_packets_received_total": "multicast_rcv_packets",
    "multicast_packets_transmitted_total": "multicast_xmit_packets",
    "port_constraint_errors_received_total": "port_rcv_constraint_errors",
    "port_constraint_errors_transmitted_total": "port_xmit_constraint_errors",
    "port_data_received_bytes_total": "port_rcv_data",
    "port_data_transmitted_bytes_total": "port_xmit_data",
    "port_discards_received_total": "port_rcv_discards",
    "port_discards_transmitted_total": "port_xmit_discards",
    "port_errors_received_total": "port_rcv_errors",
    "port_packets_received_total": "port_rcv_packets",
    "port_packets_transmitted_total": "port_xmit_packets",
    "port_transmit_wait_total": "port_xmit_wait",
    "unicast_packets_received_total": "unicast_rcv_packets",
    "unicast_packets_transmitted_total": "unicast_xmit_packets",
}
NE_IB = _prom("node_exporter-infiniband-expected.prom")


def test_node_exporter_counters_match_exactly(ne_snapshot: NodeSnapshot) -> None:
    expected: dict[tuple[str, int, str], float] = {}
    for metric, labels, value in NE_IB:
        key = NE_COUNTERS.get(metric.removeprefix("node_infiniband_"))
        if key is not None:
            expected[(labels["device"], int(labels["port"]), key)] = value
    ours = {
        (a.name, p.number, k): float(data_bytes(k, v))
        for a in ne_snapshot.adapters
        for p in a.ports
        for k, v in p.counters.items()
    }
    # Same set both ways: mlx4_0 port 2 has only 8 counter files, and neither side
    # invents the missing ones.
    assert ours == expected


def test_node_exporter_info_and_states(ne_snapshot: NodeSnapshot) -> None:
    for metric, labels, value in NE_IB:
        name = metric.removeprefix("node_infiniband_")
        adapter = _adapter(ne_snapshot, labels["device"])
        if name == "info":
            assert (adapter.board_id, adapter.fw_ver, adapter.hca_type) == (
                labels["board_id"],
                labels["firmware_version"],
                labels["hca_type"],
            )
            continue
        if "port" not in labels:
            continue
        port = next(p for p in adapter.ports if p.number == int(labels["port"]))
        if name == "state_id":
            assert port.state == value
        elif name == "physical_state_id":
            assert port.phys_state == value
        elif name == "rate_bytes_per_second":
            assert port.rate_gbps is not None
            assert port.rate_gbps * BYTES_PER_GBIT == value


def test_old_kernel_rate_without_speed_name(ne_snapshot: NodeSnapshot) -> None:
    port = _adapter(ne_snapshot, "i40iw0").ports[0]
    assert (port.rate_gbps, port.rate_lanes, port.rate_speed) == (10.0, 4, None)


def test_no_pma_counters_are_absent_and_recorded(ne_snapshot: NodeSnapshot) -> None:
    port = _adapter(ne_snapshot, "i40iw0").ports[0]
    assert port.counters == {}
    no_pma = [e for e in ne_snapshot.read_errors if e.error == "N/A (no PMA)"]
    files = sorted(
        os.listdir(CAPTURED / "node_exporter-sys/class/infiniband/i40iw0/ports/1/counters")
    )
    assert [e.path for e in no_pma] == [
        f"/class/infiniband/i40iw0/ports/1/counters/{f}" for f in files
    ]


def test_saturated_counter_kept_as_is(ne_snapshot: NodeSnapshot) -> None:
    assert _adapter(ne_snapshot, "mlx4_0").ports[0].counters["port_xmit_wait"] == 4294967295


def test_blank_second_line_link_layer() -> None:
    snap = _snapshot(CAPTURED / "procfs-sys")
    assert _adapter(snap, "mlx4_0").ports[1].link_layer == "InfiniBand"


NE_PCI = [
    pytest.param("0000:00:02.1", ("pci0000:00",), id="root-port"),
    pytest.param("0000:01:00.0", ("pci0000:00", "0000:00:02.1"), id="nvme"),
    pytest.param("0000:45:00.0", ("pci0000:40", "0000:40:01.3"), id="igb-nic"),
]


def _pci_address(labels: dict[str, str], prefix: str = "") -> str:
    return (
        f"{labels[prefix + 'segment']}:{labels[prefix + 'bus']}:"
        f"{labels[prefix + 'device']}.{labels[prefix + 'function']}"
    )


@pytest.mark.parametrize(("address", "path"), NE_PCI)
def test_pci_function_matches_node_exporter(
    ne_root: Path, address: str, path: tuple[str, ...]
) -> None:
    sysfs, log = Sysfs(ne_root), ReadErrorLog()
    pci = collect_pci_function(sysfs, f"bus/pci/devices/{address}", log)
    assert pci is not None
    assert (pci.address, pci.path) == (address, path)
    expected = {
        metric.removeprefix("node_pcidevice_"): (labels, value)
        for metric, labels, value in _prom("node_exporter-pcidevice-expected.prom")
        if _pci_address(labels) == address and "state" not in labels
    }
    info, _ = expected["info"]
    assert (pci.vendor, pci.device, pci.class_code) == (
        info["vendor_id"],
        info["device_id"],
        info["class_id"],
    )
    assert (pci.subsystem_vendor, pci.subsystem_device) == (
        info["subsystem_vendor_id"],
        info["subsystem_device_id"],
    )
    if info["parent_bus"] != "*":
        assert pci.path[-1] == _pci_address(info, "parent_")
    assert pci.link.current_speed_gts is not None
    assert pci.link.max_speed_gts is not None
    assert pci.link.current_speed_gts * 1e9 == expected["current_link_transfers_per_second"][1]
    assert pci.link.max_speed_gts * 1e9 == expected["max_link_transfers_per_second"][1]
    assert pci.link.current_width == expected["current_link_width"][1]
    assert pci.link.max_width == expected["max_link_width"][1]
    # numa_node -1 means unknown: node_exporter leaves the line out, we say None.
    numa = expected.get("numa_node")
    assert pci.numa_node == (numa[1] if numa else None)
    # Partial capture: every `driver` link dangles, which reads as absent, and is recorded.
    assert pci.driver is None
    assert log.get(f"{sysfs.realpath(f'bus/pci/devices/{address}')}/driver") == "ENOENT"


def test_node_exporter_tree_has_no_gpus_and_no_pci_read_errors(
    ne_snapshot: NodeSnapshot,
) -> None:
    assert ne_snapshot.gpus == ()
    assert not [e for e in ne_snapshot.read_errors if e.path.startswith("/bus/")]


# --- the capture plus an mlx5 behind a PCIe switch, a GPU, netdevs, char devices ------------

SWITCH = "devices/pci0000:40/0000:40:01.1/0000:41:00.0"
PF = f"{SWITCH}/0000:42:00.0/0000:43:00.0"
GPU = f"{SWITCH}/0000:42:01.0/0000:44:00.0"
TO_ROOT_FROM_PF = "../../../../../.."  # PF and GPU are 6 levels below the root
IPOIB_ADDRESS = "00:00:10:29:fe:80:00:00:00:00:00:00:b8:ce:f6:03:00:01:02:03"


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _link(root: Path, rel: str, target: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def _attrs(root: Path, directory: str, **attrs: str) -> None:
    for name, value in attrs.items():
        _write(root, f"{directory}/{name}", value + "\n")


def _pci(root: Path, directory: str, driver: str, **attrs: str) -> None:
    _attrs(
        root,
        directory,
        numa_node="1",
        local_cpulist="16-31",
        current_link_speed="16.0 GT/s PCIe",
        current_link_width="16",
        max_link_speed="16.0 GT/s PCIe",
        max_link_width="16",
        **attrs,
    )
    (root / f"bus/pci/drivers/{driver}").mkdir(parents=True, exist_ok=True)
    _link(root, f"{directory}/driver", f"{TO_ROOT_FROM_PF}/bus/pci/drivers/{driver}")
    _link(root, f"bus/pci/devices/{directory.rsplit('/', 1)[-1]}", f"../../../{directory}")


def _port(root: Path, directory: str, state: str, phys: str, **extra: str) -> None:
    _attrs(
        root,
        directory,
        state=state,
        phys_state=phys,
        rate="400 Gb/sec (4X NDR)",
        link_layer="InfiniBand",
        **extra,
    )


def _extend(root: Path) -> None:
    _pci(
        root,
        PF,
        "mlx5_core",
        vendor="0x15b3",
        device="0x101b",
        subsystem_vendor="0x15b3",
        subsystem_device="0x0007",
        **{"class": "0x020700"},
    )
    ib = f"{PF}/infiniband/mlx5_0"
    _attrs(
        root,
        ib,
        fw_ver="20.35.1012",
        board_id="MT_0000000223",
        hca_type="MT4123",
        hw_rev="0",
        node_guid="b8ce:f603:0001:0203",
        sys_image_guid="b8ce:f603:0001:0203",
        node_type="1: CA",
    )
    _link(root, f"{ib}/device", "../../../0000:43:00.0")
    _link(root, "class/infiniband/mlx5_0", f"../../{ib}")
    _port(root, f"{ib}/ports/1", "4: ACTIVE", "5: LinkUp", lid="0x1f", sm_lid="0x1")
    _attrs(root, f"{ib}/ports/1/counters", port_xmit_data="1000", port_rcv_data="2000")
    _attrs(root, f"{ib}/ports/1/hw_counters", out_of_buffer="7", lifespan="10")
    _attrs(
        root,
        f"{PF}/net/ib0",
        mtu="4092",
        operstate="up",
        carrier="1",
        address=IPOIB_ADDRESS,
        type="32",
        dev_port="0",
    )
    _link(root, "class/net/ib0", f"../../{PF}/net/ib0")

    # mlx5_5: a sub-function, an auxiliary device below the PF; its PCI function is the PF.
    sf = f"{PF}/mlx5_core.sf.2/infiniband/mlx5_5"
    _link(root, f"{sf}/device", "../../../mlx5_core.sf.2")
    _link(root, "class/infiniband/mlx5_5", f"../../{sf}")
    _port(root, f"{sf}/ports/1", "4: ACTIVE", "5: LinkUp")

    _pci(root, GPU, "nvidia", vendor="0x10de", device="0x2330", **{"class": "0x030200"})

    # mlx5_10: no PCI link (a soft device); sorts after mlx5_2.
    _port(root, "class/infiniband/mlx5_10/ports/1", "1: DOWN", "3: Disabled")
    # mlx5_2: a garbled state and a directory where the rate file should be, on port 1
    # only; port 2 and every other adapter must be unaffected.
    _port(root, "class/infiniband/mlx5_2/ports/2", "4: ACTIVE", "5: LinkUp")
    _attrs(root, "class/infiniband/mlx5_2/ports/1", state="garbage", phys_state="5: LinkUp")
    (root / "class/infiniband/mlx5_2/ports/1/rate").mkdir()

    _write(root, "class/infiniband_verbs/abi_version", "6\n")
    _attrs(root, "class/infiniband_verbs/uverbs0", ibdev="mlx5_0")
    _attrs(root, "class/infiniband_verbs/uverbs1", ibdev="mlx5_1")  # not mlx5_10's
    _attrs(root, "class/infiniband_verbs/uverbs2", ibdev="mlx5_10")
    _write(root, "class/infiniband_mad/abi_version", "5\n")
    _attrs(root, "class/infiniband_mad/umad0", ibdev="mlx5_0")
    _attrs(root, "class/infiniband_mad/issm0", ibdev="mlx5_0")
    _attrs(root, "class/misc/rdma_cm", dev="10:58")

    _attrs(root, "module/mlx5_core", version="24.10-1.1.4")
    (root / "module/ib_core/parameters").mkdir(parents=True)  # in-tree: no version file
    _attrs(root, "module/nvidia", version="550.54.15")
    _attrs(root, "module/nvidia_peermem", version="550.54.15")


@pytest.fixture(scope="module")
def rdma_root(ne_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rdma") / "sys"
    shutil.copytree(ne_root, root, symlinks=True)
    _extend(root)
    return root


@pytest.fixture(scope="module")
def rdma_snapshot(rdma_root: Path) -> NodeSnapshot:
    return _snapshot(rdma_root)


@pytest.fixture
def mutable_root(rdma_root: Path, tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    shutil.copytree(rdma_root, root, symlinks=True)
    return root


def test_adapters_in_natural_order(rdma_snapshot: NodeSnapshot) -> None:
    names = [a.name for a in rdma_snapshot.adapters]
    assert names == ["i40iw0", "mlx4_0", "mlx5_0", "mlx5_2", "mlx5_5", "mlx5_10"]


def test_mlx5_behind_a_switch(rdma_snapshot: NodeSnapshot) -> None:
    adapter = _adapter(rdma_snapshot, "mlx5_0")
    assert adapter.pci is not None
    assert adapter.pci.address == "0000:43:00.0"
    assert adapter.pci.path == ("pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:00.0")
    assert (adapter.pci.vendor, adapter.pci.device, adapter.pci.class_code) == (
        "0x15b3",
        "0x101b",
        "0x020700",
    )
    assert (adapter.pci.driver, adapter.pci.numa_node, adapter.pci.local_cpulist) == (
        "mlx5_core",
        1,
        "16-31",
    )
    assert adapter.pci.link == PcieLink(
        current_speed_gts=16.0, current_width=16, max_speed_gts=16.0, max_width=16
    )
    assert (adapter.node_guid, adapter.node_type, adapter.hw_rev) == (
        "b8ce:f603:0001:0203",
        "CA",
        "0",
    )
    port = adapter.ports[0]
    assert (port.lid, port.sm_lid, port.rate_speed, port.netdevs) == (31, 1, "NDR", ("ib0",))
    assert port.counters == {
        "hw_counters/out_of_buffer": 7,
        "port_rcv_data": 2000,
        "port_xmit_data": 1000,
    }
    assert adapter.netdevs == (
        Netdev(
            name="ib0",
            port=1,
            mtu=4092,
            operstate="up",
            carrier=True,
            address=IPOIB_ADDRESS,
            type=32,
        ),
    )


def test_sub_function_reports_its_parent_pci_function(rdma_snapshot: NodeSnapshot) -> None:
    sf = _adapter(rdma_snapshot, "mlx5_5").pci
    assert sf is not None
    assert sf == _adapter(rdma_snapshot, "mlx5_0").pci


def test_char_devices_match_ibdev_exactly(rdma_snapshot: NodeSnapshot) -> None:
    assert _adapter(rdma_snapshot, "mlx5_0").char_devices == (
        "/dev/infiniband/issm0",
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/umad0",
        "/dev/infiniband/uverbs0",
    )
    assert _adapter(rdma_snapshot, "mlx5_10").char_devices == (
        "/dev/infiniband/rdma_cm",
        "/dev/infiniband/uverbs2",
    )


def test_rdma_cm_only_when_rdma_ucm_created_it(ne_snapshot: NodeSnapshot) -> None:
    assert all(a.char_devices == () for a in ne_snapshot.adapters)


def test_gpu_found_with_its_pci_path(rdma_snapshot: NodeSnapshot) -> None:
    assert len(rdma_snapshot.gpus) == 1
    gpu = rdma_snapshot.gpus[0]
    assert gpu == Gpu(pci=gpu.pci)
    assert (gpu.pci.address, gpu.pci.driver, gpu.pci.class_code) == (
        "0000:44:00.0",
        "nvidia",
        "0x030200",
    )
    assert gpu.pci.path == ("pci0000:40", "0000:40:01.1", "0000:41:00.0", "0000:42:01.0")


def test_modules(rdma_snapshot: NodeSnapshot) -> None:
    assert rdma_snapshot.modules == (
        Module(name="mlx5_core", version="24.10-1.1.4"),
        Module(name="ib_core", version=None),
        Module(name="nvidia", version="550.54.15"),
        Module(name="nvidia_peermem", version="550.54.15"),
    )
    assert not [e for e in rdma_snapshot.read_errors if e.path.startswith("/module/")]


def test_one_bad_port_hides_nothing_else(rdma_snapshot: NodeSnapshot) -> None:
    bad = _adapter(rdma_snapshot, "mlx5_2")
    port1, port2 = bad.ports
    assert (port1.state, port1.state_name, port1.phys_state_name) == (None, "UNKNOWN", "LinkUp")
    assert (port1.rate_gbps, port1.rate_lanes) == (None, None)
    assert (port2.state_name, port2.rate_gbps) == ("ACTIVE", 400.0)
    errors = {e.path: e.error for e in rdma_snapshot.read_errors}
    assert errors["/class/infiniband/mlx5_2/ports/1/state"] == "unparsable: 'garbage'"
    assert errors["/class/infiniband/mlx5_2/ports/1/rate"] == "EISDIR"
    assert _adapter(rdma_snapshot, "mlx5_10").ports[0].state_name == "DOWN"


def test_read_errors_sorted_and_unique(rdma_snapshot: NodeSnapshot) -> None:
    paths = [e.path for e in rdma_snapshot.read_errors]
    assert paths == sorted(set(paths))


def test_port_states_for_the_fast_poll(rdma_root: Path) -> None:
    assert collect_port_states(Sysfs(rdma_root)) == {
        ("i40iw0", 1): ("ACTIVE", "LinkUp"),
        ("mlx4_0", 1): ("ACTIVE", "LinkUp"),
        ("mlx4_0", 2): ("ACTIVE", "LinkUp"),
        ("mlx5_0", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_2", 1): ("UNKNOWN", "LinkUp"),
        ("mlx5_2", 2): ("ACTIVE", "LinkUp"),
        ("mlx5_5", 1): ("ACTIVE", "LinkUp"),
        ("mlx5_10", 1): ("DOWN", "Disabled"),
    }


def test_counter_batch_matches_snapshot_counters(
    rdma_root: Path, rdma_snapshot: NodeSnapshot
) -> None:
    log = ReadErrorLog()
    batch = collect_counters(Sysfs(rdma_root), node="n1", seq=7, now=12.5, errors=log)
    assert (batch.node, batch.seq, batch.collected_at) == ("n1", 7, 12.5)
    assert [(p.adapter, p.port, p.values) for p in batch.ports] == [
        (a.name, p.number, p.counters) for a in rdma_snapshot.adapters for p in a.ports
    ]
    assert log.get("/class/infiniband/i40iw0/ports/1/counters/port_xmit_data") == "N/A (no PMA)"


def test_counter_reader_rereads_values_without_rediscovery(mutable_root: Path) -> None:
    reader = CounterReader(Sysfs(mutable_root))
    first = reader.collect(node="n1", seq=1, now=1.0)
    _write(mutable_root, f"{PF}/infiniband/mlx5_0/ports/1/counters/port_xmit_data", "5000\n")
    _write(mutable_root, f"{PF}/infiniband/mlx5_0/ports/1/counters/new_counter", "1\n")
    second = reader.collect(node="n1", seq=2, now=2.0)
    values = {(p.adapter, p.port): p.values for p in second.ports}
    assert values[("mlx5_0", 1)]["port_xmit_data"] == 5000
    assert "new_counter" not in values[("mlx5_0", 1)]  # discovery is cached
    assert len(first.ports) == len(second.ports)
    assert any(e.error == "N/A (no PMA)" for e in reader.last_errors)


def test_counter_reader_rediscovers_after_a_file_vanished(mutable_root: Path) -> None:
    reader = CounterReader(Sysfs(mutable_root))
    reader.collect(node="n1", seq=1, now=1.0)
    (mutable_root / f"{PF}/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer").unlink()
    reader.collect(node="n1", seq=2, now=2.0)
    gone = "/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer"
    assert ReadError(path=gone, error="ENOENT") in reader.last_errors
    assert reader.stale
    third = reader.collect(node="n1", seq=3, now=3.0)
    assert not reader.stale
    assert gone not in {e.path for e in reader.last_errors}
    mlx5 = next(p for p in third.ports if p.adapter == "mlx5_0")
    assert "hw_counters/out_of_buffer" not in mlx5.values


def test_counter_reader_picks_up_a_new_adapter_on_request(mutable_root: Path) -> None:
    reader = CounterReader(Sysfs(mutable_root))
    reader.collect(node="n1", seq=1, now=1.0)
    _attrs(mutable_root, "class/infiniband/mlx5_3/ports/1/counters", port_rcv_data="9")
    assert "mlx5_3" not in {p.adapter for p in reader.collect(node="n1", seq=2, now=2.0).ports}
    reader.rediscover()
    batch = reader.collect(node="n1", seq=3, now=3.0)
    assert ("mlx5_3", 1, {"port_rcv_data": 9}) in [
        (p.adapter, p.port, p.values) for p in batch.ports
    ]
