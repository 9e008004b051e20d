"""Device kinds beyond PF/VF as the agent reads them: VPD keywords (pure parser), and on
the cx8-dd-lag lab node the sub-function, RoCE LAG bond and Data Direct functions."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.host import vpd
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab.rdmakinds import vpd_image
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.inventory import NodeSnapshot

IMAGE = vpd_image("ConnectX-8", {"PN": "900-9X81Q", "SN": "MT2440X00001", "VU": "vu-a"})


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(IMAGE, {"PN": "900-9X81Q", "SN": "MT2440X00001", "VU": "vu-a"}, id="full"),
        pytest.param(b"", {}, id="empty"),
        pytest.param(IMAGE[:20], {}, id="torn-in-vpd-r"),
        pytest.param(b"\x82\x02\x00ab\x78", {}, id="no-vpd-r"),
        pytest.param(b"\x90\x08\x00SN\x03AB\x00RV\x00", {"SN": "AB"}, id="nul-padded"),
        pytest.param(b"\x90\x06\x00\xff\xfe\x01xRV", {}, id="garbage-keyword"),
        pytest.param(b"\x82\xff", {}, id="short-header"),
    ],
)
def test_read_only_keywords(data: bytes, expected: dict[str, str]) -> None:
    assert vpd.read_only_keywords(data) == expected


def test_build_checksums_to_zero() -> None:
    rv_end = IMAGE.index(b"RV\x01") + 4  # through the checksum byte
    assert sum(IMAGE[:rv_end]) % 256 == 0
    assert IMAGE.endswith(b"\x78")


@pytest.fixture(scope="module")
def cx8(tmp_path_factory: pytest.TempPathFactory) -> NodeSnapshot:
    root: Path = tmp_path_factory.mktemp("cx8")
    render(load_builtin("cx8-dd-lag"), root)
    return collect_snapshot(Sysfs(root), node="cx8", seq=1, now=0.0, agent_version="t")


def test_lab_node_kinds_are_in_the_snapshot(cx8: NodeSnapshot) -> None:
    by_name = {d.name: d for d in cx8.devices}
    assert sorted(by_name) == ["mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_bond_0"]
    sf = by_name["mlx5_5"]
    assert (sf.auxiliary_device, sf.sf_number, sf.pci_address) == (
        "mlx5_core.sf.2",
        88,
        "0000:26:00.0",
    )
    bond = by_name["mlx5_bond_0"]
    assert bond.lag_functions == ("0000:16:00.0", "0000:16:00.1")
    assert bond.pci_address == "0000:16:00.0"
    assert by_name["mlx5_3"].sriov is not None and by_name["mlx5_3"].sriov.physfn == "0000:26:00.0"
    assert (by_name["mlx5_0"].vpd_serial, by_name["mlx5_0"].vpd_vuid) == (
        "MT2440X00002",
        "3b1f0a2c-card-b",
    )
    assert [(f.pci_address, f.pci_path[0], f.driver, f.vpd_vuid) for f in cx8.data_direct] == [
        ("0000:1b:00.0", "pci0000:1a", "mlx5_data_direct", "3b1f0a2c-card-a"),
        ("0000:2b:00.0", "pci0000:2a", "mlx5_data_direct", "3b1f0a2c-card-b"),
    ]
    assert all(d.errors == () for d in cx8.devices), [d.errors for d in cx8.devices]
    assert cx8.errors == ()


def test_nodes_without_data_direct_read_no_vpd(tmp_path: Path) -> None:
    render(load_builtin("roce-cx6dx"), tmp_path)
    snap = collect_snapshot(Sysfs(tmp_path), node="n", seq=1, now=0.0, agent_version="t")
    assert snap.data_direct == ()
    assert all(d.vpd_serial is None and d.auxiliary_device is None for d in snap.devices)
    assert all(d.lag_functions == () for d in snap.devices)
