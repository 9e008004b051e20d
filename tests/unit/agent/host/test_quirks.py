"""One row per quirk the captured trees hold on purpose (fixtures README, "Quirks"), read
in place from the real captures: what real kernels do, and what nicfleet makes of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.errors import ReadErrorLog, ReadFailed
from agent.host.inventory import collect_snapshot
from agent.host.pci import function_of
from agent.host.sysfs import Sysfs
from proto.inventory import Device, NodeSnapshot, Port
from tests.support.sysfs_trees import NODE_EXPORTER_SYS, PROCFS_SYS, materialize

I40IW_PORT = NODE_EXPORTER_SYS / "class/infiniband/i40iw0/ports/1"
I40IW_COUNTERS = sorted(p.name for p in (I40IW_PORT / "counters").iterdir())


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    ne = materialize(NODE_EXPORTER_SYS, tmp_path_factory.mktemp("ne") / "sys")
    return {"procfs": PROCFS_SYS, "node_exporter": ne}


@pytest.fixture(scope="module")
def snapshots(trees: dict[str, Path]) -> dict[str, NodeSnapshot]:
    return {
        name: collect_snapshot(Sysfs(root), node="q", seq=1, now=0.0, agent_version="t")
        for name, root in trees.items()
    }


def _dev(snap: NodeSnapshot, name: str) -> Device:
    return next(d for d in snap.devices if d.name == name)


def _port(snap: NodeSnapshot, name: str, number: int) -> Port:
    return next(p for p in _dev(snap, name).ports if p.port == number)


QUIRKS: list[Any] = [
    pytest.param(
        "procfs", lambda s: _port(s, "mlx4_0", 2).link_layer, "InfiniBand",
        id="link-layer-with-blank-second-line",
    ),
    pytest.param(
        "procfs", lambda s: _dev(s, "mlx5_0").node_guid, "0a7f:bc12:45ef:d23b",
        id="node-guid-without-trailing-newline",
    ),
    pytest.param(
        "node_exporter", lambda s: _port(s, "i40iw0", 1).counters, {},
        id="no-pma-counters-are-not-zero-filled",
    ),
    pytest.param(
        "node_exporter",
        lambda s: [(e.path.rsplit("/", 1)[-1], e.error) for e in _dev(s, "i40iw0").errors
                   if "/counters/" in e.path],
        [(name, "N/A (no PMA)") for name in I40IW_COUNTERS],
        id="no-pma-counters-are-each-recorded",
    ),
    pytest.param(
        "node_exporter", lambda s: _port(s, "i40iw0", 1).rx_bytes, None,
        id="no-pma-means-no-byte-count",
    ),
    pytest.param(
        "node_exporter", lambda s: _port(s, "mlx4_0", 1).counters["port_xmit_wait"], 4294967295,
        id="saturated-32-bit-xmit-wait-kept-as-read",
    ),
    pytest.param(
        "node_exporter", lambda s: sorted(_port(s, "mlx4_0", 2).counters),
        ["link_downed", "link_error_recovery", "multicast_rcv_packets", "multicast_xmit_packets",
         "port_rcv_data", "port_xmit_data", "unicast_rcv_packets", "unicast_xmit_packets"],
        id="port-with-only-8-counter-files",
    ),
    pytest.param(
        "node_exporter",
        lambda s: (lambda p: (p.rate_gbps, p.rate_lanes, p.rate_speed))(_port(s, "i40iw0", 1)),
        (10.0, 4, None), id="old-kernel-rate-without-speed-name",
    ),
    pytest.param(
        "procfs", lambda s: (_port(s, "mlx5_0", 1).phys_state_id, _port(s, "mlx5_0", 1).phys_state),
        (4, "ACTIVE"), id="mlx5-phys-state-outside-the-ibta-names",
    ),
    pytest.param(
        "procfs", lambda s: _port(s, "hfi1_0", 1).lid, None,
        id="missing-attribute-is-null-not-zero",
    ),
]  # fmt: skip


@pytest.mark.parametrize(("tree", "get", "expected"), QUIRKS)
def test_quirk(
    snapshots: dict[str, NodeSnapshot], tree: str, get: Callable[[NodeSnapshot], Any], expected: Any
) -> None:
    assert get(snapshots[tree]) == expected


@pytest.mark.parametrize(
    ("address", "link"),
    [
        pytest.param("0000:00:02.1", "driver", id="bridge-driver"),
        pytest.param("0000:01:00.0", "driver", id="nvme-driver"),
        pytest.param("0000:45:00.0", "driver", id="nic-driver"),
        pytest.param("0000:00:02.1", "iommu", id="bridge-iommu"),
        pytest.param("0000:45:00.0", "iommu", id="nic-iommu"),
        pytest.param("0000:45:00.0", "net/ens10f0/subsystem", id="netdev-subsystem"),
        pytest.param("0000:01:00.0", "iommu_group", id="nvme-iommu-group"),
    ],
)
def test_dangling_links_read_as_absent(trees: dict[str, Path], address: str, link: str) -> None:
    directory = Sysfs(trees["node_exporter"]).dir(f"bus/pci/devices/{address}")
    parent, _, name = link.rpartition("/")
    with pytest.raises(ReadFailed) as info:
        (directory.child(parent) if parent else directory).link_name(name)
    assert info.value.error == "ENOENT"
    # What the snapshot makes of it: the function is still described, without a driver.
    log = ReadErrorLog()
    fn = function_of(directory, log)
    assert fn is not None
    assert (fn.address, fn.driver) == (address, None)
    assert log.get(f"/bus/pci/devices/{address}/driver") == "ENOENT"


def test_numa_node_minus_one_is_null(trees: dict[str, Path]) -> None:
    fn = function_of(
        Sysfs(trees["node_exporter"]).dir("bus/pci/devices/0000:00:02.1"), ReadErrorLog()
    )
    assert fn is not None
    assert fn.numa_node is None
