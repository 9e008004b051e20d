"""The renderer writes the kernel's files byte for byte, links them the way sysfs does,
refuses to clobber directories, and is deterministic; IOMMU, SR-IOV, module and counter
layouts; plus the `lab render`/`list` CLI."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.lab.cli import lab
from agent.lab.render import (
    MARKER,
    RenderError,
    cpulist_text,
    cpumask_text,
    rate_text,
    render,
)
from agent.lab.spec import load_builtin, parse_spec, with_node_name

MLX5_0 = "devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"


@pytest.fixture(scope="module")
def h100(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("h100")
    render(load_builtin("h100-ib-12nic"), root, overwrite=True)
    return root


@pytest.fixture(scope="module")
def roce(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("roce")
    render(load_builtin("roce-cx6dx"), root, overwrite=True)
    return root


@pytest.fixture(scope="module")
def acs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("acs")
    render(load_builtin("h100-iommu-acs"), root)
    return root


IB = "class/infiniband"


@pytest.mark.parametrize(
    ("path", "content"),
    [
        pytest.param(f"{IB}/mlx5_0/ports/1/state", "4: ACTIVE\n", id="state-active"),
        pytest.param(f"{IB}/mlx5_0/ports/1/phys_state", "5: LinkUp\n", id="phys-linkup"),
        pytest.param(f"{IB}/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)\n", id="rate-ndr"),
        pytest.param(f"{IB}/mlx5_0/ports/1/link_layer", "InfiniBand\n", id="link-layer-ib"),
        pytest.param(f"{IB}/mlx5_0/ports/1/lid", "0x11f\n", id="lid-287-hex"),
        pytest.param(f"{IB}/mlx5_0/ports/1/sm_lid", "0x400\n", id="sm-lid-1024-hex"),
        pytest.param(f"{IB}/mlx5_0/ports/1/lid_mask_count", "0\n", id="lmc"),
        pytest.param(f"{IB}/mlx5_0/ports/1/cap_mask", "0xa751e848\n", id="cap-mask-cx7"),
        pytest.param(
            f"{IB}/mlx5_0/ports/1/gids/0",
            "fe80:0000:0000:0000:58a2:e103:001b:2576\n",
            id="ib-gid-from-guid",
        ),
        pytest.param(f"{IB}/mlx5_0/ports/1/gid_attrs/types/0", "IB/RoCE v1\n", id="ib-gid-type"),
        pytest.param(f"{IB}/mlx5_0/ports/1/pkeys/0", "0xffff\n", id="default-pkey"),
        pytest.param(f"{IB}/mlx5_0/ports/1/counters/port_xmit_data", "0\n", id="counter"),
        pytest.param(f"{IB}/mlx5_0/ports/1/hw_counters/lifespan", "10\n", id="lifespan"),
        pytest.param(f"{IB}/mlx5_0/node_guid", "58a2:e103:001b:2576\n", id="node-guid"),
        pytest.param(f"{IB}/mlx5_0/sys_image_guid", "58a2:e103:001b:2576\n", id="image-guid"),
        pytest.param(f"{IB}/mlx5_0/node_type", "1: CA\n", id="node-type"),
        pytest.param(f"{IB}/mlx5_0/fw_ver", "28.41.1000\n", id="fw"),
        pytest.param(f"{IB}/mlx5_0/hca_type", "MT4129\n", id="hca-type-cx7"),
        pytest.param(f"{IB}/mlx5_0/board_id", "MT_0000000838\n", id="board-id"),
        pytest.param(f"{IB}/mlx5_0/hw_rev", "0\n", id="hw-rev"),
        pytest.param(f"{IB}/mlx5_0/node_desc", "h100-ib-12nic mlx5_0\n", id="node-desc"),
        pytest.param(f"{IB}/mlx5_2/node_guid", "58a2:e103:0059:2a0d\n", id="second-function"),
        pytest.param(
            f"{IB}/mlx5_2/sys_image_guid", "58a2:e103:0059:2a0c\n", id="shared-image-guid"
        ),
        pytest.param(f"{IB}/mlx5_1/hca_type", "MT4125\n", id="hca-type-cx6dx"),
        pytest.param(f"{IB}/mlx5_1/ports/1/state", "1: DOWN\n", id="state-down"),
        pytest.param(f"{IB}/mlx5_1/ports/1/phys_state", "3: Disabled\n", id="phys-disabled"),
        pytest.param(f"{IB}/mlx5_1/ports/1/rate", "40 Gb/sec (4X QDR)\n", id="down-roce-rate"),
        pytest.param(f"{IB}/mlx5_1/ports/1/link_layer", "Ethernet\n", id="link-layer-eth"),
        pytest.param(f"{IB}/mlx5_1/ports/1/lid", "0x0\n", id="roce-lid-zero"),
        pytest.param(f"{IB}/mlx5_1/ports/1/cap_mask", "0x00010000\n", id="cap-mask-roce"),
        pytest.param(f"{IB}/mlx5_7/ports/1/rate", "100 Gb/sec (4X EDR)\n", id="rate-100g"),
        pytest.param("bus/pci/devices/0000:19:00.0/vendor", "0x15b3\n", id="nic-vendor"),
        pytest.param("bus/pci/devices/0000:19:00.0/device", "0x1021\n", id="cx7-device-id"),
        pytest.param("bus/pci/devices/0000:19:00.0/class", "0x020700\n", id="ib-class"),
        pytest.param("bus/pci/devices/0000:19:00.0/numa_node", "0\n", id="numa-0"),
        pytest.param("bus/pci/devices/0000:19:00.0/local_cpulist", "4,6,8,10,12\n", id="cpus"),
        pytest.param("bus/pci/devices/0000:19:00.0/local_cpus", "1550\n", id="cpumask"),
        pytest.param(
            "bus/pci/devices/0000:19:00.0/current_link_speed", "32.0 GT/s PCIe\n", id="gen5"
        ),
        pytest.param("bus/pci/devices/0000:19:00.0/current_link_width", "16\n", id="x16"),
        pytest.param(
            "bus/pci/devices/0000:19:00.0/max_link_speed", "32.0 GT/s PCIe\n", id="max-gen5"
        ),
        pytest.param("bus/pci/devices/0000:19:00.0/max_link_width", "16\n", id="max-x16"),
        pytest.param("bus/pci/devices/0000:1a:00.1/device", "0x101d\n", id="cx6dx-device-id"),
        pytest.param("bus/pci/devices/0000:1a:00.1/class", "0x020000\n", id="eth-class"),
        pytest.param(
            "bus/pci/devices/0000:1a:00.1/current_link_speed", "16.0 GT/s PCIe\n", id="gen4"
        ),
        pytest.param("bus/pci/devices/0000:ce:00.0/numa_node", "1\n", id="numa-1"),
        pytest.param("bus/pci/devices/0000:ce:00.0/local_cpus", "0aaa\n", id="cpumask-1"),
        pytest.param("bus/pci/devices/0000:18:00.0/vendor", "0x10de\n", id="gpu-vendor"),
        pytest.param("bus/pci/devices/0000:18:00.0/device", "0x2330\n", id="h100-device-id"),
        pytest.param("bus/pci/devices/0000:18:00.0/class", "0x030200\n", id="3d-controller"),
        pytest.param("bus/pci/devices/0000:16:00.0/class", "0x060400\n", id="bridge-class"),
        pytest.param("bus/pci/devices/0000:16:00.0/vendor", "0x1000\n", id="switch-vendor"),
        pytest.param("bus/pci/devices/0000:16:00.0/device", "0xc030\n", id="switch-device"),
        pytest.param("bus/pci/devices/0000:19:00.0/revision", "0x00\n", id="revision"),
        pytest.param("bus/pci/devices/0000:15:01.0/device", "0x352a\n", id="root-port"),
        pytest.param(
            "bus/pci/devices/0000:17:02.0/current_link_speed", "16.0 GT/s PCIe\n", id="dsp-gen4"
        ),
        pytest.param(
            "bus/pci/devices/0000:17:02.0/max_link_speed", "32.0 GT/s PCIe\n", id="dsp-max-gen5"
        ),
        pytest.param("class/net/ib0/type", "32\n", id="ipoib-arphrd"),
        pytest.param("class/net/ib0/mtu", "4092\n", id="ipoib-mtu"),
        pytest.param("class/net/ib0/operstate", "up\n", id="ipoib-up"),
        pytest.param("class/net/ib0/carrier", "1\n", id="ipoib-carrier"),
        pytest.param(
            "class/net/ib0/address",
            "00:00:10:49:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1b:25:76\n",
            id="ipoib-hwaddr",
        ),
        pytest.param("class/net/ib0/dev_port", "0\n", id="dev-port"),
        pytest.param("class/net/ib0/dev_id", "0x0\n", id="dev-id"),
        pytest.param("class/net/ib0/ifindex", "2\n", id="first-ifindex"),
        pytest.param("class/net/enp26s0f0np0/type", "1\n", id="ether-arphrd"),
        pytest.param("class/net/enp26s0f0np0/operstate", "down\n", id="eth-down"),
        pytest.param("class/net/enp26s0f0np0/carrier", "0\n", id="eth-no-carrier"),
        pytest.param("class/net/enp26s0f0np0/address", "58:a2:e1:59:2a:0c\n", id="mac-from-guid"),
        pytest.param("class/infiniband_verbs/uverbs0/ibdev", "mlx5_0\n", id="uverbs-ibdev"),
        pytest.param("class/infiniband_verbs/uverbs11/dev", "231:203\n", id="uverbs-devt"),
        pytest.param("class/infiniband_mad/umad3/ibdev", "mlx5_3\n", id="umad-ibdev"),
        pytest.param("class/infiniband_mad/umad3/dev", "231:3\n", id="umad-devt"),
        pytest.param("class/infiniband_mad/issm3/dev", "231:67\n", id="issm-devt"),
        pytest.param("class/infiniband_mad/umad3/port", "1\n", id="umad-port"),
        pytest.param("module/mlx5_core/version", "24.04-0.7.0\n", id="ofed-version"),
        pytest.param("module/nvidia_peermem/initstate", "live\n", id="peermem"),
        pytest.param("devices/system/node/node0/cpulist", "4,6,8,10,12\n", id="numa0-cpus"),
        pytest.param("devices/system/node/node1/cpulist", "1,3,5,7,9,11\n", id="numa1-cpus"),
        pytest.param("devices/system/node/online", "0-1\n", id="numa-online"),
    ],
)
def test_h100_file_contents_are_kernel_exact(h100: Path, path: str, content: str) -> None:
    assert (h100 / path).read_bytes() == content.encode()


@pytest.mark.parametrize(
    ("path", "target"),
    [
        pytest.param("bus/pci/devices/0000:19:00.0", f"../../../{MLX5_0}", id="bus-device"),
        pytest.param(
            f"{MLX5_0}/driver", "../../../../../../bus/pci/drivers/mlx5_core", id="driver"
        ),
        pytest.param(
            "bus/pci/drivers/mlx5_core/0000:19:00.0", f"../../../../{MLX5_0}", id="driver-back"
        ),
        pytest.param(f"{IB}/mlx5_0", f"../../{MLX5_0}/infiniband/mlx5_0", id="class-infiniband"),
        # Like the kernel: a link to an ancestor goes one level above it and back down.
        pytest.param(f"{MLX5_0}/infiniband/mlx5_0/device", "../../../0000:19:00.0", id="ib-dev"),
        pytest.param("class/net/ib0", f"../../{MLX5_0}/net/ib0", id="class-net"),
        pytest.param(f"{MLX5_0}/net/ib0/device", "../../../0000:19:00.0", id="net-device"),
        pytest.param(
            "class/infiniband_verbs/uverbs0",
            f"../../{MLX5_0}/infiniband_verbs/uverbs0",
            id="class-uverbs",
        ),
    ],
)
def test_links_are_relative_like_the_kernels(h100: Path, path: str, target: str) -> None:
    assert os.readlink(h100 / path) == target


@pytest.mark.parametrize("tree", ["h100", "acs"])
def test_every_link_is_relative_and_resolves_inside_the_tree(
    tree: str, request: pytest.FixtureRequest
) -> None:
    root: Path = request.getfixturevalue(tree)
    links = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                links += 1
                assert not os.readlink(path).startswith("/"), path
                assert path.exists(), f"{path} dangles"
                assert path.resolve().is_relative_to(root.resolve()), path
    assert links > 100


def test_h100_inventory_shape(h100: Path) -> None:
    assert sorted(os.listdir(h100 / IB), key=lambda n: int(n.split("_")[1])) == [
        f"mlx5_{i}" for i in range(12)
    ]
    pci = h100 / "bus/pci/devices"
    gpus = [a for a in os.listdir(pci) if (pci / a / "vendor").read_text() == "0x10de\n"]
    assert len(gpus) == 8
    ib_port = h100 / IB / "mlx5_0/ports/1"
    assert len(os.listdir(ib_port / "counters")) == 21  # the mlx5 PMA set (procfs fixture)
    assert "rp_cnp_handled" not in os.listdir(ib_port / "hw_counters")
    assert "rp_cnp_handled" in os.listdir(h100 / IB / "mlx5_7/ports/1/hw_counters")
    # an IB GID has no netdev: the kernel's read fails, the renderer leaves it absent
    assert os.listdir(ib_port / "gid_attrs/ndevs") == []
    assert (h100 / IB / "mlx5_0/device/net/ib0").is_dir()
    assert json.loads((h100 / MARKER).read_text()) == {"node": "h100-ib-12nic", "format": 1}


def test_roce_gid_table(roce: Path) -> None:
    port = roce / IB / "mlx5_0/ports/1"
    gids = [(port / "gids" / str(i)).read_text() for i in range(4)]
    types = [(port / "gid_attrs/types" / str(i)).read_text() for i in range(4)]
    ndevs = {(port / "gid_attrs/ndevs" / str(i)).read_text() for i in range(4)}
    link_local = "fe80:0000:0000:0000:0e42:a1ff:fee1:7f40\n"  # EUI-64 of 0c:42:a1:e1:7f:40
    mapped = "0000:0000:0000:0000:0000:ffff:0a0a:000b\n"  # ::ffff:10.10.0.11
    assert gids == [link_local, link_local, mapped, mapped]
    assert types == ["IB/RoCE v1\n", "RoCE v2\n"] * 2
    assert ndevs == {"enp26s0f0np0\n"}
    assert not (port / "gids/4").exists()
    assert (roce / "class/net/enp26s0f0np0/mtu").read_text() == "9000\n"
    assert not (roce / "module/mlx5_core/version").exists()  # inbox driver: no version file
    assert (roce / "module/mlx5_core/initstate").read_text() == "live\n"


def test_roce_cpumasks_span_all_words(roce: Path) -> None:
    nic0 = roce / "bus/pci/devices/0000:1a:00.0/local_cpus"
    nic1 = roce / "bus/pci/devices/0000:cc:00.0/local_cpus"
    assert nic0.read_text() == "00000000,ffffffff,00000000,ffffffff\n"
    assert nic1.read_text() == "ffffffff,00000000,ffffffff,00000000\n"


@pytest.mark.parametrize(
    ("rate", "text"),
    [
        pytest.param("4X NDR", "400 Gb/sec (4X NDR)", id="ndr"),
        pytest.param("1X SDR", "2.5 Gb/sec (1X SDR)", id="half-gigabit"),
        pytest.param("1X EDR", "25 Gb/sec (1X EDR)", id="procfs-fixture"),
        pytest.param("4X QDR", "40 Gb/sec (4X QDR)", id="qdr"),
        pytest.param("4X FDR", "56 Gb/sec (4X FDR)", id="fdr"),
        pytest.param("4X FDR10", "40 Gb/sec (4X FDR10)", id="fdr10"),
        pytest.param("2X NDR", "200 Gb/sec (2X NDR)", id="2x"),
        pytest.param("12X HDR", "600 Gb/sec (12X HDR)", id="12x"),
    ],
)
def test_rate_text(rate: str, text: str) -> None:
    assert rate_text(rate) == text


@pytest.mark.parametrize(
    ("cpus", "nbits", "text"),
    [
        pytest.param(list(range(16)), 16, "ffff", id="short-leading-word"),
        pytest.param([4, 6, 8, 10, 12], 13, "1550", id="13-bits"),
        pytest.param([0], 33, "0,00000001", id="one-bit-over"),
        pytest.param(
            [*range(64), *range(128, 192)],
            256,
            "00000000,00000000,ffffffff,ffffffff,00000000,00000000,ffffffff,ffffffff",
            id="node-exporter-fixture",
        ),
    ],
)
def test_cpumask_text(cpus: list[int], nbits: int, text: str) -> None:
    assert cpumask_text(cpus, nbits) == text


@pytest.mark.parametrize(
    ("cpus", "text"),
    [
        pytest.param([0, 1, 2, 3, 8, 10, 11], "0-3,8,10-11", id="mixed"),
        pytest.param([4, 6, 8], "4,6,8", id="singles"),
        pytest.param([*range(64), *range(128, 192)], "0-63,128-191", id="node-exporter"),
    ],
)
def test_cpulist_text(cpus: list[int], text: str) -> None:
    assert cpulist_text(cpus) == text


def _snapshot(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            out[rel] = "-> " + os.readlink(path) if path.is_symlink() else path.read_bytes().hex()
    return out


@pytest.mark.parametrize("name", ["a100-ib-4nic", "h100-iommu-acs"])
def test_render_is_deterministic(tmp_path: Path, name: str) -> None:
    spec = load_builtin(name)
    render(spec, tmp_path / "a")
    render(spec, tmp_path / "b")
    assert _snapshot(tmp_path / "a") == _snapshot(tmp_path / "b")


def test_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RenderError, match="not empty"):
        render(load_builtin("roce-cx6dx-2"), tmp_path)
    with pytest.raises(RenderError, match="not a lab tree"):
        render(load_builtin("roce-cx6dx-2"), tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_refuses_a_file_as_root(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(RenderError, match="not a directory"):
        render(load_builtin("roce-cx6dx-2"), tmp_path / "file")


def test_overwrite_replaces_a_previous_lab_tree(tmp_path: Path) -> None:
    render(load_builtin("a100-ib-4nic"), tmp_path)
    render(load_builtin("roce-cx6dx-2"), tmp_path, overwrite=True)
    assert sorted(os.listdir(tmp_path / IB)) == ["mlx5_0", "mlx5_1"]
    assert not (tmp_path / "class/net/ib0").exists()


def test_node_name_override_reaches_node_desc(tmp_path: Path) -> None:
    render(with_node_name(load_builtin("roce-cx6dx"), "gpu-roce-01"), tmp_path)
    assert (tmp_path / IB / "mlx5_3/node_desc").read_text() == "gpu-roce-01 mlx5_3\n"
    assert json.loads((tmp_path / MARKER).read_text())["node"] == "gpu-roce-01"


def test_cli_render_json_and_text(tmp_path: Path) -> None:
    runner = CliRunner()
    args = ["render", "--builtin", "roce-cx6dx", "--out", str(tmp_path / "t")]
    done = runner.invoke(lab, [*args, "--node-name", "gpu-roce-02", "-o", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {
        "node": "gpu-roce-02",
        "root": str(tmp_path / "t"),
        "gpus": 2,
        "adapters": 4,
        "netdevs": 4,
    }
    done = runner.invoke(lab, [*args, "--overwrite"])
    assert done.exit_code == 0
    assert done.stdout.startswith("rendered roce-cx6dx into ")


def test_cli_render_from_a_spec_file(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text("name: x\nnuma_nodes: {0: '0'}\nhost_bridges: [{name: pci0000:00}]\n")
    done = CliRunner().invoke(lab, ["render", "--spec", str(spec), "--out", str(tmp_path / "t")])
    assert done.exit_code == 0, done.output
    assert (tmp_path / "t/devices/system/node/node0/cpulist").read_text() == "0\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--builtin", "nope"], "error: builtin:nope: $: no built-in spec", id="name"),
        pytest.param([], "error: give exactly one of --spec FILE, --builtin NAME or", id="none"),
        pytest.param(
            ["--builtin", "roce-cx6dx", "--synthetic", "2"], "error: give exactly one", id="two"
        ),
        pytest.param(
            ["--builtin", "roce-cx6dx", "--node-name", "Bad_Name"],
            "error: --node-name: $.name: node name 'Bad_Name'",
            id="node-name",
        ),
    ],
)
def test_cli_render_bad_input_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    done = CliRunner().invoke(lab, ["render", *args, "--out", str(tmp_path / "t")])
    assert done.exit_code == 2
    assert done.stderr.startswith(message)
    assert "Traceback" not in done.output


def test_cli_render_malformed_spec_file_exits_2(tmp_path: Path) -> None:
    spec = tmp_path / "node.yaml"
    spec.write_text("name: x\nnuma_nodes: {0: '0'}\nhost_bridges: [{name: pci0000:0}]\n")
    done = CliRunner().invoke(lab, ["render", "--spec", str(spec), "--out", str(tmp_path / "t")])
    assert done.exit_code == 2
    assert done.stderr.startswith(f"error: {spec}: $.host_bridges[0].name: Expected `str` matching")


def test_cli_render_refuses_non_empty_out(tmp_path: Path) -> None:
    (tmp_path / "keep").write_text("")
    done = CliRunner().invoke(lab, ["render", "--builtin", "roce-cx6dx", "--out", str(tmp_path)])
    assert done.exit_code == 2
    assert "directory is not empty" in done.stderr


def test_cli_list() -> None:
    done = CliRunner().invoke(lab, ["list", "-o", "json"])
    assert done.exit_code == 0
    names = [item["name"] for item in json.loads(done.stdout)]
    assert names == [
        "a100-ib-4nic",
        "cx8-dd-lag",
        "h100-ib-12nic",
        "h100-iommu-acs",
        "roce-cx6dx",
        "roce-cx6dx-2",
    ]
    text = CliRunner().invoke(lab, ["list"]).stdout
    assert text.splitlines()[2].startswith("h100-ib-12nic   8x H100 SXM5")


# --- IOMMU -------------------------------------------------------------------------------


def test_iommu_absent_leaves_empty_class_and_groups(h100: Path) -> None:
    assert os.listdir(h100 / "class/iommu") == []
    assert os.listdir(h100 / "kernel/iommu_groups") == []
    assert not (h100 / "bus/pci/devices/0000:19:00.0/iommu_group").exists()


def test_iommu_present_with_dmar_units_and_groups(acs: Path) -> None:
    assert sorted(os.listdir(acs / "class/iommu")) == ["dmar0", "dmar1"]
    assert os.readlink(acs / "class/iommu/dmar0") == "../../devices/virtual/iommu/dmar0"
    assert (acs / "class/iommu/dmar1/intel-iommu/version").read_text() == "1:0\n"
    nic0 = acs / "bus/pci/devices/0000:19:00.0"
    assert os.readlink(nic0 / "iommu") == "../../../../../virtual/iommu/dmar0"
    group = nic0 / "iommu_group"
    assert os.readlink(group).startswith("../../../../../../kernel/iommu_groups/")
    assert os.listdir(group / "devices") == ["0000:19:00.0"]  # ACS isolates it
    assert (group / "type").read_text() == "DMA-FQ\n"
    # Socket 1 has ACS off below its switch: the NIC shares its downstream port's group.
    nic1_group = acs / "bus/pci/devices/0000:9b:00.0/iommu_group/devices"
    assert sorted(os.listdir(nic1_group)) == ["0000:99:01.0", "0000:9b:00.0"]
    assert (acs / "class/iommu/dmar1/devices/0000:9b:00.0").resolve() == (
        acs / "bus/pci/devices/0000:9b:00.0"
    ).resolve()


# --- SR-IOV ------------------------------------------------------------------------------


def test_sriov_pf_attributes(acs: Path) -> None:
    pf = acs / "bus/pci/devices/0000:19:00.0"
    values = {n: (pf / n).read_text() for n in os.listdir(pf) if n.startswith("sriov_")}
    assert values == {
        "sriov_totalvfs": "8\n",
        "sriov_numvfs": "2\n",
        "sriov_offset": "1\n",
        "sriov_stride": "1\n",
        "sriov_vf_device": "101e\n",  # bare hex, as pci/iov.c prints it
        "sriov_drivers_autoprobe": "1\n",
    }
    assert not (acs / "bus/pci/devices/0000:9b:00.0/sriov_totalvfs").exists()


def test_sriov_links_resolve_both_ways(acs: Path) -> None:
    pf = acs / "bus/pci/devices/0000:19:00.0"
    vfs = sorted(n for n in os.listdir(pf) if n.startswith("virtfn"))
    assert vfs == ["virtfn0", "virtfn1"]
    for n, name in enumerate(vfs):
        assert os.readlink(pf / name) == f"../0000:19:00.{n + 1}"
        vf = (pf / name).resolve()
        assert os.readlink(vf / "physfn") == "../0000:19:00.0"
        assert (vf / "physfn").resolve() == pf.resolve()
        assert (acs / "bus/pci/devices" / vf.name).resolve() == vf


def test_vf_files(acs: Path) -> None:
    vf = acs / "bus/pci/devices/0000:19:00.1"
    files = {n: (vf / n).read_text() for n in ("vendor", "device", "class", "numa_node")}
    assert files == {"vendor": "0x15b3\n", "device": "0x101e\n", "class": "0x020700\n",
                     "numa_node": "0\n"}  # fmt: skip
    # A VF has no link of its own: the kernel reads zeros and prints Unknown / 0.
    assert (vf / "current_link_speed").read_text() == "Unknown\n"
    assert (vf / "max_link_width").read_text() == "0\n"
    assert os.readlink(vf / "driver").endswith("bus/pci/drivers/mlx5_core")


def test_vf_rdma_devices_follow_the_pfs(acs: Path) -> None:
    assert sorted(os.listdir(acs / IB)) == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    vf = acs / IB / "mlx5_2"
    assert vf.resolve().parent.parent.name == "0000:19:00.1"
    assert (vf / "hca_type").read_text() == "MT4126\n"
    assert (vf / "node_guid").read_text() == "946d:ae03:012b:1c40\n"
    assert (vf / "sys_image_guid").read_text() == "946d:ae03:002b:1c40\n"
    assert (vf / "ports/1/state").read_text() == "4: ACTIVE\n"
    assert not (vf / "device/net").exists()
    assert (acs / "class/infiniband_verbs/uverbs3/ibdev").read_text() == "mlx5_3\n"


def test_cli_counts_vf_rdma_devices(tmp_path: Path) -> None:
    args = ["render", "--builtin", "h100-iommu-acs", "--out", str(tmp_path), "-o", "json"]
    assert json.loads(CliRunner().invoke(lab, args).stdout)["adapters"] == 4


# --- modules and counters ----------------------------------------------------------------


def test_every_module_has_a_srcversion(h100: Path, roce: Path) -> None:
    for root in (h100, roce):
        for module in os.listdir(root / "module"):
            text = (root / "module" / module / "srcversion").read_text()
            assert re.fullmatch(r"[0-9A-F]{23}\n", text), (module, text)
    assert (h100 / "module/mlx5_core/srcversion").read_text() != (
        h100 / "module/mlx5_ib/srcversion"
    ).read_text()


MINI = """
name: mini
numa_nodes: {0: "0-3"}
modules:
  nv_peer_mem: {version: "1.3-0", srcversion: "0123456789ABCDEF0123456"}
  ib_core: {srcversion: null}
