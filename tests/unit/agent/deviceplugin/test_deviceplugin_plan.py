"""Table tests of the pure device-plugin decisions: health, IDs, topology, Allocate, placement."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import msgspec
import pytest

from agent.deviceplugin.cdi import CDI_VERSION, SPEC_FILE, cdi_spec, write_cdi_spec
from agent.deviceplugin.placement import preferred_allocation
from agent.deviceplugin.plan import (
    HEALTHY,
    NETNS_EXCLUSIVE_REASON,
    UNHEALTHY,
    DeviceNode,
    InvalidRequest,
    PortStates,
    ResourcePlan,
    adapter_health,
    allocation_envs,
    plan_allocation,
    plan_resource,
    validate_ids,
)
from agent.deviceplugin.registration import Backoff, resolve_mode
from agent.deviceplugin.selectors import select_devices
from proto.inventory import Device, Interface, Platform, PortStateName, RdmaNetnsMode
from proto.messages.config import Selectors
from tests.support.dpfakes import node, rdma_device, resource

UP: tuple[PortStateName, str | None] = ("ACTIVE", "LinkUp")
DOWN: tuple[PortStateName, str | None] = ("DOWN", "Disabled")


def _plan(*devices: Device, states: PortStates | None = None, **kwargs: object) -> ResourcePlan:
    topology = bool(kwargs.pop("topology", True))
    rc = resource(**kwargs)  # type: ignore[arg-type]
    snap = node(*devices)
    return plan_resource(rc, select_devices(snap, rc), snap, states or {}, topology=topology)


@pytest.mark.parametrize(
    ("device", "states", "healthy", "reason"),
    [
        pytest.param(rdma_device("mlx5_0", 0), {}, True, None, id="active-linkup"),
        pytest.param(
            rdma_device("mlx5_0", 0, ports=[DOWN]), {}, False,
            "no port ACTIVE/LinkUp (1:DOWN/Disabled)", id="port-down",
        ),
        pytest.param(
            rdma_device("mlx5_0", 0), {("mlx5_0", 1): DOWN}, False,
            "no port ACTIVE/LinkUp (1:DOWN/Disabled)", id="poll-says-down",
        ),
        pytest.param(
            rdma_device("mlx5_0", 0, ports=[DOWN]), {("mlx5_0", 1): UP}, True, None,
            id="poll-says-recovered",
        ),
        pytest.param(
            rdma_device("mlx5_0", 0, ports=[("ACTIVE", None)]), {}, True, None, id="phys-unknown"
        ),
        pytest.param(
            rdma_device("mlx5_0", 0, ports=[("ACTIVE", "Polling")]), {}, False,
            "no port ACTIVE/LinkUp (1:ACTIVE/Polling)", id="active-but-polling",
        ),
        pytest.param(
            rdma_device("mlx5_0", 0, ports=[("ACTIVE_DEFER", "LinkUp")]), {}, True, None,
            id="active-defer",
        ),
        pytest.param(
            rdma_device("mlx5_0", 0, ports=[DOWN, UP]), {}, True, None, id="one-of-two-ports-up"
        ),
        pytest.param(
            rdma_device("mlx5_0", 0, uverbs=False), {}, False, "no uverbs char device",
            id="no-uverbs",
        ),
        pytest.param(
            rdma_device("mlx5_0", 0), {("mlx5_1", 1): UP}, False, "RDMA device gone",
            id="gone-from-poll",
        ),
        pytest.param(rdma_device("mlx5_0", 0, ports=[]), {}, False, "no ports", id="no-ports"),
        pytest.param(None, {}, False, "not in the snapshot", id="no-device"),
    ],
)  # fmt: skip
def test_adapter_health(
    device: Device | None, states: PortStates, healthy: bool, reason: str | None
) -> None:
    assert adapter_health(device, states) == (healthy, reason)


def test_shared_resource_advertises_rdma_hca_max_slots_healthy_while_any_adapter_is() -> None:
    plan = _plan(
        rdma_device("mlx5_0", 0, numa=0, ports=[DOWN]),
        rdma_device("mlx5_1", 1, numa=1),
        hca_max=3,
    )
    assert [d.id for d in plan.devices] == ["0", "1", "2"]
    assert {d.health for d in plan.devices} == {HEALTHY}
    assert plan.devices[0].numa_nodes == (0, 1)
    assert plan.devices[0].adapters == ("mlx5_0", "mlx5_1")
    assert plan.healthy_count == 3


@pytest.mark.parametrize(
    ("kwargs", "states", "ids", "health", "numa"),
    [
        pytest.param({}, {("mlx5_0", 1): DOWN}, ["0", "1"], UNHEALTHY, (0,), id="all-down"),
        pytest.param({"topology": False}, {}, ["0", "1"], HEALTHY, (), id="no-topology"),
        pytest.param({"hca_max": 0}, {}, [], None, None, id="rdma-hca-max-0"),
        pytest.param({"devices": ["mlx5_9"]}, {}, [], None, None, id="nothing-selected"),
    ],
)
def test_shared_resource_cases(
    kwargs: dict[str, object],
    states: PortStates,
    ids: list[str],
    health: str | None,
    numa: tuple[int, ...] | None,
) -> None:
    plan = _plan(rdma_device("mlx5_0", 0), states=states, **{"hca_max": 2, **kwargs})
    assert [d.id for d in plan.devices] == ids
    if ids:
        assert {d.health for d in plan.devices} == {health}
        assert plan.devices[0].numa_nodes == numa


def test_excluded_and_unmatched_adapters_are_reported_with_reasons() -> None:
    plan = _plan(
        rdma_device("mlx5_0", 0),
        rdma_device("mlx5_1", 1, uverbs=False),
        rdma_device("mlx5_2", 2),
        devices=["mlx5_0", "mlx5_1"],
    )
    assert [a.name for a in plan.adapters] == ["mlx5_0"]
    assert plan.excluded == (("mlx5_1", "no uverbs char device (is ib_uverbs loaded?)"),)
    assert plan.unmatched == (
        ("mlx5_2", "rdmaDevices: RDMA device mlx5_2 not in [mlx5_0, mlx5_1]"),
    )


def test_exclusive_resource_has_one_id_per_adapter_with_its_own_health_and_numa() -> None:
    plan = _plan(
        rdma_device("mlx5_0", 0, numa=0),
        rdma_device("mlx5_1", 1, numa=1, ports=[DOWN]),
        exclusive=True,
    )
    assert [(d.id, d.health, d.numa_nodes) for d in plan.devices] == [
        ("0000:19:00.0", HEALTHY, (0,)),
        ("0000:29:00.0", UNHEALTHY, (1,)),
    ]
    assert plan.healthy_count == 1


def test_shared_allocate_gives_every_adapter_and_rdma_cm_once() -> None:
    plan = _plan(rdma_device("mlx5_0", 0), rdma_device("mlx5_1", 1), hca_max=2)
    allocation = plan_allocation(plan, ["1"], cdi=False)
    assert allocation.device_nodes == tuple(
        DeviceNode(p, p)
        for p in [
            "/dev/infiniband/uverbs0",
            "/dev/infiniband/umad0",
            "/dev/infiniband/issm0",
            "/dev/infiniband/uverbs1",
            "/dev/infiniband/umad1",
            "/dev/infiniband/issm1",
            "/dev/infiniband/rdma_cm",
        ]
    )
    assert {n.permissions for n in allocation.device_nodes} == {"rw"}
    assert dict(allocation.envs) == {
        "NICFLEET_RDMA_DEVICES": "mlx5_0,mlx5_1",
        "NICFLEET_PCI_ADDRESSES": "0000:19:00.0,0000:29:00.0",
        "NICFLEET_NETDEVS": "ib0,ib1",
    }
    assert allocation.cdi_devices == ()


def test_cdi_allocate_names_cdi_devices_instead_of_device_nodes() -> None:
    plan = _plan(rdma_device("mlx5_0", 0), rdma_device("mlx5_1", 1))
    allocation = plan_allocation(plan, ["0"], cdi=True)
    assert allocation.device_nodes == ()
    assert allocation.cdi_devices == ("nicfleet.io/rdma=mlx5_0", "nicfleet.io/rdma=mlx5_1")
    assert dict(allocation.envs) == dict(plan_allocation(plan, ["0"], cdi=False).envs)
    assert dict(allocation.envs)["NICFLEET_PCI_ADDRESSES"] == "0000:19:00.0,0000:29:00.0"


def test_exclusive_allocate_gives_only_the_requested_adapters() -> None:
    plan = _plan(rdma_device("mlx5_0", 0), rdma_device("mlx5_1", 1), exclusive=True)
    allocation = plan_allocation(plan, ["0000:29:00.0"], cdi=False)
    assert [n.host_path for n in allocation.device_nodes] == [
        "/dev/infiniband/uverbs1",
        "/dev/infiniband/umad1",
        "/dev/infiniband/issm1",
        "/dev/infiniband/rdma_cm",
    ]
    assert dict(allocation.envs) == {
        "NICFLEET_RDMA_DEVICES": "mlx5_1",
        "NICFLEET_PCI_ADDRESSES": "0000:29:00.0",
        "NICFLEET_NETDEVS": "ib1",
    }


def test_allocation_envs_leave_out_an_unknown_pci_address() -> None:
    known = _plan(rdma_device("mlx5_0", 0)).adapters[0]
    unknown = dataclasses.replace(known, name="mlx5_9", pci_address=None, netdevs=())
    assert allocation_envs([known, unknown]) == (
        ("NICFLEET_RDMA_DEVICES", "mlx5_0,mlx5_9"),
        ("NICFLEET_PCI_ADDRESSES", "0000:19:00.0"),
        ("NICFLEET_NETDEVS", "ib0"),
    )


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        pytest.param([], "no device IDs", id="empty"),
        pytest.param(["7"], "unknown device ID '7' for rdma/hca_shared", id="unknown"),
        pytest.param(["0", "0"], "device ID '0' listed twice", id="duplicate"),
        pytest.param([str(i) for i in range(10**6)], "1000000 device IDs requested", id="absurd"),
        pytest.param(["x" * 5000], "unknown device ID 'xxxx", id="absurdly-long"),
    ],
)
def test_bad_ids_are_refused_naming_the_id(ids: list[str], message: str) -> None:
    plan = _plan(rdma_device("mlx5_0", 0), hca_max=4)
    with pytest.raises(InvalidRequest, match=message) as info:
        validate_ids(plan, ids, what="Allocate")
    assert len(str(info.value)) < 200


def _h100_like() -> tuple[Device, ...]:
    """Four adapters on NUMA 0 (two of them behind one PCIe switch) and two on NUMA 1."""
    switch = ("pci0000:15", "0000:15:01.0", "0000:16:00.0")
    return (
        rdma_device("mlx5_0", 0, numa=0, chain=(*switch, "0000:17:01.0")),
        rdma_device("mlx5_1", 1, numa=0, chain=(*switch, "0000:17:02.0")),
        rdma_device("mlx5_2", 2, numa=0),
        rdma_device("mlx5_3", 3, numa=0),
        rdma_device("mlx5_4", 4, numa=1),
        rdma_device("mlx5_5", 5, numa=1),
    )


ADDR = {f"mlx5_{i}": f"0000:{0x19 + i * 0x10:02x}:00.0" for i in range(6)}


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        pytest.param(list(ADDR), [], 2, ["mlx5_0", "mlx5_1"], id="same-switch-pair"),
        pytest.param(list(ADDR), ["mlx5_4"], 2, ["mlx5_4", "mlx5_5"], id="anchor-numa"),
        pytest.param(list(ADDR), ["mlx5_1"], 2, ["mlx5_1", "mlx5_0"], id="anchor-switch"),
        pytest.param(
            ["mlx5_0", "mlx5_4", "mlx5_5"], [], 2, ["mlx5_4", "mlx5_5"],
            id="numa-pair-over-split",
        ),
        pytest.param(
            list(ADDR), [], 4, ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"], id="fill-one-numa"
        ),
        pytest.param(list(ADDR), [], 6, list(ADDR), id="everything"),
    ],
)  # fmt: skip
def test_exclusive_preferred_allocation_packs_by_topology(
    available: list[str], must: list[str], size: int, expected: list[str]
) -> None:
    plan = _plan(*_h100_like(), exclusive=True)
    got = preferred_allocation(plan, [ADDR[a] for a in available], [ADDR[a] for a in must], size)
    assert got == tuple(ADDR[a] for a in expected)


def test_shared_preferred_allocation_takes_lowest_slots_after_must_include() -> None:
    plan = _plan(rdma_device("mlx5_0", 0), hca_max=12)
    assert preferred_allocation(plan, ["11", "3", "10", "2"], ["10"], 3) == ("10", "2", "3")


@pytest.mark.parametrize(
    ("available", "must", "size", "message"),
    [
        pytest.param(["0", "1"], [], 0, "allocation_size 0 must be >= 1", id="size-0"),
        pytest.param(["0", "1"], [], 3, "allocation_size 3 exceeds the 2 available", id="too-big"),
        pytest.param(["0", "1"], ["0", "1"], 1, "2 must-include devices", id="must-too-many"),
        pytest.param(["0", "9"], [], 1, "unknown device ID '9'", id="unknown-available"),
        pytest.param([], [], 1, "no device IDs", id="nothing-available"),
    ],
)
def test_preferred_allocation_refuses_bad_requests(
    available: list[str], must: list[str], size: int, message: str
) -> None:
    plan = _plan(rdma_device("mlx5_0", 0), hca_max=4)
    with pytest.raises(InvalidRequest, match=message):
        preferred_allocation(plan, available, must, size)


def test_cdi_spec_has_one_device_per_adapter_and_rdma_cm_once() -> None:
    plan = _plan(rdma_device("mlx5_1", 1), rdma_device("mlx5_0", 0))
    spec = cdi_spec([*plan.adapters, *plan.adapters])
    assert spec["cdiVersion"] == CDI_VERSION
    assert spec["kind"] == "nicfleet.io/rdma"
    assert [d["name"] for d in spec["devices"]] == ["mlx5_0", "mlx5_1"]
    assert spec["devices"][0]["containerEdits"]["deviceNodes"] == [
        {"path": p, "hostPath": p, "permissions": "rw"}
        for p in ["/dev/infiniband/uverbs0", "/dev/infiniband/umad0", "/dev/infiniband/issm0"]
    ]
    assert spec["containerEdits"]["deviceNodes"] == [
        {
            "path": "/dev/infiniband/rdma_cm",
            "hostPath": "/dev/infiniband/rdma_cm",
            "permissions": "rw",
        }
    ]


def test_cdi_spec_is_replaced_atomically(tmp_path: Path) -> None:
    plan = _plan(rdma_device("mlx5_0", 0))
    first = write_cdi_spec(tmp_path / "cdi", cdi_spec(plan.adapters))
    inode = first.stat().st_ino
    second = write_cdi_spec(tmp_path / "cdi", cdi_spec(plan.adapters))
    assert first == second == tmp_path / "cdi" / SPEC_FILE
    assert second.stat().st_ino != inode  # a new file renamed over the old one
    assert json.loads(second.read_text())["devices"][0]["name"] == "mlx5_0"
    assert sorted(p.name for p in (tmp_path / "cdi").iterdir()) == [SPEC_FILE]


@pytest.mark.parametrize(
    ("attempt", "delay"), [(1, 0.2), (2, 0.4), (3, 0.8), (6, 6.4), (7, 10.0), (50, 10.0)]
)
def test_backoff_doubles_and_is_bounded(attempt: int, delay: float) -> None:
    assert Backoff().delay(attempt) == pytest.approx(delay)


@pytest.mark.parametrize(
    ("mode", "exists", "effective"),
    [
        ("auto", True, "watcher"),
        ("auto", False, "legacy"),
        ("legacy", True, "legacy"),
        ("watcher", False, "watcher"),
    ],
)
def test_registration_mode(mode: str, exists: bool, effective: str) -> None:
    assert resolve_mode(mode, registry_exists=exists) == effective  # type: ignore[arg-type]


def test_health_only_counts_the_ports_the_resource_selected() -> None:
    device = rdma_device("mlx5_0", 0, ports=[UP, DOWN])
    device = msgspec.structs.replace(
        device,
        netdevs=("ib0", "ib1"),
        interfaces=(Interface(name="ib0", port=1), Interface(name="ib1", port=2)),
    )
    rc = msgspec.structs.replace(resource(), selectors=Selectors(if_names=("ib1",)))
    snap = node(device)
    plan = plan_resource(rc, select_devices(snap, rc), snap, {})
    assert plan.adapters[0].reason == "no port ACTIVE/LinkUp (2:DOWN/Disabled)"
    assert {d.health for d in plan.devices} == {UNHEALTHY}


@pytest.mark.parametrize(
    ("mode", "exclusive", "healthy", "reason"),
    [
        pytest.param("exclusive", False, 0, True, id="shared-resource-netns-exclusive"),
        pytest.param("exclusive", True, 2, False, id="exclusive-resource-netns-exclusive"),
        pytest.param("shared", False, 2, False, id="shared-resource-netns-shared"),
        pytest.param(None, False, 2, False, id="mode-unknown"),
    ],
)
def test_exclusive_netns_mode_makes_a_shared_resource_unhealthy(
    mode: RdmaNetnsMode | None, exclusive: bool, healthy: int, reason: bool
) -> None:
    # In exclusive netns mode a pod with its own netns gets EPERM on a shared adapter's
    # uverbs: the shared slots stay advertised (capacity), all Unhealthy, with the reason.
    rc = resource(hca_max=2, exclusive=exclusive)
    snap = msgspec.structs.replace(
        node(rdma_device("mlx5_0", 0), rdma_device("mlx5_1", 1)),
        platform=Platform(rdma_netns_mode=mode),
    )
    plan = plan_resource(rc, select_devices(snap, rc), snap, {})
    assert len(plan.devices) == 2
    assert plan.healthy_count == healthy
    assert all(a.healthy for a in plan.adapters)  # the adapters themselves are fine
    assert plan.unhealthy_reason == (NETNS_EXCLUSIVE_REASON if reason else None)
    if reason:
        assert plan.unhealthy_reason is not None
        assert plan.unhealthy_reason.startswith("netns-exclusive: ")


def test_exclusive_netns_mode_with_nothing_selected_gives_no_reason() -> None:
    rc = resource(devices=["mlx5_9"])
    snap = msgspec.structs.replace(
        node(rdma_device("mlx5_0", 0)), platform=Platform(rdma_netns_mode="exclusive")
    )
    plan = plan_resource(rc, select_devices(snap, rc), snap, {})
    assert plan.devices == () and plan.unhealthy_reason is None
