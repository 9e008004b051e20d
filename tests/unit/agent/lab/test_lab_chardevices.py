"""Every built-in lab spec renders the RDMA char devices a real host has — uverbsN per RDMA
device, umadN/issmN per port, the node-wide rdma_cm misc device — in the layout the agent's
char-device reader (agent/host/devices.py) and the trace's char-devices link expect."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.errors import ReadErrorLog
from agent.host.devices import CHAR_DEVICE_CLASSES, RDMA_CM_CLASS, RDMA_CM_DEVICE, char_devices
from agent.host.inventory import collect_snapshot
from agent.host.sysfs import Sysfs
from agent.lab import hotplug, rdmakinds
from agent.lab.layout import plan
from agent.lab.nodespec import NodeSpec
from agent.lab.render import render
from agent.lab.spec import builtin_specs, load_builtin

MISC = "devices/virtual/misc/rdma_cm"


@pytest.fixture(scope="module", params=builtin_specs())
def rendered(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[NodeSpec, Path]:
    spec = load_builtin(str(request.param))
    root = tmp_path_factory.mktemp(spec.name)
    render(spec, root)
    return spec, root


@pytest.fixture
def tree(rendered: tuple[NodeSpec, Path]) -> Path:
    return rendered[1]


# (path, content or link target): the kernel's files, as ucma.c / misc.c write them.
@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param(f"{MISC}/dev", "10:58\n", id="misc-devt"),
        pytest.param(f"{MISC}/abi_version", "4\n", id="ucm-abi"),
        pytest.param(
            f"{MISC}/uevent",
            "MAJOR=10\nMINOR=58\nDEVNAME=infiniband/rdma_cm\nDEVMODE=0666\n",
            id="uevent-nodename",
        ),
        pytest.param("class/misc/rdma_cm", "-> ../../devices/virtual/misc/rdma_cm", id="class"),
        pytest.param(f"{MISC}/subsystem", "-> ../../../../class/misc", id="subsystem"),
        pytest.param("class/infiniband_verbs/abi_version", "6\n", id="verbs-abi"),
        pytest.param("class/infiniband_mad/abi_version", "5\n", id="mad-abi"),
    ],
)
def test_rdma_cm_and_class_files(tree: Path, path: str, expected: str) -> None:
    if expected.startswith("-> "):
        assert os.readlink(tree / path) == expected[3:]
    else:
        assert (tree / path).read_text() == expected


def test_every_device_has_its_char_devices_and_rdma_cm(rendered: tuple[NodeSpec, Path]) -> None:
    spec, tree = rendered
    devices = rdmakinds.rdma_devices(spec, plan(spec))  # bonds and SFs too
    found = char_devices(Sysfs(tree), errors := ReadErrorLog())
    assert errors.to_tuple() == ()
    assert found.shared == [RDMA_CM_DEVICE]
    assert sorted(found.by_ibdev) == sorted(d.name for d in devices)
    for device in devices:
        names = [p.removeprefix("/dev/infiniband/") for p in found.of(device.name)]
        ports = len(device.ports)
        assert sum(n.startswith("uverbs") for n in names) == 1, names
        assert sum(n.startswith("umad") for n in names) == ports, names
        assert sum(n.startswith("issm") for n in names) == ports, names
        assert "rdma_cm" in names
    for cls in CHAR_DEVICE_CLASSES:
        for entry in os.listdir(tree / "class" / cls):
            if entry != "abi_version":  # every device entry is a link into its function
                assert (tree / "class" / cls / entry).is_symlink()
    assert (tree / RDMA_CM_CLASS).resolve().is_relative_to(tree.resolve())


def test_snapshot_reports_rdma_cm_on_every_device(tree: Path) -> None:
    snap = collect_snapshot(Sysfs(tree), node="lab", seq=1, now=0.0, agent_version="test")
    assert snap.devices
    assert all(RDMA_CM_DEVICE in d.char_devices for d in snap.devices)


def test_device_remove_keeps_the_node_wide_rdma_cm(tmp_path: Path) -> None:
    render(load_builtin("a100-ib-4nic"), tmp_path)
    hotplug.device_remove(tmp_path, "mlx5_0")
    found = char_devices(Sysfs(tmp_path), ReadErrorLog())
    assert "mlx5_0" not in found.by_ibdev
    assert RDMA_CM_DEVICE in found.of("mlx5_1")
    assert (tmp_path / RDMA_CM_CLASS).is_symlink()