host_bridges: [{name: "pci0000:00", root_ports: ["0000:00:01.0"]}]
adapters:
  - name: mlx5_0
    model: ConnectX-6
    address: "0000:01:00.0"
    parent: "0000:00:01.0"
    node_guid: "0x0002c90300a1b2c0"
    fw_ver: "20.39.1002"
    board_id: MT_0000000223
    counters_ext: true
    ports:
      - rate: 4X HDR
        counters: {port_xmit_data: 4294967295}
        counters_ext: {port_xmit_data_64: 8589934592}
        hw_counter_names: []
"""


def test_module_options(tmp_path: Path) -> None:
    render(parse_spec(MINI), tmp_path)
    legacy = tmp_path / "module/nv_peer_mem"
    assert (legacy / "version").read_text() == "1.3-0\n"
    assert (legacy / "srcversion").read_text() == "0123456789ABCDEF0123456\n"
    # Every loaded module has `taint`; an in-tree one's is empty, MLNX_OFED's "O". ib_core
    # has its netns_mode parameter (rdma_netns_mode, default shared).
    assert sorted(os.listdir(tmp_path / "module/ib_core")) == ["initstate", "parameters", "taint"]
    assert (tmp_path / "module/ib_core/taint").read_text() == "\n"
    assert (legacy / "taint").read_text() == "O\n"


def test_legacy_counter_layout(tmp_path: Path) -> None:
    render(parse_spec(MINI), tmp_path)
    port = tmp_path / IB / "mlx5_0/ports/1"
    counters = sorted(os.listdir(port / "counters"))
    assert len(counters) == 17 and "unicast_xmit_packets" not in counters
    assert sorted(os.listdir(port / "counters_ext")) == [
        "port_multicast_rcv_packets", "port_multicast_xmit_packets", "port_rcv_data_64",
        "port_rcv_packets_64", "port_unicast_rcv_packets", "port_unicast_xmit_packets",
        "port_xmit_data_64", "port_xmit_packets_64",
    ]  # fmt: skip
    assert (port / "counters/port_xmit_data").read_text() == "4294967295\n"
    assert (port / "counters_ext/port_xmit_data_64").read_text() == "8589934592\n"
    assert not (port / "hw_counters").exists()  # an empty set renders no directory


def test_modern_layout_has_no_counters_ext(h100: Path) -> None:
    assert not (h100 / IB / "mlx5_0/ports/1/counters_ext").exists()


# --- synthetic ---------------------------------------------------------------------------


def test_cli_render_synthetic(tmp_path: Path) -> None:
    args = ["render", "--synthetic", "3", "--ports", "2", "--gpus", "2", "--out", str(tmp_path)]
    done = CliRunner().invoke(lab, [*args, "--hw-counters", "10", "-o", "json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout) == {
        "node": "synthetic-3", "root": str(tmp_path), "gpus": 2, "adapters": 6, "netdevs": 6,
    }  # fmt: skip
    port = tmp_path / IB / "mlx5_5/ports/1"
    assert len(os.listdir(port / "counters")) == 21
    assert len(os.listdir(port / "hw_counters")) == 10
    assert (port / "hw_counters/lifespan").read_text() == "10\n"


def test_cli_render_synthetic_refuses_invented_counters(tmp_path: Path) -> None:
    args = ["render", "--synthetic", "2", "--counters", "25", "--out", str(tmp_path)]
    done = CliRunner().invoke(lab, args)
    assert done.exit_code == 2
    assert "25 is not in the range 0<=x<=21" in done.output
