"""agent.links.netlink.decode on kernel wire bytes: rtnetlink messages encoded by pyroute2's
own message classes, decoded back the way they arrive from the socket."""

from __future__ import annotations

from typing import Any

import pytest
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg

from agent.links.netdevs import AddressObservation, LinkObservation
from agent.links.netlink import RTM_DELADDR, RTM_DELLINK, RTM_NEWADDR, RTM_NEWLINK, decode


def wire(message: Any) -> Any:
    """Encode to bytes and decode them again, as a message read from the socket."""
    message.encode()
    received = type(message)(message.data)
    received.decode()
    return received


def link_message(kind: int, attrs: list[tuple[str, object]], index: int = 4) -> Any:
    message = ifinfmsg()
    message["header"]["type"] = kind
    message["index"] = index
    message["attrs"] = attrs
    return wire(message)


def addr_message(kind: int, family: int, attrs: list[tuple[str, str]], prefixlen: int) -> Any:
    message = ifaddrmsg()
    message["header"]["type"] = kind
    message["index"] = 4
    message["family"] = family
    message["prefixlen"] = prefixlen
    message["attrs"] = attrs
    return wire(message)


FULL_LINK = [
    ("IFLA_IFNAME", "enp26s0f0np0"),
    ("IFLA_OPERSTATE", "LOWERLAYERDOWN"),
    ("IFLA_CARRIER", 0),
    ("IFLA_MTU", 9000),
    ("IFLA_ADDRESS", "0c:42:a1:e1:7f:40"),
]


def test_newlink_is_a_link_observation_with_sysfs_spelling() -> None:
    assert decode(link_message(RTM_NEWLINK, FULL_LINK)) == LinkObservation(
        index=4,
        name="enp26s0f0np0",
        operstate="lowerlayerdown",
        carrier=False,
        mtu=9000,
        address="0c:42:a1:e1:7f:40",
    )


def test_dellink_is_a_removal() -> None:
    observation = decode(link_message(RTM_DELLINK, FULL_LINK))
    assert isinstance(observation, LinkObservation)
    assert observation.removed


def test_link_without_optional_attributes_keeps_them_unknown() -> None:
    assert decode(link_message(RTM_NEWLINK, [("IFLA_IFNAME", "ib0")])) == LinkObservation(
        index=4, name="ib0"
    )


def test_link_without_a_name_is_skipped() -> None:
    assert decode(link_message(RTM_NEWLINK, [("IFLA_MTU", 1500)])) is None


@pytest.mark.parametrize(
    ("kind", "family", "attrs", "prefixlen", "expected"),
    [
        pytest.param(
            RTM_NEWADDR,
            2,
            [("IFA_ADDRESS", "10.10.0.11"), ("IFA_LOCAL", "10.10.0.11")],
            24,
            AddressObservation(index=4, address="10.10.0.11/24"),
            id="ipv4",
        ),
        pytest.param(
            RTM_NEWADDR,
            2,
            [("IFA_ADDRESS", "10.10.0.1"), ("IFA_LOCAL", "10.10.0.11")],
            32,
            AddressObservation(index=4, address="10.10.0.11/32"),
            id="ipv4-point-to-point-uses-local",
        ),
        pytest.param(
            RTM_NEWADDR,
            10,
            [("IFA_ADDRESS", "fe80::e42:a1ff:fee1:7f40")],
            64,
            AddressObservation(index=4, address="fe80::e42:a1ff:fee1:7f40/64"),
            id="ipv6",
        ),
        pytest.param(
            RTM_DELADDR,
            2,
            [("IFA_LOCAL", "10.10.0.11")],
            24,
            AddressObservation(index=4, address="10.10.0.11/24", removed=True),
            id="removed",
        ),
    ],
)
def test_address_messages(
    kind: int,
    family: int,
    attrs: list[tuple[str, str]],
    prefixlen: int,
    expected: AddressObservation,
) -> None:
    assert decode(addr_message(kind, family, attrs, prefixlen)) == expected


def test_other_message_types_are_ignored() -> None:
    assert decode(link_message(24, FULL_LINK)) is None  # RTM_NEWROUTE
