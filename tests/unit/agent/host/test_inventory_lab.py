"""Snapshots of lab-rendered nodes: the 12-NIC H100 node against its captured
`nvidia-smi topo -m` matrix and `ibstat`, RoCE GIDs, spec variants (ACS, IOMMU, SR-IOV,
counters_ext) and faults injected while the agent reads."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from agent.counters.reader import CounterReader
from agent.host.inventory import collect_port_states, collect_snapshot
from agent.host.sysfs import Sysfs
from agent.host.topology import parse_topo_matrix
from agent.lab import faults
from agent.lab.nodespec import NodeSpec, Sriov
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.inventory import Device, NodeSnapshot
from tests.support.sysfs_trees import TOPOLOGY

H100_MATRIX = TOPOLOGY / "nvidia_smi_topo_h100_12nic_2numa.txt"
# "# mlx5_1  MT4125 22.38.1002 Down   Disabled 40 lid 0  smlid 0   Ethernet    guid 0x..."
_IBSTAT = re.compile(
    r"# (?P<name>mlx5_\d+)\s+(?P<ca>MT\d+) (?P<fw>\S+)\s+(?P<state>\w+)\s+(?P<phys>\w+)\s+"
    r"(?P<rate>\d+)\s+lid (?P<lid>\d+)\s+smlid (?P<sm_lid>\d+)\s+(?P<link_layer>\w+)\s+"
    r"guid 0x(?P<guid>[0-9a-f]{16})(?: \(sysimg 0x(?P<sysimg>[0-9a-f]{16})\))?"
)


def _guid(hex16: str) -> str:
    return ":".join(hex16[i : i + 4] for i in range(0, 16, 4))


def _snapshot(root: Path) -> NodeSnapshot:
    return collect_snapshot(Sysfs(root), node="lab", seq=1, now=0.0, agent_version="test")


def _device(snap: NodeSnapshot, name: str) -> Device:
    return next(d for d in snap.devices if d.name == name)


@pytest.fixture(scope="module")
def h100_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("h100") / "sys"
    render(load_builtin("h100-ib-12nic"), root)
    return root


@pytest.fixture(scope="module")
def h100(h100_root: Path) -> NodeSnapshot:
    return _snapshot(h100_root)


def test_h100_gpu_nic_topology_is_the_captured_matrix(h100: NodeSnapshot) -> None:
    captured = parse_topo_matrix(H100_MATRIX.read_text())
    # nvidia-smi numbers GPUs in PCI address order; the snapshot lists them that way.
    gpu_label = {gpu.pci_address: f"GPU{i}" for i, gpu in enumerate(h100.gpus)}
    ours = {(gpu_label[r.gpu], r.nic): r.relation for r in h100.gpu_nic_topology}
    gpu_rows = {
        (row, column): cell
        for (row, column), cell in captured.items()
        if row.startswith("GPU") and column.startswith("mlx5_")
    }
    assert len(gpu_rows) == 8 * 12
    assert ours == gpu_rows
    assert [r.nic for r in h100.gpu_nic_topology[:12]] == [f"mlx5_{k}" for k in range(12)]


def test_h100_devices_match_the_captured_ibstat(h100: NodeSnapshot) -> None:
    rows = [m.groupdict() for m in map(_IBSTAT.match, H100_MATRIX.read_text().splitlines()) if m]
    assert len(rows) == 12
    assert [d.name for d in h100.devices] == [row["name"] for row in rows]
    for row in rows:
        device = _device(h100, row["name"])
        (port,) = device.ports
        assert (device.hca_type, device.fw_ver, device.node_guid) == (
            row["ca"], row["fw"], _guid(row["guid"]),
        )  # fmt: skip
        assert device.sys_image_guid == _guid(row["sysimg"] or row["guid"])
        assert (port.state, port.phys_state, port.rate_gbps, port.link_layer) == (
            row["state"].upper(), row["phys"], float(row["rate"]), row["link_layer"],
        )  # fmt: skip
        assert (port.lid, port.sm_lid) == (int(row["lid"]), int(row["sm_lid"]))
        assert port.cap_mask == ("0xa751e848" if port.link_layer == "InfiniBand" else "0x00010000")


def test_h100_snapshot_is_complete_and_clean(h100: NodeSnapshot) -> None:
    assert (len(h100.devices), len(h100.gpus)) == (12, 8)
    assert h100.errors == ()
    assert all(d.errors == () for d in h100.devices)
    ib0 = _device(h100, "mlx5_0")
    assert (ib0.driver, ib0.numa_node, ib0.netdevs, ib0.interfaces[0].type) == (
        "mlx5_core", 0, ("ib0",), 32,
    )  # fmt: skip
    assert ib0.char_devices == (
        "/dev/infiniband/issm0", "/dev/infiniband/rdma_cm", "/dev/infiniband/umad0",
        "/dev/infiniband/uverbs0",
    )  # fmt: skip
    assert ib0.ports[0].gids[0].gid == "fe80:0000:0000:0000:58a2:e103:001b:2576"
    # The ConnectX-6 Dx is a Gen4 card on a Gen5 switch port: not degraded.
    cx6 = _device(h100, "mlx5_1").pcie
    assert cx6 is not None
    assert (cx6.current_speed_gts, cx6.max_speed_gts, cx6.degraded) == (16.0, 16.0, False)
    assert {gpu.driver for gpu in h100.gpus} == {"nvidia"}
    assert set(h100.modules) == {
        "mlx5_core", "mlx5_ib", "ib_core", "ib_uverbs", "nvidia", "nvidia_peermem",
    }  # fmt: skip
    assert h100.modules["nvidia"].version == "550.90.07"
    assert h100.platform.peermem is True


def test_roce_ports_have_v1_and_v2_gids_with_their_netdev(tmp_path: Path) -> None:
    render(load_builtin("roce-cx6dx"), tmp_path)
    snap = _snapshot(tmp_path)
    for device in snap.devices:
        (port,) = device.ports
        (netdev,) = device.interfaces
        assert (port.link_layer, port.lid, netdev.type, netdev.mtu) == ("Ethernet", 0, 1, 9000)
        assert [g.type for g in port.gids] == ["IB/RoCE v1", "RoCE v2"] * 2
        assert {g.ndev for g in port.gids} == {netdev.name}
        assert port.gids[2].gid.startswith("0000:0000:0000:0000:0000:ffff:")  # IPv4-mapped
    relations = {(r.gpu, r.nic): r.relation for r in snap.gpu_nic_topology}
    assert relations["0000:19:00.0", "mlx5_0"] == "PIX"
    assert relations["0000:cb:00.0", "mlx5_2"] == "PHB"
    assert relations["0000:19:00.0", "mlx5_3"] == "SYS"
    assert snap.modules["mlx5_core"].version is None  # inbox driver: no version file
    assert snap.errors == ()


def test_drifted_node_has_no_peermem(tmp_path: Path) -> None:
    render(load_builtin("roce-cx6dx-2"), tmp_path)
    snap = _snapshot(tmp_path)
    assert snap.platform.peermem is False
    assert {r.relation for r in snap.gpu_nic_topology} == {"SYS"}


def _variant(spec: NodeSpec) -> NodeSpec:
    """roce-cx6dx with ACS enabled on the switch, an IOMMU, SR-IOV with RDMA VFs and the
    pre-4.5 counters_ext layout on mlx5_0."""
    adapters = list(spec.adapters)
    adapters[0] = msgspec.structs.replace(
        adapters[0], sriov=Sriov(totalvfs=8, numvfs=2, rdma=True), counters_ext=True
    )
    switches = [msgspec.structs.replace(s, acs="enabled") for s in spec.switches]
    return msgspec.structs.replace(spec, switches=switches, iommu=True, adapters=adapters)


def test_acs_iommu_sriov_and_counters_ext(tmp_path: Path) -> None:
    render(_variant(load_builtin("roce-cx6dx")), tmp_path)
    snap = _snapshot(tmp_path)
    # GPU0 and mlx5_0/1 meet in the switch: its downstream ports redirect their traffic.
    assert snap.platform.acs_enabled_bridges == ("0000:18:00.0", "0000:18:01.0")
    assert snap.platform.iommu is True
    pf = _device(snap, "mlx5_0")
    assert pf.sriov is not None
    assert (pf.sriov.totalvfs, pf.sriov.numvfs) == (8, 2)
    vfs = [d for d in snap.devices if d.sriov is not None and d.sriov.physfn == pf.pci_address]
    assert [d.pci_address for d in vfs] == list(pf.sriov.vfs)
    assert "port_xmit_data_64" in pf.ports[0].counters_ext
    assert snap.errors == ()


def test_acs_disabled_by_default(h100: NodeSnapshot) -> None:
    assert h100.platform.acs_enabled_bridges == ()
    assert h100.platform.iommu is False


def test_faults_are_seen(tmp_path: Path) -> None:
    render(load_builtin("roce-cx6dx"), tmp_path)
    sysfs = Sysfs(tmp_path)
    faults.port_down(tmp_path, "mlx5_1", 1)
    faults.pcie_width_drop(tmp_path, "0000:1a:00.0", 8)
    snap = _snapshot(tmp_path)
    pcie = _device(snap, "mlx5_0").pcie
    assert pcie is not None
    assert (pcie.current_width, pcie.max_width, pcie.degraded) == (8, 16, True)
    down = _device(snap, "mlx5_1")
    assert (down.ports[0].state, down.ports[0].phys_state) == ("DOWN", "Disabled")
    assert (down.interfaces[0].operstate, down.interfaces[0].carrier) == ("down", False)
    assert collect_port_states(sysfs)[("mlx5_1", 1)] == ("DOWN", "Disabled")


def test_counter_faults_and_descriptors(tmp_path: Path) -> None:
    render(load_builtin("roce-cx6dx"), tmp_path)
    with CounterReader(Sysfs(tmp_path)) as reader:
        reader.collect(node="n", seq=1, now=1.0)
        faults.bump_counter(tmp_path, "mlx5_0", 1, "port_xmit_data", 100, atomic=False)
        faults.bump_counter(tmp_path, "mlx5_0", 1, "hw_counters/out_of_buffer", 3, atomic=True)

        def values(seq: int) -> tuple[int | None, int]:
            (port, *_) = reader.collect(node="n", seq=seq, now=float(seq)).ports
            return port.tx_bytes, port.hw_counters["out_of_buffer"]

        # In place (what sysfs does): seen at once. Replaced atomically (a new inode): the
        # held descriptor still reads the old file until the reader rediscovers.
        assert values(2) == (400, 0)
        reader.rediscover()
        assert values(3) == (400, 3)
