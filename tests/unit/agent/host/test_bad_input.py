"""Garbage in any sysfs file: recorded per file, the rest of the snapshot intact, nothing
raised. One small healthy tree, one corruption per case, compared with the clean
snapshot: the corrupted path carries an error and every other device is unchanged."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from proto.inventory import Device, NodeSnapshot
from tests.support.sysfs_trees import BlockingSysfs, attrs, link, released, write

SWITCH = "devices/pci0000:00/0000:00:01.0/0000:02:00.0"
NIC = f"{SWITCH}/0000:03:01.0/0000:05:00.0"
GPU = f"{SWITCH}/0000:03:00.0/0000:04:00.0"
OTHER = "devices/pci0000:00/0000:00:02.0/0000:06:00.0"
IB0 = f"{NIC}/infiniband/mlx5_0"
PORT = f"{IB0}/ports/1"


def _function(root: Path, directory: str, **values: str) -> None:
    base = {"vendor": "0x15b3", "device": "0x1021", "subsystem_vendor": "0x15b3",
            "subsystem_device": "0x0000", "class": "0x020700", "revision": "0x00",
            "numa_node": "0", "local_cpulist": "0-7", "current_link_speed": "32.0 GT/s PCIe",
            "current_link_width": "16", "max_link_speed": "32.0 GT/s PCIe",
            "max_link_width": "16"}  # fmt: skip
    attrs(root, directory, **(base | values))
    (root / "bus/pci/drivers/mlx5_core").mkdir(parents=True, exist_ok=True)
    depth = directory.count("/") + 1
    link(root, f"{directory}/driver", "../" * depth + "bus/pci/drivers/mlx5_core")
    link(root, f"bus/pci/devices/{directory.rsplit('/', 1)[-1]}", f"../../../{directory}")


def _rdma(root: Path, fn: str, name: str, netdev: str) -> None:
    ib = f"{fn}/infiniband/{name}"
    attrs(root, ib, fw_ver="28.41.1000", board_id="MT_0000000838", hca_type="MT4129",
          hw_rev="0", node_guid="58a2:e103:001b:2576", sys_image_guid="58a2:e103:001b:2576",
          node_type="1: CA")  # fmt: skip
    link(root, f"{ib}/device", "../../../" + fn.rsplit("/", 1)[-1])
    link(root, f"class/infiniband/{name}", f"../../{ib}")
    port = f"{ib}/ports/1"
    attrs(root, port, state="4: ACTIVE", phys_state="5: LinkUp", rate="400 Gb/sec (4X NDR)",
          link_layer="InfiniBand", lid="0x11f", sm_lid="0x400", lid_mask_count="0",
          cap_mask="0xa751e848")  # fmt: skip
    attrs(root, f"{port}/counters", port_xmit_data="10", port_rcv_data="20", symbol_error="0")
    attrs(root, f"{port}/hw_counters", out_of_buffer="1")
    attrs(root, f"{port}/gids", **{"0": "fe80:0000:0000:0000:58a2:e103:001b:2576"})
    attrs(root, f"{port}/gid_attrs/types", **{"0": "IB/RoCE v1"})
    attrs(root, f"{port}/pkeys", **{"0": "0xffff"})
    address = "00:00:10:49:fe:80:00:00:00:00:00:00:58:a2:e1:03:00:1b:25:76"
    attrs(root, f"{fn}/net/{netdev}", mtu="4092", operstate="up", carrier="1", type="32",
          address=address, dev_port="0")  # fmt: skip
    link(root, f"class/net/{netdev}", f"../../{fn}/net/{netdev}")


def _acs_config(control: int) -> bytes:
    buf = bytearray(4096)
    buf[0x100:0x104] = (0x000D | 1 << 16).to_bytes(4, "little")
    buf[0x106:0x108] = control.to_bytes(2, "little")
    return bytes(buf)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    for bridge in ("devices/pci0000:00/0000:00:01.0", "devices/pci0000:00/0000:00:02.0", SWITCH,
                   f"{SWITCH}/0000:03:00.0", f"{SWITCH}/0000:03:01.0"):  # fmt: skip
        _function(root, bridge, vendor="0x1000", device="0xc030", **{"class": "0x060400"})
        write(root, f"{bridge}/config", _acs_config(0))
    _function(root, NIC)
    _function(root, GPU, vendor="0x10de", device="0x2330", **{"class": "0x030200"})
    _function(root, OTHER)
    _rdma(root, NIC, "mlx5_0", "ib0")
    _rdma(root, OTHER, "mlx5_1", "ib1")
    attrs(root, "module/mlx5_core", version="24.04-0.7.0")
    return root


def _snapshot(sysfs: Sysfs, timeout: float | None = 5.0) -> NodeSnapshot:
    return collect_snapshot(sysfs, node="bad", seq=1, now=0.0, agent_version="t", timeout=timeout)


def _device(snap: NodeSnapshot, name: str) -> Device:
    return next(d for d in snap.devices if d.name == name)


def test_the_clean_tree_is_clean(root: Path) -> None:
    snap = _snapshot(Sysfs(root))
    assert [d.name for d in snap.devices] == ["mlx5_0", "mlx5_1"]
    assert snap.errors == ()
    assert all(d.errors == () for d in snap.devices)
    assert [(r.nic, r.relation) for r in snap.gpu_nic_topology] == [
        ("mlx5_0", "PIX"), ("mlx5_1", "PHB"),
    ]  # fmt: skip


def _replace(rel: str, content: str | bytes) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / rel).unlink()
        write(root, rel, content)

    return apply


def _directory(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / rel).unlink()
        (root / rel).mkdir()

    return apply


def _dangling(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        if (root / rel).is_dir() and not (root / rel).is_symlink():
            shutil.rmtree(root / rel)
        else:
            (root / rel).unlink()
        (root / rel).symlink_to("../nowhere")

    return apply


def _fifo(rel: str) -> Callable[[Path], None]:
    def apply(root: Path) -> None:
        (root / rel).unlink()
        os.mkfifo(root / rel)

    return apply


C = "/class/infiniband/mlx5_0"
CASES = [
    pytest.param(_replace(f"{PORT}/counters/symbol_error", "lots\n"),
                 f"{C}/ports/1/counters/symbol_error", "unparsable: 'lots'",
                 id="non-numeric-counter"),
    pytest.param(_replace(f"{PORT}/counters/symbol_error", ""),
                 f"{C}/ports/1/counters/symbol_error", "empty", id="empty-counter"),
    pytest.param(_replace(f"{PORT}/hw_counters/out_of_buffer", b"\x7fELF\x02\x01\x00\x00"),
                 f"{C}/ports/1/hw_counters/out_of_buffer", "unparsable:", id="binary-counter"),
    pytest.param(_replace(f"{IB0}/fw_ver", b"\x00\x9c\xff junk \x1b[2J"),
                 f"{C}/fw_ver", "unparsable:", id="binary-fw-ver"),
    pytest.param(_replace(f"{IB0}/fw_ver", "\n"), f"{C}/fw_ver", "empty", id="empty-fw-ver"),
    pytest.param(_replace(f"{IB0}/board_id", "x" * 1_048_576), f"{C}/board_id", "EFBIG",
                 id="one-megabyte-file"),
    pytest.param(_replace(f"{PORT}/counters/port_xmit_data", "9" * 100),
                 f"{C}/ports/1/counters/port_xmit_data", "EFBIG",
                 id="counter-longer-than-any-counter"),
    pytest.param(_directory(f"{PORT}/state"), f"{C}/ports/1/state", "EISDIR",
                 id="directory-where-a-file-should-be"),
    pytest.param(_dangling(f"{IB0}/hca_type"), f"{C}/hca_type", "ELOOP",
                 id="link-where-a-file-should-be"),
    pytest.param(_dangling(f"{IB0}/device"), f"{C}/device", "ENOENT", id="dangling-device-link"),
    pytest.param(_dangling(f"{NIC}/net/ib0"), f"{C}/device/net/ib0", "ENOENT",
                 id="dangling-netdev"),
    pytest.param(_fifo(f"{PORT}/phys_state"), f"{C}/ports/1/phys_state", "not a regular file",
                 id="fifo-attribute"),
    pytest.param(_fifo(f"{PORT}/counters/port_rcv_data"), f"{C}/ports/1/counters/port_rcv_data",
                 "not a regular file", id="fifo-counter"),
    pytest.param(_replace(f"{PORT}/rate", "fast\n"), f"{C}/ports/1/rate", "unparsable: 'fast'",
                 id="garbled-rate"),
    pytest.param(_replace(f"{PORT}/gids/0", "fe80::1\n"), f"{C}/ports/1/gids/0",
                 "unparsable: 'fe80::1'", id="garbled-gid"),
    pytest.param(_replace(f"{NIC}/numa_node", "-7\n"), f"{C}/device/numa_node",
                 "unparsable: '-7'", id="garbled-numa-node"),
    pytest.param(_replace(f"{NIC}/net/ib0/mtu", "jumbo\n"), "/class/net/ib0/mtu",
                 "unparsable: 'jumbo'", id="garbled-mtu"),
    pytest.param(_replace(f"{NIC}/max_link_width", "٨\n"), f"{C}/device/max_link_width",
                 "unparsable: '٨'", id="non-ascii-digit"),
]  # fmt: skip


@pytest.mark.parametrize(("corrupt", "path", "error"), CASES)
def test_corrupt_file_is_one_recorded_error(
    root: Path, corrupt: Callable[[Path], None], path: str, error: str
) -> None:
    clean = _snapshot(Sysfs(root))
    corrupt(root)
    snap = _snapshot(Sysfs(root))
    bad = _device(snap, "mlx5_0")
    recorded = {e.path: e.error for e in bad.errors}
    assert recorded[path].startswith(error)
    assert _device(snap, "mlx5_1") == _device(clean, "mlx5_1")
    assert (snap.gpus, snap.modules, snap.platform) == (clean.gpus, clean.modules, clean.platform)
    if "/ports/" in path:  # everything outside the port is unaffected
        assert (bad.fw_ver, bad.pcie, bad.interfaces) == (
            _device(clean, "mlx5_0").fw_ver, _device(clean, "mlx5_0").pcie,
            _device(clean, "mlx5_0").interfaces,
        )  # fmt: skip
    if "/counters/" in path:  # the other counters of the port still read, none invented
        name = path.rsplit("/", 1)[-1]
        port, clean_port = bad.ports[0], _device(clean, "mlx5_0").ports[0]
        assert {**port.counters, **port.hw_counters} == {
            k: v for k, v in {**clean_port.counters, **clean_port.hw_counters}.items() if k != name
        }


def test_unreadable_device_directory_hides_no_other_device(root: Path) -> None:
    (root / "class/infiniband/mlx5_0").unlink()
    (root / "class/infiniband/mlx5_0").symlink_to("../../devices/gone")
    snap = _snapshot(Sysfs(root))
    assert [d.name for d in snap.devices] == ["mlx5_0", "mlx5_1"]
    assert _device(snap, "mlx5_0").errors[0].error == "ENOENT"
    assert _device(snap, "mlx5_1").errors == ()


@pytest.mark.parametrize(
    ("corrupt", "path", "error"),
    [
        pytest.param(_replace(f"{SWITCH}/0000:03:01.0/config", os.urandom(40)),
                     "/devices/pci0000:00/0000:00:01.0/0000:02:00.0/0000:03:01.0/config",
                     "unparsable: only 40 bytes", id="junk-config-space"),
        pytest.param(_replace(f"{SWITCH}/0000:03:00.0/config", bytes(64)),
                     "/devices/pci0000:00/0000:00:01.0/0000:02:00.0/0000:03:00.0/config",
                     "extended config space not readable: needs CAP_SYS_ADMIN",
                     id="unprivileged-config-read"),
        pytest.param(_replace("module/mlx5_core/version", b"\xff\xfe"),
                     "/module/mlx5_core/version", "unparsable:", id="binary-module-version"),
        pytest.param(_replace(f"{GPU}/class", "3d\n"), "/bus/pci/devices/0000:04:00.0/class",
                     "unparsable: '3d'", id="garbled-gpu-class"),
    ],
)  # fmt: skip
def test_corrupt_host_file_is_one_host_error(
    root: Path, corrupt: Callable[[Path], None], path: str, error: str
) -> None:
    clean = _snapshot(Sysfs(root))
    corrupt(root)
    snap = _snapshot(Sysfs(root))
    assert [(e.path, e.error[: len(error)]) for e in snap.errors] == [(path, error)]
    assert snap.devices == clean.devices


def test_class_directory_that_is_a_file(root: Path) -> None:
    for name in ("mlx5_0", "mlx5_1"):
        (root / "class/infiniband" / name).unlink()
    (root / "class/infiniband").rmdir()
    write(root, "class/infiniband", "not a directory\n")
    snap = _snapshot(Sysfs(root))
    assert snap.devices == ()
    assert [(e.path, e.error) for e in snap.errors] == [("/class/infiniband", "ENOTDIR")]
    assert len(snap.gpus) == 1


def test_non_numeric_port_directory_is_ignored(root: Path) -> None:
    (root / PORT).parent.joinpath("junk").mkdir()
    assert [p.port for p in _device(_snapshot(Sysfs(root)), "mlx5_0").ports] == [1]


def test_a_read_that_blocks_costs_one_error(root: Path) -> None:
    with released(BlockingSysfs(root, "/mlx5_0/ports/1/rate")) as sysfs:
        snap = _snapshot(sysfs, timeout=1.0)  # the retry without the hung file must fit
        assert sysfs.entered.is_set()
    bad = _device(snap, "mlx5_0")
    assert [(e.path, e.error) for e in bad.errors] == [(f"{C}/ports/1/rate", "ETIMEDOUT")]
    assert (bad.ports[0].rate_gbps, bad.ports[0].state) == (None, "ACTIVE")
    assert _device(snap, "mlx5_1").ports[0].rate_gbps == 400.0
    assert len(snap.gpu_nic_topology) == 2


def test_reads_that_all_block_still_give_a_snapshot(root: Path) -> None:
    with released(BlockingSysfs(root, "")) as sysfs:
        snap = _snapshot(sysfs, timeout=0.05)
    assert (snap.node, snap.devices) == ("bad", ())
    assert [e.error for e in snap.errors] == ["ETIMEDOUT"]
