"""NodeSnapshot.nic_functions: every Mellanox network function on the bus, with an RDMA
device or not — so the aggregator can tell an unregistered RDMA device (function still
there) from an adapter that fell off the bus. Read from rendered lab trees."""

from __future__ import annotations

import os
from pathlib import Path

from agent.errors import ReadErrorLog
from agent.host.inventory import collect_snapshot
from agent.host.pci import BUS_DEVICES, find_nic_functions
from agent.host.sysfs import Sysfs
from agent.lab import hotplug
from agent.lab.render import render
from agent.lab.spec import load_builtin


def test_every_adapters_function_is_listed_and_stays_when_its_rdma_device_goes(
    tmp_path: Path,
) -> None:
    render(load_builtin("a100-ib-4nic"), tmp_path)
    before = collect_snapshot(Sysfs(tmp_path), node="lab", seq=1, now=0.0, agent_version="t")
    addresses = {d.pci_address for d in before.devices}
    assert before.nic_functions is not None and addresses <= set(before.nic_functions)
    assert not {g.pci_address for g in before.gpus} & set(before.nic_functions)  # GPUs: no
    gone = next(d for d in before.devices if d.name == "mlx5_0")
    hotplug.device_remove(tmp_path, "mlx5_0")
    after = collect_snapshot(Sysfs(tmp_path), node="lab", seq=2, now=1.0, agent_version="t")
    assert "mlx5_0" not in {d.name for d in after.devices}
    assert after.nic_functions == before.nic_functions
    assert gone.pci_address in after.nic_functions


def test_a_function_gone_from_the_bus_is_not_listed(tmp_path: Path) -> None:
    render(load_builtin("a100-ib-4nic"), tmp_path)
    listed = find_nic_functions(Sysfs(tmp_path), ReadErrorLog())
    assert listed
    os.unlink(tmp_path / BUS_DEVICES / listed[0])  # as a surprise removal leaves the bus
    assert find_nic_functions(Sysfs(tmp_path), ReadErrorLog()) == listed[1:]


def test_no_bus_is_not_reported_rather_than_empty(tmp_path: Path) -> None:
    (tmp_path / "class").mkdir()  # a sysfs root without bus/ (a container's partial mount)
    errors = ReadErrorLog()
    assert find_nic_functions(Sysfs(tmp_path), errors) is None
    assert not errors.to_tuple()  # ENOENT: no PCI bus in this tree, not a read failure
