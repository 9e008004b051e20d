"""The lab's extra RDMA device kinds (agent/lab/rdmakinds.py): the sysfs layout of Data
Direct functions, sub-functions and RoCE LAG bonds, and the spec checks that guard them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.host import vpd
from agent.lab.render import render
from agent.lab.spec import SpecError, load_builtin, parse_spec

BUILTIN = Path(__file__).parents[4] / "agent/lab/specs/cx8-dd-lag.yaml"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cx8")
    render(load_builtin("cx8-dd-lag"), root)
    return root


def test_data_direct_function_below_the_gpu_root(tree: Path) -> None:
    fn = tree / "devices/pci0000:1a/0000:1a:01.0/0000:1b:00.0"
    assert (fn / "vendor").read_text() == "0x15b3\n"
    assert (fn / "device").read_text() == "0x2100\n"
    assert os.readlink(fn / "driver").endswith("bus/pci/drivers/mlx5_data_direct")
    assert (tree / "bus/pci/devices/0000:1b:00.0").resolve() == fn.resolve()
    keywords = vpd.read_only_keywords((fn / "vpd").read_bytes())
    assert (keywords["SN"], keywords["VU"]) == ("MT2440X00001", "3b1f0a2c-card-a")
    assert not (fn / "infiniband").exists()


def test_sub_function_is_an_auxiliary_device_of_its_pf(tree: Path) -> None:
    aux = tree / "devices/pci0000:25/0000:25:01.0/0000:26:00.0/mlx5_core.sf.2"
    assert (aux / "sfnum").read_text() == "88\n"
    assert (tree / "bus/auxiliary/devices/mlx5_core.sf.2").resolve() == aux.resolve()
    assert (tree / "class/infiniband/mlx5_5/device").resolve() == aux.resolve()


def test_bond_master_and_lowers(tree: Path) -> None:
    master = tree / "devices/virtual/net/bond0"
    pf0 = tree / "devices/pci0000:15/0000:15:01.0/0000:16:00.0"
    pf1 = tree / "devices/pci0000:15/0000:15:01.0/0000:16:00.1"
    assert (master / "bonding/slaves").read_text() == "enp22s0f0np0 enp22s0f1np1\n"
    assert (master / "lower_enp22s0f1np1").resolve() == (pf1 / "net/enp22s0f1np1").resolve()
    assert (pf0 / "net/enp22s0f0np0/master").resolve() == master.resolve()
    assert (tree / "class/infiniband/mlx5_bond_0/device").resolve() == pf0.resolve()
    assert not (tree / "class/infiniband/mlx5_1").exists()
    assert not (tree / "class/infiniband/mlx5_2").exists()  # the second PF has none


def broken(edit: Any) -> bytes:
    doc = msgspec.yaml.decode(BUILTIN.read_bytes())
    edit(doc)
    return msgspec.yaml.encode(doc)


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        pytest.param(
            lambda d: d["data_direct"][0].update(parent="0000:99:01.0"),
            "$.data_direct[0].parent",
            id="dd-parent",
        ),
        pytest.param(
            lambda d: d["data_direct"][0].update(address="0000:16:00.0"),
            "$.data_direct[0].address",
            id="dd-address",
        ),
        pytest.param(
            lambda d: d["bonds"][0]["members"].append("0000:99:00.0"),
            "$.bonds[0].members[2]",
            id="bond-member",
        ),
        pytest.param(
            lambda d: d["adapters"][0]["sub_functions"][0].update(name="mlx5_1"),
            "$.adapters[0].sub_functions[0].name",
            id="sf-name",
        ),
    ],
)
def test_spec_checks(edit: Any, path: str) -> None:
    with pytest.raises(SpecError) as caught:
        parse_spec(broken(edit))
    assert caught.value.path == path
