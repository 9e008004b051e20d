"""Pure change detection: RDMA port polls (agent.links.portdiff) and netdev tables built from
netlink observations (agent.links.netdevs) turned into link events."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agent.links.netdevs import (
    AddressObservation,
    LinkObservation,
    Netdev,
    Netdevs,
    Observation,
    diff_netdevs,
    netdev_ports,
    netdevs_from_dump,
    update_netdevs,
)
from agent.links.portdiff import PortStates, diff_port_states
from proto.inventory import Device, Interface, NodeSnapshot
from proto.messages.events import LinkEvent

NODE = "gpu-001"
NOW = 1_700_000_000.0
PORTS = {"enp26s0f0np0": ("mlx5_0", 1), "ib0": ("mlx5_1", None)}
UP = Netdev(
    name="enp26s0f0np0", operstate="up", carrier=True, mtu=9000, address="0c:42:a1:e1:7f:40"
)


def summary(events: list[LinkEvent]) -> list[tuple[object, ...]]:
    return [(e.seq, e.kind, e.device, e.port, e.netdev, e.old_state, e.new_state) for e in events]


# ---- RDMA ports (sysfs polls) -------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param({("mlx5_0", 1): ("ACTIVE", "LinkUp")}, {("mlx5_0", 1): ("ACTIVE", "LinkUp")},
                     [], id="unchanged"),
        pytest.param(
            {("mlx5_0", 1): ("ACTIVE", "LinkUp")},
            {("mlx5_0", 1): ("DOWN", "Disabled")},
            [(8, "port-state", "mlx5_0", 1, None, "ACTIVE", "DOWN")],
            id="port-down",
        ),
        pytest.param(
            {("mlx5_0", 1): ("ACTIVE", "LinkUp")},
            {("mlx5_0", 1): ("ACTIVE", "LinkUp"), ("mlx5_1", 1): ("DOWN", "Polling")},
            [(8, "device-added", "mlx5_1", None, None, None, None)],
            id="device-added",
        ),
        pytest.param(
            {("mlx5_0", 1): ("ACTIVE", "LinkUp"), ("mlx5_1", 1): ("ACTIVE", "LinkUp")},
            {("mlx5_1", 1): ("INIT", "LinkUp")},
            [
                (8, "device-removed", "mlx5_0", None, None, None, None),
                (9, "port-state", "mlx5_1", 1, None, "ACTIVE", "INIT"),
            ],
            id="removed-and-port-change-numbered-in-order",
        ),
    ],
)  # fmt: skip
def test_diff_port_states(
    old: PortStates, new: PortStates, expected: list[tuple[object, ...]]
) -> None:
    assert summary(diff_port_states(old, new, node=NODE, now=NOW, seq=7)) == expected


def test_port_phys_state_change_alone_is_an_event() -> None:
    (event,) = diff_port_states(
        {("mlx5_0", 1): ("DOWN", "Polling")},
        {("mlx5_0", 1): ("DOWN", "Disabled")},
        node=NODE,
        now=NOW,
        seq=0,
    )
    assert (event.kind, event.phys_state, event.observed_at) == ("port-state", "Disabled", NOW)


# ---- netdev table from netlink observations -----------------------------------------


def link(
    index: int = 4,
    name: str = "enp26s0f0np0",
    *,
    operstate: str = "up",
    carrier: bool = True,
    mtu: int = 9000,
    address: str | None = "0c:42:a1:e1:7f:40",
    removed: bool = False,
) -> LinkObservation:
    return LinkObservation(
        index=index,
        name=name,
        operstate=operstate,
        carrier=carrier,
        mtu=mtu,
        address=address,
        removed=removed,
    )


def test_dump_builds_the_table_links_then_addresses() -> None:
    table = netdevs_from_dump(
        [
            link(1, "lo", operstate="unknown", mtu=65536, address="00:00:00:00:00:00"),
            link(4),
            AddressObservation(index=4, address="10.10.0.11/24"),
            AddressObservation(index=4, address="fe80::e42:a1ff:fee1:7f40/64"),
            AddressObservation(index=99, address="192.0.2.9/24"),  # no such link: ignored
        ]
    )
    assert sorted(table) == [1, 4]
    assert table[4] == Netdev(
        name="enp26s0f0np0",
        operstate="up",
        carrier=True,
        mtu=9000,
        address="0c:42:a1:e1:7f:40",
        ips=frozenset({"10.10.0.11/24", "fe80::e42:a1ff:fee1:7f40/64"}),
    )


def test_update_keeps_addresses_across_link_messages_and_does_not_mutate() -> None:
    before: Netdevs = {4: Netdev(name="enp26s0f0np0", ips=frozenset({"10.10.0.11/24"}))}
    after = update_netdevs(before, link(operstate="down"))
    assert after[4].ips == frozenset({"10.10.0.11/24"})
    assert after[4].operstate == "down"
    assert before[4].operstate is None


def test_removed_link_leaves_the_table() -> None:
    assert update_netdevs({4: UP}, link(removed=True)) == {}


@pytest.mark.parametrize(
    ("observations", "expected"),
    [
        pytest.param([link(operstate="down", carrier=False)],
                     [(11, "netdev-state", "mlx5_0", 1, "enp26s0f0np0", "up", "down")],
                     id="link-down"),
        pytest.param([link(operstate="lowerlayerdown", carrier=False)],
                     [(11, "netdev-state", "mlx5_0", 1, "enp26s0f0np0", "up", "lowerlayerdown")],
                     id="lower-layer-down"),
        pytest.param([link(mtu=1500)],
                     [(11, "netdev-mtu", "mlx5_0", 1, "enp26s0f0np0", "9000", "1500")],
                     id="mtu"),
        pytest.param([link(address="0c:42:a1:e1:7f:99")],
                     [(11, "netdev-address", "mlx5_0", 1, "enp26s0f0np0",
                       "0c:42:a1:e1:7f:40", "0c:42:a1:e1:7f:99")],
                     id="mac"),
        pytest.param([AddressObservation(index=4, address="10.10.0.11/24")],
                     [(11, "netdev-address", "mlx5_0", 1, "enp26s0f0np0", None, "10.10.0.11/24")],
                     id="ip-added"),
        pytest.param([AddressObservation(index=4, address="10.10.0.11/24"),
                      AddressObservation(index=4, address="10.10.0.11/24", removed=True)],
                     [], id="ip-added-and-removed-in-one-batch"),
        pytest.param([link(removed=True)],
                     [(11, "netdev-state", "mlx5_0", 1, "enp26s0f0np0", "up", None)],
                     id="netdev-gone"),
        pytest.param([link(operstate="down", mtu=4200)],
                     [(11, "netdev-state", "mlx5_0", 1, "enp26s0f0np0", "up", "down"),
                      (12, "netdev-mtu", "mlx5_0", 1, "enp26s0f0np0", "9000", "4200")],
                     id="state-and-mtu-in-one-message"),
        pytest.param([link()], [], id="repeated-message-no-event"),
        pytest.param([link(index=7, name="vethab12cd", operstate="down")], [],
                     id="unmapped-netdev-appears-silently"),
    ],
)  # fmt: skip
def test_netlink_observations_become_events(
    observations: list[Observation], expected: list[tuple[object, ...]]
) -> None:
    old: Netdevs = {4: UP}
    new = old
    for observation in observations:
        new = update_netdevs(new, observation)
    changes = diff_netdevs(old, new, ports=PORTS, node=NODE, now=NOW, seq=10)
    assert summary(changes.events) == expected
    assert all(e.node == NODE and e.observed_at == NOW for e in changes.events)
    assert changes.reread == bool(expected)


def test_ipv6_address_refresh_is_not_an_event() -> None:
    # The kernel re-announces an IPv6 address (RTM_NEWADDR) when its flags or lifetimes
    # change, e.g. when duplicate address detection completes.
    ip = "fe80::e42:a1ff:fee1:7f40/64"
    old: Netdevs = {4: Netdev(name="enp26s0f0np0", ips=frozenset({ip}))}
    new = update_netdevs(old, AddressObservation(index=4, address=ip))
    assert diff_netdevs(old, new, ports=PORTS, node=NODE, now=NOW, seq=0).events == []


def test_new_rdma_netdev_is_a_state_event_from_none() -> None:
    new = update_netdevs({}, link(index=9, name="ib0", operstate="down", address=None))
    changes = diff_netdevs({}, new, ports=PORTS, node=NODE, now=NOW, seq=0)
    assert summary(changes.events) == [(1, "netdev-state", "mlx5_1", None, "ib0", None, "down")]


def test_rename_of_rdma_netdev_rereads_without_an_event() -> None:
    # udev renames eth2 -> enp26s0f0np0 at boot; the RDMA mapping knows the old name
    # until the snapshot is re-read, which this must trigger.
    old: Netdevs = {4: UP}
    new = update_netdevs(old, link(name="eth2"))
    changes = diff_netdevs(old, new, ports=PORTS, node=NODE, now=NOW, seq=0)
    assert changes.events == []
    assert changes.reread


def test_carrier_flip_without_operstate_change_rereads_without_an_event() -> None:
    old: Netdevs = {4: replace(UP, operstate="down")}
    new = update_netdevs(old, link(operstate="down", carrier=False))
    changes = diff_netdevs(old, new, ports=PORTS, node=NODE, now=NOW, seq=0)
    assert (changes.events, changes.reread) == ([], True)


def test_unmapped_netdev_changes_are_ignored_entirely() -> None:
    old: Netdevs = {7: Netdev(name="vethab12cd", operstate="up")}
    new = update_netdevs(old, link(index=7, name="vethab12cd", operstate="down"))
    changes = diff_netdevs(old, new, ports=PORTS, node=NODE, now=NOW, seq=0)
    assert (changes.events, changes.reread) == ([], False)


def test_events_follow_ifindex_order_and_number_consecutively() -> None:
    ports = {"a": ("mlx5_0", 1), "b": ("mlx5_1", 1)}
    old: Netdevs = {2: Netdev(name="b", mtu=1500), 1: Netdev(name="a", mtu=1500)}
    new: Netdevs = {1: Netdev(name="a", mtu=9000), 2: Netdev(name="b", mtu=9000)}
    changes = diff_netdevs(old, new, ports=ports, node=NODE, now=NOW, seq=41)
    assert [(e.seq, e.netdev) for e in changes.events] == [(42, "a"), (43, "b")]


def test_netdev_ports_from_snapshot_prefers_interface_ports() -> None:
    snapshot = NodeSnapshot(
        node=NODE,
        agent_version="0",
        seq=1,
        collected_at=NOW,
        devices=(
            Device(
                name="mlx5_0",
                netdevs=("enp26s0f0np0",),
                interfaces=(Interface(name="enp26s0f0np0", port=1),),
            ),
            Device(name="mlx5_1", netdevs=("ib0",)),
            Device(name="hfi1_0"),
        ),
    )
    assert netdev_ports(snapshot) == {"enp26s0f0np0": ("mlx5_0", 1), "ib0": ("mlx5_1", None)}
