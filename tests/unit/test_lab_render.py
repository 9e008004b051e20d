"""The renderer writes the kernel's files byte for byte, links them the way sysfs does,
refuses to clobber directories, and is deterministic; plus the `lab render`/`list` CLI."""

from __future__ import annotations

import json
import os
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
from agent.lab.spec import load_builtin, with_node_name

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


def test_every_link_is_relative_and_resolves_inside_the_tree(h100: Path) -> None:
    links = 0
    for dirpath, dirnames, filenames in os.walk(h100):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path.is_symlink():
                links += 1
                assert not os.readlink(path).startswith("/"), path
                assert path.exists(), f"{path} dangles"
                assert path.resolve().is_relative_to(h100.resolve()), path
    assert links > 300


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
            out[rel] = "-> " + os.readlink(path) if path.is_symlink() else path.read_text()
    return out


def test_render_is_deterministic(tmp_path: Path) -> None:
    spec = load_builtin("a100-ib-4nic")
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
        pytest.param([], "error: give exactly one of --spec FILE or --builtin NAME", id="none"),
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
    assert names == ["a100-ib-4nic", "h100-ib-12nic", "roce-cx6dx", "roce-cx6dx-2"]
    text = CliRunner().invoke(lab, ["list"]).stdout
    assert text.splitlines()[1].startswith("h100-ib-12nic  8x H100 SXM5")
