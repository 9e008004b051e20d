"""Port states for the change-detection poll: read afresh, or from held descriptors that
notice devices coming and going."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import get_args

import pytest

from agent.host.portstates import PortStateReader, collect_port_states
from agent.host.sysfs import Sysfs
from agent.lab.faults import port_down, port_up
from agent.lab.nodespec import PhysState, PortState
from agent.lab.render import render
from agent.lab.spec import load_builtin
from proto.ibta import PHYS_STATES, PORT_STATES
from tests.support.sysfs_trees import BlockingSysfs, attrs, link, released, write


def _device(root: Path, name: str, fn: str, ports: dict[int, tuple[str, str]]) -> None:
    ib = f"devices/pci0000:00/0000:00:01.0/{fn}/infiniband/{name}"
    for number, (state, phys) in ports.items():
        attrs(root, f"{ib}/ports/{number}", state=state, phys_state=phys)
    link(root, f"class/infiniband/{name}", f"../../{ib}")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    root = tmp_path / "sys"
    _device(root, "mlx5_0", "0000:3b:00.0", {1: ("4: ACTIVE", "5: LinkUp")})
    _device(root, "mlx4_0", "0000:5e:00.0", {1: ("4: ACTIVE", "5: LinkUp"),
                                             2: ("1: DOWN", "3: Disabled")})  # fmt: skip
    return root


EXPECTED = {
    ("mlx4_0", 1): ("ACTIVE", "LinkUp"),
    ("mlx4_0", 2): ("DOWN", "Disabled"),
    ("mlx5_0", 1): ("ACTIVE", "LinkUp"),
}


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_fresh_and_held_reads_agree(root: Path) -> None:
    assert collect_port_states(Sysfs(root)) == EXPECTED
    with PortStateReader(Sysfs(root)) as reader:
        assert reader.collect() == EXPECTED
        assert list(reader.collect()) == list(EXPECTED)  # natural device order


def test_held_descriptors_see_in_place_changes_without_reopening(root: Path) -> None:
    state = root / "devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband/mlx5_0/ports/1"
    with PortStateReader(Sysfs(root)) as reader:
        reader.collect()
        held = _fds()
        with open(state / "state", "r+") as f:
            f.write("1: DOWN  ")  # sysfs rewrites in place; pad over the old text
        with open(state / "phys_state", "r+") as f:
            f.write("2: Polling")
        assert reader.collect()[("mlx5_0", 1)] == ("DOWN", "Polling")
        assert _fds() == held
    assert _fds() == held - 6


def test_devices_coming_and_going_are_noticed(root: Path) -> None:
    with PortStateReader(Sysfs(root)) as reader:
        reader.collect()
        _device(root, "mlx5_1", "0000:7f:00.0", {1: ("2: INIT", "5: LinkUp")})
        assert reader.collect()[("mlx5_1", 1)] == ("INIT", "LinkUp")
        (root / "class/infiniband/mlx4_0").unlink()
        assert set(reader.collect()) == {("mlx5_0", 1), ("mlx5_1", 1)}


class GoneSysfs(Sysfs):
    """On kernfs a held attribute of a removed device reads ENODEV; an ordinary
    filesystem keeps serving the old inode, so this fake says it for `removed` inodes."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.removed: set[int] = set()

    def _pread(self, fd: int, path: str, size: int) -> bytes:
        if os.fstat(fd).st_ino in self.removed:
            raise OSError(errno.ENODEV, "No such device")
        return super()._pread(fd, path, size)


def test_a_device_replaced_under_the_same_name_is_reread(root: Path) -> None:
    sysfs = GoneSysfs(root)
    old = root / "devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband/mlx5_0/ports/1"
    with PortStateReader(sysfs) as reader:
        reader.collect()
        # Unbound and bound again: same name, new directory, the old files are gone.
        sysfs.removed = {(old / name).stat().st_ino for name in ("state", "phys_state")}
        (root / "class/infiniband/mlx5_0").unlink()
        _device(root, "mlx5_0", "0000:3c:00.0", {1: ("1: DOWN", "2: Polling")})
        assert reader.collect()[("mlx5_0", 1)] == ("DOWN", "Polling")


def test_garbage_reads_as_unknown(root: Path) -> None:
    port = "devices/pci0000:00/0000:00:01.0/0000:3b:00.0/infiniband/mlx5_0/ports/1"
    (root / port / "state").unlink()
    write(root, f"{port}/state", b"\xff\x00junk")
    os.unlink(root / port / "phys_state")
    os.mkfifo(root / port / "phys_state")
    expected = EXPECTED | {("mlx5_0", 1): ("UNKNOWN", None)}
    assert collect_port_states(Sysfs(root)) == expected
    with PortStateReader(Sysfs(root)) as reader:
        assert reader.collect() == expected


def test_a_hung_state_read_is_bounded(root: Path) -> None:
    with released(BlockingSysfs(root, "/mlx4_0/ports/2/state")) as sysfs:
        states = collect_port_states(sysfs, timeout=1.0)  # the retry must fit, even stalled
    assert states == EXPECTED | {("mlx4_0", 2): ("UNKNOWN", "Disabled")}


def test_reader_sees_a_file_replaced_by_a_new_inode(tmp_path: Path) -> None:
    # Lab faults replace files atomically (new inode); a held descriptor must not keep
    # reading the old one.
    root = tmp_path / "node"
    render(load_builtin("h100-ib-12nic"), root)
    with PortStateReader(Sysfs(root)) as reader:
        assert reader.collect()[("mlx5_0", 1)] == ("ACTIVE", "LinkUp")
        port_down(root, "mlx5_0", 1, atomic=True)
        assert reader.collect()[("mlx5_0", 1)] == ("DOWN", "Disabled")
        port_up(root, "mlx5_0", 1, atomic=True)
        assert reader.collect()[("mlx5_0", 1)] == ("ACTIVE", "LinkUp")


def test_the_lab_spec_names_exactly_the_ibta_states() -> None:
    """The lab renders `state`/`phys_state` numbers from proto.ibta: every name a spec may
    use has a number there, and the table has no state a spec cannot express."""
    assert set(get_args(PortState)) == set(PORT_STATES)
    assert set(get_args(PhysState)) == set(PHYS_STATES)
