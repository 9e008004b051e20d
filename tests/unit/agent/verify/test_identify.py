"""Which pod interfaces are the RDMA ones, and why: GID addresses, the device's netdevs in
the pod's namespace and network-status device-info; host netdev names never count."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agent.verify.identify import (
    attachment_reasons,
    identify_interfaces,
    primary_interface,
    secondary_interfaces,
)
from agent.verify.verdict import match_gids
from proto.inventory import Gid
from proto.messages.validation import (
    AttachmentEvidence,
    DeviceEvidence,
    InjectedEvidence,
    InterfaceEvidence,
    PortEvidence,
)

GID_10_10_0_11 = Gid(index=3, gid="0000:0000:0000:0000:0000:ffff:0a0a:000b", type="RoCE v2",
                     ndev="net1")  # fmt: skip
ROCE = DeviceEvidence(
    name="mlx5_0",
    pci_address="0000:1a:00.0",
    netdevs=("enp26s0f0np0",),  # a lab tree rendered with host names
    ports=(PortEvidence(port=1, state="ACTIVE", link_layer="Ethernet", gids=(GID_10_10_0_11,)),),
)
IPOIB = DeviceEvidence(
    name="mlx5_1",
    pci_address="0000:3b:00.0",
    netdevs=("ib0",),
    ports=(PortEvidence(port=1, state="ACTIVE", link_layer="InfiniBand"),),
)
ETH0 = InterfaceEvidence(name="eth0", addresses=("10.244.1.7/24",))
NET1 = InterfaceEvidence(name="net1", addresses=("10.10.0.11/24",))
NET1_ELSEWHERE = InterfaceEvidence(name="net1", addresses=("10.99.0.5/24",))
IB0 = InterfaceEvidence(name="ib0", addresses=("192.168.50.3/24",))
HOST_NAMED = InterfaceEvidence(name="enp26s0f0np0")  # a pod interface named like the host's
DEFAULT = AttachmentEvidence(name="k8s-pod-network", interface="eth0", default=True)
NET1_INFO = AttachmentEvidence(name="default/rdma", interface="net1", device_type="pci",
                               pci_address="0000:1a:00.0", rdma_device="mlx5_0")  # fmt: skip


@dataclass(frozen=True)
class Row:
    interfaces: tuple[InterfaceEvidence, ...]
    attachments: tuple[AttachmentEvidence, ...] = ()
    devices: tuple[DeviceEvidence, ...] = (ROCE,)
    found: tuple[tuple[str, str, tuple[str, ...]], ...] = ()


ROWS = [
    pytest.param(Row(interfaces=(ETH0,)), id="primary-only-nothing"),
    pytest.param(Row(interfaces=(ETH0, NET1), found=(("net1", "mlx5_0",
                                                      ("gid-address", "gid-ndev")),)),
                 id="multus-net1-holds-the-gid-address"),
    pytest.param(Row(interfaces=(ETH0, NET1), attachments=(DEFAULT, NET1_INFO),
                     found=(("net1", "mlx5_0", ("gid-address", "device-info", "gid-ndev")),)),
                 id="gid-address-and-device-info"),
    pytest.param(Row(interfaces=(ETH0, NET1_ELSEWHERE), attachments=(DEFAULT, NET1_INFO),
                     found=(("net1", "mlx5_0", ("device-info", "gid-ndev")),)),
                 id="device-info-without-the-gid-address"),
    pytest.param(Row(interfaces=(ETH0, NET1_ELSEWHERE)), id="gid-ndev-alone-proves-nothing"),
    pytest.param(Row(interfaces=(ETH0, IB0), devices=(IPOIB,),
                     found=(("ib0", "mlx5_1", ("device-net",)),)),
                 id="ipoib-netdev-of-the-device"),
    pytest.param(Row(interfaces=(ETH0, HOST_NAMED), found=(("enp26s0f0np0", "mlx5_0",
                                                            ("device-net",)),)),
                 id="device-net-by-name-in-the-pods-sysfs"),
    pytest.param(Row(interfaces=(ETH0, NET1),
                     attachments=(DEFAULT, AttachmentEvidence(name="x", interface="net1",
                                                              pci_address="0000:1a:00.0")),
                     found=(("net1", "mlx5_0", ("gid-address", "device-info", "gid-ndev")),)),
                 id="device-info-by-pci-address-alone"),
]  # fmt: skip


@pytest.mark.parametrize("row", ROWS)
def test_identification_table(row: Row) -> None:
    found = identify_interfaces(
        row.devices, row.interfaces, match_gids(row.devices, row.interfaces), row.attachments
    )
    assert tuple((f.interface, f.device, f.sources) for f in found) == row.found


@pytest.mark.parametrize(
    ("attachments", "primary", "secondary"),
    [
        pytest.param((), "eth0", ("net1",), id="convention-without-network-status"),
        pytest.param((DEFAULT,), "eth0", ("net1",), id="default-entry"),
        pytest.param((AttachmentEvidence(name="c", interface="net1", default=True),), "net1",
                     ("eth0",), id="default-on-another-name"),
    ],
)  # fmt: skip
def test_primary_and_secondary(
    attachments: tuple[AttachmentEvidence, ...], primary: str, secondary: tuple[str, ...]
) -> None:
    assert primary_interface(attachments) == primary
    assert tuple(i.name for i in secondary_interfaces((ETH0, NET1), attachments)) == secondary


INJECTED = InjectedEvidence(rdma_devices=("mlx5_0",), pci_addresses=("0000:1a:00.0",))


@pytest.mark.parametrize(
    ("attachment", "injected", "codes"),
    [
        pytest.param(NET1_INFO, INJECTED, (), id="allocated-adapter"),
        pytest.param(AttachmentEvidence(name="n", interface="net1", pci_address="0000:1a:00.2",
                                        pf_pci_address="0000:1a:00.0", rdma_device="mlx5_4"),
                     INJECTED, (), id="vf-of-the-allocated-pf"),
        pytest.param(AttachmentEvidence(name="n", interface="net1", pci_address="0000:5e:00.0"),
                     INJECTED, ("attachment-not-allocated",), id="another-pci-function"),
        pytest.param(AttachmentEvidence(name="n", interface="net1", pci_address="0000:5e:00.0"),
                     InjectedEvidence(rdma_devices=("mlx5_0",)), ("attachment-not-allocated",),
                     id="pci-from-the-injected-device-name"),
        pytest.param(AttachmentEvidence(name="n", interface="net1", rdma_device="mlx5_7"),
                     INJECTED, ("attachment-not-allocated",), id="another-rdma-device"),
        pytest.param(AttachmentEvidence(name="n", interface="net9"), INJECTED,
                     ("attachment-interface-missing",), id="interface-not-in-pod"),
        pytest.param(AttachmentEvidence(name="n", interface="net1", pci_address="0000:5e:00.0"),
                     InjectedEvidence(), (), id="nothing-allocated-nothing-to-compare"),
        pytest.param(AttachmentEvidence(name="c", interface="eth9", default=True), INJECTED, (),
                     id="default-network-not-checked"),
    ],
)  # fmt: skip
def test_attachment_reasons(
    attachment: AttachmentEvidence, injected: InjectedEvidence, codes: tuple[str, ...]
) -> None:
    reasons = tuple(attachment_reasons((attachment,), (ETH0, NET1), injected, (ROCE,)))
    assert tuple(r.code for r in reasons) == codes
    assert all(attachment.name in r.message for r in reasons)
